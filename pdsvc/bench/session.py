"""Runs against one deployment, one after another: each run's files numbered in one
directory, how each went said as it ends, and the SLO search over them (`pdsvc bench --slo`
and each candidate of `pdsvc tune` search the same way)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pdsvc.sglang import running_requests
from pdsvc.status.collect import http_get

from .gates import read_pairs
from .runner import RunResult, Slo, run_once
from .search import Near, bisect_rate, confirm_rate
from .target import Load, Target, current_env

if TYPE_CHECKING:
    from pdsvc.plan.build import Plan


#: how long a run waits for the requests the run before it left running (a run starts on a
#: drained deployment: an overloaded run leaves requests queued until the router gives up on
#: them, and the next run's warmup and first requests would wait behind them)
DRAIN_BOUND_S = 120.0
DRAIN_POLL_S = 0.5


def running_total(engines: tuple[tuple[str, str], ...], timeout: float = 3.0) -> int | None:
    """The requests the engines run now (sglang:num_running_reqs of each /metrics); None when
    one cannot be read."""
    total = 0
    for _, url in engines:
        probe = http_get(f"{url}/metrics", timeout=timeout)
        count = running_requests(probe.body) if probe.ok else None
        if count is None:
            return None
        total += count
    return total


def meets_slo(res: RunResult, slo: Slo) -> bool | None:
    """Whether a run meets the SLO; None when the run is invalid (the search stops there):
    a failed gate other than ``errors`` (failed requests only mean the SLO is missed), or
    bench_serving itself failed."""
    if res.error or any(g.name != "errors" for g in res.failed_gates()):
        return None
    return bool(res.valid and (res.slo_share or 0) >= slo.share)


def state_dir_of(plan: Plan, target: Target, state_dir: Path | None) -> Path | None:
    """Where the runtimes' pair canaries write: ``state_dir`` when given, else the plan's
    (when the target is the plan's own)."""
    if state_dir is None and target.owned:
        from pdsvc.status.runstate import state_dir as plan_state_dir

        return plan_state_dir(plan, "supervisord" if plan.format == "supervisord" else "systemd")
    return state_dir


class Session:
    """Runs one load after another, numbering their files, and says how each went."""

    def __init__(self, target: Target, output_dir: Path, slo: Slo | None,
                 max_error_rate: float, plan: Plan, state_dir: Path | None,
                 say: Callable[[str], None]) -> None:
        self.target, self.output_dir, self.slo = target, output_dir, slo
        self.max_error_rate, self.plan, self.state_dir = max_error_rate, plan, state_dir
        self.say = say
        self.runs: list[RunResult] = []
        self.before: int | None = None  # requests running before the first run (live ones)

    def one(self, load: Load) -> RunResult:
        """Run ``load``, keep its result, and report it."""
        i = len(self.runs) + 1
        say = self.say
        if self.runs:
            self._drained()
        else:
            self.before = running_total(self.target.engines)
        say(f"run {i}: {load.rate:g} req/s, {load.num_prompts} requests of "
            f"{load.input_len}+{load.output_len} tokens …")
        plan = self.plan if self.target.owned else None
        self.output_dir.mkdir(parents=True, exist_ok=True)
        res = run_once(self.target, load, self.output_dir / f"run-{i:02d}.jsonl",
                       env=current_env(), slo=self.slo, max_error_rate=self.max_error_rate,
                       pairs=lambda: read_pairs(plan, self.state_dir),
                       log=say, log_file=self.output_dir / f"run-{i:02d}.log")
        self.runs.append(res)
        m = res.metrics
        said = (f"  {res.ok}/{res.total} ok, p99 TTFT {m.get('p99_ttft_ms') or 0:.0f} ms, "
                f"p99 ITL {m.get('p99_itl_ms') or 0:.1f} ms"
                + (f", SLO met by {res.slo_share:.1%}" if res.slo_share is not None else ""))
        say(said if not res.error else f"  {res.error}")
        for g in res.gates:
            if g.result != "pass":
                say(f"  gate {g.name}: {g.result}: {g.detail}")
        return res

    def _drained(self) -> None:
        """Wait (bounded) until the engines run no more requests than before the first run,
        one per engine of live traffic allowed."""
        if self.before is None:
            return
        most = self.before + len(self.target.engines)
        deadline = time.monotonic() + DRAIN_BOUND_S
        said = False
        while (left := running_total(self.target.engines)) is not None and left > most:
            if time.monotonic() >= deadline:
                self.say(f"  still {left} requests running after {DRAIN_BOUND_S:g} s; "
                         "running anyway")
                return
            if not said:
                self.say(f"  waiting for the {left} requests the last run left running "
                         "(a run starts drained)")
                said = True
            time.sleep(DRAIN_POLL_S)

    def search(self, lo: float, hi: float, precision: float, shape: Load, *,
               race: float | None = None, near: Near | None = None) -> float | None:
        """The highest rate in lo..hi meeting the session's SLO (bisect_rate), each run
        ``shape``'s lengths and prompts at the rate tried; None when none does or a run was
        invalid (its gate is in self.runs).

        ``race``: a rate to run first, the rate to beat (`pdsvc tune`'s racing). Missed there,
        the search ends at once (None: the goodput is below it, one run spent); met, the
        search bisects race..hi only. ``near``: where an earlier measurement of the same
        config ended (the rate that met, the one above that missed): the search starts there
        (confirm_rate: 2 runs when nothing moved); a race then only bounds it from below."""
        slo = self.slo
        assert slo is not None

        def meets(rate: float) -> bool | None:
            return meets_slo(self.one(Load(rate, shape.input_len, shape.output_len,
                                           shape.num_prompts)), slo)

        floor = race if race is not None and lo < race <= hi else None
        if near is not None and lo <= near[0] <= hi and (floor is None or near[0] >= floor):
            best, _ = confirm_rate(lo, hi, precision, meets, near, floor=floor)
            return best
        if floor is not None:
            if not meets(floor):
                return None
            best, _ = bisect_rate(floor, hi, precision, meets, lo_met=True)
            return best
        best, _ = bisect_rate(lo, hi, precision, meets)
        return best
