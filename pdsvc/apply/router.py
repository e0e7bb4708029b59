"""The routers' control plane as a rollout uses it, for every router a unit names (its
--router, one per router.replicas): list the workers, take one out (`DELETE /workers/{id}`:
both router generations have it, sglang-router 0.3.2 and smg; the runtime's membership.py
does the same at every stop), put one in as its runtime would (`POST /workers`,
membership.Worker), and look until every list is as wanted."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pdsvc.apply.bounds import Bounds
from pdsvc.apply.host import Host
from pdsvc.apply.units import Unit
from pdsvc.ship.runtime.membership import Worker

T = TypeVar("T")
#: Between two looks at the router during the switch of halves, while no pair is listed.
SWITCH_POLL_S = 0.02

Entry = dict[str, Any]  # one worker as GET /workers lists it


def at_once(call: Callable[[T], object], items: Sequence[T]) -> None:
    """``call`` for every item at the same moment (threads): the control-plane calls of one
    change, each a round trip the router answers from memory."""
    if len(items) < 2:
        for item in items:
            call(item)
        return
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        list(pool.map(call, items))


def entry_in(workers: list[Entry], u: Unit) -> Entry | None:
    """The router's entry for this engine in a worker list."""
    for entry in workers:
        if str(entry.get("url", "")).rstrip("/") == u.url:
            return entry
    return None


def routable(entry: Entry | None) -> bool:
    return entry is not None and entry.get("is_healthy") is not False and str(
        entry.get("status", "")).lower() not in ("draining", "failed")


class RouterClient:
    """Calls on every router a unit names (its --router, one per router.replicas), with its
    control-plane key when it has one. An engine is in rotation only once each router lists
    it, and out of it only once none does: with several routers, each sends it requests."""

    def __init__(self, host: Host, bounds: Bounds) -> None:
        self.host = host
        self.bounds = bounds

    def _headers(self, u: Unit) -> dict[str, str]:
        key = (self.host.read(u.key_file) or "").strip() if u.key_file else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    @staticmethod
    def routers(u: Unit) -> tuple[str, ...]:
        return tuple(r.rstrip("/") for r in u.options.get("--router", ()))

    def workers_at(self, router: str, u: Unit) -> list[Entry] | None:
        """One router's worker list (GET /workers); None when it did not answer."""
        code, body = self.host.http("GET", f"{router}/workers", self._headers(u))
        try:
            doc = json.loads(body) if code == 200 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
            return None
        return [e for e in doc["workers"] if isinstance(e, dict)]

    def lists(self, u: Unit) -> list[list[Entry] | None]:
        """Every router's worker list, in --router order (None: that one did not answer)."""
        routers = self.routers(u)
        out: list[list[Entry] | None] = [None] * len(routers)

        def look(i: int) -> None:
            out[i] = self.workers_at(routers[i], u)
        at_once(look, list(range(len(routers))))
        return out

    def entry(self, u: Unit) -> tuple[Entry | None, bool]:
        """(the engine's entry where it is least in rotation: None when a router lacks it,
        whether every router answered)."""
        lists = self.lists(u)
        if not lists or any(w is None for w in lists):
            return None, False
        entries = [entry_in(w, u) for w in lists if w is not None]
        return (None if any(e is None for e in entries) else
                next((e for e in entries if not routable(e)), entries[0])), True

    def deregister(self, u: Unit) -> bool:
        """Take the engine out of every router; True when one listed it."""
        found = [(router, e) for router, w in zip(self.routers(u), self.lists(u), strict=True)
                 for e in [entry_in(w or [], u)] if e is not None]
        at_once(lambda re: self._delete(u, *re), found)
        return bool(found)

    def _delete(self, u: Unit, router: str, entry: Entry) -> None:
        wid = urllib.parse.quote(str(entry.get("id", "")), safe="")
        self.host.http("DELETE", f"{router}/workers/{wid}", self._headers(u))

    def register(self, u: Unit) -> None:
        """POST the engine to every router as its runtime would (membership.Worker)."""
        port = u.option("--bootstrap-port")
        worker = Worker(u.url, u.role, int(port) if port.isdigit() else None)
        headers = {**self._headers(u), "Content-Type": "application/json"}
        at_once(lambda router: self.host.http("POST", f"{router}/workers", headers,
                                              body=worker.payload()), list(self.routers(u)))

    def until(self, done: Callable[[list[Entry]], bool], u: Unit, poll: float = SWITCH_POLL_S,
              waiting: Callable[[], None] | None = None) -> bool:
        """Look at the worker list of every router ``u`` names until ``done`` holds for each,
        every ``poll`` s at most (``waiting``: called once, after the first look that was
        not); False once the step's bound passed."""
        deadline = self.host.now() + self.bounds.ready_secs
        first = True
        while True:
            lists = self.lists(u)
            if lists and all(w is not None and done(w) for w in lists):
                return True
            if first and waiting is not None:
                waiting()
            first = False
            if self.host.now() >= deadline:
                return False
            self.host.sleep(min(self.bounds.poll_secs, poll))
