"""The search of `pdsvc tune` (pdsvc/tune/search.py) against a deployment whose capacity is
a designed function of its config (the fake below): the designed best is found by the grid
and by one lever at a time; a candidate that fails to start is recorded with its reason and
the next one starts from the last good config; the best wins only beyond the spread; an
interrupted search goes back to the last good config and a re-run measures nothing twice;
the bounds stop it. The real deployment (apply, bench_serving, systemd) is
tests/test_e2e_tune.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pdsvc.render.hosts_bundle import render_for
from pdsvc.topology import load_topology_file
from pdsvc.tune.check import Checker
from pdsvc.tune.search import Interrupted, Limits, StuckError, Switched, Tuner
from pdsvc.tune.space import DEFAULT_REPEATS as REPEATS
from pdsvc.tune.space import candidates, parse_space
from pdsvc.tune.store import Measurement, Result, Store

TOPO = REPO / "etc/seed-host.topology.json"
CONFIG = (REPO / "tests/cases/seed-2p2d-explicit.yaml").read_text()
BS = "decode.args.cuda-graph-max-bs-decode"
PROTO = "decode.env.NCCL_PROTO"
BACKEND = "decode.args.moe-runner-backend"
SPACE = f"""\
slo: {{ttft_ms: 2000, itl_ms: 50}}
rates: {{low: 1, high: 64, precision: 0.1}}
search: SEARCH
levers:
  {BS}: [8, 16, 32, 64]
  {PROTO}: [null, LL128, Simple]
  {BACKEND}: [null, flashinfer_trtllm]
"""


class Fake:
    """A deployment whose goodput is designed: slots × 0.5 req/s up to 32 slots (more break
    the ITL bound: no rate meets the SLO), × 1.25 with NCCL_PROTO=LL128, × 0.8 with Simple;
    the flashinfer_trtllm backend refuses to start. ``noise``: repeat r of a candidate
    measures × (1 + noise × (1 - r)). ``interrupt_at``: the measure call (1-based) that
    raises KeyboardInterrupt, as Ctrl-C would; ``invalid_at``: the measure calls that come
    back invalid (a gate failed: a transient), ``capped``: the goodput at which the SLO
    search meets the range's top (lower-bound)."""

    def __init__(self, noise: float = 0.0, interrupt_at: int | None = None,
                 invalid_at: tuple[int, ...] = (), capped: float = 1e9,
                 outage_levers: tuple[str, ...] = ()) -> None:
        self.noise, self.interrupt_at = noise, interrupt_at
        self.invalid_at, self.capped = invalid_at, capped
        self.running = "baseline.yaml"  # the file whose config runs (the baseline's: the
        # user's config, copied)
        #: a switch that changes one of these levers stops serving (1P1D: the one decode
        #: restarts): refused unless allowed; each one allowed is in ``outages``
        self.outage_levers = outage_levers
        self.outages: list[str] = []
        self.doc = yaml.safe_load(CONFIG)  # what runs now
        self.switches: list[str] = []
        self.measures: list[str] = []
        self.repeat: dict[str, int] = {}
        self.races: list[tuple[str, float | None]] = []  # each measure: (name, rate to beat)
        self.nears: list[tuple[str, tuple | None]] = []  # each measure: (name, where it starts)

    def runs(self, config: Path) -> bool:
        return config.name == self.running

    @staticmethod
    def lever(doc: dict, path: str) -> object:
        """A lever's value in a config (decode.args.X, decode.env.X: the first decode's)."""
        _, section, key = path.split(".", 2)
        return (doc["decode"][0].get(section) or {}).get(key)

    def switch(self, name: str, config: Path, say, *, allow_outage: bool) -> Switched:
        self.switches.append(name)
        doc = yaml.safe_load(config.read_text())
        stops = [p for p in self.outage_levers if self.lever(doc, p) != self.lever(self.doc, p)]
        if stops and not allow_outage:  # refused before anything changes, as apply's plan
            return Switched(False, 0.0, f"serving would stop while dsv4-decode-0 restarts: "
                            f"{stops[0]} changes (--allow-outage measures it)", outage=True)
        if stops:
            self.outages.append(name)
        self.doc = doc
        backend = (doc["decode"][0].get("args") or {}).get("moe-runner-backend")
        if backend == "flashinfer_trtllm":
            self.running = "broken"
            return Switched(False, 2.0, "dsv4-decode-0.service: decode exited with status 1: "
                            "ValueError: flashinfer_trtllm does not support FP4 experts")
        self.running = config.name
        return Switched(True, 1.0)

    def goodput(self, config: Path) -> float | None:
        doc = yaml.safe_load(config.read_text())
        d = doc["decode"][0]
        slots = (d.get("args") or {}).get("cuda-graph-max-bs-decode", 16)
        if slots > 32:
            return None
        factor = {"LL128": 1.25, "Simple": 0.8}.get((d.get("env") or {}).get("NCCL_PROTO"), 1)
        return slots * 0.5 * factor

    def measure(self, name: str, config: Path, bench_dir: Path, say, *,
                race: float | None = None, near: tuple | None = None) -> Measurement:
        assert self.running == config.name, (self.running, config.name)  # measures what runs
        self.measures.append(name)
        self.races.append((name, race))
        self.nears.append((name, near))
        if self.interrupt_at == len(self.measures):
            raise KeyboardInterrupt
        if len(self.measures) in self.invalid_at:
            return Measurement("", "", [], 0, Result.INVALID,
                           why="run at 32 req/s: gate canary: decode-0 re-proven during the run")
        r = self.repeat.get(name, 0)
        self.repeat[name] = r + 1
        designed = self.goodput(config)
        rate = None if designed is None else designed * (1 + self.noise * (1 - r))
        if race is not None and (rate is None or rate < race):  # one run, at the rate to beat
            return Measurement("", "", [], 0, Result.BELOW, why=f"missed the SLO at {race:g} "
                           "req/s, the rate to beat", above=race)
        if rate is None:
            return Measurement("", "", [], 0, "no-rate", why="no rate in 1..64 req/s meets the SLO")
        if rate >= self.capped:
            return Measurement("", "", [], 0, Result.LOWER_BOUND, rate=self.capped)
        return Measurement("", "", [], 0, "measured", rate=rate)


