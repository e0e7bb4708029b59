"""What SERVING's loop waits for: typed events in one inbox, posted by the pollers that do
the I/O (a probe, a router call, a peer's /health, a file on another host) on threads of their
own, by the child's waiter and by the signal handlers.

The loop (serving.Serving.run) blocks on ``Inbox.get`` and nothing else, so a stop, the
child's exit or a verdict is acted on the moment it is posted, whatever a poller is waiting
for (a probe of a hung engine takes its whole timeout; a router that does not answer, its
own). What the loop makes of an event is watch.step's, a pure function of (state, event).

The inbox is a ``queue.SimpleQueue``: its ``put`` is reentrant (the queue module's docs: it
may interrupt a ``put`` or ``get`` of the same thread), so a signal handler may post to it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .duties import Duties, quiet
from .probe import ProbeResult

if TYPE_CHECKING:
    import subprocess


@dataclass(frozen=True)
class ChildExited:
    """The engine (or router) process exited."""

    returncode: int


@dataclass(frozen=True)
class StopAsked:
    """A stop signal reached the runtime (the manager's SIGTERM, an operator's Ctrl-C)."""

    signo: int


@dataclass(frozen=True)
class Probed:
    """A liveness probe ended (``at``: the loop's clock when it did); ``excused``: why a
    failure is not judged now (a profile hold: profiled.py), "" when it is."""

    result: ProbeResult
    at: float
    excused: str = ""


@dataclass(frozen=True)
class PeerRestarted:
    """A --restart-with peer on another host restarted (phases.PeerWatch said why)."""

    detail: str


@dataclass(frozen=True)
class CureDue:
    """A heal cascade's cure marker is newer than this engine (cascade.Cascade.due)."""

    detail: str


@dataclass(frozen=True)
class PairsJudged:
    """The pair canary recorded rounds (on its thread): ``why`` the pairs need a heal now (the
    canary's verdict, None when not), ``good``: a pair proved good among them; ``at``: the
    loop's clock when it did."""

    why: str | None
    good: bool
    at: float


@dataclass(frozen=True)
class HealSaid:
    """The answer to watch.AskTurn, found off the loop (it may ask the routers and the other
    hosts): ``wait`` says why the heal waits (its turn among the role's engines, the heal
    budget) with the ``status`` to show; without one the heal is recorded and ``detail`` says
    why the engine restarts (the cascade's cure, or the pairs' verdict)."""

    why: str
    detail: str = ""
    wait: str | None = None
    status: str = ""
    ask_after: float | None = None  # ask again this many seconds after ``at``, rounds or not
    at: float = 0.0  # the loop's clock when it was found


@dataclass(frozen=True)
class DutyFailed:
    """A duty whose policy ends the runtime raised (duties.py): ``duty`` and its words."""

    duty: str
    detail: str


@dataclass(frozen=True)
class Wake:
    """No event before the loop's next deadline (the watchdog's, with a bound of our own)."""

    at: float


if TYPE_CHECKING:  # for annotations only: "A | B" cannot be evaluated on 3.9
    Event = (ChildExited | StopAsked | Probed | PeerRestarted | CureDue | PairsJudged
             | HealSaid | DutyFailed | Wake)


class Inbox:
    """Events, first posted first taken; safe to post from any thread and from a signal
    handler."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.clock = clock

    def post(self, event: Event) -> None:
        self._events.put(event)

    def get(self, timeout: float | None) -> Event:
        """The next event, or ``Wake`` once ``timeout`` s passed without one."""
        try:
            return self._events.get(timeout=None if timeout is None else max(0.0, timeout))
        except queue.Empty:
            return Wake(self.clock())


class Poller:
    """One duty's I/O on a thread of its own: ``work()`` after ``first`` s, then again
    ``pace()`` s after each call began (at once after a call that took longer: a probe that
    waited out its timeout is followed by the next, as the watchdog's bound assumes); what it
    returns (an Event) is posted. ``stop`` ends it at its next pause (a call in progress ends
    on its own; the thread is a daemon)."""

    def __init__(self, name: str, inbox: Inbox, work: Callable[[], Event | None],
                 pace: Callable[[], float], *, first: float = 0.0,
                 duties: Duties | None = None) -> None:
        self.name = name
        self.inbox, self.work, self.pace, self.first = inbox, work, pace, first
        self.duties = duties or quiet()  # a work() that raises: said and counted, then again
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Poller:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        if self.stopped.wait(self.first):
            return
        while True:
            began = time.monotonic()
            event = self.duties.guard(self.name, self.work)
            if event is not None and not self.stopped.is_set():
                self.inbox.post(event)
            if self.stopped.wait(max(0.0, began + self.pace() - time.monotonic())):
                return


def watch_child(process: subprocess.Popen[bytes], inbox: Inbox,
                duties: Duties | None = None) -> threading.Thread:
    """Post ``ChildExited`` when ``process`` exits (its own thread, blocked in wait(); the
    loop's other waits on it poll and see the same returncode). Should the wait raise, the
    runtime cannot learn of its child's exit: the duty's policy ends it (duties.py)."""
    guard = duties or quiet()

    def run() -> None:
        code = guard.guard("child-exit", process.wait)
        if code is not None:
            inbox.post(ChildExited(code))

    thread = threading.Thread(target=run, name="child-exit", daemon=True)
    thread.start()
    return thread
