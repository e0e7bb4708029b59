"""How a test bounds a duration it measured under the suite's own load (docs/testing.md,
"Durations"): only as a guard that a mechanism worked at all (a timer fired, nothing hung),
never as a speed target. The bound is SLACK × what the mechanism takes on an idle machine, the
idle figure derived from the settings the test gave it (a watchdog, a restart delay, a load
time), so the same verdict comes on an idle and on a busy machine (CI runs 6 workers on 2
cores, and its machine may be busy besides). Speed targets are benchmarks' (benchmarks/),
printed as figures beside each other."""

from __future__ import annotations

#: how much slower than idle a busy machine may make a mechanism before a test calls it broken
SLACK = 3.0


def within(took: float, idle: float, what: str) -> None:
    """Assert that ``what`` took at most SLACK × ``idle`` seconds (its idle figure)."""
    assert took <= SLACK * idle, (
        f"{what}: {took:.1f} s, over {SLACK:g} × its idle {idle:.1f} s: the mechanism did not "
        "work (a missed timer, a hang), or this machine is over 3× slower than idle")
