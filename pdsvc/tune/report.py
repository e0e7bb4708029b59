"""`pdsvc tune`'s answer: the table, the JSON (``pdsvc-tune/2``), the plot (with the optional
``plot`` extra: matplotlib) and the best config as a file whose header says how it was
measured."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from .search import Answer
from .space import Candidate, Space
from .store import Measurement, Result
from .verdict import confirmed, goodputs, mean_rate, rates, span

#: /2: ``best`` and ``baseline`` give ``goodput`` (each measurement's rate with its bound and
#: whether it confirmed the first) and ``said`` (the words), where /1 gave bare ``rates``
TUNE_SCHEMA = "pdsvc-tune/2"


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    return (f"{v:.0f}" if v >= 100 else f"{v:.3g}") + unit


def _goodput(outcomes: list[Measurement], unit: str = "") -> str:
    """The valid measurements' goodput: as ``span`` says it where the repeats confirmed the
    first ("69.8, confirmed by 2 repeats"), else their mean with their range beside it."""
    valid = [o for o in outcomes if o.counted]
    if not valid:
        return "-"
    if confirmed(valid):
        return span(valid, unit)
    return f"{mean_rate(valid):.3g}{unit} ({span(valid, '')})"


def _result(o: Measurement) -> str:
    """The table's result column: what the measurement came to, a lower bound said as one."""
    twice = f" (the first of two invalid: {o.first_invalid})" if o.first_invalid else ""
    if o.status == Result.MEASURED:
        return f"measured{twice}"
    if o.status == Result.LOWER_BOUND:
        return f"lower bound: the SLO held at the range's top (raise rates.high){twice}"
    return f"{o.status}: {o.why}"


def table(answer: Answer, measured: dict[str, list[Measurement]]) -> list[str]:
    """One row per candidate: what differs from the baseline, goodput (req/s, with the
    range of its measurements, or the repeats that confirmed the first), output tokens/s, p99
    TTFT and ITL, what the measurement came to (a lower bound said as one), seconds."""
    head = ["name", "changes", "goodput req/s", "tok/s", "TTFT p99", "ITL p99", "result",
            "secs"]
    rows = [head]
    for cand, o, why in answer.rows:
        outs = measured.get(cand.name, [o] if o else [])
        if o is None:
            rows.append([cand.name, cand.describe(), "-", "-", "-", "-", why, "-"])
            continue
        result = _result(o)
        mark = " *" if cand == answer.best and answer.wins else ""
        rows.append([cand.name + mark, cand.describe(), _goodput(outs),
                     _num(o.tokens_per_s), _num(o.ttft_p99_ms, " ms"), _num(o.itl_p99_ms, " ms"),
                     result, f"{sum(x.seconds for x in outs):.0f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 2)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r[:-2], widths, strict=False)),
                       r[-1].rjust(5), r[-2]]).rstrip() for r in rows]


def document(space: Space, answer: Answer, measured: dict[str, list[Measurement]], *,
             results: Path, best_config: Path | None, plot_path: str | None) -> dict[str, Any]:
    return {
        "format": TUNE_SCHEMA,
        "slo": {"ttft_ms": space.ttft_ms, "itl_ms": space.itl_ms, "share": space.share},
        "workload": {"input_len": space.input_len, "output_len": space.output_len,
                     "num_prompts": space.num_prompts},
        "search": answer.how,
        "verdict": answer.verdict,
        "wins": answer.wins,
        "best": {"name": answer.best.name, "changes": dict(answer.best.changes),
                 "goodput": goodputs(answer.best_outcomes), "said": span(answer.best_outcomes)},
        "baseline": {"goodput": goodputs(answer.baseline), "said": span(answer.baseline)},
        "running": answer.running.name if answer.running else None,
        "candidates": [
            {"name": cand.name, "changes": dict(cand.changes), "skipped": why or None,
             "measurements": [o.to_dict() for o in measured.get(cand.name, [o] if o else [])]}
            for cand, o, why in answer.rows],
        "results": str(results),
        "best_config": str(best_config) if best_config else None,
        "plot": plot_path,
    }


def best_config_text(config_text: str, answer: Answer, space: Space, *, space_path: Path,
                     config_path: Path, host: str, best_text: str) -> str:
    """The best config (or the current one, when nothing beats it) with a header that says
    how it was measured."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Written by pdsvc tune on {host}, {now}: the config that served the most at the",
        f"# SLO (TTFT ≤ {space.ttft_ms:g} ms, ITL ≤ {space.itl_ms:g} ms for "
        f"{space.share:.0%} of requests; {space.input_len}+{space.output_len} tokens, "
        f"{space.num_prompts} prompts a run),",
        f"# searched over {space_path} from {config_path}.",
        f"# {answer.verdict}.",
        f"# Baseline goodput: {_goodput(answer.baseline, ' req/s')} "
        f"({len(answer.baseline)} measurements).",
    ]
    if answer.wins:
        lines.append(f"# This config ({answer.best.describe()}): "
                     f"{_goodput(answer.best_outcomes, ' req/s')} ({len(answer.best_outcomes)} "
                     "measurements).")
    lines.append("# To run it: pdsvc apply -c THIS_FILE (or copy it over your config first).")
    body = best_text if answer.wins else config_text
    return "\n".join(lines) + "\n" + body


def plot(space: Space, answer: Answer, measured: dict[str, list[Measurement]],
         path: Path) -> str | None:
    """Goodput per candidate with the range of its measurements, a lower bound hatched and
    marked "≥"; latency against rate for the baseline and the
    best, the SLO bounds drawn. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = figure(plt, space, answer, measured)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def figure(plt: Any, space: Space, answer: Answer, measured: dict[str, list[Measurement]]) -> Any:
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(16, 4.5))
    shown = [(c, measured.get(c.name, [o] if o else [])) for c, o, _ in answer.rows
             if o is not None]
    names = [c.name for c, _ in shown]
    means = [mean_rate(outs) for _, outs in shown]
    lows = [m - min(rates(outs), default=m) for m, (_, outs) in zip(means, shown, strict=True)]
    highs = [max(rates(outs), default=m) - m for m, (_, outs) in zip(means, shown, strict=True)]
    bars = ax0.bar(names, means, yerr=[lows, highs], capsize=3,
                   color=["tab:green" if c == answer.best and answer.wins else "tab:blue"
                          for c, _ in shown])
    for bar, (_, outs) in zip(bars, shown, strict=True):
        if any(o.status == Result.LOWER_BOUND for o in outs):  # the SLO held at the top
            bar.set_hatch("//")
            ax0.annotate("≥", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         ha="center", va="bottom")
    ax0.set_ylabel("goodput at the SLO (req/s)")
    ax0.set_title("goodput per candidate (range over its measurements;\n"
                  "hatched, ≥: a lower bound, the SLO held at the range's top)")
    ax0.tick_params(axis="x", rotation=60)
    for ax, what, bound in ((ax1, "ttft", space.ttft_ms), (ax2, "itl", space.itl_ms)):
        for cand, outs, style in ((Candidate("baseline"), answer.baseline, "o--"),
                                  (answer.best, answer.best_outcomes, "s-")):
            pts = sorted((p.rate, getattr(p, f"{what}_p99_ms")) for o in outs[:1]
                         for p in o.points if getattr(p, f"{what}_p99_ms") is not None)
            if pts:
                ax.plot([r for r, _ in pts], [v for _, v in pts], style,
                        label=f"{cand.name} p99")
        ax.axhline(bound, color="tab:red", linestyle=":", label=f"SLO {bound:g} ms")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{what.upper()} p99 (ms)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig
