"""SERVING's decisions: a pure function of (state, event) -> (state, effects, outcome).

``step`` reads no clock, no socket and no file: the events (events.py) carry what the pollers
found and when, and the effects say what the loop (serving.Serving.run) does about it: a line
in the journal, a message to the process manager, a heal to try. So every decision of SERVING
is unit-tested by feeding it events (tests/test_runtime_watch.py), and the loop does nothing
but wait for the next event and carry out the effects.

  event            state it reads            what follows
  ChildExited      -                         -> outcome EXITED (the run is over)
  StopAsked        -                         -> outcome STOP
  Wake(at)         last_ok                   the watchdog's bound ran out -> outcome HUNG
                   ask_at                    a heal's question due again -> AskTurn
  Probed(ok)       failures                  Ping (WATCHDOG=1), "OK again after N"
  Probed(failed)   failures                  no ping, a status; alive = False
  Probed(excused)  excused                   a failure during a profile hold: Ping, a status
  PeerRestarted    -                         -> outcome PEER
  CureDue          -                         -> outcome HEAL (the cascade's cure)
  PairsJudged      alive, failing_since      PairGood; a verdict while alive -> AskTurn once
  HealSaid         -                         wait -> Wait (and ask_at); else -> outcome HEAL
  DutyFailed       -                         -> outcome DUTY (a duty that cannot go on)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .endings import Ending
from .events import (
    ChildExited,
    CureDue,
    DutyFailed,
    HealSaid,
    PairsJudged,
    PeerRestarted,
    Probed,
    StopAsked,
    Wake,
)
from .phases import End, Outcome

if TYPE_CHECKING:
    from .events import Event


@dataclass(frozen=True)
class Watch:
    """SERVING's state."""

    last_ok: float  # the loop's clock: the last good liveness probe (or healthy)
    failures: int = 0  # liveness probes failed in a row
    alive: bool = True  # whether the last liveness probe passed
    failing_since: float | None = None  # since when the pair canary says heal
    why: str = ""  # ... and why (its last verdict)
    asking: bool = False  # a HealSaid is awaited (one question at a time)
    ask_at: float | None = None  # ask again then, whether a round came or not
    excused: int = 0  # failed probes not judged in a row (a profile hold)


@dataclass(frozen=True)
class Say:
    """A line in the journal."""

    text: str


@dataclass(frozen=True)
class Notify:
    """A message to the process manager (sd_notify fields: WATCHDOG=1, STATUS=...)."""

    fields: tuple[str, ...]


@dataclass(frozen=True)
class PairGood:
    """A pair proved good: the restart policy's heal budget hears of it."""


@dataclass(frozen=True)
class AskTurn:
    """Ask (off the loop) whether a heal may go now among this role's engines."""

    why: str
    waited: float  # seconds the pairs have been failing


@dataclass(frozen=True)
class Wait:
    """A heal must wait: ``reason``; said once per reason."""

    why: str
    reason: str
    status: str


if TYPE_CHECKING:  # for annotations only: "A | B" cannot be evaluated on 3.9
    Effect = Say | Notify | PairGood | AskTurn | Wait


@dataclass(frozen=True)
class Decision:
    """What one event decided: the state after it, the effects to carry out, and how SERVING
    ends (None: it goes on)."""

    state: Watch
    effects: tuple[Effect, ...] = ()
    outcome: Outcome | None = None


def deadline(state: Watch, hang_after: float | None) -> float | None:
    """When the watchdog's bound runs out (None without one: systemd's WatchdogSec= is)."""
    return None if hang_after is None else state.last_ok + hang_after


def wake_at(state: Watch, hang_after: float | None) -> float | None:
    """When the loop must wake without an event: the watchdog's bound, a question due again."""
    times = [t for t in (deadline(state, hang_after), state.ask_at) if t is not None]
    return min(times) if times else None


def step(state: Watch, event: Event, *, hang_after: float | None = None,
         serving_status: str = "serving") -> Decision:
    """What SERVING makes of ``event``. ``hang_after``: the watchdog for managers without one
    (--watchdog-secs: no good probe for that long -> HUNG); ``serving_status``: the STATUS=
    that a good probe after failed ones restores."""
    if isinstance(event, ChildExited):
        return Decision(state, outcome=Outcome(End.EXITED, event.returncode))  # SERVING -> STOPPING
    if isinstance(event, StopAsked):
        return Decision(state, outcome=Outcome(End.STOP))  # SERVING -> STOPPING
    if isinstance(event, (Wake, Probed)):
        bound = deadline(state, hang_after)
        if bound is not None and event.at >= bound:  # SERVING -> STOPPING: hung
            return Decision(state, outcome=Outcome(Ending.HUNG, elapsed=event.at - state.last_ok))
        return probed(state, event, serving_status) if isinstance(event, Probed) else \
            ask_again(state, event.at)
    if isinstance(event, PeerRestarted):  # SERVING -> STOPPING: restart with the peer
        return Decision(state, outcome=Outcome(Ending.PEER, detail=event.detail))
    if isinstance(event, CureDue):  # SERVING -> STOPPING: the cascade's cure
        return Decision(state, outcome=Outcome(Ending.HEAL, detail=event.detail))
    if isinstance(event, DutyFailed):  # SERVING -> STOPPING: the runtime cannot go on
        return Decision(state, outcome=Outcome(Ending.DUTY, detail=f"duty {event.duty} failed: "
                                                               f"{event.detail}"))
    if isinstance(event, PairsJudged):
        return judged(state, event)
    if isinstance(event, HealSaid):
        state = replace(state, asking=False)
        if event.wait:
            ask_at = None if event.ask_after is None else event.at + event.ask_after
            return Decision(replace(state, ask_at=ask_at),
                        (Wait(event.why, event.wait, event.status),))
        # SERVING -> STOPPING: heal the pair (recorded: it happens even if the pairs got well
        # in the second it took to ask)
        return Decision(state, outcome=Outcome(Ending.HEAL, detail=event.detail or event.why))
    raise TypeError(f"not an event: {event!r}")


def probed(state: Watch, event: Probed, serving_status: str) -> Decision:
    """A liveness probe's result: WATCHDOG=1 after a 200, a line and a status after a
    failure (no ping: once WatchdogSec= passes without one, systemd kills the unit). A
    failure a profile hold excuses is a ping, with the reason in a line (the first in a row)
    and the status: the engine may freeze while it writes a trace (profiled.py)."""
    result = event.result
    if result.ok:
        recovered = state.failures > 0 or state.excused > 0
        effects: tuple[Effect, ...] = (
            (Say(f"liveness probe OK again after {state.failures + state.excused} "
                 f"failure(s){f', {state.excused} of them excused' if state.excused else ''}"),
             Notify(("WATCHDOG=1", f"STATUS={serving_status}"))) if recovered
            else (Notify(("WATCHDOG=1",)),))
        return Decision(replace(state, failures=0, excused=0, last_ok=event.at, alive=True),
                        effects)
    if event.excused:
        said = () if state.excused else (
            Say(f"liveness probe failed: {result.detail}; not judged: {event.excused}"),)
        return Decision(replace(state, failures=0, excused=state.excused + 1, last_ok=event.at,
                            alive=True),
                    (*said, Notify(("WATCHDOG=1", f"STATUS=profiling: liveness probe failing "
                                                  f"({state.excused + 1}x), not judged: "
                                                  f"{event.excused}"))))
    failures = state.failures + 1
    return Decision(replace(state, failures=failures, excused=0, alive=False), (
        Say(f"liveness probe failed: {result.detail}"),
        Notify((f"STATUS=liveness probe failing ({failures}x, no watchdog ping): "
                f"{result.detail}",))))


def judged(state: Watch, event: PairsJudged) -> Decision:
    """The canary's rounds: the budget hears of a good pair; a verdict while this engine is
    alive (a dead engine's pairs fail because of it: its own restart comes first) starts the
    heal's clock and asks for a turn, one question at a time."""
    good: tuple[Effect, ...] = (PairGood(),) if event.good else ()
    if not event.why or not state.alive:
        return Decision(replace(state, failing_since=None, why="", ask_at=None), good)
    since = state.failing_since if state.failing_since is not None else event.at
    state = replace(state, failing_since=since, why=event.why)
    if state.asking:
        return Decision(state, good)
    return Decision(replace(state, asking=True, ask_at=None),
                good + (AskTurn(event.why, event.at - since),))


def ask_again(state: Watch, now: float) -> Decision:
    """A question due again (HealSaid.ask_after: a dead-lock is judged over time, and the rounds
    of a failing pair slow down to the steady interval): asked with the last verdict."""
    if state.ask_at is None or now < state.ask_at or state.asking or \
            state.failing_since is None:
        return Decision(state)
    return Decision(replace(state, asking=True, ask_at=None),
                (AskTurn(state.why, now - state.failing_since),))
