"""A hold: `pdsvc apply`'s word to one engine's runtime while it rolls a change.

The file is the unit's state file NAME.hold.json (statefile.state_path(STATE_DIR, NAME,
Kind.HOLD)), written whole by apply (root) before it takes the engine out of the router and
removed when its step ends, on failure and on Ctrl-C too. The runtime only reads it:

  {"by": "pdsvc apply", "since": WALL, "until": WALL, "out": true|false,
   "peers": [URL, ...] (optional), "why": "..."}

* ``out``: keep this engine out of the router. Membership neither joins nor re-adds it
  after apply took it out (without the hold, the runtime posted it again within one
  membership check, and apply had to DELETE it again on every poll).
* ``peers``: the only peers the pair canary probes while the hold lasts. During a
  pair-incompatible rollout, old and new engines must never meet: SGLang's decode raises
  on a page size or KV cache dtype mismatch when it first reaches a prefill's bootstrap
  server (disaggregation/common/conn.py ``try_ensure_parallel_info``, called from the
  decode scheduler's ``_ensure_prefill_info``), and that exception ends the scheduler,
  which SIGQUITs the server (managers/scheduler.py ``run_scheduler_process``): one probe
  across the two configs would take the decode down.
* While any hold exists, the canary reports and never heals: a pair that fails during a
  rollout is apply's to judge, and a heal would restart an engine apply is working on.

* ``profile``: the run id of a `pdsvc profile` capture (profiled.py): while it lasts the
  engine's scheduler may freeze for as long as its trace takes to write (SGLang's profiler
  exports on the scheduler thread: sglang #34943, PR #35115), so a failed liveness probe is
  not judged, the routers stop health-checking the engine (their checks would take it out
  of rotation and fail the requests that wait for it), and the canary probes nothing
  (``peers: []``). Never longer than PROFILE_HOLD_MAX_S after ``since``, renewed or not: a
  hung engine is judged again then.

* ``until``: the hold's lease (epoch seconds, this host's wall clock: apply writes it on the
  host whose units it restarts). apply renews it every few seconds while it runs
  (pdsvc/apply/lease.py); once it has passed, the runtime treats the hold as absent and logs
  that once: a hold left by an apply that cannot remove it (killed with SIGKILL, its machine
  gone) ends by itself, and the engine rejoins the router at its next membership check. A
  hold without ``until`` (an older apply) lasts until its file is removed.

The runtime looks at the file on every membership check and canary round; removing it ends
the hold at once. `pdsvc status` shows a hold, how long its lease has left, or that it expired.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .statefile import Kind, read_known, state_path, write_state
from .timings import PROFILE_HOLD_MAX_S


def hold_path(state_dir: str | None, name: str) -> str | None:
    return state_path(state_dir, name, Kind.HOLD) if state_dir else None


def lease_end(doc: dict[str, Any]) -> float | None:
    """The hold's ``until`` (epoch seconds), or None: no lease (an older apply's hold)."""
    until = doc.get("until")
    return float(until) if isinstance(until, (int, float)) and not isinstance(until, bool) \
        else None


class Hold:
    """What the runtime reads of its hold file, afresh at every look (a few hundred bytes).
    A hold whose lease has run out is no hold; ``log`` says so once per lease."""

    def __init__(self, path: str | None, log: Callable[[str], None] | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self.log = log
        self.wall = wall
        self._told: float | None = None  # the ``until`` of the expired hold logged last
        self._capped: float | None = None  # the ``since`` of the profile hold past its bound
        self._lock = threading.Lock()  # membership and the canary thread both look

    @classmethod
    def of(cls, state_dir: str | None, name: str,
           log: Callable[[str], None] | None = None) -> Hold:
        return cls(hold_path(state_dir, name), log)

    def doc(self) -> dict[str, Any] | None:
        """The hold in force: None without a file, once its lease has run out, or once a
        profile hold has lasted PROFILE_HOLD_MAX_S."""
        doc = read_known(self.path, self.log)
        if doc is None:
            return None
        now = self.wall()
        if doc.get("profile") and now >= profile_end(doc):
            self._past_bound(doc, now)
            return None
        until = lease_end(doc)
        if until is None or now < until:
            return doc
        with self._lock:
            told, self._told = self._told, until
        if told != until and self.log is not None:
            self.log(f"ignoring an expired hold from {doc.get('by') or 'pdsvc apply'} "
                     f"({self.path}: its lease ran out {now - until:.0f} s ago and was not "
                     "renewed: apply is gone): joining the router and healing as usual")
        return None

    def _past_bound(self, doc: dict[str, Any], now: float) -> None:
        since = float(doc.get("since") or 0.0)
        with self._lock:
            told, self._capped = self._capped, since
        if told != since and self.log is not None:
            self.log(f"ignoring the profile hold {doc.get('profile')} ({self.path}): it "
                     f"began {now - since:.0f} s ago, past its bound of {PROFILE_HOLD_MAX_S:g} "
                     "s (PROFILE_HOLD_MAX_S): judging liveness and healing as usual")

    def profile(self) -> tuple[str, float] | None:
        """(run id, when it ends at the latest) of a `pdsvc profile` hold in force, or
        None."""
        doc = self.doc()
        if doc is None or not doc.get("profile"):
            return None
        until = lease_end(doc)
        end = profile_end(doc)
        return str(doc["profile"]), end if until is None else min(until, end)

    def active(self) -> bool:
        return self.doc() is not None

    def out(self) -> str | None:
        """Why this engine stays out of the router now, or None."""
        doc = self.doc()
        if doc is None or doc.get("out") is False:
            return None
        return f"held out of the router by {doc.get('by') or 'pdsvc apply'}" + (
            f" ({doc['why']})" if doc.get("why") else "")

    def allows(self, peer: str) -> bool:
        """Whether the canary may probe the pair with ``peer`` now."""
        doc = self.doc()
        peers = doc.get("peers") if doc else None
        if not isinstance(peers, list):
            return True
        return peer.rstrip("/") in {str(p).rstrip("/") for p in peers}


def profile_end(doc: dict[str, Any]) -> float:
    """The latest a profile hold lasts, renewed or not: PROFILE_HOLD_MAX_S after it began."""
    since = doc.get("since")
    began = float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) \
        else 0.0
    return began + PROFILE_HOLD_MAX_S


def write_hold(path: str, *, out: bool, peers: list[str] | None = None, why: str = "",
               by: str = "pdsvc apply", until: float | None = None,
               since: float | None = None, profile: str | None = None) -> dict[str, Any]:
    """Write a hold (0644: the runtime's user reads what root wrote), leased ``until`` (None:
    no lease); ``since``: when it began (a renewal keeps the first write's); ``profile``: the
    run id of a `pdsvc profile` capture. The doc written."""
    doc: dict[str, object] = {"by": by, "since": time.time() if since is None else since,
                              "out": out, "why": why}
    if until is not None:
        doc["until"] = until
    if profile is not None:
        doc["profile"] = profile
    if peers is not None:
        doc["peers"] = sorted(p.rstrip("/") for p in peers)
    return write_state(path, doc, mode=0o644)


def clear_hold(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
