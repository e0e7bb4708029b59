"""A hold: `pdsvc apply`'s word to one engine's runtime while it rolls a change.

The file is the unit's state file NAME.hold.json (statefile.state_path(STATE_DIR, NAME,
"hold")), written whole by apply (root) before it takes the engine out of the router and
removed when its step ends, on failure and on Ctrl-C too. The runtime only reads it:

  {"by": "pdsvc apply", "since": WALL, "out": true|false, "peers": [URL, ...] (optional),
   "why": "..."}

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

A hold nobody removed (apply killed with SIGKILL) shows in `pdsvc status`; removing the
file ends it (the runtime looks at it on every membership check and canary round).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from .statefile import read_json, state_path, write_atomic

KIND = "hold"


def hold_path(state_dir: str | None, name: str) -> str | None:
    return state_path(state_dir, name, KIND) if state_dir else None


class Hold:
    """What the runtime reads of its hold file, afresh at every look (a few hundred bytes)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    @classmethod
    def of(cls, state_dir: str | None, name: str) -> Hold:
        return cls(hold_path(state_dir, name))

    def doc(self) -> dict | None:
        return read_json(self.path) if self.path else None

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
               by: str = "pdsvc apply") -> None:
    """Write a hold (0644: the runtime's user reads what root wrote)."""
    doc: dict[str, object] = {"by": by, "since": time.time(), "out": out, "why": why}
    if peers is not None:
        doc["peers"] = sorted(p.rstrip("/") for p in peers)
    write_atomic(path, json.dumps(doc), mode=0o644)


def clear_hold(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
