"""A whole `pdsvc profile` run: the load, then each role in turn: batches full, tok/s measured,
the hold taken and answered, each engine asked for N steps, every rank's trace whole, the
engines healthy, the hold released; then the breakdown of the traces.

Nothing is left behind, whatever ends the run: the load is stopped; an engine asked for a
capture whose traces are not whole yet is told to stop (``/stop_profile``) and its hold is
kept while it writes (up to --write-timeout; a second interrupt releases it at once); every
hold is removed. A hold left by a run killed outright lapses with its lease (30 s).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import json
import os
import pwd
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pdsvc.apply.host import LocalHost
from pdsvc.apply.lease import Lease
from pdsvc.bench.target import Target, foreign, target_from_plan
from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan
from pdsvc.profile import capture, report
from pdsvc.profile.breakdown import breakdown
from pdsvc.profile.engines import Engine, engine_of, select, trace_root
from pdsvc.profile.load import Background, load_of, words
from pdsvc.profile.options import ROLES, CannotProfile, ProfileError, ProfileOptions
from pdsvc.profile.result import EngineCapture, ProfileRun, RoleResult
from pdsvc.profile.trace import read_trace
from pdsvc.profile.waits import HEALTHY_WAIT_S, TOKENS, Fill, Waits
from pdsvc.ship.runtime.hold import hold_path
from pdsvc.ship.runtime.statefile import Kind, read_known, state_path
from pdsvc.ship.runtime.timings import PROFILE_HOLD_MAX_S
from pdsvc.status.managers import make_backend
from pdsvc.status.runstate import state_dir as plan_state_dir

#: the decode's batch when its server info names no limit
DEFAULT_BATCH = 32
#: every wait inside a hold ends this long before the runtime stops honouring it
HOLD_MARGIN_S = 30.0


class Host(Protocol):
    """What a run needs of the machine (apply's LocalHost is one)."""

    def http(self, method: str, url: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0, body: bytes | None = None) -> tuple[int, str]: ...

    def write_hold(self, path: str, out: bool, peers: list[str] | None, why: str,
                   until: float | None = None, since: float | None = None,
                   by: str = "pdsvc apply", profile: str | None = None) -> bool: ...

    def clear_hold(self, path: str) -> None: ...

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def sleep(self, secs: float) -> None: ...


def on_this_host(whole: Plan, here: Plan, opts: ProfileOptions, say: Callable[[str], None],
                 state_dir: Path | None = None, **more: Any) -> Run:
    """A run on this machine: its service manager's logs, the runtimes' state directory
    (``state_dir``, else the plan's), the local host's HTTP and holds."""
    manager = make_backend(here)
    states = str(state_dir or plan_state_dir(here, manager.name))
    return Run(whole, here, opts, LocalHost(), say, states, manager.tail, **more)


def new_run_id(wall: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + "-" + uuid.uuid4().hex[:4]


@dataclass
class Run:
    """One run's parts: the plans, the options, the machine, where state and traces go."""

    whole: Plan
    here: Plan
    opts: ProfileOptions
    host: Host
    say: Callable[[str], None]
    state_dir: str  # the runtimes' state directory: holds and their answers
    tail: Callable[[str], list[str]]  # a unit's last log lines
    run: str = ""
    profiles: Path | None = None  # where runs go (default: StateDirectory=/profiles)
    #: what a second interrupt does while a stopped capture writes ("" when the caller, as
    #: pdsvc tune, does not pass it on)
    second_interrupt: str = "Ctrl-C: release it now; the engine may then be judged hung"
    roles: dict[str, list[Engine]] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run = self.run or new_run_id(self.host.wall())
        self.waits = Waits(self.host, self.say)
        self.root = (self.profiles / self.run) if self.profiles is not None \
            else trace_root(self.here, self.run)

    # ---------------------------------------------------------------- before anything runs
    def prepare(self) -> list[str]:
        """Select the engines of each role (ConfigError when this host runs none of them), ask
        each for its server info, refuse an engine another command holds. The lines that say
        what to run on other hosts."""
        elsewhere: list[str] = []
        for role in (r for r in ROLES if r in self.opts.roles):
            local, lines = select(self.whole, self.here, role, self.opts.engine)
            elsewhere += lines
            if local:
                self.roles[role] = local
        if not self.roles:
            raise ConfigError(f"no engine to profile on this host ({'; '.join(elsewhere)})")
        for e in (e for es in self.roles.values() for e in es):
            self.infos[e.name] = capture.server_info(self.host, e)
            refused = capture.refuses_by_stage(e, self.infos[e.name]) \
                if self.opts.by_stage else None
            if refused:
                raise ConfigError(refused, hint="leave --by-stage out: plain steps work there")
            held = read_known(hold_path(self.state_dir, e.name))
            if held is not None:
                raise CannotProfile(f"{e.name} is held by {held.get('by') or 'pdsvc apply'} "
                                    f"({held.get('why') or 'no reason given'})",
                                    hint="wait for it to end, then try again")
        return elsewhere

    def target(self) -> Target:
        return target_from_plan(self.here)

    def concurrency(self) -> int:
        """--concurrency, else the decodes' batches: each one's limit (the smallest of its
        max_running_requests and CUDA-graph batch), summed."""
        if self.opts.concurrency:
            return self.opts.concurrency
        decodes = [e for e in self.whole.engines if e.role == "decode" and e.node_rank == 0]
        return sum(self.limit(e.name) or DEFAULT_BATCH for e in decodes) or DEFAULT_BATCH

    def fills(self, role: str, engines: list[Engine], load: Background | None) -> list[Fill]:
        """What makes each engine's batch full: its limit; under pdsvc's own load of a
        concurrency, a decode's share of what the load keeps in flight (the routers spread
        requests over the decodes), and for a prefill every decode at its share."""
        least = 0.0 if load is None else float(
            self.opts.input_len if role == "prefill" else self.opts.output_len)
        decodes = [engine_of(e) for e in self.whole.engines
                   if e.role == "decode" and e.node_rank == 0]
        ours = load is not None and self.opts.rate is None
        share = max(1, self.concurrency() // max(1, len(decodes)))
        out = []
        for e in engines:
            limit = self.limit(e.name)
            if e.role == "decode" and ours and (limit is None or share < limit):
                out.append(Fill(e, share, f"its share of the load's {self.concurrency()} in "
                                          "flight", least=least))
            else:
                feeders = tuple((d, share) for d in decodes) if ours else ()
                out.append(Fill(e, limit, "as many as it takes", feeders, least))
        return out

    def limit(self, name: str) -> int | None:
        info = self.infos.get(name) or {}
        found = [v for k in ("max_running_requests", "cuda_graph_max_bs_decode",
                             "cuda_graph_max_bs")
                 if isinstance(v := info.get(k), int) and not isinstance(v, bool) and v > 0]
        return min(found) if found else None

    def make_dirs(self) -> None:
        """The run's directory and one per engine, owned by the units' user (the engine
        creates nothing under a directory root made: SGLang's export would fail with
        EACCES), 0750 as the StateDirectory= itself."""
        try:
            uid = pwd.getpwnam(self.here.user).pw_uid
            gid = grp.getgrnam(self.here.group).gr_gid
        except KeyError as e:
            raise CannotProfile(f"no user or group {e.args[0]!s} on this host (runtime.user, "
                                "runtime.group): is the bundle installed?") from None
        if not self.root.parent.parent.is_dir():
            raise CannotProfile(f"{self.root.parent.parent} does not exist (the units' state "
                                "directory): is the bundle installed and started?")
        engines = [e for es in self.roles.values() for e in es]
        for path in (self.root.parent, self.root, *(self.root / e.name for e in engines)):
            path.mkdir(mode=0o750, exist_ok=True)
            os.chown(path, uid, gid)

    # ---------------------------------------------------------------- the run
    def execute(self, load: Background | None) -> ProfileRun:
        started = self.host.now()
        if load is not None:
            load.start()
            self.say(f"pdsvc profile: load: {load.command} (its log: {load.log})")
        warmup = 0.0
        results = []
        for role, engines in self.roles.items():
            t0 = self.host.now()
            full = self.waits.full(self.fills(role, engines, load), self.opts.warmup_timeout,
                                   load.ended if load is not None else lambda: None)
            tok_s = self.waits.tok_s(engines, role, self.opts.measure_secs)
            warmup += self.host.now() - t0
            results.append(self.capture(role, engines, full, tok_s))
        shape = words(load_of(self.opts, self.concurrency())) if load is not None \
            else "live traffic (--no-load)"
        return ProfileRun(self.run, str(self.root), shape, tuple(results), warmup,
                          self.host.now() - started - warmup)

    def capture(self, role: str, engines: list[Engine], full: dict[str, str],
                tok_s: dict[str, float | None]) -> RoleResult:
        """One role: hold, capture, wait for the traces, release; its breakdown."""
        with self.held(engines) as budget:
            t0 = self.host.now()
            files = Capturing(self, engines, budget).run()
            wrote = self.host.now() - t0
        captures = tuple(EngineCapture(e.name, e.url, str(self.root / e.name),
                                       tuple(str(f) for f in files[e.name]), full[e.name],
                                       tok_s[e.name], wrote) for e in engines)
        traces = [(e.name, read_trace(f)) for e in engines for f in files[e.name]]
        how = (f"{TOKENS[role]} over the {self.opts.measure_secs:g} s before the capture, "
               "batches full")
        return RoleResult(role, self.opts.steps, how, captures, breakdown(role, traces))

    @contextlib.contextmanager
    def held(self, engines: list[Engine]) -> Iterator[float]:
        """Each engine under a profile hold, answered by its runtime, for the block; it gets
        the hold's budget (a monotonic time): the runtime honours the hold until
        PROFILE_HOLD_MAX_S after it began, and every wait inside ends HOLD_MARGIN_S before."""
        lease = Lease(self.host, self.say, by="pdsvc profile", owns=self.owns)
        paths = {e.name: hold_path(self.state_dir, e.name) or "" for e in engines}
        budget = self.host.now() + PROFILE_HOLD_MAX_S - HOLD_MARGIN_S
        lease.start()
        try:
            for e in engines:
                why = f"pdsvc profile {self.run}: {self.opts.steps} steps and their trace"
                if not lease.hold(paths[e.name], out=False, peers=[], why=why,
                                  profile=self.run):
                    raise CannotProfile(f"cannot write the hold {paths[e.name]}: is the "
                                        "bundle installed and the unit running?")
            acks = {e.name: state_path(self.state_dir, e.name, Kind.PROFILE) for e in engines}
            self.waits.acknowledged(acks, self.run)
            self.say(f"pdsvc profile: held {', '.join(paths)}: liveness not judged, router "
                     "health checks paused, no heals, until the traces are whole")
            yield budget
        finally:
            for path in paths.values():
                lease.release(path)
            lease.stop()

    def owns(self, path: str) -> bool:
        """Whether the hold at ``path`` is this run's (or gone): only then is it renewed or
        removed; another command's hold is left alone."""
        doc = read_known(path)
        return doc is None or doc.get("profile") == self.run


class Capturing:
    """One role's engines asked for a capture, and waited for, all within the hold's budget
    (``budget``: a monotonic time, PROFILE_HOLD_MAX_S after the hold began, less a margin:
    the runtime honours the hold no longer). On any exit before every trace is whole, each
    engine asked is told to stop, and its write is waited for with the hold kept, unless the
    bound has passed or a second interrupt comes."""

    def __init__(self, run: Run, engines: list[Engine], budget: float) -> None:
        self.r, self.engines, self.budget = run, engines, budget
        self.asked: list[Engine] = []
        self.files: dict[str, list[Path]] = {}
        self.waited_out = False  # the write's bound passed: nothing more to wait for

    def run(self) -> dict[str, list[Path]]:
        r, opts = self.r, self.r.opts
        try:
            for e in self.engines:
                body = capture.start_body(opts, str(r.root / e.name), r.run, opts.by_stage)
                self.asked.append(e)  # before the call: an interrupt in it may leave it asked
                try:
                    capture.start(r.host, e, body, functools.partial(self.logged_error, e))
                except ProfileError:
                    self.asked.remove(e)  # refused: any capture it runs is not ours to stop
                    raise
            r.say(f"pdsvc profile: asked {', '.join(e.name for e in self.engines)} for "
                  f"{opts.steps} steps; each freezes while it writes its traces (up to "
                  f"{opts.write_timeout:g} s): requests wait, none fails")
            deadline = min(r.host.now() + opts.write_timeout, self.budget)
            for e in self.engines:
                try:
                    self.files[e.name] = r.waits.traces(e, r.root / e.name, self.stage(e),
                                                        max(0.0, deadline - r.host.now()))
                except ProfileError:
                    self.waited_out = True  # the write's bound passed: nothing to wait for
                    raise
            self.healthy()
            return self.files
        except BaseException:
            self.wind_down()
            raise

    def logged_error(self, e: Engine) -> str | None:
        """SGLang's own error, from the engine's log (its HTTP reply is a bare 500)."""
        return capture.runtime_error(self.r.tail(e.unit))

    def stage(self, e: Engine) -> str | None:
        if not self.r.opts.by_stage:
            return None
        return "EXTEND" if e.role == "prefill" else "DECODE"

    def left(self) -> float:
        return max(0.0, self.budget - self.r.host.now())

    def healthy(self) -> None:
        for e in self.engines:
            if not self.r.waits.healthy(e, min(HEALTHY_WAIT_S, self.left())):
                self.r.say(f"pdsvc profile: warning: {e.name} does not answer /health 200 after "
                           "its trace was written: its hold is released and its runtime "
                           "judges it again")

    def wind_down(self) -> None:
        """Stop each asked engine whose traces are not whole, and wait for its write within
        the hold's budget (not once the bound has passed); the caller releases the hold. A
        second interrupt returns at once."""
        r = self.r
        left = [e for e in self.asked if e.name not in self.files]
        if not left:
            return
        names = ", ".join(e.name for e in left)
        for e in left:
            threading.Thread(target=self.stop, args=(e,), daemon=True).start()
        if self.waited_out or self.left() <= 0:
            r.say(f"pdsvc profile: told {names} to stop; the bound has passed: releasing the "
                  "hold (an engine still writing is judged by its runtime again)")
            return
        r.say(f"pdsvc profile: ending the capture on {names} and waiting up to "
              f"{self.left():.0f} s for its traces before the hold is released"
              + (f" ({r.second_interrupt})" if r.second_interrupt else ""))
        try:
            for e in left:
                with contextlib.suppress(ProfileError):
                    r.waits.traces(e, r.root / e.name, self.stage(e), self.left())
                r.waits.healthy(e, min(HEALTHY_WAIT_S, self.left()))
        except KeyboardInterrupt:
            r.say("pdsvc profile: releasing the hold now")

    def stop(self, e: Engine) -> None:
        """/stop_profile: the write comes before the reply, or 500 when no capture runs (it
        stopped itself after its steps; with --by-stage, also one still armed: SGLang cannot
        cancel that)."""
        status, _ = capture.stop(self.r.host, e, max(1.0, self.left()))
        if status == 500 and self.r.opts.by_stage and \
                not any((self.r.root / e.name).glob("*.trace.json.gz")):
            self.r.say(f"pdsvc profile: warning: {e.name}: its by-stage capture may still be "
                       "armed, and SGLang cannot cancel an armed one (its /stop_profile answers "
                       "500 until a step runs): it would capture and write at its next "
                       "requests, with no hold")


@contextlib.contextmanager
def only_run(root: Path) -> Iterator[None]:
    """One `pdsvc profile` at a time per deployment (an flock beside its runs' traces)."""
    path = root / ".lock"
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise CannotProfile(f"another pdsvc profile runs ({fh.read().strip() or path})",
                                hint="wait for it to end") from None
        fh.truncate(0)
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        yield


def serving(target: Target) -> None:
    """CannotProfile unless the router serves this deployment (the load goes through it)."""
    other = foreign(target)
    if other is not None:
        raise CannotProfile(f"the router does not serve this deployment: {other.why}",
                            hint="see `pdsvc status`, or --no-load to capture live traffic")


def profile_running(run: Run) -> ProfileRun:
    """A whole run on the running deployment (`pdsvc profile`, `pdsvc tune --profile`): the
    engines selected and asked for their server info, the load started through the router,
    each role captured, the load stopped, the breakdown kept as RUN/profile.json. The caller
    turns signals into KeyboardInterrupt: the run winds down cleanly on one."""
    for line in run.prepare():
        run.say(f"pdsvc profile: {line}")
    load = None
    if run.opts.load:
        serving(run.target())
        load = Background(run.target(), load_of(run.opts, run.concurrency()),
                          run.root / "bench_serving.log")
    run.make_dirs()
    with only_run(run.root.parent):
        try:
            result = run.execute(load)
        finally:
            if load is not None:
                load.stop()
    (run.root / "profile.json").write_text(json.dumps(report.document(result), indent=1))
    return result
