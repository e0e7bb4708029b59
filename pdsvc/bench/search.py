"""The highest request rate that meets an SLO, by bisection (geometric: rates span decades)."""

from __future__ import annotations

import math
from collections.abc import Callable

Meets = Callable[[float], bool | None]
#: where a measurement ended: the rate that met the SLO, the lowest above it that missed
#: (None: none missed above it)
Near = tuple[float, float | None]


def bisect_rate(lo: float, hi: float, precision: float, meets: Meets, *,
                lo_met: bool = False, hi_missed: bool = False
                ) -> tuple[float | None, float | None]:
    """(best rate that met, lowest rate that did not) within [lo, hi], to ``precision``
    (stop when fail/pass ≤ 1 + precision). ``meets(rate)``: True, False, or None to stop
    (an invalid run). Runs: about log2(ln(hi/lo) / ln(1 + precision)); the ends are run
    only when every midpoint on their side went their way. ``lo_met``: ``lo`` is known to
    meet it already (a run before this search): it is not run again; ``hi_missed``: ``hi``
    is known to miss it, likewise."""
    good: float | None = lo if lo_met else None
    bad: float | None = None
    a, b = lo, hi
    while b / a > 1 + precision:
        mid = math.sqrt(a * b)
        verdict = meets(mid)
        if verdict is None:
            return good, bad
        if verdict:
            good, a = mid, mid
        else:
            bad, b = mid, mid
    if good is None:  # every midpoint failed: does the lowest rate meet it at all?
        verdict = meets(lo)
        if verdict:
            good = lo
        elif verdict is False:
            bad = lo
    elif bad is None and hi_missed:
        bad = hi
    elif bad is None:  # every midpoint met it: does the highest?
        verdict = meets(hi)
        if verdict:
            good = hi
        elif verdict is False:
            bad = hi
    return good, bad


def confirm_rate(lo: float, hi: float, precision: float, meets: Meets,
                 near: Near, *, floor: float | None = None
                 ) -> tuple[float | None, float | None]:
    """bisect_rate's answer for a config measured before, started where that measurement
    ended: ``near`` = (the rate that met the SLO, the lowest above it that missed; None: none
    missed above it). Both are run first; when they go as before, that is the answer in 2
    runs (1 at the top) instead of a whole search. A config that does better now is searched
    above the rate that missed, one that does worse below the rate that met, so the answer is
    as precise as a search from scratch and never taken on trust. ``floor``: a rate to beat
    (racing): when ``near``'s rate is missed, that is run next, and missed too, the search
    ends there (the goodput is below it)."""
    met, missed = near
    verdict = meets(met)
    if verdict is None:
        return None, None
    if not verdict:  # worse than before: below the rate that met
        if floor is not None and floor >= met:  # that was the rate to beat: below it
            return None, met
        if floor is not None and lo < floor:
            verdict = meets(floor)
            if not verdict:
                return None, floor if verdict is False else None
            return bisect_rate(floor, met, precision, meets, lo_met=True, hi_missed=True)
        if met <= lo:
            return None, met
        return bisect_rate(lo, met, precision, meets, hi_missed=True)
    if met >= hi:
        return met, None
    if missed is None:  # nothing above it was run before: search above it
        return bisect_rate(met, hi, precision, meets, lo_met=True)
    verdict = meets(missed)
    if verdict is None:
        return met, None
    if not verdict:
        return met, missed
    return bisect_rate(missed, hi, precision, meets, lo_met=True)  # better than before
