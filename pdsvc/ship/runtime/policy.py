"""The restart policy: heal transient faults forever, give up only on real misconfiguration.

systemd's ``StartLimitBurst=`` counts every start alike: the first one, an operator's
``systemctl restart``, a restart that ``PartOf=`` propagated, and a crash's restart
(systemd.unit(5)); a unit that trips it stays failed until ``systemctl reset-failed``. And
systemd 252 has no ``RestartSteps=``/``RestartMaxDelaySec=`` (added in v254) to back off. So the
units turn the start limit off and keep ``RestartSec=`` short, and this module, run by the
unit's main process, keeps what systemd cannot: why the last run ended, in a small JSON file in
the unit's ``StateDirectory=``.

* An engine that crashes after it has served is always restarted. The delay doubles while
  crashes repeat (``RestartSec=`` × 2^(n-1), at most ``max_delay``), and resets once the engine
  has served ``reset_after`` seconds in a row.
* An engine that fails to become healthy ``attempts`` starts in a row (a missing model, OOM at
  load, a flag SGLang rejects) gives up: the main process exits ``Exit.GAVE_UP`` (endings.py),
  which the unit lists in ``RestartPreventExitStatus=``, with the reason in one line.
* A stop (operator, ``PartOf=``, a pair heal) is neither a crash nor a failed start.
* Giving up clears the count, so the operator's next ``systemctl start`` tries afresh.

The state file is written atomically (rename) and read leniently: a missing or unreadable file
is a first start, never a reason to refuse one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from .endings import Ending, Phase
from .statefile import Kind, read_known, state_path, write_state
from .timings import GAVE_UP_GRACE_S, HEAL_WINDOW_S, SLOW_HEAL_S


@dataclass
class RunState:
    """What one unit's previous runs left behind (the file's JSON object)."""

    phase: str = Phase.STOPPED.value  # how the last run stands (endings.Phase)
    failed_starts: int = 0  # starts in a row that ended before the engine was healthy
    crashes: int = 0  # crashes in a row after serving, each less than reset_after after healthy
    serving_since: float | None = None  # wall clock, while serving
    ended_at: float | None = None  # wall clock of the last run's end
    reason: str = ""  # the last run's end in one line (shown by `pdsvc status`)
    heals: list[float] = field(default_factory=list)  # wall clock of each pair heal (canary)
    # every heal within HEAL_WINDOW_S, a good pair or not (cascade.py reads every engine's),
    # and this engine's role (prefill | decode) when it has pairs
    heal_log: list[float] = field(default_factory=list)
    role: str = ""
    # the last start that served: seconds in each phase before it did (backoff, wait_gpus,
    # jit_lock, starting), for `pdsvc status --metrics` and the textfile
    start_phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """What to do before this start: wait ``delay`` seconds (``why`` says why)."""

    delay: float
    why: str


class RestartPolicy:
    """The previous runs of one unit, and what they mean for this one."""

    def __init__(self, path: str | None, *, restart_delay: float, max_delay: float,
                 reset_after: float, attempts: int,
                 clock: Callable[[], float] = time.time,
                 log: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.log = log  # says that the file is of a newer format (then: a first start)
        self.restart_delay = restart_delay
        self.max_delay = max_delay
        self.reset_after = reset_after
        self.attempts = attempts
        self.clock = clock
        self.state = self._load()

    # ------------------------------------------------------------------ the file
    def _load(self) -> RunState:
        raw = read_known(self.path, self.log)
        known = {k: v for k, v in (raw or {}).items() if k in RunState.__dataclass_fields__}
        try:
            return RunState(**known)
        except TypeError:
            return RunState()

    def _save(self) -> None:
        if self.path:
            write_state(self.path, asdict(self.state))

    # ------------------------------------------------------------------ transitions
    def on_start(self) -> Verdict:
        """Called once per run, before the engine starts: reads how the last run ended
        (a run that never wrote its end was killed: a crash if it served, else a failed
        start) and returns the delay this start must wait."""
        s, now = self.state, self.clock()
        if s.phase == Phase.SERVING:  # the main process itself died while serving (kill -9)
            self._crashed(now, "the previous run ended without a word (killed while serving)")
        elif s.phase == Phase.STARTING:
            s.failed_starts += 1
            s.reason = "the previous run ended without a word (killed while starting)"
        verdict = Verdict(0.0, "")
        if s.phase == Phase.CRASHED and s.crashes > 1:
            delay = min(self.max_delay, self.restart_delay * (2 ** (s.crashes - 1) - 1))
            verdict = Verdict(delay, f"crash #{s.crashes} in a row ({s.reason}): backing off "
                              f"{delay:g} s more before the restart")
        s.phase, s.serving_since = Phase.STARTING.value, None
        self._save()
        return verdict

    def _crashed(self, now: float, reason: str) -> None:
        s = self.state
        served = now - s.serving_since if s.serving_since is not None else 0.0
        s.crashes = 1 if served >= self.reset_after else s.crashes + 1
        s.failed_starts = 0
        s.phase, s.reason, s.ended_at, s.serving_since = Phase.CRASHED.value, reason, now, None

    def on_healthy(self, phases: dict[str, float] | None = None) -> None:
        s = self.state
        s.phase, s.serving_since, s.failed_starts = Phase.SERVING.value, self.clock(), 0
        if phases is not None:
            s.start_phases = dict(phases)
        self._save()

    def on_crash(self, reason: str) -> None:
        """The engine exited (or hung) after it had served."""
        self._crashed(self.clock(), reason)
        self._save()

    def on_failed_start(self, reason: str) -> str | None:
        """The engine ended before it was healthy, no stop asked for. Returns the one-line
        reason to give up with, or None to let the process manager restart it."""
        s = self.state
        s.failed_starts += 1
        s.phase, s.reason, s.ended_at = Phase.FAILED_START.value, reason, self.clock()
        if s.failed_starts < self.attempts:
            self._save()
            return None
        why = (f"gave up after {s.failed_starts} starts in a row that never became healthy; "
               f"last: {reason}")
        s.phase, s.reason, s.failed_starts, s.crashes = Phase.GAVE_UP.value, why, 0, 0
        self._save()
        return why

    def record_end(self, ending: Ending, reason: str) -> Ending:
        """Record how this run ended (``ending``, in one line: ``reason``); returns the
        ending, ``Ending.GAVE_UP`` when a failed start was the last of ``attempts`` in a row
        (``reason`` is then the give-up's, in the state file)."""
        if ending is Ending.GAVE_UP:
            raise ValueError("a give-up is the policy's verdict, never its input")
        if ending is Ending.ASKED:
            self.on_stop(reason, asked=True)
        elif ending.failed_start:
            return Ending.GAVE_UP if self.on_failed_start(reason) else ending
        elif ending.phase is Phase.CRASHED:
            self.on_crash(reason)
        else:
            self.on_stop(reason)
        return ending

    def on_stop(self, reason: str, *, asked: bool = False) -> None:
        """A stop (operator, coupling, a pair heal): no crash count changes. ``asked``: the
        process manager stopped it (an operator, or ``PartOf=``), not this runtime itself."""
        s = self.state
        was_serving = s.phase == Phase.SERVING
        s.phase, s.reason, s.ended_at = Phase.STOPPED.value, reason, self.clock()
        if asked:
            # an operator's stop or restart starts the heal budget (and the cascade's count)
            # afresh
            s.heals, s.heal_log = [], []
        if was_serving and s.serving_since is not None and \
                s.ended_at - s.serving_since >= self.reset_after:
            s.crashes = 0
        s.serving_since = None
        self._save()

    # ------------------------------------------------------------------ pair heals
    # A heal that worked (the pair served again afterwards) is forgotten: every decode a fleet
    # replaces poisons its prefills again (smg #2382), and each of those is healed. What the
    # budget bounds is heals in a row that did not bring the pair back: a restart storm. Past
    # the budget, heals go on, slower (one per ``slow`` s): nothing ends in a state only an
    # operator can clear, and an operator's stop or restart clears the count (on_stop).
    def may_heal(self, budget: int, window: float = HEAL_WINDOW_S,
                 slow: float = SLOW_HEAL_S) -> tuple[bool, str]:
        """(heal now?, why not) for a pair the canary found to need this engine's restart."""
        now = self.clock()
        self.state.heals = recent_heals(self.state.heals, now, window)
        if budget <= 0:
            return False, "--canary-heals 0: the canary only reports"
        if len(self.state.heals) < budget:
            return True, ""
        wait = self.state.heals[-1] + slow - now
        if wait <= 0:
            return True, ""
        return False, (f"{len(self.state.heals)} heals within {window / 60:g} min did not "
                       f"bring a pair back: the next try in {wait:.0f} s (one every "
                       f"{slow:g} s; `systemctl restart` of the unit starts afresh)")

    def record_heal(self, role: str = "") -> None:
        """A heal now: against the budget, and in the log a heal cascade is judged by
        (cascade.py), which a good pair does not clear."""
        now = self.clock()
        self.state.heals.append(now)
        self.state.heal_log = [*recent_heals(self.state.heal_log, now), now]
        if role:
            self.state.role = role
        self._save()

    def on_pair_good(self) -> None:
        """A canary round went through: the heals before it worked."""
        if self.state.heals:
            self.state.heals = []
            self._save()


def recent_heals(heals: object, now: float, window: float = HEAL_WINDOW_S) -> list[float]:
    """The heals (wall clock) within ``window`` of ``now`` that count against the budget; a
    state file's value read leniently (anything but a list of numbers counts none)."""
    if not isinstance(heals, list):
        return []
    return [float(t) for t in heals
            if isinstance(t, (int, float)) and not isinstance(t, bool) and now - t < window]




def gave_up_engines(state_dir: str | None, names: Sequence[str], since: float,
                    now: float) -> list[str]:
    """The engines (by their runtime's --name) whose restart policy says they gave up during
    this start: at or after ``since`` (wall clock), or before it and still so
    GAVE_UP_GRACE_S later. One line each: the name and its reason."""
    if not state_dir:
        return []
    out = []
    for name in names:
        doc = read_known(state_path(state_dir, name, Kind.RESTART)) or {}
        ended = doc.get("ended_at")
        if doc.get("phase") != Phase.GAVE_UP or not isinstance(ended, (int, float)):
            continue
        if ended >= since or now - since >= GAVE_UP_GRACE_S:
            out.append(f"{name} gave up ({doc.get('reason') or 'no reason recorded'})")
    return out
