"""A profile run as a table a person can act on, as JSON (``pdsvc-profile/1``), and as a
picture (with the optional ``plot`` extra: matplotlib).

The JSON's fields, each with its unit in its name (``_us``, ``_s``, ``_share``):

* ``format``, ``run``, ``trace_root``, ``load``, ``warmup_s``, ``capture_s``;
* ``roles``: per role, ``role``, ``steps``, ``tok_s`` (null when not measured) and
  ``tok_s_how``; ``engines`` (name, url, trace_dir, traces, batch, tok_s, write_s);
  ``gpu_us``, ``window_us``, ``busy_share``; ``groups`` and ``kernels`` (every one, largest
  first: name, group, rule, us, count, share, window_share, by_rank); ``ranks`` (engine,
  rank, path, gpu_us, window_us, busy_us, compute_us, kernels); ``outliers`` (rank label,
  compute over the median rank's, less 1); ``ceilings``: the top kernel's and the top
  group's (``what``, ``name``, ``window_share``, ``speedup``: 2x, 4x, zero, and ``tok_s`` at
  each when measured);
* ``rules``: the grouping rules, in the order they are tried.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pdsvc.profile.breakdown import SPEEDUPS, Activity, Breakdown, speedup, speedup_key
from pdsvc.profile.groups import described
from pdsvc.profile.result import ProfileRun, RoleResult

PROFILE_SCHEMA = "pdsvc-profile/1"
#: kernels a table shows by default (the JSON holds all)
TOP = 10
#: the width of a kernel's name in the table
NAME_WIDTH = 56


def short(name: str, width: int = NAME_WIDTH) -> str:
    """A kernel's name for a table: without ``void`` and template arguments, cut to width."""
    name = name.removeprefix("void ")
    if "<" in name:
        name = name[:name.index("<")] + "<…>"
    return name if len(name) <= width else name[:width - 1] + "…"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def _tok(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def role_lines(r: RoleResult, top: int = TOP) -> list[str]:
    """One role's table: the header, the top kernels, the groups, the ranks, the ceiling."""
    b = r.breakdown
    names = ", ".join(e.name for e in r.engines)
    lines = [f"{r.role}: {names}; {len(b.ranks)} rank(s), {r.steps} steps each",
             f"  tok/s {_tok(r.tok_s)} ({r.tok_s_how})",
             f"  GPU busy {pct(b.busy_share)} of the window ({_ms(b.window_us)} over its "
             f"ranks); GPU time {_ms(b.gpu_us)}", "",
             f"  {'share':>6}  {'of window':>9}  {'calls':>6}  {'group':<13}  kernel"]
    for k in b.kernels[:top]:
        lines.append(f"  {pct(k.share):>6}  {pct(k.window_share):>9}  {k.count:>6}  "
                     f"{k.group:<13}  {short(k.name)}")
    rest = b.kernels[top:]
    if rest:
        lines.append(f"  {pct(sum(k.share for k in rest)):>6}  {'':>9}  "
                     f"{sum(k.count for k in rest):>6}  {'':<13}  ({len(rest)} more kernels: "
                     "--top N, or --json)")
    lines += ["", "  groups: " + "  ".join(f"{g.name} {pct(g.share)}" for g in b.groups)]
    lines += rank_lines(b)
    lines += ceiling_lines(r)
    return lines


def rank_lines(b: Breakdown) -> list[str]:
    """Each rank's GPU time and busy share; the ones that stand out named."""
    odd = dict(b.outliers)
    lines = ["  ranks:"]
    for rank in b.ranks:
        busy = rank.busy_us / rank.window_us if rank.window_us else 0.0
        note = (f"  <- compute {odd[rank.label]:+.0%} against the median rank: stands out"
                if rank.label in odd else "")
        lines.append(f"    {rank.label:<24} GPU {_ms(rank.gpu_us):>9}  busy {pct(busy):>6}"
                     f"{note}")
    if not b.outliers and len(b.ranks) > 1:
        lines.append("    no rank's compute is more than 10 % from the median rank's")
    return lines


def ceilings(r: RoleResult) -> list[tuple[str, Activity]]:
    """The activities a ceiling is given for: the top kernel, and the top group."""
    b = r.breakdown
    return [("top kernel", b.kernels[0]), ("top group", b.top_group)]


def ceiling_lines(r: RoleResult) -> list[str]:
    """tok/s if the top kernel, or the top group, ran 2x, 4x faster or took no time."""
    heads = "".join(f"{(speedup_key(s) + ' faster') if s else 'took no time':>15}"
                    for s in SPEEDUPS)
    lines = ["", "  ceiling: tok/s if it ran faster (Amdahl's law, on the window)",
             f"    {'':<10}  {'':<30}  {'of window':>9}{heads}"]
    for what, a in ceilings(r):
        cells = "".join(f"{_tok(v) + ' ' if v is not None else ''}"
                        f"(x{speedup(a.window_share, s):.2f})".rjust(15)
                        for s, v in zip(SPEEDUPS, a.ceiling(r.tok_s).values(), strict=True))
        lines.append(f"    {what:<10}  {short(a.name, 30):<30}  {pct(a.window_share):>9}{cells}")
    return lines


def table(run: ProfileRun, top: int = TOP) -> list[str]:
    """The whole run: each role, then where its traces are."""
    lines = [f"pdsvc profile {run.run_id}: {run.load}; batches full after {run.warmup_s:.0f} s,"
             f" captured and written in {run.capture_s:.0f} s", ""]
    for r in run.roles:
        lines += role_lines(r, top) + [""]
    lines.append(f"traces (open in https://ui.perfetto.dev, or HTA): {run.trace_root}")
    for r in run.roles:
        for e in r.engines:
            lines += [f"  {path}" for path in e.traces]
    return lines


def document(run: ProfileRun) -> dict[str, Any]:
    """The ``--json`` document."""
    return {"format": PROFILE_SCHEMA, "run": run.run_id, "trace_root": run.trace_root,
            "load": run.load, "warmup_s": run.warmup_s, "capture_s": run.capture_s,
            "roles": [role_doc(r) for r in run.roles], "rules": described()}


def role_doc(r: RoleResult) -> dict[str, Any]:
    b = r.breakdown
    return {
        "role": r.role, "steps": r.steps, "tok_s": r.tok_s, "tok_s_how": r.tok_s_how,
        "engines": [{**asdict(e), "traces": list(e.traces)} for e in r.engines],
        "gpu_us": b.gpu_us, "window_us": b.window_us, "busy_share": b.busy_share,
        "groups": [asdict(g) for g in b.groups], "kernels": [asdict(k) for k in b.kernels],
        "ranks": [asdict(x) for x in b.ranks],
        "outliers": [{"rank": label, "compute_over_median": d} for label, d in b.outliers],
        "ceilings": [{"what": what, "name": a.name, "window_share": a.window_share,
                      "speedup": {speedup_key(s): speedup(a.window_share, s) for s in SPEEDUPS},
                      "tok_s": a.ceiling(r.tok_s)} for what, a in ceilings(r)],
    }


def plot(run: ProfileRun, path: Path, top: int = 8) -> str | None:
    """Per role, its top kernels' shares as bars coloured by group; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    colours = {"attention": "tab:red", "moe/gemm": "tab:blue", "communication": "tab:purple",
               "memory": "tab:gray", "other": "tab:olive"}
    fig, axes = plt.subplots(len(run.roles), 1, figsize=(10, 3.2 * len(run.roles)),
                             squeeze=False)
    for ax, r in zip(axes[:, 0], run.roles, strict=True):
        ks = list(r.breakdown.kernels[:top])[::-1]
        ax.barh([short(k.name, 40) for k in ks], [100 * k.share for k in ks],
                color=[colours.get(k.group, "black") for k in ks])
        ax.set_xlabel("share of GPU time (%)")
        ax.set_title(f"{r.role}: GPU busy {pct(r.breakdown.busy_share)} of the window; "
                     f"tok/s {_tok(r.tok_s)}")
        for group, colour in colours.items():
            ax.barh([], [], color=colour, label=group)
        ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)
