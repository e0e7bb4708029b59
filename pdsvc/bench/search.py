"""The highest request rate that meets an SLO, by bisection (geometric: rates span decades)."""

from __future__ import annotations

import math
from collections.abc import Callable


def bisect_rate(lo: float, hi: float, precision: float,
                meets: Callable[[float], bool | None], *,
                lo_met: bool = False) -> tuple[float | None, float | None]:
    """(best rate that met, lowest rate that did not) within [lo, hi], to ``precision``
    (stop when fail/pass ≤ 1 + precision). ``meets(rate)``: True, False, or None to stop
    (an invalid run). Runs: about log2(ln(hi/lo) / ln(1 + precision)); the ends are run
    only when every midpoint on their side went their way. ``lo_met``: ``lo`` is known to
    meet it already (a run before this search): it is not run again."""
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
    elif bad is None:  # every midpoint met it: does the highest?
        verdict = meets(hi)
        if verdict:
            good = hi
        elif verdict is False:
            bad = hi
    return good, bad