def tuner(tmp_path: Path, fake: Fake, search: str = "grid", limits: Limits | None = None,
          space_text: str | None = None) -> tuple[Tuner, list]:
    space = parse_space((space_text or SPACE).replace("SEARCH", search), "tune.yaml")
    checker = Checker(space, CONFIG, "config.yaml", load_topology_file(TOPO),
                      lambda p: {f.path: f.content for f in render_for(p, "pdsvc tune")})
    first = [checker.check(c) for c in candidates(space, checker.base_data)]
    said: list[str] = []
    store = Store(tmp_path / "results", {"space": "tune.yaml"})
    return Tuner(space, checker, fake, store, said.append, limits or Limits()), first


def test_the_grid_finds_the_designed_best_and_ends_on_it(tmp_path: Path) -> None:
    fake = Fake()
    t, first = tuner(tmp_path, fake)
    answer = t.run(first)
    assert answer.wins
    assert dict(answer.best.changes) == {BS: 32, PROTO: "LL128"}
    assert [o.rate for o in answer.best_outcomes] == [20.0] * REPEATS
    assert fake.running == f"{answer.best.name}.yaml"  # the deployment runs the best
    # the baseline's repeats, and once more after the search, right before the best's
    assert fake.measures.count("baseline") == REPEATS + 1
    assert fake.measures[-REPEATS:] == ["baseline"] + [answer.best.name] * (REPEATS - 1)
    assert fake.measures.count(answer.best.name) == REPEATS
    # every other candidate measured once: 24 combinations (the config sets none of the
    # levers), the failing backend's 12 never measured (their switch failed)
    assert len(fake.measures) == REPEATS + 12 + 1 + (REPEATS - 1)
    once = {n for n in fake.measures if n not in ("baseline", answer.best.name)}
    assert all(fake.measures.count(n) == 1 for n in once)
    assert "grid: every one of the" in answer.how


