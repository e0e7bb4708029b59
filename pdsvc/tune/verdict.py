"""What `pdsvc tune`'s measurements say, in numbers and in words: each config's goodputs, the
verdict on the best against the baseline (judge), the drift check (drifted), the rate a
candidate races at (to_beat).

A config's repeats start where its first measurement ended (bench/search.confirm_rate: the
rate it met, then the one it missed): a repeat that finds the same interval *confirms* the
first, it is not an independent sample, and its "spread" of zero means nothing. So the words
say what the repeats are: "69.8, confirmed by 2 repeats" where each repeat found the first's
interval again, a range ("7.3..8.1") only where one moved. A goodput that held at the range's
top is a lower bound ("≥ 64") and one that lost a race an upper bound ("< 24"), in every
output: the verdict, the table, the JSON (``bound``), the plot.
"""

from __future__ import annotations

import statistics
from typing import Any

from .space import Candidate, Space
from .store import RATED, Measurement, Result


def rates(outcomes: list[Measurement]) -> list[float]:
    """The goodputs of a candidate's valid measurements (0 where no rate met the SLO; a
    race lost has none: only less than the rate to beat)."""
    return [o.rate or 0.0 for o in outcomes if o.counted and o.status != Result.BELOW]


def mean_rate(outcomes: list[Measurement]) -> float:
    rs = rates(outcomes)
    return statistics.fmean(rs) if rs else 0.0


def drifted(before: list[Measurement], once_more: Measurement, space: Space) -> str:
    """Why the baseline measured again is not the baseline measured at the start: its
    interval (from the highest rate that met the SLO to the lowest that missed it) apart from
    every earlier one by at least a step of the search, a move beyond what the search can tell
    apart; or it could not be measured again. "" when it is within them. Intervals that only
    touch (the same rate met once and missed once) are the search's resolution, not a drift."""
    if once_more.status not in RATED and once_more.status != Result.NO_RATE:
        return f"was {once_more.status} ({once_more.why}), so a drift cannot be ruled out"
    valid = [o for o in before if o.counted and o.status != Result.BELOW]
    met, missed = once_more.rate or 0.0, once_more.above
    tops = [o.above if o.above is not None else space.rate_high for o in valid]
    if valid and once_more.status != Result.NO_RATE and met > max(tops) and \
            all(o.status != Result.LOWER_BOUND for o in valid):
        return (f"met the SLO at {met:.3g} req/s, above where each measurement at the start "
                f"missed it (at {', '.join(f'{t:.3g}' for t in tops)}): the host got faster")
    lows = [o.rate or 0.0 for o in valid]
    if valid and missed is not None and missed < min(lows):
        return (f"missed the SLO at {missed:.3g} req/s, below where each measurement at the "
                f"start met it (up to {', '.join(f'{x:.3g}' for x in lows)}): the host got "
                "slower")
    return ""


def judge(cand: Candidate, outs: list[Measurement],
          baseline: list[Measurement]) -> tuple[bool, str]:
    """Whether ``cand``'s repeats beat the baseline's, and the verdict naming the fact that
    decided it: a repeat that is not a valid measurement (the first such); or the intervals
    not apart. A measurement's goodput lies between the highest rate that met the SLO and the
    lowest rate above it that missed it (Measurement.above): the candidate wins only when its
    lowest goodput is above every baseline goodput and at or above every rate the baseline
    missed, so a gain within the search's precision is never called a win."""
    n, who = len(outs), f"{cand.name} ({cand.describe()})"
    lost = [o for o in outs if not o.counted or o.status == Result.BELOW]
    if lost:
        o = lost[0]
        if o.status == Result.BELOW:
            rated = [x for x in outs if x.status != Result.BELOW]
            return False, (f"no candidate beats the current config: the best, {who}, "
                           f"missed the SLO at {o.above or 0:.3g} req/s, the baseline's rate "
                           f"to beat, in repeat {o.repeat + 1} (its goodputs: {span(rated)}; "
                           f"the baseline's: {span(baseline)}): a win needs each of its {n} "
                           "measurements above it")
        return False, (f"no candidate beats the current config: the best, {who}, has "
                       f"{n - len(lost)} valid measurement(s) of {n}: repeat {o.repeat + 1} "
                       f"was {o.status}: {o.why}; a win needs each of its {n}")
    low, high = min(rates(outs)), max(rates(baseline))
    missed = max((o.above for o in baseline if o.counted and o.above is not None), default=None)
    lost_by = (f"is not above the baseline's highest, {high:.3g}" if low <= high else
               f"is below {missed:.3g}, a rate the baseline missed the SLO at: within what the "
               "search can tell apart (rates.precision)" if missed is not None and low < missed
               else "")
    if lost_by:
        return False, (f"no candidate beats the current config: the best, {who}, measured "
                       f"{span(outs)} against the baseline's {span(baseline)}: its "
                       f"lowest, {low:.3g}, {lost_by}")
    return True, (f"{who} meets the SLO at {span(outs)}, the current config at "
                  f"{span(baseline)}; the best's lowest, {low:.3g}, is above the baseline's "
                  "highest and at or above every rate the baseline missed")


