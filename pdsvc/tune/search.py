"""The search of `pdsvc tune`: the baseline measured, then each candidate switched to and
measured, the best measured again, and the deployment left on the answer.

* **grid**: every candidate of the space, in order.
* **one-at-a-time**: a round tries each lever's other values from the current best (the
  other levers as they are); the round's best becomes the current best when it gains more
  than the search's precision (what `pdsvc bench --slo` can tell apart); rounds go on until
  one gains nothing.
* **Racing**: a candidate is measured first at the rate to beat (to_beat: the lowest rate
  the leader missed); missing it there, it is ``below`` after one run; meeting it, it is
  searched above it only, and leads.
* **A candidate that fails** to start (its switch fails: the engine gives up, crash-loops,
  its JIT fails) is recorded ``failed-start`` with the engine's own words, never retried, and
  the deployment goes back to the last good config before the next.
* **A transient is not a verdict**: a measurement whose run failed a gate (``invalid``) is
  measured once more, once the pairs are proven again; only when that one is invalid too is
  the candidate written off (both reasons said) and the deployment goes back.
* **Drift**: when a candidate measured above the baseline, the baseline is measured once
  more after the search; an interval apart from all of its first ones (the host got faster
  or slower), or no valid measurement, blocks the win (drifted), and the best's repeats
  are not run.
* **Repeats start where the first ended**: a config's repeats (and the baseline's once more
  after the search) run first at the rate its first measurement met and at the one it missed
  (bench/search.confirm_rate): 2 runs, not a whole search, when nothing moved; a config that
  does better or worse now is searched on from there, so nothing is taken on trust.
* **Noise**: the baseline is measured ``space.repeats`` times, and so is the best once found;
  only valid measurements count (store.COUNTED); the best wins only when it has every one of
  its repeats and its lowest beats the baseline's highest. Else the answer is the current
  config, and the verdict names the fact that decided it.
* **--profile** (profiled.py): the baseline's decode captured once it is measured, the
  best's once the deployment ends on it.
* **Interrupted** (KeyboardInterrupt: Ctrl-C, and the command turns SIGTERM and SIGHUP into
  one): the running measurement is dropped, the deployment goes back to the last good config,
  and Interrupted is raised. Every finished measurement is in the store: a re-run measures
  only what is missing.

The deployment is anything with ``switch`` and ``measure`` (live.py's is the real one:
`pdsvc apply` and the SLO search of `pdsvc bench`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pdsvc.bench.search import Near
from pdsvc.errors import PdsvcError

from .check import Checked, Checker
from .profiled import Profiled, Profiler, take
from .space import Candidate, Space, Value, current, is_baseline
from .store import BASELINE_KEY, RATED, Measurement, Result, Store, changes_key, write_atomic
from .verdict import drifted, goodput, judge, mean_rate, rates, span, to_beat

Progress = Callable[[str], None]
#: what runs when the deployment does not run the config's own bundle (tune knows it, but it
#: is none of the space's candidates)
UNLISTED = "(a config that is not the space's)"


@dataclass(frozen=True)
class Switched:
    ok: bool
    seconds: float
    why: str = ""  # not ok: what says why (the engine's last error line, the failed step)
    outage: bool = False  # not switched: it would stop serving (and that was not allowed)


class Deployment(Protocol):
    def switch(self, name: str, config: Path, say: Progress, *, allow_outage: bool) -> Switched:
        """Make the running deployment run ``config`` (`pdsvc apply`)."""
        ...

    def runs(self, config: Path) -> bool:
        """Whether the deployment runs ``config`` now (nothing to apply)."""
        ...

    def measure(self, name: str, config: Path, bench_dir: Path, say: Progress, *,
                race: float | None = None, near: Near | None = None) -> Measurement:
        """Once its pairs are proven, the SLO search (first at ``race``, the rate to beat,
        when given: missed there, the outcome is ``below``; started at ``near``, where the
        config's first measurement ended, when given: a repeat); key, name, changes, repeat
        are the caller's to fill."""
        ...


class Interrupted(PdsvcError):
    """Stopped by a signal; the deployment is back on the last good config."""

    exit_code = 130


class StuckError(PdsvcError):
    """The way back to the last good config failed: the deployment runs something else."""


@dataclass(frozen=True)
class Limits:
    allow_outage: bool = False
    max_candidates: int | None = None  # candidates besides the baseline
    max_time: float | None = None  # seconds, from the start of this run
    keep_current: bool = False  # end on the baseline whatever the answer


@dataclass
class Answer:
    baseline: list[Measurement]
    best: Candidate  # the baseline when nothing beats it
    best_outcomes: list[Measurement]
    wins: bool
    verdict: str  # the answer in one sentence
    how: str  # which search ran and why it stopped
    rows: list[tuple[Candidate, Measurement | None, str]] = field(default_factory=list)
    running: Candidate | None = None  # what the deployment runs at the end
    profiles: list[Profiled] = field(default_factory=list)  # --profile: the baseline, the best
    unprofiled: str = ""  # --profile: why the best was not captured


class Tuner:
    def __init__(self, space: Space, checker: Checker, deployment: Deployment, store: Store,
                 say: Progress, limits: Limits,
                 clock: Callable[[], float] = time.monotonic,
                 profiler: Profiler | None = None) -> None:
        self.space, self.checker, self.deployment, self.store = space, checker, deployment, store
        self.say, self.limits, self.clock, self.profiler = say, limits, clock, profiler
        self.profiles: list[Profiled] = []  # tune/profiled.py
        self.good = Candidate("baseline")  # the last config that served well
        self.running: str | None = None  # the key the deployment runs; None: not known
        self.rows: dict[str, tuple[Candidate, Measurement | None, str]] = {}
        self.started = clock()
        self.tried = 0  # candidates besides the baseline, measured or taken from the store
        self.planned = 0  # of this round (or the grid): for "candidate i of n" and the ETA
        self.names: dict[str, str] = {}

    # ------------------------------------------------------------------ the whole search
    def run(self, first: list[Checked]) -> Answer:
        try:
            return self._run(first)
        except KeyboardInterrupt:
            self.say(f"tune: interrupted; going back to the last good config "
                     f"({self.good.name})")
            self._go_back()
            raise Interrupted(f"interrupted; the deployment runs the last good config, "
                              f"{self.good.name} ({self.good.describe()}); run the same "
                              "command again to measure what is missing") from None

    def _run(self, first: list[Checked]) -> Answer:
        base = first[0].candidate
        path = self.store.config_path(base.name)
        write_atomic(path, self.checker.text_of(base))
        if self.deployment.runs(path):
            self.running = BASELINE_KEY
        else:
            self._apply_first(base, path)
        for c in first:
            self.names[changes_key(c.candidate.changes)] = c.candidate.name
        self.planned = self.space.repeats
        baseline = [self._measure(Checked(base, "baseline", "", (), 0.0), r)
                    for r in range(self.space.repeats)]
        if not rates(baseline):
            raise StuckError(f"the baseline cannot be measured: {baseline[-1].why}",
                             hint="pdsvc bench --slo shows each run and its gates")
        self._row(base, baseline[0], "")
        self._profile(base)
        how = self._grid(first[1:]) if self.space.strategy == "grid" else self._rounds(first)
        return self._finish(base, baseline, how)

    def _apply_first(self, base: Candidate, path: Path) -> None:
        """The deployment does not run the config: switch to it before anything, under the
        same rule as every switch (an outage only with --allow-outage). Refused or failed,
        tune ends there: a refused switch changed nothing, and a baseline that does not run
        cannot be measured."""
        self.say("tune: the deployment does not run the config yet: applying it first")
        self.running = UNLISTED
        sw = self._switch(base, path, allow_outage=self.limits.allow_outage)
        if sw.outage:
            raise StuckError(f"the deployment does not run {self.checker.source}, and applying "
                             f"it {sw.why.removesuffix(' (--allow-outage measures it)')}; "
                             "nothing was changed",
                             hint="apply it first (sudo pdsvc apply), or pass --allow-outage")
        if not sw.ok:
            raise StuckError(f"applying {self.checker.source} failed: {sw.why}",
                             hint="see `pdsvc status`; `pdsvc apply --rollback` goes back")

    def _grid(self, checked: list[Checked]) -> str:
        wanted = [c for c in checked if self._wanted(c)]
        self.planned = len(wanted)
        leader = self._baseline()
        for i, c in enumerate(wanted, 1):
            if self._bounded(c, i):
                return f"grid: stopped at {c.candidate.name} of {len(wanted)} ({self._bound})"
            o = self._measure(c, 0, i, race=to_beat(leader, self.space))
            if o.status in RATED and (o.rate or 0) > max(rates(leader), default=0.0):
                leader = [o]
        return f"grid: every one of the {len(wanted)} candidates to measure"

    def _rounds(self, first: list[Checked]) -> str:
        current = first[0].candidate
        current_rate = mean_rate(self._baseline())
        for round_no in range(1, len(self.space.levers) + 2):
            checked = first[1:] if round_no == 1 else [
                self.checker.check(c) for c in self._neighbours(current)]
            wanted = [c for c in checked if self._wanted(c)]
            self.planned = len(wanted)
            best, best_rate = current, current_rate
            leader = self.store.of(changes_key(current.changes))
            for i, c in enumerate(wanted, 1):
                if self._bounded(c, i):
                    return (f"one at a time: stopped in round {round_no} at "
                            f"{c.candidate.name} ({self._bound})")
                o = self._measure(c, 0, i, race=to_beat(leader, self.space))
                if o.counted and (o.rate or 0) > best_rate:
                    best, best_rate, leader = c.candidate, o.rate or 0.0, [o]
            if best_rate <= current_rate * (1 + self.space.precision):
                return (f"one at a time: {round_no} round(s); round {round_no} gained "
                        f"nothing beyond the precision ({self.space.precision:.0%}) over "
                        f"{current.name}")
            self.say(f"tune: round {round_no}: {best.name} ({best.describe()}) gains "
                     f"{best_rate / max(current_rate, 1e-9) - 1:.0%}; the next round starts "
                     "from it")
            current, current_rate = best, best_rate
        return "one at a time: stopped after as many rounds as levers"

    def _baseline(self) -> list[Measurement]:
        """The baseline's measurements at the start (not the one after the search: _again)."""
        return [o for o in self.store.of(BASELINE_KEY) if o.repeat < self.space.repeats]

    def _neighbours(self, current: Candidate) -> list[Candidate]:
        """Each lever's other values from ``current`` (the next round's candidates)."""
        base = dict(self._baseline_values())
        now = {**base, **dict(current.changes)}
        out = []
        for lv in self.space.levers:
            for v in lv.values:
                if v == now[lv.path]:
                    continue
                changed = {**now, lv.path: v}
                changes = tuple((p.path, changed[p.path]) for p in self.space.levers
                                if changed[p.path] != base[p.path])
                # the baseline is measured already (a layout may equal it)
                if changes and not is_baseline(self.checker.base_data, changes,
                                               self.space.levers):
                    out.append(Candidate(self._name(changes), changes))
        return out

    def _baseline_values(self) -> list[tuple[str, Value]]:
        return [(lv.path, current(self.checker.base_data, lv)) for lv in self.space.levers]

    def _name(self, changes: tuple[tuple[str, Value], ...]) -> str:
        key = changes_key(changes)
        if key not in self.names:
            self.names[key] = f"c{len(self.names)}"
        return self.names[key]

    # ------------------------------------------------------------------ bounds
    def _wanted(self, c: Checked) -> bool:
        if c.verdict == "refused" or (c.verdict == "outage" and not self.limits.allow_outage):
            self._row(c.candidate, None, f"{c.verdict}: {c.why}")
            return False
        return True

    _bound = ""

    def _bounded(self, c: Checked, i: int) -> bool:
        """Whether --max-candidates or --max-time stops the search before ``c``."""
        key = changes_key(c.candidate.changes)
        if self.store.get(key) is not None:
            return False  # measured before: costs nothing
        lim = self.limits
        if lim.max_candidates is not None and self.tried >= lim.max_candidates:
            self._bound = f"--max-candidates {lim.max_candidates}"
            return True
        if lim.max_time is not None:
            spent = self.clock() - self.started
            if spent + self._cost(c) > lim.max_time:
                self._bound = (f"--max-time {lim.max_time:g} s: {spent:.0f} s spent, the next "
                               f"costs about {self._cost(c):.0f} s")
                return True
        return False

    def _cost(self, c: Checked) -> float:
        """What measuring ``c`` will cost: the mean of those measured in this run, else the
        estimate."""
        spent = [o.seconds for o in self.store.outcomes if o.seconds and o.key != BASELINE_KEY]
        return statistics.fmean(spent) if spent else c.seconds

    def _eta(self, i: int) -> str:
        left = max(0, self.planned - i + 1)
        spent = [o.seconds for o in self.store.outcomes if o.seconds]
        if not spent or not left:
            return ""
        return f", about {statistics.fmean(spent) * left / 60:.0f} min left in this pass"

    # ------------------------------------------------------------------ one measurement
    def _measure(self, c: Checked, repeat: int, i: int | None = None, *,
                 race: float | None = None) -> Measurement:
        cand = c.candidate
        key = changes_key(cand.changes)
        known = self.store.get(key, repeat)
        if i is not None and known is None:
            self.tried += 1  # measured in this run (--max-candidates counts these)
        where = f"{cand.name}" + (
            " (once more, after the search)" if repeat >= self.space.repeats
            else f" (repeat {repeat + 1} of {self.space.repeats})"
            if repeat or not cand.changes else "")
        step = f"[{i}/{self.planned}] " if i is not None else ""
        if known is not None:
            self.say(f"tune: {step}{where}: measured before: {self._said(known)}")
            if repeat == 0:
                self._row(cand, known, "")
            return known
        self.say(f"tune: {step}{where}: {cand.describe()}{self._eta(i or 1)}")
        t0 = self.clock()
        path = self.store.config_path(cand.name)
        write_atomic(path, self.checker.text_of(cand))
        applied = 0.0
        if self.running != key:
            sw = self._switch(cand, path, allow_outage=self.limits.allow_outage)
            applied = sw.seconds
            if not sw.ok:
                o = Measurement(key, cand.name, list(cand.changes), repeat,
                            Result.OUTAGE if sw.outage else Result.FAILED_START, why=sw.why,
                            apply_seconds=applied, seconds=self.clock() - t0)
                self.store.add(o)
                self.say(f"tune: {cand.name}: {o.status}: {sw.why}")
                self._go_back()
                self._row(cand, o, "")
                return o
        measured = self._measured(cand, path, repeat, race, self._near(key, repeat))
        o = dataclasses.replace(measured, key=key, name=cand.name, changes=list(cand.changes),
                                repeat=repeat, apply_seconds=applied,
                                seconds=self.clock() - t0)
        self.store.add(o)
        self.say(f"tune: {cand.name}: {self._said(o)}")
        if o.status == Result.INVALID:
            self._go_back()
        else:
            self.good = cand
        if repeat == 0:
            self._row(cand, o, "")
        return o

    def _near(self, key: str, repeat: int) -> Near | None:
        """Where a repeat's search starts: the config's first measurement's end, when it was
        rated (a lost race, no rate, or an invalid first one: a whole search)."""
        first = self.store.get(key, 0) if repeat else None
        if first is None or first.status not in RATED or not first.rate:
            return None
        return first.rate, first.above

    def _measured(self, cand: Candidate, path: Path, repeat: int,
                  race: float | None, near: Near | None = None) -> Measurement:
        """One measurement on the running ``cand`` (raced at ``race``: to_beat); an invalid
        one is measured once more (the deployment's measure waits for every pair to be
        proven first): a transient is not a verdict. Invalid twice: written off, both
        reasons said."""
        if race is not None:
            self.say(f"tune: {cand.name}: racing: first at {race:g} req/s, the rate to beat")
        if near is not None:
            self.say(f"tune: {cand.name}: from where its first measurement ended: "
                     f"{near[0]:g} req/s met" + (f", {near[1]:g} missed" if near[1] else ""))
        first = self.deployment.measure(cand.name, path, self.store.bench_dir(cand.name, repeat),
                                        self._progress(cand.name), race=race, near=near)
        if first.status != Result.INVALID:
            return first
        self.say(f"tune: {cand.name}: invalid ({first.why}); measuring it once more: one "
                 "transient is not a verdict")
        second = self.deployment.measure(cand.name, path,
                                         self.store.bench_dir(cand.name, repeat, second=True),
                                         self._progress(cand.name), race=race, near=near)
        if second.status == Result.INVALID:
            return dataclasses.replace(second,
                                       why=f"invalid twice: {first.why}; then {second.why}")
        return dataclasses.replace(second, first_invalid=first.why)

    def _switch(self, cand: Candidate, path: Path, *, allow_outage: bool) -> Switched:
        """Switch the deployment to ``cand``. What runs after: ``cand`` when it went through;
        what ran before when it was refused (it would stop serving: nothing was changed);
        not known when it failed on the way (None)."""
        key = changes_key(cand.changes)
        before, self.running = self.running, None  # not known while the switch runs
        sw = self.deployment.switch(cand.name, path, self._progress(cand.name),
                                    allow_outage=allow_outage)
        self.running = key if sw.ok else before if sw.outage else None
        return sw

    def _go_back(self) -> None:
        """The deployment back on the last good config, under the same rule as every switch:
        a way back that would stop serving is taken only with --allow-outage (without it, the
        way forward could not have stopped serving either; a refused one changed nothing)."""
        key = changes_key(self.good.changes)
        if self.running == key:
            return
        self.say(f"tune: back to {self.good.name} ({self.good.describe()})")
        sw = self._switch(self.good, self.store.config_path(self.good.name),
                          allow_outage=self.limits.allow_outage)
        if sw.outage:
            raise StuckError(f"going back to {self.good.name}: "
                             f"{sw.why.removesuffix(' (--allow-outage measures it)')}; not taken "
                             "without --allow-outage",
                             hint="see `pdsvc status`; `pdsvc apply --rollback` goes back one "
                             "more step")
        if not sw.ok:
            raise StuckError(f"going back to {self.good.name} failed: {sw.why}",
                             hint="see `pdsvc status`; `pdsvc apply --rollback` goes back one "
                             "more step")

    def _progress(self, name: str) -> Progress:
        return lambda line: self.say(f"tune: {name}: {line.strip()}")

    @staticmethod
    def _said(o: Measurement) -> str:
        if o.status in RATED:
            twice = (f"; measured twice, the first invalid: {o.first_invalid}"
                     if o.first_invalid else "")
            return (f"{goodput(o)} req/s at the SLO (p99 TTFT {o.ttft_p99_ms or 0:.0f} ms, "
                    f"p99 ITL {o.itl_p99_ms or 0:.1f} ms), {o.seconds:.0f} s{twice}")
        return f"{o.status}: {o.why}"

    def _row(self, cand: Candidate, o: Measurement | None, why: str) -> None:
        self.rows.setdefault(changes_key(cand.changes), (cand, o, why))

    # ------------------------------------------------------------------ the answer
    def _once_more(self, base: Candidate) -> Measurement:
        """The baseline measured once more, after the search and before the best's repeats
        (its repeat ``space.repeats``): has the host drifted since the start (drifted)?"""
        self.say("tune: the baseline once more, after the search: a gain is only an answer "
                 "if the host measures the baseline as it did at the start")
        self.planned = 1
        return self._measure(Checked(base, "baseline", "", (), 0.0), self.space.repeats)

    def _repeats(self, cand: Candidate, baseline: list[Measurement]
                 ) -> tuple[bool, str, list[Measurement]]:
        """The best's ``space.repeats`` measurements, judged against the baseline's."""
        self.planned = self.space.repeats
        checked = Checked(cand, "measure", "", (), 0.0)
        # each repeat raced at the baseline's rate to beat: one that misses it there
        # cannot be apart from the baseline (judge), one run says so
        outs = [self._measure(checked, r, race=to_beat(baseline, self.space))
                for r in range(self.space.repeats)]
        wins, verdict = judge(cand, outs, baseline)
        return wins, verdict, outs

    def _finish(self, base: Candidate, baseline: list[Measurement], how: str) -> Answer:
        firsts = [(cand, o) for cand, o, _ in self.rows.values()
                  if o is not None and o.counted and o.rate and cand.changes]
        top = max(firsts, key=lambda x: x[1].rate or 0.0, default=None)
        wins, best, best_outcomes = False, base, baseline
        if top is not None and (top[1].rate or 0) > max(rates(baseline)):
            cand = top[0]
            moved = drifted(baseline, self._once_more(base), self.space)
            if moved:
                wins, verdict = False, (
                    f"no claimed win: the baseline, measured again after the search, "
                    f"{moved}; the best so far, {cand.name} "
                    f"({cand.describe()}), measured {goodput(top[1])} req/s against the "
                    f"baseline's {span(baseline)} at the start, but a gain is an answer only "
                    "on a host that measures the baseline as it did at the start: measure "
                    "afresh when the host is steady (another --results directory; this one "
                    "keeps what was measured)")
            else:
                wins, verdict, outs = self._repeats(cand, baseline)
            if wins:
                best, best_outcomes = cand, outs
            capped = [c.name for c, o in firsts if o.status == Result.LOWER_BOUND]
            if len(capped) > 1:
                verdict += (f" ({' and '.join(capped)} each met the SLO at the range's top, "
                            f"{self.space.rate_high:g} req/s: raise rates.high to tell them "
                            "apart)")
        else:
            verdict = ("no candidate beats the current config: none measured above the "
                       f"baseline's {span(baseline)}")
        end = base if self.limits.keep_current or not wins else best
        if self.running != changes_key(end.changes):
            self.say(f"tune: the deployment ends on {end.name} ({end.describe()})")
            self.good = end
            self._go_back()
        unprofiled = ""
        if wins and end != best:
            unprofiled = f"{best.name} not captured: --keep-current ends on the baseline"
        elif wins:
            self._profile(best)
        return Answer(baseline, best, best_outcomes, wins, verdict, how,
                      list(self.rows.values()), end, self.profiles,
                      unprofiled if self.profiler else "")

    def _profile(self, cand: Candidate) -> None:
        """--profile: ``cand``'s decode, captured now that the deployment runs it."""
        if self.profiler is not None and self.running == changes_key(cand.changes):
            self.profiles.append(take(self.profiler, cand.name,
                                      self.store.config_path(cand.name), self.say))