def test_a_failed_candidate_is_recorded_and_the_next_starts_from_the_last_good(
        tmp_path: Path) -> None:
    fake = Fake()
    t, first = tuner(tmp_path, fake, "one-at-a-time")
    answer = t.run(first)
    failed = [o for _, o, _ in answer.rows if o is not None and o.status == "failed-start"]
    assert failed and all("ValueError: flashinfer_trtllm does not support FP4" in o.why
                          for o in failed)
    # after each failed switch, the next switch is back to the config that ran before it
    served = [c.name for c, o, _ in answer.rows if o and o.counted]  # it served: measured
    backs = 0
    for i, name in enumerate(fake.switches[:-1]):
        if any(o.name == name for o in failed):
            before = fake.switches[i - 1] if i else "baseline"
            assert fake.switches[i + 1] == before and before in served, fake.switches
            backs += 1
    assert backs == len(failed) == 3  # the backend from each round's current best
    assert fake.running != "broken"
    # coordinate descent: 32 slots (round 1), then LL128 from there (round 2)
    assert dict(answer.best.changes) == {BS: 32, PROTO: "LL128"}
    assert answer.how.startswith("one at a time: 3 round(s); round 3 gained nothing")


def test_the_best_wins_only_beyond_the_spread(tmp_path: Path) -> None:
    """A designed gain of 25 % (LL128: 10 req/s against the baseline's 8) with repeats
    spread ± 30 % is not beyond the spread (the first measurement of each is the highest);
    spread ± 5 %, it is."""
    space = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {PROTO}: [LL128]\n"
    fake = Fake(noise=0.3)
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    assert not answer.wins
    assert answer.verdict.startswith("no candidate beats the current config: the best,")
    # the fact that decided it, with both figures: the best's repeats are raced at the
    # baseline's rate to beat (10.4 a precision up), and its second (10 × 1.0) missed it
    assert ("missed the SLO at 11.4 req/s, the baseline's rate to beat, in repeat 2 (its "
            "goodputs: 13 req/s; the baseline's: 5.6..10.4 req/s)") in answer.verdict, \
        answer.verdict
    # each of its measurements raced there: the first in the grid, the repeats for the win
    assert [x for x in fake.races if x[0] == "c1"] == [("c1", pytest.approx(11.44))] * REPEATS
    assert fake.running == "baseline.yaml"  # back on the current config
    fake = Fake(noise=0.05)
    t, first = tuner(tmp_path / "again", fake, space_text=space)
    answer = t.run(first)
    assert answer.wins and dict(answer.best.changes) == {PROTO: "LL128"}


def test_keep_current_ends_on_the_baseline(tmp_path: Path) -> None:
    fake = Fake()
    space = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {BS}: [32]\n"
    t, first = tuner(tmp_path, fake, space_text=space, limits=Limits(keep_current=True))
    answer = t.run(first)
    assert answer.wins and answer.running is not None and not answer.running.changes
    assert fake.running == "baseline.yaml"


def test_interrupted_goes_back_and_a_rerun_measures_nothing_twice(tmp_path: Path) -> None:
    fake = Fake(interrupt_at=REPEATS + 3)  # the third candidate, once two were measured
    t, first = tuner(tmp_path, fake)
    with pytest.raises(Interrupted) as e:
        t.run(first)
    assert e.value.exit_code == 130
    done = list(fake.measures[:-1])
    good = done[-1]
    assert fake.running == f"{good}.yaml"  # the last good config runs
    assert "run the same command again" in str(e.value)
    again = Fake()
    again.running = fake.running
    t2, first2 = tuner(tmp_path, again)
    answer = t2.run(first2)
    # nothing measured before is measured again (the best's repeats aside); the baseline
    # once, after the search (it never came that far before)
    assert not set(done) & set(again.measures) - {answer.best.name, "baseline"}
    assert again.measures.count("baseline") == 1
    assert answer.wins and dict(answer.best.changes) == {BS: 32, PROTO: "LL128"}


def test_the_bounds_stop_the_search(tmp_path: Path) -> None:
    fake = Fake()
    t, first = tuner(tmp_path, fake, limits=Limits(max_candidates=3))
    answer = t.run(first)
    assert "stopped at" in answer.how and "--max-candidates 3" in answer.how
    assert len({n for n in fake.switches if n != "baseline"}) == 3  # c2 fails to start


