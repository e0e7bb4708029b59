"""Each candidate of a search space, checked before anything restarts, and what the search
would cost.

* **Refused**: its config is one the schema or the pairing check refuses (parse_config's one
  line), or whose plan does not fit the host (build_plan's): skipped with that reason, no
  restart.
* **Outage**: switching the deployment from the baseline to it stops serving (the rollout
  `pdsvc apply` would run has a step that leaves no pair: a pair-incompatible change on
  1P1D, say): skipped unless --allow-outage.
* Else it is measured: the seconds that costs are estimated from the steps its rollout
  makes (a step that restarts or starts engines: one engine load, space.engine_load_secs,
  since a step's engines restart together, plus SETTLE_S; a step of the router's or the
  front's: SETTLE_S) and its race
  (search.to_beat): RACE_RUNS runs, each ``num_prompts`` at the middle rate of the range. The
  candidates that take the lead are searched above the rate to beat too (as `pdsvc bench
  --slo` bisects: ``bisect_runs``): total_seconds counts the leaders a search expects.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import yaml

from pdsvc.apply.rollout import Step, StepKind, plan_rollout
from pdsvc.config.load import parse_config
from pdsvc.errors import ConfigError, TopologyError
from pdsvc.plan.build import Plan, build_plan
from pdsvc.topology import Topology

from .space import Candidate, Space, apply_changes

#: what an applied candidate takes beyond its engines' load: proving pairs, registering
SETTLE_S = 10.0
#: a run's cost beyond its requests and its warm-up request: bench_serving's tokenizer and
#: prompts, the gates' reads (3 s a run on the stand-in: the losers' one run each in
#: benchmarks/results/tune.txt). bench_serving's import is paid once per pdsvc process, not
#: a run (bench/driver.py)
RUN_OVERHEAD_S = 3.0
#: the runs a candidate's race costs in the estimate: the run at the rate to beat (a loser's
#: only one) and one more (measured again after an invalid run, or a leader's first above it)
RACE_RUNS = 2
#: the runs a repeat costs in the estimate: it starts where the config's first measurement
#: ended, at the rate that met and at the one that missed (bench/search.confirm_rate)
CONFIRM_RUNS = 2


@dataclass(frozen=True)
class Checked:
    candidate: Candidate
    verdict: Literal["baseline", "measure", "refused", "outage"]
    why: str  # the refusal, or the step that stops serving; "" otherwise
    restarts: tuple[str, ...]  # the units its rollout restarts (or starts)
    seconds: float  # its estimated cost if measured (0: refused)
    loads: int = 0  # the engine loads its rollout waits for, one after another


def bisect_runs(space: Space) -> int:
    """How many runs `pdsvc bench --slo` makes over the space's rate range: the two ends,
    then halving the range (geometrically) until it is within the precision."""
    span = math.log(space.rate_high / space.rate_low)
    return 2 + max(0, math.ceil(math.log2(span / math.log1p(space.precision))))


def one_run_seconds(space: Space) -> float:
    """One bench run: num_prompts at the range's middle rate (geometric), its warm-up
    request before them (one request alone: within the SLO's TTFT and ITL bounds) and
    RUN_OVERHEAD_S."""
    warmup = (space.ttft_ms + (space.output_len - 1) * space.itl_ms) / 1000
    return (space.num_prompts / math.sqrt(space.rate_low * space.rate_high) + warmup
            + RUN_OVERHEAD_S)


def run_seconds(space: Space) -> float:
    """One SLO search over the whole range: its runs."""
    return bisect_runs(space) * one_run_seconds(space)


def repeat_seconds(space: Space) -> float:
    """One repeat of a config measured before: started where the first ended."""
    return CONFIRM_RUNS * one_run_seconds(space)


def leaders(n: int) -> float:
    """How many of ``n`` candidates measured one after another take the lead, expected: the
    records of a random order, 1 + 1/2 + … + 1/n."""
    return sum(1 / k for k in range(1, n + 1))


class Checker:
    """Checks candidates against the baseline config (its plan and bundle built once)."""

    def __init__(self, space: Space, config_text: str, source: str, topology: Topology | None,
                 bundle_of: Callable[[Plan], dict[str, str]]) -> None:
        self.space, self.source, self.topology, self.bundle_of = space, source, topology, \
            bundle_of
        self.config_text = config_text
        self.base_data = yaml.safe_load(config_text) or {}
        base_plan = build_plan(parse_config(config_text, source), topology,
                               config_source=source, config_text=config_text)
        self.base_bundle = bundle_of(base_plan)
        self.base_engines = engine_units(base_plan)

    def text_of(self, c: Candidate) -> str:
        """The candidate's config as YAML text: the baseline's own text, or it with the
        candidate's changes made."""
        if not c.changes:
            return self.config_text
        return yaml.safe_dump(apply_changes(self.base_data, c.changes, self.space.levers),
                              sort_keys=False)

    def check(self, c: Candidate) -> Checked:
        """The candidate's verdict (module docstring)."""
        space = self.space
        if not c.changes:
            return Checked(c, "baseline", "", (), run_seconds(space) +
                           (space.repeats - 1) * repeat_seconds(space))
        text = self.text_of(c)
        source = f"{self.source} with {c.describe()}"
        try:
            plan = build_plan(parse_config(text, source), self.topology,
                              config_source=self.source, config_text=text)
        except (ConfigError, TopologyError) as e:
            said = str(e)  # less the source and the line in the candidate's text, if said
            why = said[len(source):].lstrip(":0123456789 ") if said.startswith(source) else \
                said.split(": ", 1)[-1]
            return Checked(c, "refused", why, (), 0.0)
        rollout = plan_rollout(self.base_bundle, self.bundle_of(plan))
        units = tuple(u for s in rollout.steps for u in s.units)
        stops = [s for s in rollout.steps if s.serving_stops]
        engines = self.base_engines | engine_units(plan)
        loads = sum(1 for s in rollout.steps if loads_engines(s, engines))
        cost = loads * space.engine_load_secs + len(rollout.steps) * SETTLE_S + \
            RACE_RUNS * one_run_seconds(space)
        if stops:  # measured only with --allow-outage: its cost is the same
            return Checked(c, "outage", f"serving stops while {stops[0].clause()} (no pair "
                           f"left): {stops[0].why}", units, cost, loads)
        return Checked(c, "measure", "", units, cost, loads)


def engine_units(plan: Plan) -> set[str]:
    """The names a rollout's steps may give an engine: its unit, its supervisord program."""
    return {n for e in plan.engines for n in (e.unit, e.name)}


def loads_engines(step: Step, engines: set[str]) -> bool:
    """Whether ``step`` waits for an engine's load: it restarts or starts one (its engines
    restart together: PartOf=, a half, a pair-incompatible group). The router's restart, the
    front's reload and the switch between halves load none."""
    return step.action not in NO_LOAD and any(u in engines for u in step.down)


#: steps that load no engine
NO_LOAD = frozenset({StepKind.SWITCH_HALVES, StepKind.RELOAD_FRONT, StepKind.RESTART_ROUTER})


def check(space: Space, candidates: list[Candidate], config_text: str, source: str,
          topology: Topology | None, bundle_of: Callable[[Plan], dict[str, str]]
          ) -> list[Checked]:
    """Every candidate's verdict (module docstring), the baseline first."""
    checker = Checker(space, config_text, source, topology, bundle_of)
    return [checker.check(c) for c in candidates]


def total_seconds(space: Space, checked: list[Checked]) -> float:
    """The estimate for the candidates in ``checked`` (those to measure): each raced once,
    the leaders among them searched above the rate to beat, the baseline and the best
    ``space.repeats`` times (a search, then repeats started where it ended), the baseline
    once more after the search (the drift check: a switch to it and a repeat), and the way
    back to the best (or the baseline) at the end."""
    measured = [c for c in checked if c.verdict != "refused"]
    others = len([c for c in measured if c.verdict != "baseline"])
    searched = leaders(others) * run_seconds(space)
    switch = _back_loads(measured) * (space.engine_load_secs + SETTLE_S)
    best_again = (space.repeats - 1) * repeat_seconds(space) if others else 0.0
    drift = switch + repeat_seconds(space) if others else 0.0
    return sum(c.seconds for c in measured) + searched + best_again + drift + switch


def _back_loads(measured: list[Checked]) -> int:
    """The engine loads of one way back to the baseline (or on to the best): the most any
    candidate's rollout waits for."""
    return max((c.loads for c in measured), default=0)


def engine_loads(checked: list[Checked]) -> int:
    """The engine loads total_seconds counts, one after another: each candidate's switch,
    the way back to the baseline for the drift check, and the way to the answer."""
    measured = [c for c in checked if c.verdict != "refused"]
    others = any(c.verdict != "baseline" for c in measured)
    return sum(c.loads for c in measured) + (2 * _back_loads(measured) if others else 0)
