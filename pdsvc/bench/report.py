"""A run list as a table, as JSON (``pdsvc-bench/1``), and as a plot of TTFT/ITL
percentiles against the request rate (with the optional ``plot`` extra: matplotlib)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .runner import RunResult, Slo

BENCH_SCHEMA = "pdsvc-bench/1"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def table(runs: list[RunResult]) -> list[str]:
    head = ["run", "rate/s", "ok/total", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50",
            "ITL p99", "SLO met", "valid"]
    rows = [head]
    for i, r in enumerate(runs, 1):
        m = r.metrics
        verdict = "yes" if r.valid else "NO: " + (", ".join(g.name for g in r.failed_gates())
                                                  or "bench_serving failed")
        rows.append([str(i), f"{r.load.rate:g}", f"{r.ok}/{r.total}",
                     _ms(m.get("output_throughput")), _ms(m.get("median_ttft_ms")),
                     _ms(m.get("p99_ttft_ms")), _ms(m.get("median_itl_ms")),
                     _ms(m.get("p99_itl_ms")),
                     "-" if r.slo_share is None else f"{r.slo_share:.1%}", verdict])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def spread(runs: list[RunResult]) -> dict[str, dict[str, float]]:
    """Mean, standard deviation, min and max of each latency figure over repeats."""
    out: dict[str, dict[str, float]] = {}
    for key in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                "p99_itl_ms"):
        vals = [float(v) for r in runs if (v := r.metrics.get(key)) is not None]
        if vals:
            out[key] = {"mean": statistics.fmean(vals),
                        "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                        "min": min(vals), "max": max(vals)}
    return out


def spread_lines(runs: list[RunResult]) -> list[str]:
    s = spread(runs)
    return [f"  {k}: {v['mean']:.1f} ± {v['stdev']:.1f} (min {v['min']:.1f}, max "
            f"{v['max']:.1f}, {len(runs)} runs)" for k, v in s.items()]


def plot(runs: list[RunResult], path: Path, slo: Slo | None = None,
         found: float | None = None) -> str | None:
    """TTFT and ITL p50/p90/p99 against the rate, with the SLO's bounds (``slo``) and the
    highest rate the search found to meet it (``found``) drawn; None when matplotlib is not
    installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = figure(plt, runs, slo, found)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def figure(plt: Any, runs: list[RunResult], slo: Slo | None, found: float | None) -> Any:
    """The plot's figure (matplotlib.pyplot ``plt``): one axis for TTFT, one for ITL; an SLO
    bound is a dashed horizontal line on its axis (a request meets the SLO under both), the
    rate found a dotted vertical line on both."""
    pts = sorted((r for r in runs if r.metrics.get("median_ttft_ms") is not None),
                 key=lambda r: r.load.rate)
    rates = [r.load.rate for r in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what in ((ax1, "ttft"), (ax2, "itl")):
        for q, style in (("median", "o-"), ("p90", "s--"), ("p99", "^-")):
            ax.plot(rates, [r.metrics.get(f"{q}_{what}_ms") for r in pts], style,
                    label=f"{q} {what.upper()}")
        if slo is not None:
            bound = slo.ttft_ms if what == "ttft" else slo.itl_ms
            ax.axhline(bound, color="red", linestyle="--",
                       label=f"SLO: {what.upper()} ≤ {bound:g} ms ({slo.share:.0%})")
        if found is not None:
            ax.axvline(found, color="green", linestyle=":",
                       label=f"highest rate meeting it: {found:.2f} req/s")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{what.upper()} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def document(target: dict[str, Any], runs: list[RunResult], *, mode: str,
             slo: dict[str, Any] | None, plot_path: str | None, valid: bool,
             reason: str) -> dict[str, Any]:
    return {"format": BENCH_SCHEMA, "mode": mode, "target": target, "valid": valid,
            "reason": reason, "slo": slo, "runs": [r.to_dict() for r in runs],
            "spread": spread(runs) if mode == "repeat" else None, "plot": plot_path}
