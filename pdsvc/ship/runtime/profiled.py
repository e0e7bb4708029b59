"""A `pdsvc profile` hold, as the engine's runtime keeps it (the hold file: hold.py).

SGLang writes a capture's trace on the scheduler thread: serving stops for the whole write,
/health answers nothing (sglang #34943: 25 s for a 242 MB trace; PR #35115: a 108 s gap with
five failed /health_generate checks). Judged as usual, such an engine is hung: the runtime
stops feeding the watchdog and the manager kills it mid-write, and the routers' health
checks take it out of rotation, which fails every request of a role that has no other
engine. So while a profile hold is in force (``Hold.profile``):

* a liveness probe that fails is not judged (``excuse``): the watchdog is fed and the engine
  stays alive to membership, with the reason in the journal and the unit's status;
* every router stops health-checking the engine (membership.Routers.pause), and membership
  changes nothing: requests that reach the engine wait for the write, and none fails;
* the pair canary probes nothing and heals nothing (the hold's ``peers: []``).

It ends when `pdsvc profile` removes the file, when its lease lapses (pdsvc profile is gone),
or PROFILE_HOLD_MAX_S after it began, whichever comes first: the journal says which, and
liveness, health checks and the canary are back as before.

The runtime answers in its own state file, NAME.profile.json (statefile.Kind.PROFILE):
``run``, ``since``, ``until`` (the latest the hold lasts, as known when the file was written:
its lease is renewed without a write), ``routers`` (each router's answer to the pause: ""
when paused, else why not), then ``ended_at`` and ``ended``.
`pdsvc profile` asks an engine for a capture only once this answer names its run with every
router paused: an older runtime, which would let the watchdog kill a frozen engine, never
writes it.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .hold import Hold, lease_end, profile_end
from .statefile import read_known, write_state
from .timings import PROFILE_HOLD_MAX_S, PROFILE_VERIFY_S

if TYPE_CHECKING:
    from .membership import Routers


def clock_time(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


class Profiled:
    """The profile hold this runtime is under, if any: what it changes and when it ends."""

    def __init__(self, hold: Hold, path: str | None, log: Callable[[str], None],
                 routers: Routers | None = None, wall: Callable[[], float] = time.time) -> None:
        self.hold, self.path, self.log, self.routers, self.wall = hold, path, log, routers, wall
        self.run: str | None = None  # the run whose hold this runtime keeps now
        self.began = 0.0  # wall clock: when it took it
        self.end = 0.0  # wall clock: the latest it lasts, as last read
        self.paused: dict[str, str] = {}  # router -> "" (paused) or why not
        self.resuming: dict[str, str] = {}  # router -> why its resume failed: asked again
        self.verified = 0.0  # monotonic: the last look that asked every router again
        self.clock = time.monotonic
        self._lock = threading.Lock()

    def excuse(self) -> str | None:
        """Why a failed liveness probe is not judged now (a profile hold), or None."""
        found = self.hold.profile()
        if found is None:
            return None
        run, end = found
        return (f"profile hold {run} (pdsvc profile: the engine may freeze while it writes "
                f"its trace) until {clock_time(end)} at the latest")

    def look(self) -> None:
        """The poller's work: take a new hold; while it lasts, ask every router again every
        PROFILE_VERIFY_S (one that restarted has lost the entry: it is registered and paused
        again), at once one that refused; end the hold; retry a resume a router refused. An
        error of its own is logged with its traceback, and the next look tries again."""
        try:
            with self._lock:
                self._look()
        except Exception:  # a look that failed must not end the poller: the hold would stay
            self.log("profile hold: a look failed; looking again: "
                     + " | ".join(traceback.format_exc().strip().splitlines()[-3:]))

    def _look(self) -> None:
        found = self.hold.profile()
        if found is not None:
            run, self.end = found
            if run != self.run:
                if self.run is not None:
                    self._leave(f"replaced by {run}")
                self._enter(run)
            elif any(self.paused.values()) or \
                    self.clock() - self.verified >= PROFILE_VERIFY_S:
                self._pause_again()
            return
        if self.run is not None:
            self._leave(self._how_it_ended())
        elif self.resuming and self.routers is not None:
            self._resume_again()

    def _enter(self, run: str) -> None:
        self.run, self.began = run, self.wall()
        self.log(f"profile hold {run} by pdsvc profile: until {clock_time(self.end)} at the "
                 f"latest ({self.end - self.began:.0f} s: its lease, renewed while pdsvc "
                 f"profile runs, and never past {PROFILE_HOLD_MAX_S:g} s after it began), "
                 "failed liveness probes are not judged, the routers do not health-check "
                 "this engine, and its pairs are neither probed nor healed")
        self.paused = self.routers.pause(True) if self.routers is not None else {}
        self.verified = self.clock()
        self._say_paused(self.paused)
        self._write()

    def _pause_again(self) -> None:
        self.verified = self.clock()
        if self.routers is None:
            return
        answers = self.routers.pause(True)
        if answers != self.paused:
            self._say_paused({r: why for r, why in answers.items() if self.paused.get(r) != why})
            self.paused = answers
            self._write()

    def _say_paused(self, answers: dict[str, str]) -> None:
        for router, why in answers.items():
            self.log(f"router {router}: health checks of this engine paused" if not why else
                     f"router {router}: could not pause its health checks ({why}); asking "
                     "again")

    def _leave(self, how: str) -> None:
        run, took = self.run, self.wall() - self.began
        self.run = None
        resumed = self.routers.pause(False) if self.routers is not None else {}
        self.resuming = {r: why for r, why in resumed.items() if why}
        self.log(f"profile hold {run} ended after {took:.0f} s ({how}): liveness is judged "
                 "again" + "".join(f"; router {r}: " + ("health checks resumed" if not why
                                                         else f"could not resume ({why}): "
                                                         "asking again")
                                   for r, why in resumed.items()))
        self._write(run, ended=how)
        self.paused = {}

    def _resume_again(self) -> None:
        assert self.routers is not None
        answers = self.routers.pause(False, only=set(self.resuming))
        for router, why in answers.items():
            if not why:
                self.log(f"router {router}: health checks of this engine resumed")
        self.resuming = {r: why for r, why in answers.items() if why}

    def _how_it_ended(self) -> str:
        doc = read_known(self.hold.path)
        now = self.wall()
        if doc is None or doc.get("profile") != self.run:
            return "released by pdsvc profile"
        if now >= profile_end(doc):
            return f"past its bound of {PROFILE_HOLD_MAX_S:g} s"
        until = lease_end(doc)
        if until is not None and now >= until:
            return "its lease lapsed: pdsvc profile is gone"
        return "released"

    def _write(self, run: str | None = None, ended: str | None = None) -> None:
        if not self.path:
            return
        doc: dict[str, Any] = {"run": run or self.run, "since": self.began, "until": self.end,
                               "routers": dict(self.paused)}
        if ended is not None:
            doc.update(ended_at=self.wall(), ended=ended)
        write_state(self.path, doc)
