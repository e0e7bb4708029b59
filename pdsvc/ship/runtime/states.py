"""The explicit states of one unit's run and the transitions allowed between them, as supervisor's
ProcessStates (supervisor/states.py, with process.py's _assertInState) has them for a program:

  PREFLIGHT ─► BACKOFF ─► WAIT_GPUS ─► JIT_LOCK ─► STARTING ─► SERVING ─► STOPPING ─► EXITED
                (a crash     (busy GPUs:   (cold cache:    (until healthy;  (liveness, the
                 in a row)    bounded wait) one compiler)   READY=1)         router membership,
                                                                             the pair canary)

A state a run does not need is skipped (no back-off after a good run, no GPU check for the
router, no lock for a warm cache); a run refused before its start goes straight to EXITED. Every
other step is an error of the runtime itself: ``Machine.enter`` raises rather than carry on.

How a run ended, once it stops, is an ``Ending`` (endings.py): what the restart policy records
and what the exit status says to the process manager follow from it alone.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class State(enum.Enum):
    PREFLIGHT = "preflight"  # --wait-for, the restart policy's verdict
    BACKOFF = "backoff"  # crashes in a row wait longer
    WAIT_GPUS = "wait_gpus"  # the engine's GPUs must be idle
    JIT_LOCK = "jit_lock"  # one cold compile at a time per JIT cache
    STARTING = "starting"  # the child runs; probing until healthy
    SERVING = "serving"  # READY=1; liveness, membership, the pair canary
    STOPPING = "stopping"  # leave the router, stop the child, pick the exit status
    EXITED = "exited"  # the exit status is known


_S = State
#: state -> the states it may go to. Skipping ahead is allowed (a state a run does not need);
#: going back is not: a new attempt is a new run, started by the process manager.
TRANSITIONS: dict[State, frozenset[State]] = {
    _S.PREFLIGHT: frozenset({_S.BACKOFF, _S.WAIT_GPUS, _S.JIT_LOCK, _S.STARTING, _S.EXITED}),
    _S.BACKOFF: frozenset({_S.WAIT_GPUS, _S.JIT_LOCK, _S.STARTING, _S.EXITED}),
    _S.WAIT_GPUS: frozenset({_S.JIT_LOCK, _S.STARTING, _S.EXITED}),
    _S.JIT_LOCK: frozenset({_S.STARTING, _S.EXITED}),
    _S.STARTING: frozenset({_S.SERVING, _S.STOPPING, _S.EXITED}),  # EXITED: cannot execute
    _S.SERVING: frozenset({_S.STOPPING}),
    _S.STOPPING: frozenset({_S.EXITED}),
    _S.EXITED: frozenset(),
}

#: The states whose time a start spends before SERVING, reported as its start phases.
TIMED = (_S.BACKOFF, _S.WAIT_GPUS, _S.JIT_LOCK, _S.STARTING, _S.SERVING)


class IllegalTransition(RuntimeError):
    """A step the transition table does not allow: a defect of the runtime, never of a config."""


class Machine:
    """The current state, and when each timed state was entered (monotonic clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.state = State.PREFLIGHT
        self.visited = {State.PREFLIGHT}
        self.entered: list[tuple[State, float]] = []  # (state, monotonic) of each timed state

    def enter(self, new: State) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.state.name} -> {new.name}")
        self.state = new
        self.visited.add(new)
        if new in TIMED:
            self.entered.append((new, self.clock()))

    def start_phases(self) -> dict[str, float]:
        """Seconds this start spent in each timed state before the last one entered (SERVING,
        once it serves): ``{"wait_gpus": 2.5, "starting": 75.2}``."""
        out: dict[str, float] = {}
        # by index, not zip(strict=...): that keyword is Python 3.10's, and this runs on 3.9
        for i in range(1, len(self.entered)):
            (state, t0), (_, t1) = self.entered[i - 1], self.entered[i]
            out[state.value] = round(out.get(state.value, 0.0) + (t1 - t0), 3)
        return out