def test_a_baseline_that_cannot_be_measured_stops_everything(tmp_path: Path) -> None:
    fake = Fake()
    fake.measure = lambda *a, **k: Measurement(  # type: ignore[method-assign]
        "", "", [], 0, "invalid", why="run at 8 req/s: gate kv-transfer: 3 transfers failed")
    t, first = tuner(tmp_path, fake)
    with pytest.raises(StuckError, match="the baseline cannot be measured"):
        t.run(first)
    assert fake.switches == []


def test_the_answer_as_a_table_json_and_the_best_config(tmp_path: Path) -> None:
    from pdsvc.tune import report

    fake = Fake()
    space = (f"slo: {{ttft_ms: 1, itl_ms: 1}}\nsearch: one-at-a-time\nlevers:\n  {BS}: [32, 64]"
             f"\n  {BACKEND}: [flashinfer_trtllm]\n")
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    measured: dict[str, list[Measurement]] = {}
    for o in t.store.outcomes:
        measured.setdefault(o.name, []).append(o)
    lines = report.table(answer, measured)
    assert lines[0].split()[:3] == ["name", "changes", "goodput"]
    best = next(x for x in lines if x.startswith(f"{answer.best.name} *"))
    # repeats start where the first ended: they confirm it, and are said so (no spread)
    assert "16, confirmed by 2 repeats" in best and best.endswith("measured"), best
    assert "each of its" not in answer.verdict and "confirmed by 2 repeats" in answer.verdict
    # 64 slots break the ITL bound: it lost the race at the leader's (32 slots) 16 req/s and
    # a tenth (the fake says no rate above its goodput that missed)
    assert any("< 17.6" in x and "below: missed the SLO at 17.6 req/s, the rate to beat" in x
               for x in lines), "\n".join(lines)
    assert any("failed-start: dsv4-decode-0.service: decode exited with status 1" in x
               for x in lines)
    doc = report.document(t.space, answer, measured, results=tmp_path, best_config=None,
                          plot_path=None)
    assert doc["format"] == "pdsvc-tune/2" and doc["wins"]
    assert doc["best"] == {
        "name": answer.best.name, "changes": {BS: 32},
        "goodput": [{"repeat": r, "rate": 16.0, "bound": "exact", "missed_at": None,
                     "confirms_first": r > 0} for r in range(REPEATS)],
        "said": "16 req/s, confirmed by 2 repeats"}
    text = report.best_config_text(CONFIG, answer, t.space, space_path=Path("tune.yaml"),
                                   config_path=Path("config.yaml"), host="gpu-1",
                                   best_text=t.checker.text_of(answer.best))
    assert text.startswith("# Written by pdsvc tune on gpu-1, ")
    assert "# Baseline goodput: 8 req/s, confirmed by 2 repeats (3 measurements)." in text
    assert yaml.safe_load(text)["decode"][0]["args"]["cuda-graph-max-bs-decode"] == 32
    # what was measured is on disk, whole, and read back as it was
    again = Store(tmp_path / "results", {})
    assert [o.to_dict() for o in again.outcomes] == [o.to_dict() for o in t.store.outcomes]


def test_results_this_pdsvc_cannot_read_are_refused_not_overwritten(tmp_path: Path) -> None:
    from pdsvc.errors import OutputError

    (tmp_path / "results.json").write_text('{"format": "pdsvc-tune-results/9"}')
    with pytest.raises(OutputError, match="not results this pdsvc reads"):
        Store(tmp_path, {})
    assert "results/9" in (tmp_path / "results.json").read_text()


def test_an_invalid_measurement_is_measured_once_more_and_then_counts(tmp_path: Path) -> None:
    """One transient (a gate failed in one run) is not a verdict: measured again once the
    deployment is steady; the second counts, and the first's reason is kept."""
    space = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {BS}: [32]\n"
    fake = Fake(invalid_at=(REPEATS + 1,))  # c1's first measurement
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    assert answer.wins and dict(answer.best.changes) == {BS: 32}
    c1 = t.store.of(t.store.outcomes[-1].key)
    assert [o.status for o in c1] == ["measured"] * REPEATS
    assert "decode-0 re-proven during the run" in c1[0].first_invalid
    assert fake.measures.count("c1") == REPEATS + 1  # the transient cost one measurement
    # never went back for a transient: only to measure the baseline again after the search
    assert fake.switches == ["c1", "baseline", "c1"]


