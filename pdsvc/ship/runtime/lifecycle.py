"""One unit's life, as explicit states with named transitions (supervisor's process.py model):

  PREFLIGHT ─► BACKOFF ─► WAIT_GPUS ─► JIT_LOCK ─► STARTING ─► SERVING ─► STOPPING ─► EXITED
                (a crash     (busy GPUs:   (cold cache:    (until healthy;  (liveness, the
                 in a row)    bounded wait) one compiler)   READY=1)         router membership,
                                                                             the pair canary)

What ends each state, and what the exit status then says to the process manager, is decided
here and nowhere else; the policy (restart.py's RestartPolicy) remembers across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence

from .canary import HEAL_STAGGER_S, Canary, CanaryThread, Pair, own_failures
from .child import Child, exit_status, supervisor_exit_code
from .codes import (
    EXIT_GAVE_UP,
    EXIT_HUNG,
    EXIT_PEER,
    EXIT_REFUSED,
    EXIT_USAGE,
    KILL_WAIT_S,
)
from .gpu import wait_gpus_idle
from .jitlock import JitLock
from .membership import MEMBERSHIP_RETRY_S, Membership, Worker, read_key
from .notify import Log, Notifier
from .phases import Outcome, PeerWatch, liveness_loop, wait_for_urls, wait_until_healthy
from .policy import GAVE_UP, RestartPolicy
from .probe import (
    START_PROBE_TIMEOUT_S,
    ProbeResult,
    base_url,
    http_probe,
    liveness_url_for,
    router_start_probe,
)
from .proctree import become_subreaper
from .statefile import read_json, state_path


def _watchdog_hint(args: argparse.Namespace, log: Log) -> None:
    """Warn when the liveness cadence cannot keep the unit's watchdog fed."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit():
        if os.environ.get("NOTIFY_SOCKET"):
            log("WatchdogSec= is not set for this unit: failed liveness probes are only logged")
        return
    watchdog = int(usec) / 1e6
    if args.liveness_interval + args.liveness_timeout >= watchdog:
        log(
            f"warning: --liveness-interval {args.liveness_interval:g} s + --liveness-timeout "
            f"{args.liveness_timeout:g} s >= WatchdogSec={watchdog:g} s: a single slow probe "
            "gets the unit killed"
        )


