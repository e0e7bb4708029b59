"""The running deployment as `pdsvc tune` drives it: switched to a candidate by the flow of
`pdsvc apply` (engine by engine, back on failure; its progress is tune's), measured by the
SLO search of `pdsvc bench --slo` once every pair is proven.

A switch that fails says why in the engine's own words: the restart file its runtime wrote
when the run ended (``NAME.restart.json``'s reason: "decode exited with status 1: ValueError:
…", the child's last error line, as the journal has it), else apply's line for the step that
failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdsvc.apply.bundles import as_bundle, read_bundle
from pdsvc.apply.events import FAILURES, ApplyEvent, words
from pdsvc.apply.flow import FAILED, Options, Source, apply_rollout
from pdsvc.apply.order import plan as plan_apply
from pdsvc.bench.gates import read_pairs
from pdsvc.bench.runner import RunResult, Slo
from pdsvc.bench.search import Near
from pdsvc.bench.session import Session, meets_slo, state_dir_of
from pdsvc.bench.target import Load, target_from_plan
from pdsvc.plan.build import Plan
from pdsvc.profile.options import ProfileOptions
from pdsvc.profile.result import ProfileRun
from pdsvc.profile.run import on_this_host, profile_running
from pdsvc.render.kit import File
from pdsvc.ship.runtime.canary import PairHealth
from pdsvc.status.runstate import unit_runs

from .check import bisect_runs
from .search import Progress, Switched
from .space import Space
from .store import Measurement, Point, Result

#: the phases of a run that ended badly (runtime/endings.py's Phase values)
BAD_PHASES = ("failed-start", "gave-up", "crashed")
#: how often the pairs' canary state is read while waiting for every pair to be proven
PAIR_POLL_S = 1.0


class _Frontend:
    """apply's Frontend for tune: the plan kept quiet, progress passed on, never a question
    (tune decides about outages before it switches), the first failure kept as apply's
    typed event (apply/events.py), never read back from a printed line."""

    def __init__(self, say: Progress, installer: Path | None) -> None:
        self._say, self._installer = say, installer
        self.failure: ApplyEvent | None = None

    @property
    def failed(self) -> str:
        """What failed, in apply's words ("" when nothing did)."""
        return words(self.failure) if self.failure is not None else ""

    def echo(self, text: str) -> None:  # the plan: tune says what it switches to
        pass

    def say(self, text: str) -> None:  # apply's details (drains, registrations, timings)
        line = text.removeprefix("pdsvc apply: ")
        if line.startswith(("installing", "nothing to do", "  ")):
            self._say(line)

    def event(self, e: ApplyEvent) -> None:
        if isinstance(e, FAILURES) and self.failure is None:
            self.failure = e
        self._say(words(e))

    def confirm(self, question: str) -> bool | None:
        return True

    def shown(self, path: Path) -> str:
        return str(path)

    def installer(self) -> Path | None:
        return self._installer