def test_invalid_twice_is_written_off_and_the_verdict_names_the_repeat(tmp_path: Path) -> None:
    """The best's second repeat is invalid twice: it does not win, and the verdict says so,
    not something else (the spread)."""
    space = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {BS}: [32]\n"
    # c1's repeat 2, and its re-measure (after c1's first and the baseline's once more)
    fake = Fake(invalid_at=(REPEATS + 3, REPEATS + 4))
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    assert not answer.wins
    assert ("has 2 valid measurement(s) of 3: repeat 2 was invalid: invalid twice: run at 32 "
            "req/s: gate canary") in answer.verdict, answer.verdict
    assert fake.running == "baseline.yaml"  # written off: back on the current config


def test_the_range_top_is_a_lower_bound_said_with_a_sign(tmp_path: Path) -> None:
    from pdsvc.tune import report

    space = (f"slo: {{ttft_ms: 1, itl_ms: 1}}\nrepeats: 2\nsearch: grid\n"
             f"levers:\n  {BS}: [32, 64]\n")
    fake = Fake(capped=12.0)  # 32 slots: 16 req/s designed, the range's top met at 12
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    assert fake.measures.count("baseline") == 2 + 1  # the space's repeats, once more
    assert answer.wins and answer.best_outcomes[0].status == Result.LOWER_BOUND
    assert "meets the SLO at ≥ 12 req/s, confirmed by 1 repeat" in answer.verdict, \
        answer.verdict
    measured: dict[str, list[Measurement]] = {}
    for o in t.store.outcomes:
        measured.setdefault(o.name, []).append(o)
    assert any(x.startswith(f"{answer.best.name} *") and "≥ 12" in x
               for x in report.table(answer, measured))


def test_a_gain_within_the_precision_is_not_a_win(tmp_path: Path) -> None:
    """The baseline met 8 req/s and missed at 9.5 (its goodput lies in 8..9.5); a candidate
    measured at 9 each time is above 8 but below a rate the baseline missed: not apart."""
    space = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {PROTO}: [LL128]\n"
    fake = Fake()
    real = fake.measure

    def measure(name, config, bench_dir, say, race=None, near=None):  # noqa: ANN001, ANN202
        o = real(name, config, bench_dir, say, race=race, near=near)
        if name == "baseline":
            return Measurement("", "", [], 0, Result.MEASURED, rate=8.0, above=9.5)
        return Measurement("", "", [], 0, Result.MEASURED, rate=9.0, above=10.0) if o.rate else o

    fake.measure = measure  # type: ignore[method-assign]
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    assert not answer.wins
    assert "its lowest, 9, is below 9.5, a rate the baseline missed" in answer.verdict
    assert fake.running == "baseline.yaml"