def to_beat(leader: list[Measurement], space: Space) -> float | None:
    """Racing: the rate a candidate must meet to take the lead from ``leader`` (its
    measurements), run first; a candidate that misses it costs one run (``below``). The
    lowest rate the leader missed above its goodput (a candidate below it is within the
    search's precision of the leader at best), else its goodput a precision up, at most the
    range's top (a leader at the top: a candidate can only tie there). None: no race (no
    valid goodput to beat, or the rate to beat is the range's bottom)."""
    rated = [o for o in leader if o.status in RATED]
    if not rated:
        return None
    if any(o.status == Result.LOWER_BOUND for o in rated):
        return space.rate_high
    rate = max(o.above if o.above is not None else (o.rate or 0.0) * (1 + space.precision)
               for o in rated)
    rate = min(rate, space.rate_high)
    return rate if rate > space.rate_low else None


def goodput(o: Measurement) -> str:
    """The goodput as said: "≥ 64" where the SLO held at the range's top, "< 24" where it
    lost the race at 24."""
    if o.status == Result.BELOW:
        return f"< {o.above or 0:.3g}"
    return f"{'≥ ' if o.status == Result.LOWER_BOUND else ''}{o.rate or 0:.3g}"


def extremes(valid: list[Measurement]) -> tuple[Measurement, Measurement]:
    """The lowest and the highest goodput of (non-empty) valid measurements."""
    def key(o: Measurement) -> float:
        return o.rate or 0.0
    return min(valid, key=key), max(valid, key=key)


def _interval(o: Measurement) -> tuple[Result, float | None, float | None]:
    return o.status, o.rate, o.above


def confirmed(valid: list[Measurement]) -> bool:
    """Whether every later measurement of the (non-empty) valid ones found the first's
    interval again: the same result, rate met and rate missed."""
    return all(_interval(o) == _interval(valid[0]) for o in valid[1:])


def span(outcomes: list[Measurement], unit: str = " req/s") -> str:
    """A config's goodput in words that say what its measurements are: "69.8 req/s, confirmed
    by 2 repeats" where each repeat found the first's interval again (a repeat starts where
    the first ended, so it confirms it; it is no new sample), "7.3..8.1 req/s" where one
    moved, "≥ 64 req/s" (a lower bound), "< 24 req/s" (a race lost there), "none"."""
    valid = [o for o in outcomes if o.counted]
    if not valid:
        return "none"
    if confirmed(valid):
        n = len(valid) - 1
        return (goodput(valid[0]) + unit
                + (f", confirmed by {n} repeat{'s' * (n > 1)}" if n else ""))
    low, high = extremes(valid)
    if goodput(low) == goodput(high):  # the same rate met, not the same one missed
        return goodput(low) + unit
    return f"{goodput(low)}..{goodput(high)}{unit}"


#: each Result's goodput as a bound, for machines (the JSON's ``bound``): "exact" within the
#: search's precision, "at-least" (the SLO held at the range's top), "below" (a race lost at
#: ``above``: the goodput is less), "none" (no rate in the range met the SLO)
BOUNDS = {Result.MEASURED: "exact", Result.LOWER_BOUND: "at-least", Result.BELOW: "below",
          Result.NO_RATE: "none"}


def goodputs(outcomes: list[Measurement]) -> list[dict[str, Any]]:
    """The valid measurements' goodputs as a machine reads them: the rate (req/s; None for a
    race lost), its bound (BOUNDS), the lowest rate above it that missed the SLO, and whether
    the measurement confirmed the first's interval (a repeat) or searched."""
    valid = [o for o in outcomes if o.counted]
    first = valid[0] if valid else None
    return [{"repeat": o.repeat, "rate": None if o.status == Result.BELOW else o.rate or 0.0,
             "bound": BOUNDS[o.status], "missed_at": o.above,
             "confirms_first": first is not None and o is not first
             and _interval(o) == _interval(first)}
            for o in valid]