@dataclass
class Live:
    """The deployment whose bundle is in ``output`` (what `pdsvc apply` compares with)."""

    space: Space
    output: Path
    origin: Path  # the user's config: the bundle's record names it whatever candidate runs
    plan_of: Callable[[Path], Plan]  # a config file's plan (on this host)
    files_of: Callable[[Plan], list[File]]  # its bundle, as `pdsvc render` writes it
    installer: Path | None
    sysfs_root: Path | None = None
    topology: Path | None = None
    drain_secs: float = 30.0
    step_secs: float = 900.0
    state_dir: Path | None = None
    max_error_rate: float = 0.01

    def runs(self, config: Path) -> bool:
        new = as_bundle(self.files_of(self.plan_of(config)))
        return plan_apply(read_bundle(self.output), new).nothing_to_do

    def switch(self, name: str, config: Path, say: Progress, *, allow_outage: bool) -> Switched:
        plan = self.plan_of(config)
        files = self.files_of(plan)
        rollout = plan_apply(read_bundle(self.output), as_bundle(files))
        if rollout.outage and not allow_outage:
            s = rollout.outage[0]
            return Switched(False, 0.0, f"serving would stop while {s.clause()}: {s.why} "
                            "(--allow-outage measures it)", outage=True)
        fe = _Frontend(say, self.installer)
        options = Options(self.output, sysfs_root=self.sysfs_root, topology=self.topology,
                          yes=True, drain_secs=self.drain_secs, step_secs=self.step_secs)
        t0 = time.monotonic()
        code = apply_rollout(options, Source(files, config, self.origin), fe)
        seconds = time.monotonic() - t0
        if code == 0:
            return Switched(True, seconds)
        why = self.why_failed(plan) or fe.failed or f"pdsvc apply exited {code}"
        return Switched(False, seconds, why if code == FAILED else f"{why} (exit {code})")

    def profile(self, name: str, config: Path, say: Progress) -> ProfileRun:
        """--profile: the decode of ``config``, which runs now, as `pdsvc profile` captures it
        (its own load through the router, at the space's input and output lengths)."""
        plan = self.plan_of(config)
        opts = ProfileOptions(input_len=self.space.input_len,
                              output_len=self.space.output_len)
        return profile_running(on_this_host(plan, plan, opts, say, self.state_dir,
                                            second_interrupt=""))  # tune's 2nd signal: "wait"

    def why_failed(self, plan: Plan) -> str:
        """The engines' own words for a run that ended badly (their restart files)."""
        target = target_from_plan(plan)
        directory = state_dir_of(plan, target, self.state_dir)
        if directory is None:
            return ""
        bad = [f"{r.unit}: {r.reason}" for r in unit_runs(plan, directory)
               if r.phase in BAD_PHASES and r.reason]
        return "; ".join(bad)

    def measure(self, name: str, config: Path, bench_dir: Path, say: Progress, *,
                race: float | None = None, near: Near | None = None) -> Measurement:
        space = self.space
        plan = self.plan_of(config)
        target = target_from_plan(plan)
        directory = state_dir_of(plan, target, self.state_dir)
        unproven = self._pairs_proven(plan, directory, say)
        if unproven:
            return Measurement("", name, [], 0, Result.INVALID, why=unproven)
        slo = Slo(space.ttft_ms, space.itl_ms, space.share)
        most = bisect_runs(space)

        def said(line: str) -> None:  # "run 4: 14.2 req/s …" -> "run 4 of at most 7: …"
            head, sep, rest = line.partition(": ")
            say(f"{head} of at most {most}{sep}{rest}" if head.startswith("run ") else line)

        session = Session(target, bench_dir, slo, self.max_error_rate, plan, directory, said)
        best = session.search(space.rate_low, space.rate_high, space.precision,
                              Load(space.rate_low, space.input_len, space.output_len,
                                   space.num_prompts), race=race, near=near)
        return outcome_of(session.runs, best, slo, space, race)

    def _pairs_proven(self, plan: Plan, directory: Path | None, say: Progress) -> str:
        """Wait until every pair's canary says ok (bounded by the step bound); what is
        still unproven ("" once proven, or when no canary state is kept at all)."""
        deadline = time.monotonic() + self.step_secs
        said = False
        while True:
            pairs = read_pairs(plan, directory)
            if all(p.state is PairHealth.OK for p in pairs) or all(p.state is PairHealth.UNKNOWN
                                                          for p in pairs):
                return ""
            left = [f"{p.prefill} -> {p.decode}: {p.last_error or p.state}" for p in pairs
                    if p.state is not PairHealth.OK]
            if time.monotonic() >= deadline:
                return f"pairs not proven within {self.step_secs:g} s: {'; '.join(left)}"
            if not said:
                say(f"waiting for every pair's canary ({len(left)} not proven yet)")
                said = True
            time.sleep(PAIR_POLL_S)


def outcome_of(runs: list[RunResult], best: float | None, slo: Slo, space: Space,
               race: float | None = None) -> Measurement:
    """One measurement from the SLO search's runs: the goodput and the latencies of the run
    at that rate, and the lowest rate above it that missed the SLO (the goodput lies
    between); invalid when a run's gate failed; below when it missed the SLO at ``race``,
    the rate to beat, its first run; no-rate when none met the SLO; lower-bound when it held
    at the range's top (the goodput is at least that)."""
    points = [Point(r.load.rate, meets_slo(r, slo), r.metrics.get("p99_ttft_ms"),
                    r.metrics.get("p99_itl_ms")) for r in runs]
    bad = [r for r in runs if meets_slo(r, slo) is None]
    if bad:
        r = bad[0]
        why = r.error or "; ".join(f"gate {g.name}: {g.detail}" for g in r.failed_gates()
                                   if g.name != "errors")
        return Measurement("", "", [], 0, Result.INVALID,
                       why=f"run at {r.load.rate:g} req/s: {why}", points=points)
    missed = [r.load.rate for r in runs if meets_slo(r, slo) is False]
    if best is None and race is not None and race in missed:  # nothing met, the race missed
        return Measurement("", "", [], 0, Result.BELOW, why=f"missed the SLO at {race:g} req/s, "
                       "the rate to beat", above=race, points=points)
    if best is None:
        return Measurement("", "", [], 0, Result.NO_RATE, why=f"no rate in {space.rate_low:g}.."
                       f"{space.rate_high:g} req/s meets the SLO", above=min(missed, default=None),
                       points=points)
    run = [r for r in runs if r.load.rate == best][-1]
    m = run.metrics
    above = min((r for r in missed if r > best), default=None)
    status = Result.LOWER_BOUND if best >= space.rate_high else Result.MEASURED
    return Measurement("", "", [], 0, status, rate=best, above=above,
                   tokens_per_s=m.get("output_throughput"),
                   ttft_p50_ms=m.get("median_ttft_ms"), ttft_p99_ms=m.get("p99_ttft_ms"),
                   itl_p50_ms=m.get("median_itl_ms"), itl_p99_ms=m.get("p99_itl_ms"),
                   gates={g.name: g.result for g in run.gates}, points=points)
