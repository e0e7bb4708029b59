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
        self._lock = threading.Lock()  # membership and the canary thread both look

    @classmethod
    def of(cls, state_dir: str | None, name: str,
           log: Callable[[str], None] | None = None) -> Hold:
        return cls(hold_path(state_dir, name), log)

    def doc(self) -> dict[str, Any] | None:
        """The hold in force: None without a file, or once its lease has run out."""
        doc = read_known(self.path, self.log)
        until = lease_end(doc) if doc is not None else None
        if doc is None or until is None:
            return doc
        now = self.wall()
        if now < until:
            return doc
        with self._lock:
            told, self._told = self._told, until
        if told != until and self.log is not None:
            self.log(f"ignoring an expired hold from {doc.get('by') or 'pdsvc apply'} "
                     f"({self.path}: its lease ran out {now - until:.0f} s ago and was not "
                     "renewed: apply is gone): joining the router and healing as usual")
        return None

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


def write_hold(path: str, *, out: bool, peers: list[str] | None = None, why: str = "",
               by: str = "pdsvc apply", until: float | None = None,
               since: float | None = None) -> dict[str, Any]:
    """Write a hold (0644: the runtime's user reads what root wrote), leased ``until`` (None:
    no lease); ``since``: when it began (a renewal keeps the first write's). The doc written."""
    doc: dict[str, object] = {"by": by, "since": time.time() if since is None else since,
                              "out": out, "why": why}
    if until is not None:
        doc["until"] = until
    if peers is not None:
        doc["peers"] = sorted(p.rstrip("/") for p in peers)
    return write_state(path, doc, mode=0o644)


def clear_hold(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
