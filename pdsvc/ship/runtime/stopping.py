"""STOPPING: how the child is stopped for each way a run ends, and the exit status it ends in.

An Outcome ended STARTING or SERVING; here it becomes the run's Ending (endings.py), in this
order: a stop signal from the process manager (ASKED), the runtime's own decision (PEER, HEAL,
LATE, HUNG), else CRASHED if the engine served, FAILED_START if not. The restart policy records
it (policy.RestartPolicy.record_end), which may make a failed start a give-up.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from .child import Child, exit_status, runtime_exit_code
from .endings import Ending, Exit
from .notify import Notifier
from .options import Options
from .phases import End, Outcome
from .policy import RestartPolicy
from .probe import NoAnswerKind, http_probe
from .timings import DUTY_SLICE_S, KILL_WAIT_S, STOP_JUDGE_S
from .waiting import aside


def _signal_suffix(returncode: int) -> str:
    if returncode >= 0:
        return ""
    try:
        return f" (killed by {signal.Signals(-returncode).name})"
    except ValueError:
        return f" (killed by signal {-returncode})"


def give_up(log: Callable[[str], None], notifier: Notifier, why: str) -> int:
    """The last of --start-attempts failed starts in a row: not restarted."""
    log(why)
    log(f"exiting {Exit.GAVE_UP}: not restarted (RestartPreventExitStatus=); fix the cause, "
        "then start the unit again")
    notifier.status(why)
    return Exit.GAVE_UP


@dataclass
class Stopping:
    """STOPPING's state: what it stops, and what it tells."""

    args: Options
    role: str
    log: Callable[[str], None]
    notifier: Notifier
    child: Child
    policy: RestartPolicy
    served: bool  # the run reached SERVING

    def ending(self, kind: End | Ending) -> Ending:
        """How this run ended, from what ended its last loop, whether a stop signal came and
        whether it served; the first that holds (Ending's order)."""
        if self.child.stop_signal is not None:
            return Ending.ASKED
        if isinstance(kind, Ending):
            return kind
        return Ending.CRASHED if self.served else Ending.FAILED_START

    def run(self, outcome: Outcome) -> int:
        """Stop the child as the outcome asks, say why, and pick the exit status."""
        kind, child = outcome.kind, self.child
        own = kind if isinstance(kind, Ending) and kind.own_stop else None
        if own is not None:
            self.stop_own(own, outcome.detail)
        if kind is Ending.HUNG:
            child.kill_now(
                f"no successful liveness probe for {outcome.elapsed:.0f} s "
                f"(--watchdog-secs {self.args.watchdog_secs:g}): the {self.role} is hung"
            )
        returncode = self.wait_child(kind, outcome, own is not None)
        return self.exit_code(self.ending(kind), outcome, returncode)

    def stop_own(self, ending: Ending, detail: str) -> None:
        """Our own stop (a peer's restart, a heal, too late): SIGTERM the child, and say why."""
        child = self.child
        assert child.process is not None
        why = OWN_STOPS[ending]
        self.log(f"{detail}; {why}: stopping the {self.role} (SIGTERM) and exiting "
                 f"{ending.exit} so that the process manager restarts it")
        self.notifier.status(f"{why}: {detail}")
        child.stop_time, child.forwarded = time.monotonic(), True
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)

    def wait_child(self, kind: End | Ending, outcome: Outcome, own_stop: bool) -> int:
        """The child's returncode once it is gone, however it was stopped."""
        a, child = self.args, self.child
        if kind is End.STOP:
            child.forward_stop()
            hung = self.hung_after_stop()
            if hung:
                child.kill_now(hung)
                returncode = child.wait(KILL_WAIT_S)
                return -signal.SIGKILL if returncode is None else returncode
            # systemd stops the unit's watchdog as the stop begins (service.c
            # service_set_state), but a WATCHDOG=1 it reads after that arms it again
            # (service_reset_watchdog looks at no state): a liveness ping sent just before the
            # stop, read late on a busy host. Unfed, that watchdog then kills the runtime
            # mid-drain (SIGABRT, result 'watchdog'). So keep it fed until the child exits;
            # TimeoutStopSec= stays the stop's bound.
            return child.wait_after_stop(a.progress_every, a.stop_timeout, tick=self.feed_watchdog)
        if own_stop:
            # our own stop, not the manager's: its watchdog still runs, so keep it fed while
            # the engine drains (bounded by --stop-timeout, which the units pass for this)
            return child.wait_after_stop(a.progress_every, a.stop_timeout, tick=self.feed_watchdog)
        if kind is Ending.HUNG:
            returncode = child.wait(KILL_WAIT_S)
            return -signal.SIGKILL if returncode is None else returncode
        return outcome.returncode if outcome.returncode is not None else 1

    def feed_watchdog(self) -> None:
        self.notifier("WATCHDOG=1")

    def hung_after_stop(self) -> str:
        """Why the engine is hung, once the stop signal is forwarded: its /health gives no
        answer at all within STOP_JUDGE_S (a draining SGLang answers 503 at once), so no
        drain can come. "" when it answers, exits meanwhile, or has no /health to ask."""
        url, process = self.args.health_url, self.child.process
        if not url or process is None:
            return ""
        answer = aside(lambda: http_probe(url, STOP_JUDGE_S),
                       lambda: process.poll() is not None, DUTY_SLICE_S)
        if answer is None or answer.no_answer is not NoAnswerKind.TIMEOUT:
            return ""
        return (f"{url} gave no answer within {STOP_JUDGE_S:g} s of the stop signal: the "
                f"{self.role} is hung and cannot drain")

    def exit_code(self, ending: Ending, outcome: Outcome, returncode: int) -> int:
        """Say how the child exited, tell the restart policy, and pick the exit status: the
        ending's own (endings.Ending.exit), else the child's."""
        child, log, role = self.child, self.log, self.role
        status = exit_status(returncode)
        last_error = child.tap.drain() if child.tap is not None and status != 0 else ""
        said = f"; its last error: {last_error}" if last_error and ending is not Ending.ASKED \
            else ""
        log(f"{role} exited with status {status}" + _signal_suffix(returncode) + said)
        if said:
            self.notifier.status(f"{role} exited with status {status}: {last_error}")
        code = runtime_exit_code(returncode, child.stop_signal)
        if ending is Ending.ASKED:
            assert child.stop_signal is not None
            stop_name = signal.Signals(child.stop_signal).name
            self.policy.record_end(ending, f"stopped ({stop_name})")
            verdict = "a clean stop" if code == 0 else "a failed stop"
            log(f"after {stop_name}: treating it as {verdict}; exiting {code}")
            return code
        ended = f"{role} exited with status {status}" + (f": {last_error}" if last_error else "")
        reasons = {Ending.HUNG: f"hung: no good liveness probe for {outcome.elapsed:.0f} s",
                   Ending.CRASHED: ended, Ending.FAILED_START: ended}
        final = self.policy.record_end(ending, reasons.get(ending, outcome.detail))
        if final is Ending.GAVE_UP:
            return give_up(self.log, self.notifier, self.policy.state.reason)
        if ending is Ending.HUNG:
            log(f"exiting {Exit.HUNG} so that the process manager restarts the {role}")
        if final.exit is None and code == 0:
            # a server that ends on its own never meant to: Restart=on-failure and
            # supervisord's exitcodes= would take status 0 for a wanted end and leave it down
            log(f"the {role} ended on its own with status 0, no stop asked for: exiting "
                f"{Exit.ENDED} so that the process manager restarts it")
            return Exit.ENDED
        return code if final.exit is None else final.exit


#: the runtime's own stops, and what it says it does
OWN_STOPS = {Ending.PEER: "restarting with its peer",
             Ending.DUTY: "a duty of its runtime cannot go on",
             Ending.HEAL: "restarting to heal its pair",
             Ending.LATE: "giving up this start"}