@pytest.mark.parametrize(("again", "said"), [
    (Measurement("", "", [], 0, Result.MEASURED, rate=12.0, above=13.0),
     "met the SLO at 12 req/s, above where each measurement at the start missed it (at 9.5, "
     "9.5, 9.5): the host got faster"),
    (Measurement("", "", [], 0, Result.MEASURED, rate=4.0, above=5.0),
     "missed the SLO at 5 req/s, below where each measurement at the start met it (up to 8, "
     "8, 8): the host got slower"),
    (Measurement("", "", [], 0, Result.INVALID, why="run at 8 req/s: gate canary: failing"),
     "was invalid (invalid twice: run at 8 req/s: gate canary: failing; then run at 8 "
     "req/s: gate canary: failing), so a drift cannot be ruled out"),
    (Measurement("", "", [], 0, Result.MEASURED, rate=9.0, above=10.0), None),  # within: a win
    # touching: met where the start missed once (9.5), missed where it met (8): resolution
    (Measurement("", "", [], 0, Result.MEASURED, rate=9.5, above=11.0), None),
    (Measurement("", "", [], 0, Result.MEASURED, rate=7.0, above=8.0), None),
    (Measurement("", "", [], 0, Result.NO_RATE, above=1.0), "missed the SLO at 1 req/s, below"),
])
def test_the_baseline_measured_again_after_the_search_must_not_have_moved(
        tmp_path: Path, again: Measurement, said: str | None) -> None:
    """The baseline is measured once more after the search, before the best's repeats: an
    interval apart from all of the start's (beyond the search's precision) or no valid
    measurement blocks the win, the verdict says which, and the best's repeats are not run."""
    space = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {BS}: [32]\n"
    fake = Fake()
    real = fake.measure

    def measure(name, config, bench_dir, say, race=None, near=None):  # noqa: ANN001, ANN202
        o = real(name, config, bench_dir, say, race=race, near=near)
        if name == "baseline":  # 8..9.5 at the start, then ``again``
            n = fake.measures.count("baseline")
            return Measurement("", "", [], 0, Result.MEASURED, rate=8.0, above=9.5) \
                if n <= REPEATS else again
        return o

    fake.measure = measure  # type: ignore[method-assign]
    t, first = tuner(tmp_path, fake, space_text=space)
    answer = t.run(first)
    if said is None:
        assert answer.wins and fake.measures.count("c1") == REPEATS
        return
    assert not answer.wins and answer.verdict.startswith(
        f"no claimed win: the baseline, measured again after the search, {said}"), \
        answer.verdict
    assert "; the best so far, c1 (decode.args.cuda-graph-max-bs-decode=32), measured 16 " \
        "req/s" in answer.verdict
    assert "another --results directory" in answer.verdict
    assert fake.measures.count("c1") == 1  # no repeats: they could not make it a win
    assert fake.running == "baseline.yaml"


def test_a_baseline_below_the_range_at_the_start_and_at_the_end_has_not_drifted() -> None:
    """A busy machine: the baseline met no rate at the start (no-rate, missed at the range's
    bottom, 4); after the search it misses 4 again, or meets 4 and misses 24: the intervals
    touch, which is the search's resolution, not a drift (seen on CI with the e2e space)."""
    from pdsvc.tune.search import drifted

    s = parse_space("slo: {ttft_ms: 1, itl_ms: 1}\nrates: {low: 4, high: 144}\n"
                    "levers: {decode.args.x: [1]}\n", "t.yaml")
    start = [Measurement("", "", [], 0, Result.NO_RATE, above=4.0)]
    for again in (Measurement("", "", [], 1, Result.NO_RATE, above=4.0),
                  Measurement("", "", [], 1, Result.MEASURED, rate=4.0, above=24.0)):
        assert drifted(start, again, s) == "", again
    far = Measurement("", "", [], 1, Result.MEASURED, rate=24.0, above=144.0)
    assert drifted(start, far, s).endswith("the host got faster")


def test_repeats_start_where_the_configs_first_measurement_ended(tmp_path: Path) -> None:
    """The baseline's repeats, the baseline once more after the search and the best's repeats
    each start at the rate the config's first measurement met (confirm_rate); every first
    measurement is a search of its own."""
    fake = Fake()
    t, first = tuner(tmp_path, fake)
    answer = t.run(first)
    base = [near for name, near in fake.nears if name == "baseline"]
    assert base == [None] + [(8.0, None)] * REPEATS  # 16 slots: 8 req/s
    best = [near for name, near in fake.nears if name == answer.best.name]
    assert best == [None] + [(20.0, None)] * (REPEATS - 1)
    others = {name for name, _ in fake.nears} - {"baseline", answer.best.name}
    assert others and all(near is None for name, near in fake.nears if name in others)


def test_a_repeat_does_not_start_from_a_first_measurement_without_a_rate(
        tmp_path: Path) -> None:
    """A first measurement invalid twice has no end to start from: its repeat (here the
    baseline's) is a whole search."""
    fake = Fake(invalid_at=(1, 2))  # the baseline's first measurement, and its second try
    t, first = tuner(tmp_path, fake)
    t.run(first)
    # the first (twice), then each repeat: all whole searches
    assert fake.nears[:REPEATS + 1] == [("baseline", None)] * (REPEATS + 1)


# ---------------------------------------------------------------------- no outage not allowed
# A deployment where a change of NCCL_PROTO stops serving (its switch is refused unless
# allowed: Fake.outage_levers); the checker's own verdict, from the rendered bundles, says
# none does (2P2D rolls): only the switch itself can tell. Without --allow-outage no path of
# tune may take one: a refused switch changes nothing, and tune knows what runs.