def engine_fingerprint() -> str:
    """What the cached kernels depend on besides the engine's name: the SGLang (and torch)
    versions of this interpreter — the engine's own venv. An upgrade makes the cache cold
    again, so engines serialise their compiles after it too."""
    from importlib import metadata

    parts = []
    for dist in ("sglang", "torch"):
        try:
            parts.append(f"{dist}-{metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"no-{dist}")
    return "_".join(parts)


#: a gave-up state older than the router's start is believed after this many seconds of it
#: (an engine started with the router rewrites its state within a second of its start)
GAVE_UP_GRACE_S = 10.0


def gave_up_engines(state_dir: str | None, names: Sequence[str], since: float,
                    now: float) -> list[str]:
    """The engines (by their runtime's --name) whose restart policy says they gave up during
    this start: at or after ``since`` (wall clock), or before it and still so
    GAVE_UP_GRACE_S later. One line each: the name and its reason."""
    if not state_dir:
        return []
    out = []
    for name in names:
        doc = read_json(state_path(state_dir, name, "restart")) or {}
        ended = doc.get("ended_at")
        if doc.get("phase") != GAVE_UP or not isinstance(ended, (int, float)):
            continue
        if ended >= since or now - since >= GAVE_UP_GRACE_S:
            out.append(f"{name} gave up ({doc.get('reason') or 'no reason recorded'})")
    return out


def probes_for(args: argparse.Namespace, log: Log) -> tuple[Callable[[], ProbeResult], str, str]:
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


def _signal_suffix(returncode: int) -> str:
    if returncode >= 0:
        return ""
    try:
        return f" (killed by {signal.Signals(-returncode).name})"
    except ValueError:
        return f" (killed by signal {-returncode})"


class Unit:
    """One run of one unit's main process."""

    def __init__(self, args: argparse.Namespace, command: Sequence[str]) -> None:
        self.args, self.command = args, list(command)
        self.role = args.mode
        self.log = Log(args.name)
        self.notifier = Notifier(self.log)
        self.child = Child(self.log, self.notifier, self.role, kill_tree=args.kill_tree,
                           prefix_output=args.prefix_output)
        state = args.state_dir
        self.policy = RestartPolicy(
            state_path(state, args.name, "restart") if state else None,
            restart_delay=args.restart_delay,
            max_delay=args.restart_max_delay, reset_after=args.restart_reset,
            attempts=args.start_attempts)
        self.canary_path = state_path(state, args.name, "canary") if state else None
        self.jit: JitLock | None = None
        self.membership: Membership | None = None
        self.canary: CanaryThread | None = None
        self.gave_up: list[str] = []  # router: engines of this host that gave up (--engine)
        self.entered: list[tuple[str, float]] = []  # (state, monotonic) as each was entered
        self.state = "PREFLIGHT"

    def enter(self, state: str, status: str | None = None) -> None:
        self.state = state
        self.entered.append((state, time.monotonic()))
        if status:
            self.notifier.status(status)

    # ---------------------------------------------------------------- preflight states
    def backoff(self) -> bool:
        """BACKOFF: crashes in a row wait longer (systemd 252 has no RestartSteps=). False when
        a stop arrived meanwhile."""
        verdict = self.policy.on_start()
        if verdict.delay <= 0:
            return True
        self.enter("BACKOFF", verdict.why)
        self.log(verdict.why)
        deadline = time.monotonic() + verdict.delay
        while time.monotonic() < deadline:
            if self.child.stopping():
                return False
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return not self.child.stopping()

    def wait_gpus(self) -> int | None:
        """WAIT_GPUS: the exit status when the engine must not start now, else None."""
        a = self.args
        if self.role != "engine" or not a.gpus:
            return None
        self.enter("WAIT_GPUS", f"checking that GPUs {','.join(map(str, a.gpus))} are idle")
        result = wait_gpus_idle(a.nvidia_smi, a.gpus, self.log, self.notifier.status,
                                timeout=a.gpu_wait, progress_every=a.progress_every,
                                should_stop=self.child.stopping)
        if result == "idle":
            return None
        if result == "stopped":
            return 0
        self.notifier.status("refused to start: " + ("GPUs busy" if result == "busy"
                                                     else "nvidia-smi failed"))
        self.policy.on_stop(f"did not start: GPUs {'busy' if result == 'busy' else 'unknown'}")
        return EXIT_REFUSED

    def jit_lock(self) -> int | None:
        """JIT_LOCK: take the compile lock while the cache is cold for this engine."""
        a = self.args
        if self.role != "engine" or not a.jit_cache:
            return None
        key = f"{a.jit_key}@{engine_fingerprint()}"
        jit = JitLock(a.jit_cache, key, a.name, self.log, a.progress_every)
        if jit.is_warm():
            self.log(f"JIT cache warm for {a.jit_key}: starting without the compile lock")
            self.jit = jit
            return None
        self.enter("JIT_LOCK")
        try:
            taken = jit.acquire(
                should_stop=self.child.stopping,
                on_wait=lambda holder: self.notifier.status(
                    f"JIT cache cold: waiting for {holder} to finish compiling"),
            )
        except OSError as exc:
            self.log(f"cannot use JIT cache {a.jit_cache}: {exc}")
            return EXIT_REFUSED
        if not taken:
            self.log("stopped while waiting for the JIT compile lock")
            return 0
        self.log(f"JIT cache cold for {a.jit_key}: holding {jit.lock_path} until healthy, "
                 "so engines sharing this cache compile one at a time")
        self.jit = jit
        return None

    def setup_membership(self) -> int | None:
        a = self.args
        if self.role != "engine" or not a.router:
            return None
        try:
            key = read_key(a.control_plane_key)
        except (OSError, ValueError) as exc:
            why = f"cannot read the router's control-plane key: {exc}"
            self.log(why)
            gave_up = self.policy.on_failed_start(why)  # a config problem: it counts
            if gave_up:
                self.log(gave_up)
                self.notifier.status(gave_up)
                return EXIT_GAVE_UP
            return EXIT_USAGE
        worker = Worker(a.advertise or base_url(a.health_url), a.role, a.bootstrap_port)
        self.membership = Membership(a.router, worker, key, self.log)
        return None

    # ---------------------------------------------------------------- serving duties
    def duties(self, liveness_url: str) -> Callable[[bool], Outcome | None]:
        """What SERVING does besides the liveness probe, each on its own clock."""
        a, log = self.args, self.log
        next_check = 0.0
        peers = None
        if getattr(a, "restart_with", None):
            # a peer probe must not hold up this engine's own probes (and its watchdog)
            peers = PeerWatch(a.restart_with, a.peer_down_probes,
                              min(a.liveness_timeout, a.peer_interval), log=self.log)
            peers.check()  # from the first second: a peer killed now is seen go and return
        next_peer = time.monotonic() + a.peer_interval if peers else float("inf")
        said_wait = [""]
        verdict_since: list[float | None] = [None]

        def run(alive: bool) -> Outcome | None:
            nonlocal next_check, next_peer
            now = time.monotonic()
            if peers is not None and now >= next_peer:
                next_peer = now + a.peer_interval
                restarted = peers.check()
                if restarted:
                    return Outcome("peer", detail=restarted)
            if self.membership is not None and now >= next_check:
                self.membership.check(alive)
                # not (yet) in the router — it restarted, or still drains our previous entry
                # (smg keeps one for seconds): look again soon, not a whole interval later
                next_check = now + (a.membership_interval if self.membership.joined
                                    else min(a.membership_interval, MEMBERSHIP_RETRY_S))
            if self.canary is not None:
                rounds = self.canary.take()
                for r in rounds:
                    self.canary.canary.record(r)
                    if any(one.ok for one in r):
                        self.policy.on_pair_good()
                why = self.canary.canary.verdict() if rounds and alive else None
                if not rounds:
                    pass
                elif not why:
                    verdict_since[0] = None
                else:
                    verdict_since[0] = verdict_since[0] or now
                    turn = self.not_my_turn(now - verdict_since[0])
                    if turn:
                        if turn != said_wait[0]:
                            log(f"{why} — but not now: {turn}")
                            self.notifier.status(f"pair failing, heal waits: {turn}")
                        said_wait[0] = turn
                        why = None
                if why:
                    heal, wait = self.policy.may_heal(a.canary_heals)
                    if heal:
                        self.policy.record_heal()
                        return Outcome("heal", detail=why)
                    if wait != said_wait[0]:  # news only: rounds come every second
                        log(f"{why} — but not now: {wait}")
                        self.notifier.status(f"pair failing, not healed now: {wait}")
                    said_wait[0] = wait
            return None

        return run

    def not_my_turn(self, waited: float) -> str | None:
        """Why a heal of this engine must wait, so that engines of one role heal one at a
        time and another pair serves meanwhile (issue 23), or None. Only with siblings (other
        engines of this role): the only engine of its role has no one to wait for."""
        a = self.args
        if not a.sibling or self.membership is None:
            return None
        if waited < a.heal_turn * HEAL_STAGGER_S:
            return f"its turn among its role comes {a.heal_turn * HEAL_STAGGER_S:g} s in"
        if not self.membership.lists_any(a.sibling):
            return ("the router lists no other healthy engine of this role (one is down or "
                    "healing): healing now would leave no pair serving")
        return None

    def start_canary(self) -> None:
        a = self.args
        if self.role != "engine" or not a.pair:
            return
        me = a.advertise or base_url(a.health_url)
        pairs = [Pair(p, int(b) if b not in ("", "none") else None, d) for p, b, d in a.pair]
        canary = Canary(me, pairs, failures_to_act=a.canary_failures, log=self.log,
                        path=self.canary_path, followers=a.follower)
        # real traffic that failed through a pair shows in this engine's own counters
        failures = own_failures(f"{base_url(a.health_url)}/metrics")
        self.canary = CanaryThread(canary, a.canary_interval, a.canary_timeout,
                                   failures=failures)
        if self.membership is not None:
            self.membership.admit = canary.admits
        self.canary.start()

    # ---------------------------------------------------------------- the run
    def run(self) -> int:
        a, child, log = self.args, self.child, self.log
        child.install_signal_handlers()
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
            return 0
        # back off first: a crash in a row waits before it holds the GPUs' check or the JIT
        # compile lock, which other engines may be waiting for
        if not self.backoff():
            log(f"stopped before the {self.role} was started")
            self.policy.on_stop("stopped before the start", asked=True)
            return 0
        for step in (self.setup_membership, self.wait_gpus, self.jit_lock):
            refused = step()
            if refused is not None:
                return refused
        if child.stopping():
            log(f"stopped before the {self.role} was started")
            self.policy.on_stop("stopped before the start", asked=True)
            return 0
        probe, what, liveness_url = probes_for(a, log)
        probe = self.unless_engines_gave_up(probe)
        self.enter("STARTING", f"starting {self.role}")
        failed = child.start(self.command)
        if failed is not None:
            why = self.policy.on_failed_start(f"cannot execute {self.command[0]}")
            return EXIT_GAVE_UP if why else failed
        self.notifier.status(f"waiting for {what}")
        started = time.monotonic()

        def late() -> bool:
            return a.start_timeout is not None and time.monotonic() - started >= a.start_timeout

        outcome = wait_until_healthy(
            probe, child.wait, what=what, log=log, status=self.notifier.status,
            poll_interval=a.poll_interval, progress_every=a.progress_every,
            should_stop=lambda: child.stopping() or late(), started=started,
        )
        if outcome.kind == "stop" and not child.stopping():
            # our own start deadline, before systemd's TimeoutStartSec= (whose SIGTERM would
            # look like any stop): a start that never got healthy, and counts as one
            outcome = Outcome("late", elapsed=time.monotonic() - started,
                              detail=f"not healthy within --start-timeout {a.start_timeout:g} s")
        served = outcome.kind == "healthy"
        if served:
            outcome = self.serve(outcome, liveness_url)
        return self.finish(outcome, served)

    def start_phases(self) -> dict[str, float]:
        """Seconds this start spent in each state before SERVING (the last entered)."""
        out: dict[str, float] = {}
        for (state, t0), (_, t1) in zip(self.entered, self.entered[1:], strict=False):
            key = state.lower()
            out[key] = round(out.get(key, 0.0) + (t1 - t0), 3)
        return out

    def unless_engines_gave_up(self, probe: Callable[[], ProbeResult]
                               ) -> Callable[[], ProbeResult]:
        """Router: the start probe waits for a generation through a prefill and a decode,
        which an engine that gave up (exit 78: not restarted) can no longer serve. Once one
        of this host's engines (--engine) gave up, the wait ends: READY=1 with the reason in
        the status, so that `systemctl start` returns and the target's gate names it."""
        names = getattr(self.args, "engine", None)
        if self.role != "router" or not names:
            return probe
        since = time.time()

        def check() -> ProbeResult:
            self.gave_up = gave_up_engines(self.args.state_dir, names, since, time.time())
            if self.gave_up:
                return ProbeResult(True, "; ".join(self.gave_up))
            return probe()

        return check

    def serve(self, healthy: Outcome, liveness_url: str) -> Outcome:
        """SERVING: join the router, READY=1, then liveness, membership and the canary."""
        a, log = self.args, self.log
        self.enter("SERVING")
        self.policy.on_healthy(self.start_phases())
        if self.jit is not None and self.jit.held:
            self.jit.mark_warm()
            log(f"JIT cache for {a.jit_key} marked warm; compile lock released")
        # the canary first: a replaced engine joins the router only once its pairs with the
        # engines the router lists are good (Canary.admits); the first round runs now, and a
        # join it holds back is retried every MEMBERSHIP_RETRY_S by the serving duties
        self.start_canary()
        if self.membership is not None:
            self.membership.join()  # before READY=1: ordering waits for a routable engine
        serving = f"serving on {base_url(liveness_url)} (healthy after {healthy.elapsed:.1f} s)"
        if self.gave_up:
            serving = (f"up on {base_url(liveness_url)} but not serving: "
                       f"{'; '.join(self.gave_up)}")
            log(f"{serving}: READY=1 without a generation, so that the start ends now; the "
                "router serves once that engine is fixed and started again")
        self.notifier("READY=1", f"STATUS={serving}")
        if not self.gave_up:
            log(f"healthy after {healthy.elapsed:.1f} s")
        _watchdog_hint(a, log)
        return liveness_loop(
            lambda left=a.liveness_timeout: http_probe(
                liveness_url, max(0.05, round(min(a.liveness_timeout, left), 2))
            ),
            self.child.wait,
            interval=a.liveness_interval,
            log=log,
            notify=self.notifier,
            serving_status=serving,
            should_stop=self.child.stopping,
            hang_after=a.watchdog_secs,
            duties=self.duties(liveness_url),
        )

    def finish(self, outcome: Outcome, served: bool) -> int:
        """STOPPING → EXITED: leave the router, stop the child, say why, pick the exit status."""
        a, child, log, role = self.args, self.child, self.log, self.role
        self.enter("STOPPING")
        if self.canary is not None:
            self.canary.stop()
        if self.membership is not None and child.process is not None:
            self.membership.leave()  # first: no new request reaches an engine that drains
        own_stop = outcome.kind in ("peer", "heal", "late")
        if own_stop:
            assert child.process is not None
            why = {"peer": "restarting with its peer", "heal": "restarting to heal its pair",
                   "late": "giving up this start"}[outcome.kind]
            log(f"{outcome.detail}; {why}: stopping the {role} (SIGTERM) and exiting "
                f"{EXIT_PEER} so that the process manager restarts it")
            self.notifier.status(f"{why}: {outcome.detail}")
            child.stop_time, child.forwarded = time.monotonic(), True
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        hung = outcome.kind == "hung"
        if hung:
            child.kill_now(
                f"no successful liveness probe for {outcome.elapsed:.0f} s "
                f"(--watchdog-secs {a.watchdog_secs:g}): the {role} is hung"
            )
        if outcome.kind == "stop":
            child.forward_stop()
            returncode = child.wait_after_stop(a.progress_every, a.stop_timeout)
        elif own_stop:
            # our own stop, not the manager's: its watchdog still runs, so keep it fed while
            # the engine drains (bounded by --stop-timeout, which the units pass for this)
            returncode = child.wait_after_stop(a.progress_every, a.stop_timeout,
                                               tick=lambda: self.notifier("WATCHDOG=1"))
        elif hung:
            returncode = child.wait(KILL_WAIT_S)
            returncode = -signal.SIGKILL if returncode is None else returncode
        else:
            returncode = outcome.returncode if outcome.returncode is not None else 1
        child.kill_leftovers()
        if self.jit is not None:
            self.jit.release()
        self.enter("EXITED")
        status = exit_status(returncode)
        last_error = child.tap.drain() if child.tap is not None and status != 0 else ""
        asked = child.stop_signal is not None
        said = f"; its last error: {last_error}" if last_error and not asked else ""
        log(f"{role} exited with status {status}" + _signal_suffix(returncode) + said)
        if said:
            self.notifier.status(f"{role} exited with status {status}: {last_error}")
        code = supervisor_exit_code(returncode, child.stop_signal)
        ended = f"{role} exited with status {status}" + (f": {last_error}" if last_error else "")
        if asked:
            self.policy.on_stop(f"stopped ({signal.Signals(child.stop_signal).name})",
                                asked=True)
            stop_name = signal.Signals(child.stop_signal).name
            verdict = "a clean stop" if code == 0 else "a failed stop"
            log(f"after {stop_name}: treating it as {verdict}; exiting {code}")
            return code
        if outcome.kind == "late":
            gave_up = self.policy.on_failed_start(outcome.detail)
            if gave_up:
                log(gave_up)
                self.notifier.status(gave_up)
                return EXIT_GAVE_UP
            return EXIT_REFUSED
        if own_stop:
            self.policy.on_stop(outcome.detail)
            return EXIT_PEER
        if hung:
            self.policy.on_crash(f"hung: no good liveness probe for {outcome.elapsed:.0f} s")
            log(f"exiting {EXIT_HUNG} so that the process manager restarts the {role}")
            return EXIT_HUNG
        if served:
            self.policy.on_crash(ended)
            return code
        gave_up = self.policy.on_failed_start(ended)
        if gave_up:
            log(gave_up)
            log(f"exiting {EXIT_GAVE_UP}: not restarted (RestartPreventExitStatus=); fix the "
                "cause, then start the unit again")
            self.notifier.status(gave_up)
            return EXIT_GAVE_UP
        return code


def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Supervise one engine or the router; returns the exit status (see cli.EPILOG)."""
    started = time.monotonic()
    code = Unit(args, command).run()
    # supervisord judges an exit code against exitcodes= only once the process has been
    # RUNNING startsecs; a give-up sooner is a failed spawn, retried (supervisord's
    # process.py, ProcessStates.STARTING -> BACKOFF), and the give-up would not hold
    left = (getattr(args, "min_uptime", None) or 0.0) - (time.monotonic() - started)
    if code == EXIT_GAVE_UP and left > 0:
        time.sleep(left)
    return code
