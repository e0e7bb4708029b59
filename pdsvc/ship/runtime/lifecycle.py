"""One unit's life: its explicit states (states.py), walked by one loop, and what each does.

Signal handlers only record a stop (child.Child; gunicorn's arbiter: handlers queue, one loop
dispatches); ``Unit.run`` is that loop: it calls the current state's step, which does the
state's work and names the next state, until EXITED; each transition is marked where it is
taken (``# STARTING -> SERVING``). What SERVING does is serving.py's; how a run stops and the
exit status it ends in, stopping.py's; the policy (policy.py's RestartPolicy) remembers across
runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from .canary import Canary, Pair
from .cascade import Cascade
from .child import Child
from .duties import Duties
from .endings import Ending, Exit
from .events import StopAsked, watch_child
from .fleet import share
from .gpu import GpuWait, wait_gpus_idle
from .hold import Hold
from .jitlock import JitLock, engine_fingerprint
from .leaving import leave_within
from .membership import Routers, Worker, call_timeout, read_key
from .notify import Log, Notifier, watchdog_hint, watchdog_secs
from .options import Options
from .phases import End, Outcome, wait_for_urls, wait_until_healthy
from .policy import RestartPolicy, gave_up_engines
from .probe import (
    ProbeResult,
    base_url,
    http_probe,
    liveness_url_for,
    router_start_probe,
)
from .proctree import become_subreaper
from .profiled import Profiled
from .rounds import CanaryThread, own_failures, queued
from .serving import Serving
from .statefile import Kind, state_path
from .states import Machine, State
from .stopping import Stopping, give_up
from .timings import (
    BACKOFF_LOOK_S,
    LIVENESS_PROBE_MIN_S,
    START_PROBE_TIMEOUT_S,
)
from .waiting import aside


def probes_for(args: Options, log: Log) -> tuple[Callable[[], ProbeResult], str, str]:
    """(start-phase probe, what it waits for, liveness URL) for the mode."""
    if args.mode == "engine":
        url = args.health_url
        return (lambda: http_probe(url, START_PROBE_TIMEOUT_S)), url, url
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env) or None
        if api_key is None:
            log(f"--api-key-env {args.api_key_env}: variable not set; probing without a key")
    probe = router_start_probe(
        args.readiness_url, args.generate_url, api_key, args.generate_timeout
    )
    what = f"{args.readiness_url} + a good completion via {args.generate_url}"
    return probe, what, args.liveness_url or liveness_url_for(args.readiness_url)


class Unit:
    """One run of one unit's main process."""

    def __init__(self, args: Options, command: Sequence[str],
                 duties: Duties | None = None) -> None:
        self.args, self.command = args, list(command)
        self.role = args.mode
        self.log = Log(args.name)
        self.duties = duties or Duties(None, self.log)  # its threads' failures (duties.py)
        self.notifier = Notifier(self.log)
        self.child = Child(self.log, self.notifier, self.role, kill_tree=args.kill_tree,
                           prefix_output=args.prefix_output)
        self.child.duties = self.duties
        state = args.state_dir
        self.policy = RestartPolicy(
            state_path(state, args.name, Kind.RESTART) if state else None,
            restart_delay=args.restart_delay,
            max_delay=args.restart_max_delay, reset_after=args.restart_reset,
            attempts=args.start_attempts, log=self.log)
        self.canary_path = state_path(state, args.name, Kind.CANARY) if state else None
        self.hold = Hold.of(state, args.name, self.log)  # pdsvc apply's, while it rolls a change
        self.profiled: Profiled | None = None  # pdsvc profile's hold (engines with a state dir)
        self.jit: JitLock | None = None
        self.membership: Routers | None = None
        self.canary: Canary | None = None  # the pair canary's judgment (engines with pairs)
        self.rounds: CanaryThread | None = None  # and the thread that runs its rounds
        self.cascade = Cascade.of(args, self.log)  # an engine with pairs and a state dir
        self.began: float | None = None  # wall clock: when this run's child was started
        self.gave_up: list[str] = []  # router: engines of this host that gave up (--engine)
        self.machine = Machine()
        self.delay = (0.0, "")  # the restart policy's back-off for this start, and why
        self.liveness_url = ""
        self.outcome: Outcome | None = None  # how STARTING or SERVING ended
        self.code: int | None = None  # the exit status, once EXITED
        self.steps: dict[State, Callable[[], State]] = {
            State.PREFLIGHT: self.preflight, State.BACKOFF: self.backoff,
            State.WAIT_GPUS: self.wait_gpus, State.JIT_LOCK: self.jit_lock,
            State.STARTING: self.starting, State.SERVING: self.serve,
            State.STOPPING: self.stopping,
        }

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def entered(self) -> list[tuple[State, float]]:
        return self.machine.entered

    @entered.setter
    def entered(self, value: list[tuple[State, float]]) -> None:
        self.machine.entered = value

    def start_phases(self) -> dict[str, float]:
        """Seconds this start spent in each state before SERVING (the last entered)."""
        return self.machine.start_phases()

    # ---------------------------------------------------------------- the loop
    def run(self) -> int:
        """The one loop: each step does its state's work and names the next state."""
        self.child.install_signal_handlers()
        while self.machine.state is not State.EXITED:
            self.machine.enter(self.steps[self.machine.state]())
        assert self.code is not None
        return self.code

    def exit(self, code: int) -> State:
        self.code = code
        return State.EXITED

    def stopped_before_start(self) -> State:
        self.log(f"stopped before the {self.role} was started")
        self.policy.on_stop("stopped before the start", asked=True)
        return self.exit(0)  # (before STARTING) -> EXITED

    # ---------------------------------------------------------------- before the start
    def preflight(self) -> State:
        """PREFLIGHT: subreaper, --wait-for, then the restart policy's verdict on this start."""
        a, child, log = self.args, self.child, self.log
        if a.kill_tree:
            failed_subreaper = become_subreaper()
            if failed_subreaper:
                log(f"cannot become a child subreaper ({failed_subreaper}): descendants that "
                    "leave the process group may survive a stop")
        if a.wait_for and not wait_for_urls(
            a.wait_for, log=log, status=self.notifier.status, poll_interval=a.poll_interval,
            progress_every=a.progress_every, should_stop=child.stopping,
        ):
            log(f"stopped while waiting for {', '.join(a.wait_for)}")
            return self.exit(0)  # PREFLIGHT -> EXITED
        # back off first: a crash in a row waits before it holds the GPUs' check or the JIT
        # compile lock, which other engines may be waiting for
        verdict = self.policy.on_start()
        if verdict.delay > 0:
            self.delay = (verdict.delay, verdict.why)
            return State.BACKOFF  # PREFLIGHT -> BACKOFF
        return self.after_backoff()

    def backoff(self) -> State:
        """BACKOFF: crashes in a row wait longer (systemd 252 has no RestartSteps=)."""
        delay, why = self.delay
        self.notifier.status(why)
        self.log(why)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if self.child.stopping():
                return self.stopped_before_start()
            time.sleep(min(BACKOFF_LOOK_S, max(0.0, deadline - time.monotonic())))
        if self.child.stopping():
            return self.stopped_before_start()
        return self.after_backoff()

    def after_backoff(self) -> State:
        """The router's key (engines), then the GPUs, the JIT lock or the start: what applies."""
        refused = self.setup_membership()
        if refused is not None:
            return self.exit(refused)
        a = self.args
        if self.role == "engine" and a.gpus:
            return State.WAIT_GPUS  # PREFLIGHT | BACKOFF -> WAIT_GPUS
        return self.after_gpus()

    def after_gpus(self) -> State:
        a = self.args
        if self.role == "engine" and a.jit_cache:
            key = f"{a.jit_key}@{engine_fingerprint()}"
            jit = JitLock(a.jit_cache, key, a.name, self.log, a.progress_every)
            self.jit = jit
            if not jit.is_warm():
                return State.JIT_LOCK  # ... -> JIT_LOCK: a cold cache
            self.log(f"JIT cache warm for {a.jit_key}: starting without the compile lock")
        return self.after_jit()

    def after_jit(self) -> State:
        if self.child.stopping():
            return self.stopped_before_start()
        return State.STARTING  # ... -> STARTING: run the child

    def wait_gpus(self) -> State:
        """WAIT_GPUS: the engine starts only on idle GPUs (a bounded wait)."""
        a, gpus = self.args, self.args.gpus or []
        self.notifier.status(f"checking that GPUs {','.join(map(str, gpus))} are idle")
        result = wait_gpus_idle(a.nvidia_smi, gpus, self.log, self.notifier.status,
                                timeout=a.gpu_wait, progress_every=a.progress_every,
                                should_stop=self.child.stopping)
        if result is GpuWait.IDLE:
            return self.after_gpus()
        if result is GpuWait.STOPPED:
            return self.exit(0)
        busy = result is GpuWait.BUSY
        self.notifier.status("refused to start: " + ("GPUs busy" if busy else "nvidia-smi failed"))
        self.policy.on_stop(f"did not start: GPUs {'busy' if busy else 'unknown'}")
        return self.exit(Exit.REFUSED)

    def jit_lock(self) -> State:
        """JIT_LOCK: take the compile lock while the cache is cold for this engine."""
        a, jit = self.args, self.jit
        assert jit is not None
        try:
            taken = jit.acquire(
                should_stop=self.child.stopping,
                on_wait=lambda holder: self.notifier.status(
                    f"JIT cache cold: waiting for {holder} to finish compiling"),
            )
        except OSError as exc:
            self.log(f"cannot use JIT cache {a.jit_cache}: {exc}")
            return self.exit(Exit.REFUSED)
        if not taken:
            self.log("stopped while waiting for the JIT compile lock")
            return self.exit(0)
        self.log(f"JIT cache cold for {a.jit_key}: holding {jit.lock_path} until healthy, "
                 "so engines sharing this cache compile one at a time")
        return self.after_jit()

    def setup_membership(self) -> int | None:
        a = self.args
        if self.role != "engine" or not a.router:
            return None
        try:
            key = read_key(a.control_plane_key)
        except (OSError, ValueError) as exc:
            why = f"cannot read the router's control-plane key: {exc}"
            self.log(why)
            # a config problem: it counts as a failed start
            if self.policy.record_end(Ending.FAILED_START, why) is Ending.GAVE_UP:
                return give_up(self.log, self.notifier, self.policy.state.reason)
            return Exit.USAGE
        assert a.role is not None  # parse_args: --router needs --role
        worker = Worker(a.advertise or base_url(a.health_url), a.role, a.bootstrap_port)
        watchdog = a.watchdog_secs or watchdog_secs()  # supervisord's bound, or systemd's
        membership = Routers(a.router, worker, key, self.log, held=self.hold.out,
                             timeout=call_timeout(watchdog, a.liveness_interval,
                                                  a.liveness_timeout, len(a.router)))
        if self.cascade is not None:  # heals and cures of the other hosts (fleet.py)
            share(a, key, self.cascade, self.log, self.duties)
        self.membership = membership
        return None

    # ---------------------------------------------------------------- the start
    def starting(self) -> State:
        """STARTING: run the child and probe it until healthy, it exits, or a stop arrives."""
        a, child, log = self.args, self.child, self.log
        self.notifier.status(f"starting {self.role}")
        probe, what, self.liveness_url = probes_for(a, log)
        probe = self.unless_engines_gave_up(probe)
        self.began = time.time()
        failed = child.start(self.command)
        if failed is not None:
            why = f"cannot execute {self.command[0]}"
            if self.policy.record_end(Ending.FAILED_START, why) is Ending.GAVE_UP:
                return self.exit(give_up(self.log, self.notifier, self.policy.state.reason))
            return self.exit(failed)
        self.notifier.status(f"waiting for {what}")
        started = time.monotonic()

        def late() -> bool:
            return a.start_timeout is not None and time.monotonic() - started >= a.start_timeout

        cure = [""]  # a heal cascade's cure (cascade.py) restarts a loading engine too

        def cured() -> bool:
            cure[0] = (self.cascade.due(self.began, time.monotonic()) or "") if self.cascade \
                else ""
            return bool(cure[0])

        outcome = wait_until_healthy(
            probe, child.wait, what=what, log=log, status=self.notifier.status,
            poll_interval=a.poll_interval, progress_every=a.progress_every,
            should_stop=lambda: child.stopping() or late() or cured(), started=started,
        )
        if outcome.kind == End.STOP and not child.stopping():
            # the cure (the heal's path), else our own start deadline, before systemd's
            # TimeoutStartSec= (whose SIGTERM would look like any stop): a start that never got
            # healthy, and counts as one
            elapsed = time.monotonic() - started
            outcome = Outcome(Ending.HEAL, elapsed=elapsed, detail=cure[0]) if cure[0] else \
                Outcome(Ending.LATE, elapsed=elapsed,
                        detail=f"not healthy within --start-timeout {a.start_timeout:g} s")
        self.outcome = outcome
        # STARTING -> SERVING once healthy; STARTING -> STOPPING otherwise
        return State.SERVING if outcome.kind == End.HEALTHY else State.STOPPING

    def unless_engines_gave_up(self, probe: Callable[[], ProbeResult]
                               ) -> Callable[[], ProbeResult]:
        """Router: the start probe waits for a generation through a prefill and a decode,
        which an engine that gave up (exit 78: not restarted) can no longer serve. Once one
        of this host's engines (--engine) gave up, the wait ends: READY=1 with the reason in
        the status, so that `systemctl start` returns and the target's gate names it."""
        names = self.args.engine
        if self.role != "router" or not names:
            return probe
        since = time.time()

        def check() -> ProbeResult:
            self.gave_up = gave_up_engines(self.args.state_dir, names, since, time.time())
            if self.gave_up:
                return ProbeResult(True, "; ".join(self.gave_up))
            return probe()

        return check

    # ---------------------------------------------------------------- serving
    def serving(self) -> Serving:
        """SERVING's state and duties (serving.py), from this run's parts."""
        serving = Serving(self.args, self.log, self.notifier, self.policy, self.membership,
                          self.cascade, self.canary, self.rounds, self.began,
                          duties=self.duties)
        state = self.args.state_dir
        if self.role == "engine" and state:
            serving.profiled = self.profiled = Profiled(
                self.hold, state_path(state, self.args.name, Kind.PROFILE), self.log,
                self.membership)
        return serving

    def start_canary(self) -> None:
        a = self.args
        if self.role != "engine" or not a.pair:
            return
        me = a.advertise or base_url(a.health_url)
        pairs = [Pair(p, int(b) if b not in ("", "none") else None, d) for p, b, d in a.pair]
        canary = Canary(me, pairs, failures_to_act=a.canary_failures, log=self.log,
                        path=self.canary_path, followers=a.follower, hold=self.hold)
        # real traffic that failed through a pair shows in this engine's own counters
        failures = own_failures(f"{base_url(a.health_url)}/metrics")
        self.canary = canary
        # a round that waits behind a queue is busy, not failed: each engine's own queue
        self.rounds = CanaryThread(canary, a.canary_interval, a.canary_timeout,
                                   failures=failures, queue=queued, duties=self.duties)
        if self.membership is not None:
            self.membership.admit = canary.admits
        self.rounds.start()

    def serve(self) -> State:
        """SERVING: join the router, READY=1, then liveness, membership and the canary."""
        a, log, liveness_url = self.args, self.log, self.liveness_url
        healthy = self.outcome
        assert healthy is not None
        self.policy.on_healthy(self.start_phases())
        if self.jit is not None and self.jit.held:
            self.jit.mark_warm()
            log(f"JIT cache for {a.jit_key} marked warm; compile lock released")
        # the canary first: joins wait for good pairs with listed engines (Canary.admits)
        self.start_canary()
        if self.membership is not None:
            # before READY=1: ordering waits for a routable engine; aside, so that a stop is
            # seen at once while a router that does not answer holds the call
            membership = self.membership
            aside(membership.join, self.child.stopping)
        serving = f"serving on {base_url(liveness_url)} (healthy after {healthy.elapsed:.1f} s)"
        if self.gave_up:
            serving = (f"up on {base_url(liveness_url)} but not serving: "
                       f"{'; '.join(self.gave_up)}")
            log(f"{serving}: READY=1 without a generation, so that the start ends now; the "
                "router serves once that engine is fixed and started again")
        self.notifier("READY=1", f"STATUS={serving}")
        if not self.gave_up:
            log(f"healthy after {healthy.elapsed:.1f} s")
        watchdog_hint(a.liveness_interval, a.liveness_timeout, log)
        serving_ = self.serving()
        self.child.on_stop = lambda signo: serving_.inbox.post(StopAsked(signo))
        if self.child.stopping():  # a stop that came before the hook
            serving_.inbox.post(StopAsked(self.child.stop_signal or 0))
        assert self.child.process is not None
        watch_child(self.child.process, serving_.inbox, self.duties)
        self.outcome = serving_.run(
            lambda: http_probe(liveness_url, max(LIVENESS_PROBE_MIN_S, a.liveness_timeout)),
            serving_status=serving, hang_after=a.watchdog_secs, stopping=self.child.stopping,
            reap=self.child.reap_adopted if a.kill_tree else None)
        self.child.on_stop = None
        return State.STOPPING  # SERVING -> STOPPING

    # ---------------------------------------------------------------- the stop
    def stopping(self) -> State:
        """STOPPING: stop the canary, leave the router, stop the child (stopping.py says
        how, and picks the exit status), release what this run held."""
        outcome = self.outcome
        assert outcome is not None
        if self.rounds is not None:
            self.rounds.stop()
        if self.membership is not None and self.child.process is not None:
            # first: no new request reaches an engine that drains
            leave_within(self.membership, self.log)
        stop = Stopping(self.args, self.role, self.log, self.notifier, self.child, self.policy,
                        served=State.SERVING in self.machine.visited)
        code = stop.run(outcome)
        self.child.kill_leftovers()
        if self.jit is not None:
            self.jit.release()
        return self.exit(code)  # STOPPING -> EXITED


def run(args: Options, command: Sequence[str], duties: Duties | None = None) -> int:
    """Supervise one engine or the router; returns the exit status (see cli.EPILOG)."""
    started = time.monotonic()
    code = Unit(args, command, duties).run()
    # supervisord judges an exit code against exitcodes= only once the process has been
    # RUNNING startsecs; a give-up sooner is a failed spawn, retried (supervisord's
    # process.py, ProcessStates.STARTING -> BACKOFF), and the give-up would not hold
    left = (args.min_uptime or 0.0) - (time.monotonic() - started)
    if code == Exit.GAVE_UP and left > 0:
        time.sleep(left)
    return code
