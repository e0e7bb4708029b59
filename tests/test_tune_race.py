"""Racing in `pdsvc tune`: a candidate is measured first at the rate to beat (the lowest rate
the leader missed, search.to_beat); one that misses it there is ``below`` after one run, and
one that meets it is searched above it only. The SLO search's side (bench/session.py,
bench/search.py) with a designed capacity, the measurement's outcome (tune/live.py), and the
search's (tune/search.py) with the designed deployment of test_tune_search.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tune_search import Fake, tuner

from pdsvc.bench.runner import Gate, RunResult, Slo
from pdsvc.bench.search import bisect_rate
from pdsvc.bench.session import Session
from pdsvc.bench.target import Load, Target
from pdsvc.tune.live import outcome_of
from pdsvc.tune.search import goodput, to_beat
from pdsvc.tune.space import parse_space
from pdsvc.tune.store import Measurement, Result

SLO = Slo(1000, 100, 0.99)
SPACE = parse_space("slo: {ttft_ms: 1000, itl_ms: 100}\nrates: {low: 1, high: 64, "
                    "precision: 0.1}\nlevers:\n  decode.env.NCCL_PROTO: [LL128]\n", "tune.yaml")


class Designed(Session):
    """A session whose deployment meets the SLO up to ``capacity`` req/s; ``invalid``: the
    rates whose run fails a gate (a canary re-proven during the run)."""

    def __init__(self, tmp_path: Path, capacity: float, invalid: tuple[float, ...] = ()) -> None:
        target = Target("python", "http://r", "/m", "m", (("d", "http://d"),), True)
        super().__init__(target, tmp_path, SLO, 0.01, None, None,  # type: ignore[arg-type]
                         lambda line: None)
        self.capacity, self.invalid = capacity, invalid

    def one(self, load: Load) -> RunResult:
        gates = [Gate("canary", "fail", "d re-proven")] if load.rate in self.invalid else []
        res = RunResult(load, [], total=16, ok=16, gates=gates,
                        slo_share=1.0 if load.rate <= self.capacity else 0.5)
        self.runs.append(res)
        return res


def search(s: Designed, race: float | None) -> float | None:
    return s.search(SPACE.rate_low, SPACE.rate_high, SPACE.precision, Load(1, 16, 8, 16),
                    race=race)


def test_a_candidate_that_misses_the_rate_to_beat_costs_one_run(tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=10.0)
    assert search(s, race=12.0) is None
    assert [r.load.rate for r in s.runs] == [12.0]
    o = outcome_of(s.runs, None, SLO, SPACE, race=12.0)
    assert o.status == Result.BELOW and o.above == 12.0 and o.rate is None
    assert goodput(o) == "< 12"
    # the same deployment searched without a race: the whole bisection, and a goodput
    full = Designed(tmp_path, capacity=10.0)
    best = search(full, race=None)
    assert best is not None and best <= 10.0 and len(full.runs) >= 5


def test_a_candidate_that_meets_the_rate_to_beat_is_searched_above_it_only(
        tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=30.0)
    best = search(s, race=12.0)
    rates = [r.load.rate for r in s.runs]
    assert rates[0] == 12.0 and all(r > 12.0 for r in rates[1:])  # 12 is not run again
    assert best is not None and 12.0 < best <= 30.0
    o = outcome_of(s.runs, best, SLO, SPACE, race=12.0)
    assert o.status == Result.MEASURED and o.above is not None and o.above > 30.0
    assert o.above / best <= 1 + SPACE.precision  # as precise as a search from the bottom


def test_an_invalid_race_run_is_invalid_not_below(tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=30.0, invalid=(12.0,))
    assert search(s, race=12.0) is None and len(s.runs) == 1
    o = outcome_of(s.runs, None, SLO, SPACE, race=12.0)
    assert o.status == Result.INVALID and "gate canary" in o.why


def test_a_race_outside_the_range_is_not_run_first(tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=30.0)
    search(s, race=SPACE.rate_low)  # at the bottom: a plain search
    assert s.runs[0].load.rate != SPACE.rate_low


def test_bisection_from_a_rate_known_to_meet_does_not_run_it() -> None:
    tried: list[float] = []

    def meets(rate: float) -> bool:
        tried.append(rate)
        return rate <= 40.0

    good, bad = bisect_rate(12, 64, 0.1, meets, lo_met=True)
    assert 12 not in tried and good is not None and bad is not None
    assert good <= 40.0 < bad
    tried.clear()
    # within the precision already: only the top is tried
    assert bisect_rate(12, 13, 0.1, meets, lo_met=True) == (13, None) and tried == [13]


@pytest.mark.parametrize(("leader", "expected"), [
    ([], None),  # nothing valid to beat: a whole search
    ([Measurement("", "", [], 0, Result.NO_RATE)], None),
    ([Measurement("", "", [], 0, Result.MEASURED, rate=8.0, above=9.0)], 9.0),
    # repeats: the highest of the rates each missed
    ([Measurement("", "", [], 0, Result.MEASURED, rate=8.0, above=9.0),
      Measurement("", "", [], 1, Result.MEASURED, rate=9.5, above=10.4)], 10.4),
    ([Measurement("", "", [], 0, Result.MEASURED, rate=10.0)], 11.0),  # none missed: a precision up
    ([Measurement("", "", [], 0, Result.MEASURED, rate=62.0)], 64.0),  # at most the range's top
    ([Measurement("", "", [], 0, Result.LOWER_BOUND, rate=64.0)], 64.0),  # only a tie is left
    ([Measurement("", "", [], 0, Result.MEASURED, rate=0.5, above=0.9)], None),  # at the bottom
])
def test_the_rate_to_beat(leader: list[Measurement], expected: float | None) -> None:
    got = to_beat(leader, SPACE)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_the_grid_races_each_candidate_at_the_leaders_rate_and_finds_the_best(
        tmp_path: Path) -> None:
    fake = Fake()
    t, first = tuner(tmp_path, fake)
    answer = t.run(first)
    assert answer.wins and dict(answer.best.changes) == {
        "decode.args.cuda-graph-max-bs-decode": 32, "decode.env.NCCL_PROTO": "LL128"}
    outcomes = {o.name: o for o in t.store.outcomes if o.repeat == 0}
    firsts: dict[str, float | None] = {}  # each candidate's first measurement: its race
    for name, race in fake.races:
        if name != "baseline":
            firsts.setdefault(name, race)
    assert firsts and all(race is not None for race in firsts.values())
    races = [race or 0.0 for race in firsts.values()]
    assert races == sorted(races)  # the rate to beat only rises, as leaders come
    for name, race in firsts.items():
        o = outcomes[name]
        if o.status == Result.BELOW:  # lost: one measurement, at the rate to beat
            assert o.above == race and fake.measures.count(name) == 1
        else:  # a new leader meets the rate it was raced at
            assert o.status == Result.MEASURED and (o.rate or 0) >= (race or 0), o
    lost = [o for o in outcomes.values() if o.status == Result.BELOW]
    assert len(lost) >= len(firsts) // 2, [(o.name, o.status) for o in outcomes.values()]


# ---------------------------------------------------------------- repeats: confirm_rate
def confirm(s: Designed, near: tuple[float, float | None], race: float | None = None
            ) -> float | None:
    return s.search(SPACE.rate_low, SPACE.rate_high, SPACE.precision, Load(1, 16, 8, 16),
                    race=race, near=near)


def test_a_repeat_that_measures_as_before_costs_two_runs(tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=10.0)
    assert confirm(s, (9.5, 10.4)) == 9.5
    assert [r.load.rate for r in s.runs] == [9.5, 10.4]
    o = outcome_of(s.runs, 9.5, SLO, SPACE)
    assert o.status == Result.MEASURED and o.rate == 9.5 and o.above == 10.4


def test_a_repeat_that_does_better_is_searched_above_where_it_missed(tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=30.0)
    best = confirm(s, (9.5, 10.4))
    rates = [r.load.rate for r in s.runs]
    assert rates[:2] == [9.5, 10.4] and all(r > 10.4 for r in rates[2:])
    assert best is not None and 10.4 < best <= 30.0
    o = outcome_of(s.runs, best, SLO, SPACE)
    assert o.above is not None and o.above > 30.0 and o.above / best <= 1 + SPACE.precision


def test_a_repeat_that_does_worse_is_searched_below_where_it_met(tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=5.0)
    best = confirm(s, (9.5, 10.4))
    rates = [r.load.rate for r in s.runs]
    assert rates[0] == 9.5 and all(r < 9.5 for r in rates[1:])  # 9.5 is not run again
    assert best is not None and best <= 5.0
    o = outcome_of(s.runs, best, SLO, SPACE)
    assert o.above is not None and o.above > 5.0 and o.above / best <= 1 + SPACE.precision


def test_a_repeat_at_the_top_costs_one_run_and_an_invalid_one_is_invalid(
        tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=100.0)
    assert confirm(s, (64.0, None)) == 64.0 and len(s.runs) == 1
    assert outcome_of(s.runs, 64.0, SLO, SPACE).status == Result.LOWER_BOUND
    bad = Designed(tmp_path, capacity=10.0, invalid=(9.5,))
    assert confirm(bad, (9.5, 10.4)) is None and len(bad.runs) == 1
    assert outcome_of(bad.runs, None, SLO, SPACE).status == Result.INVALID


def test_a_raced_repeat_that_does_worse_stops_at_the_rate_to_beat(tmp_path: Path) -> None:
    """The best's repeats are raced at the baseline's rate to beat: one below it is
    ``below`` after the run where it ended before and the one at the rate to beat."""
    s = Designed(tmp_path, capacity=10.0)
    assert confirm(s, (20.0, 21.5), race=12.0) is None
    assert [r.load.rate for r in s.runs] == [20.0, 12.0]
    o = outcome_of(s.runs, None, SLO, SPACE, race=12.0)
    assert o.status == Result.BELOW and o.above == 12.0
    # between the rate to beat and where it met before: searched there only
    mid = Designed(tmp_path, capacity=15.0)
    best = confirm(mid, (20.0, 21.5), race=12.0)
    rates = [r.load.rate for r in mid.runs]
    assert rates[:2] == [20.0, 12.0] and all(12.0 < r < 20.0 for r in rates[2:])
    assert best is not None and 12.0 <= best <= 15.0


def test_bisection_up_to_a_rate_known_to_miss_does_not_run_it() -> None:
    tried: list[float] = []

    def meets(rate: float) -> bool:
        tried.append(rate)
        return True

    good, bad = bisect_rate(1, 10, 0.1, meets, hi_missed=True)
    assert 10 not in tried and bad == 10 and good is not None and 10 / good <= 1.1


def test_a_raced_repeat_missing_where_it_met_which_is_the_rate_to_beat_costs_one_run(
        tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=10.0)
    assert confirm(s, (12.0, 13.0), race=12.0) is None and len(s.runs) == 1
    assert outcome_of(s.runs, None, SLO, SPACE, race=12.0).status == Result.BELOW


def test_a_repeat_of_a_measurement_that_missed_nothing_above_is_searched_above(
        tmp_path: Path) -> None:
    s = Designed(tmp_path, capacity=10.0)
    best = confirm(s, (9.0, None))
    rates = [r.load.rate for r in s.runs]
    assert rates[0] == 9.0 and all(r > 9.0 for r in rates[1:]) and len(rates) > 1
    assert best is not None and 9.0 <= best <= 10.0
    o = outcome_of(s.runs, best, SLO, SPACE)
    assert o.above is not None and o.above > 10.0
