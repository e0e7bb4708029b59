"""`pdsvc tune --profile`: the decode of the baseline and of the answer, each captured as
`pdsvc profile` captures it (pdsvc/profile/run.py) while the deployment runs it, and the two
breakdowns side by side: did the winning config move the bottleneck, or only the lever?

* **When**: the baseline once its measurements are taken (the deployment runs it then); the
  best once the deployment ends on it (not with --keep-current, which ends on the baseline:
  the line says so). When nothing beats the baseline, its breakdown is the answer's.
* **Under what**: `pdsvc profile`'s own load (bench_serving through the router, its batches
  full) at the space's workload (input and output lengths), its default steps.
* **A capture that fails** is said with its error, and the search goes on: the measurement is
  tune's answer, the profile its explanation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdsvc.errors import PdsvcError
from pdsvc.profile.breakdown import Activity, speedup
from pdsvc.profile.report import pct, short
from pdsvc.profile.result import ProfileRun, RoleResult

#: a decode capture of what runs now: (candidate name, its config file, progress) -> the run
Profiler = Callable[[str, Path, Callable[[str], None]], ProfileRun]
#: the width of a column of the side-by-side table
COLUMN = 40


@dataclass(frozen=True)
class Profiled:
    """One candidate's decode capture, or why there is none."""

    name: str
    run: ProfileRun | None
    why: str = ""

    @property
    def decode(self) -> RoleResult | None:
        if self.run is None:
            return None
        return next((r for r in self.run.roles if r.role == "decode"), None)


def take(profiler: Profiler, name: str, config: Path, say: Callable[[str], None]) -> Profiled:
    """``name``'s decode, captured while the deployment runs ``config``; a failed capture is
    said and kept as its reason (an interrupt is not caught: tune goes back as on any)."""
    say(f"tune: {name}: capturing its decode as pdsvc profile does (--profile)")
    try:
        run = profiler(name, config, lambda line: say(f"tune: {name}: {line}"))
    except (PdsvcError, OSError) as e:  # OSError: e.g. no room left for profile.json
        say(f"tune: {name}: not profiled: {e}")
        return Profiled(name, None, str(e))
    return Profiled(name, run)


def _named(a: Activity) -> str:
    return f"{short(a.name, COLUMN - 8)} {pct(a.share)}"


def _cells(p: Profiled) -> list[str]:
    """One column: tok/s, GPU busy, top kernel, top group, the top kernel's ceiling."""
    d = p.decode
    if d is None:
        return [f"not captured: {p.why or 'no decode in the capture'}"[:COLUMN * 2]]
    b, top = d.breakdown, d.breakdown.kernels[0]
    tok = "-" if d.tok_s is None else f"{d.tok_s:.0f}"
    zero = speedup(top.window_share, None)
    ceiling = f"x{zero:.2f}" + ("" if d.tok_s is None else f" ({d.tok_s * zero:.0f} tok/s)")
    return [tok, pct(b.busy_share), _named(top), f"{b.top_group.name} {pct(b.top_group.share)}",
            ceiling]


ROWS = ("tok/s", "GPU busy", "top kernel", "top group", "top kernel took no time")


def verdict(profiles: list[Profiled], missing: str = "") -> str:
    """Whether the bottleneck moved from the baseline's decode to the answer's, in one line
    (``missing``: why the best has no capture, e.g. --keep-current)."""
    got = [(p.name, p.decode) for p in profiles if p.decode is not None]
    if missing:
        return f"no comparison: {missing}"
    if len(got) < 2:
        if len(profiles) == 1 and got:
            return ("the answer is the baseline: its decode breakdown is the answer's; past the "
                    f"levers, only a faster {short(got[0][1].breakdown.kernels[0].name)} helps")
        return "no comparison: " + "; ".join(f"{p.name} {p.why}" for p in profiles
                                             if p.decode is None)
    (a_name, a), (b_name, b) = got[0], got[1]
    ka, kb = a.breakdown.kernels[0], b.breakdown.kernels[0]
    if ka.name == kb.name:
        return (f"the bottleneck did not move: {short(ka.name)} is the top decode kernel of "
                f"both ({pct(ka.share)} of {a_name}'s GPU time, {pct(kb.share)} of "
                f"{b_name}'s): the win came from the levers, and only a faster kernel goes "
                f"further (x{speedup(kb.window_share, None):.2f} if it took no time)")
    return (f"the bottleneck moved: the top decode kernel was {short(ka.name)} "
            f"({pct(ka.share)}) on {a_name} and is {short(kb.name)} ({pct(kb.share)}) on "
            f"{b_name}")


def table(profiles: list[Profiled], missing: str = "") -> list[str]:
    """The breakdowns side by side, a row per fact, then the verdict (and why a column is
    missing, e.g. --keep-current)."""
    if not profiles:
        return []
    columns = [_cells(p) for p in profiles]
    lines = ["decode, as pdsvc profile captures it (--profile):",
             f"  {'':<25}" + "".join(f"{p.name:<{COLUMN}}" for p in profiles).rstrip()]
    for i, row in enumerate(ROWS):
        cells = [c[i] if i < len(c) else "" for c in columns]
        lines.append((f"  {row:<25}" + "".join(f"{c:<{COLUMN}}" for c in cells)).rstrip())
    lines += [f"  {p.name}'s traces: {p.run.trace_root}" for p in profiles if p.run is not None]
    if missing:
        lines.append(f"  ({missing})")
    lines.append(f"profile: {verdict(profiles, missing)}")
    return lines


def document(profiles: list[Profiled], missing: str = "") -> dict[str, Any]:
    """The ``profiles`` field of tune's JSON: each capture's facts and its own JSON's path
    (``pdsvc-profile/1``: every kernel), the verdict."""
    out: list[dict[str, Any]] = []
    for p in profiles:
        d = p.decode
        if d is None or p.run is None:
            out.append({"name": p.name, "error": p.why or "no decode in the capture"})
            continue
        b = d.breakdown
        out.append({
            "name": p.name, "run": p.run.run_id, "trace_root": p.run.trace_root,
            "profile_json": str(Path(p.run.trace_root) / "profile.json"), "tok_s": d.tok_s,
            "busy_share": b.busy_share,
            "top_kernel": {"name": b.kernels[0].name, "group": b.kernels[0].group,
                           "share": b.kernels[0].share,
                           "window_share": b.kernels[0].window_share},
            "top_group": {"name": b.top_group.name, "share": b.top_group.share,
                          "window_share": b.top_group.window_share},
        })
    return {"captures": out, "missing": missing or None, "verdict": verdict(profiles, missing)}
