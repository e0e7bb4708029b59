"""The lease on apply's holds: every hold apply writes (the runtime's NAME.hold.json,
pdsvc/ship/runtime/hold.py) carries ``until``, and a thread here writes it again with a later
``until`` every few seconds while apply runs. An apply that cannot remove its holds (killed
with SIGKILL, its machine gone) stops renewing them; once ``until`` has passed the runtime
treats the hold as absent and its engine rejoins the router.

Renewal runs in a thread of its own, not in the executor's poll loops: a step blocks in
`systemctl restart` for as long as the unit takes to start (Type=notify: until the engine
is loaded, minutes; systemd.service(5) "Type=notify"), and the holds must outlive that.
Writes and removals of one hold are serialised, so a renewal never brings back a hold the
executor has just removed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: How long a hold lasts unless renewed. Renewed every LEASE_SECS / RENEWALS seconds (5 s),
#: it survives five missed renewals in a row: a renewal is one small atomic write into the
#: runtime's state directory (a tmpfs under systemd: RuntimeDirectory=), which stalls only
#: when the whole host does, and a step's length does not matter (the thread renews
#: throughout). Five renewals' worth also covers the wall clock stepping forward up to 25 s
#: under apply (chrony/ntpd stepping a clock that was off): the next renewal writes a fresh
#: ``until``. The price is the other way round: an apply killed with SIGKILL keeps its
#: engine out of the router for up to 30 s more, then one membership check.
LEASE_SECS = 30.0
RENEWALS = 6
#: Overrides LEASE_SECS (seconds, > 0), for tests that kill apply and wait for the lease.
LEASE_ENV = "PDSVC_APPLY_HOLD_LEASE_SECS"


def lease_secs(environ: dict[str, str] | None = None) -> float:
    """LEASE_SECS, or the positive number of seconds LEASE_ENV says."""
    raw = (os.environ if environ is None else environ).get(LEASE_ENV, "")
    try:
        secs = float(raw)
    except ValueError:
        return LEASE_SECS
    return secs if secs > 0 else LEASE_SECS


class HoldWriter(Protocol):
    """What the lease needs of the executor's Host (execute.py)."""

    def write_hold(self, path: str, out: bool, peers: list[str] | None, why: str,
                   until: float | None = None, since: float | None = None,
                   by: str = "pdsvc apply", profile: str | None = None) -> bool: ...

    def clear_hold(self, path: str) -> None: ...

    def wall(self) -> float: ...


@dataclass(frozen=True)
class Held:
    out: bool
    peers: list[str] | None
    why: str
    since: float
    profile: str | None = None  # a profile hold's run (pdsvc profile)


class Lease:
    """Every hold apply holds now, written with ``until`` = now + ``secs`` and renewed by
    ``renew()`` (the thread ``start()`` begins calls it every ``secs / RENEWALS``)."""

    def __init__(self, host: HoldWriter, say: Callable[[str], None],
                 secs: float | None = None, by: str = "pdsvc apply",
                 owns: Callable[[str], bool] | None = None) -> None:
        self.host = host
        self.by = by  # the command that holds: the holds' ``by``, and its own lines' words
        #: whether the hold at a path is still this command's: another's is neither renewed
        #: nor removed (None: every hold written is)
        self.owns = owns
        self.say = say
        self.secs = lease_secs() if secs is None else secs
        self.every = self.secs / RENEWALS
        self.held: dict[str, Held] = {}
        self._failing: set[str] = set()  # holds whose last renewal failed (said once)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, path: str, *, out: bool, peers: list[str] | None, why: str,
             profile: str | None = None) -> bool:
        """Write the hold; whether it is there (the runtime's state directory exists)."""
        with self._lock:
            held = Held(out, peers, why, self.host.wall(), profile)
            self.held[path] = held
            return self._write(path, held)

    def release(self, path: str) -> None:
        """Remove the hold (when it is still this command's); it is no longer renewed."""
        with self._lock:
            self.held.pop(path, None)
            self._failing.discard(path)
            if self.owns is None or self.owns(path):
                self.host.clear_hold(path)

    def renew(self) -> None:
        """Write every hold again with a fresh ``until``. A renewal that fails is said on
        stderr, once until one succeeds again, and never raises: the rollout goes on, and
        the hold lapses only if none succeeds before its ``until``."""
        with self._lock:
            for path, held in self.held.items():
                if self.owns is not None and not self.owns(path):
                    continue  # another command's now: not this lease's to write
                try:
                    ok, error = self._write(path, held), ""
                except Exception as e:  # whatever it is, the rollout goes on
                    ok, error = False, f": {e}"
                if ok and path in self._failing:
                    self._failing.discard(path)
                    self.say(f"{self.by}: renewed the hold {path} again")
                elif not ok and path not in self._failing:
                    self._failing.add(path)
                    self.say(f"{self.by}: could not renew the hold {path}{error}; it lapses "
                             f"within {self.secs:g} s of its last renewal unless a later one "
                             "succeeds (the engine would rejoin the router)")

    def _write(self, path: str, held: Held) -> bool:
        return self.host.write_hold(path, held.out, held.peers, held.why,
                                    until=self.host.wall() + self.secs, since=held.since,
                                    by=self.by, profile=held.profile)

    def start(self) -> None:
        """Renew in a daemon thread until ``stop()`` (a killed apply renews nothing)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="pdsvc-hold-lease",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.renew()