def test_a_refused_switch_changes_nothing_and_no_way_back_stops_serving(tmp_path: Path) -> None:
    fake = Fake(outage_levers=(PROTO,))
    t, first = tuner(tmp_path, fake)
    answer = t.run(first)
    assert fake.outages == []
    refused = [c.name for c, o, _ in answer.rows if o is not None and o.status == "outage"]
    assert refused and all(fake.switches.count(n) == 1 for n in refused)
    # after each refusal, the deployment ran what it ran before: no switch back to it
    for i, name in enumerate(fake.switches[:-1]):
        if name in refused:
            ran = [n for n in fake.switches[:i] if n not in refused][-1:] or ["baseline"]
            assert fake.switches[i + 1] != ran[0], (name, fake.switches)
    assert dict(answer.best.changes) == {BS: 32}  # the best among what it could measure
    allowed = Fake(outage_levers=(PROTO,))
    t, first = tuner(tmp_path / "allowed", allowed, limits=Limits(allow_outage=True))
    assert dict(t.run(first).best.changes) == {BS: 32, PROTO: "LL128"}
    assert allowed.outages  # taken, as allowed


def test_a_deployment_off_its_config_is_not_switched_to_it_by_an_outage(
        tmp_path: Path) -> None:
    """The first switch, to the config itself (the deployment runs another): refused, tune
    ends before measuring anything, and nothing was changed: not the way back either."""
    fake = Fake(outage_levers=(PROTO,))
    fake.running, fake.doc["decode"][0]["env"] = "other.yaml", {"NCCL_PROTO": "Simple"}
    t, first = tuner(tmp_path, fake)
    with pytest.raises(StuckError, match="does not run .*, and applying it serving would "
                                         "stop while dsv4-decode-0 restarts.*nothing was "
                                         "changed; apply it first"):
        t.run(first)
    assert fake.outages == [] and fake.running == "other.yaml" and fake.measures == []
    assert fake.switches == ["baseline"]


def test_an_interrupt_and_a_resume_stop_serving_nowhere(tmp_path: Path) -> None:
    fake = Fake(outage_levers=(PROTO,), interrupt_at=REPEATS + 2)
    t, first = tuner(tmp_path, fake)
    with pytest.raises(Interrupted):
        t.run(first)
    assert fake.outages == [] and fake.running != "broken"  # back on the last good config
    fake.interrupt_at = None
    t, first = tuner(tmp_path, fake)  # the same results: a resume
    t.run(first)
    assert fake.outages == []
    # a resume whose deployment was left on a config a refused outage away from its own
    fake.running, fake.doc["decode"][0]["env"] = "c9.yaml", {"NCCL_PROTO": "LL128"}
    t, first = tuner(tmp_path, fake)
    with pytest.raises(StuckError, match="nothing was changed"):
        t.run(first)
    assert fake.outages == [] and fake.running == "c9.yaml"


def test_a_way_back_that_would_stop_serving_is_not_taken_without_allow_outage(
        tmp_path: Path) -> None:
    """A candidate's switch fails half way (its engine does not start) and leaves a config
    from which the way back would stop serving: tune says so and stops, and takes no
    outage."""
    fake = Fake(outage_levers=(PROTO,))
    original = fake.switch

    def switch(name: str, config: Path, say, *, allow_outage: bool) -> Switched:
        sw = original(name, config, say, allow_outage=allow_outage)
        if sw.ok and name != "baseline" and not fake.outages:  # the first candidate fails
            fake.doc = {**fake.doc, "decode": [{"env": {"NCCL_PROTO": "Simple"}}]}
            fake.running = "broken"
            return Switched(False, 1.0, "dsv4-decode-0.service: exited with status 1")
        return sw

    fake.switch = switch  # type: ignore[method-assign]
    t, first = tuner(tmp_path, fake)
    with pytest.raises(StuckError, match="going back to baseline: serving would stop while "
                                         "dsv4-decode-0 restarts.*not taken without "
                                         "--allow-outage"):
        t.run(first)
    assert fake.outages == []
