"""The runtime's duties, each on a thread of its own, and what becomes of one that raises what
it did not expect.

Before the event loop, such an exception ended the runtime and the process manager restarted
it; on a thread of its own, it ends only that thread, and the unit looks healthy while, say,
a hung engine is never seen again or no heal ever happens. So every duty's body runs under
``Duties.guard``: the exception is caught; one journal line carries its traceback (the first
of each kind, then every REPEAT_EVERY-th of it); its count and last words go to the unit's
NAME.duties.json (statefile.Kind.DUTIES), which `pdsvc status` and the textfile metrics read;
and the duty's policy (POLICIES, the choice written down) says what follows:

  duty              after an unexpected exception       why
  liveness          goes on: the next probe             each probe starts afresh; one that
                                                        fails every time feeds no watchdog,
                                                        and the manager ends the unit
  peers             goes on: the next look              each look starts afresh
  membership        goes on: the next check             each check reads the router afresh
  cure              goes on: the next look              a stat and a read of a marker
  profile           goes on: the next look              profiled.py re-reads its hold
  reap              goes on                             waitpid(-1) of what is left
  pair-canary       goes on: the round is not recorded  a heal is judged on recorded rounds
  heal-question     goes on: "not now", asked again     the loop waits for an answer to it
                    in HEAL_STAGGER_S
  fleet-read        goes on: the next read              each read is afresh
  metrics-textfile  goes on: the next write             each write reads the state afresh
  stderr-tap        goes on, copying the bytes as they  an engine whose stderr nobody reads
                    come (no line is parsed any more)   blocks on its next write
  child-exit        ENDS the runtime: exit 71           without it the runtime does not learn
                    (Exit.DUTY), the manager restarts   that its engine exited
"""

from __future__ import annotations

import enum
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from .statefile import write_state

T = TypeVar("T")
#: the same failure again is said in the journal once in this many (the count is kept)
REPEAT_EVERY = 100


class Policy(str, enum.Enum):
    GOES_ON = "goes on"
    ENDS = "ends the runtime"


POLICIES: dict[str, Policy] = {
    **{duty: Policy.GOES_ON for duty in (
        "liveness", "peers", "membership", "cure", "profile", "reap", "pair-canary",
        "heal-question", "fleet-read", "metrics-textfile", "stderr-tap")},
    "child-exit": Policy.ENDS,
}


def words(exc: BaseException) -> str:
    """The exception and where it came from, on one line: ``ValueError: x (at f.py:12 in g)``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename != __file__]  # the guard's own frame says nothing
    where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"
                      for f in frames[-3:])
    return f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


class Duties:
    """The failures of one run's duties: said, counted, written, and acted on by policy."""

    def __init__(self, path: str | None, log: Callable[[str], None],
                 wall: Callable[[], float] = time.time) -> None:
        self.path, self.log, self.wall = path, log, wall
        self.failures: dict[str, dict[str, Any]] = {}
        #: what a duty whose policy ends the runtime calls (the loop's inbox, once it runs)
        self.on_fatal: Callable[[str, str], None] | None = None
        self._lock = threading.Lock()
        if path:  # a new run: no failure yet (the last run's are its own)
            write_state(path, {"duties": {}})

    def failed(self, duty: str, exc: BaseException) -> Policy:
        """Record ``duty``'s exception; its policy."""
        policy = POLICIES.get(duty, Policy.GOES_ON)
        said = words(exc)
        with self._lock:
            f = self.failures.setdefault(duty, {"count": 0, "last": "", "at": 0.0,
                                                "policy": policy.value})
            f["count"] += 1
            again = f["last"] == said
            f["last"], f["at"] = said, self.wall()
            count = f["count"]
            if self.path:
                write_state(self.path, {"duties": {k: dict(v) for k, v in
                                                   self.failures.items()}})
        if not again or count % REPEAT_EVERY == 0:
            self.log(f"duty {duty} failed ({count}x): {said}; it {policy.value}"
                     + ("" if policy is Policy.GOES_ON else
                        ": the process manager restarts the unit"))
        if policy is Policy.ENDS and self.on_fatal is not None:
            self.on_fatal(duty, said)
        return policy

    def guard(self, duty: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None once its exception is recorded (``failed``)."""
        try:
            return fn()
        except Exception as e:  # what the duty did not expect: said, counted, acted on
            self.failed(duty, e)
            return None


def quiet() -> Duties:
    """Duties that catch and count but write nothing: for parts used without a unit (tests,
    tools)."""
    return Duties(None, lambda line: None)
