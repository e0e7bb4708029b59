"""The router's control plane as a rollout uses it, for the router a unit names (its --router):
list the workers, take one out (`DELETE /workers/{id}`: both router generations have it,
sglang-router 0.3.2 and smg; the runtime's membership.py does the same at every stop), put one
in as its runtime would (`POST /workers`, membership.Worker), and look until the list is as
wanted."""

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
    """Calls on the router each unit names, with its control-plane key when it has one."""

    def __init__(self, host: Host, bounds: Bounds) -> None:
        self.host = host
        self.bounds = bounds

    def _headers(self, u: Unit) -> dict[str, str]:
        key = (self.host.read(u.key_file) or "").strip() if u.key_file else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def workers(self, u: Unit) -> list[Entry] | None:
        """The router's worker list (GET /workers on the router the unit names); None when
        it has none or did not answer."""
        router = u.option("--router")
        if not router:
            return None
        code, body = self.host.http("GET", f"{router.rstrip('/')}/workers", self._headers(u))
        try:
            doc = json.loads(body) if code == 200 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
            return None
        return [e for e in doc["workers"] if isinstance(e, dict)]

    def entry(self, u: Unit) -> tuple[Entry | None, bool]:
        """(the router's entry for this engine, whether the router answered)."""
        workers = self.workers(u)
        return (None, False) if workers is None else (entry_in(workers, u), True)

    def delete(self, u: Unit, entry: Entry) -> None:
        wid = urllib.parse.quote(str(entry.get("id", "")), safe="")
        self.host.http("DELETE", f"{u.option('--router').rstrip('/')}/workers/{wid}",
                       self._headers(u))

    def deregister(self, u: Unit) -> bool:
        """Take the engine out of the router; True when it was listed."""
        entry, _ = self.entry(u)
        if entry is None:
            return False
        self.delete(u, entry)
        return True

    def register(self, u: Unit) -> None:
        """POST the engine to the router as its runtime would (membership.Worker)."""
        port = u.option("--bootstrap-port")
        worker = Worker(u.url, u.role, int(port) if port.isdigit() else None)
        self.host.http("POST", f"{u.option('--router').rstrip('/')}/workers",
                       {**self._headers(u), "Content-Type": "application/json"},
                       body=worker.payload())

    def until(self, done: Callable[[list[Entry]], bool], u: Unit, poll: float = SWITCH_POLL_S,
              waiting: Callable[[], None] | None = None) -> bool:
        """Look at the router's worker list (the one ``u`` names) until ``done``, every
        ``poll`` s at most (``waiting``: called once, after the first look that was not);
        False once the step's bound passed."""
        deadline = self.host.now() + self.bounds.ready_secs
        first = True
        while True:
            workers = self.workers(u)
            if workers is not None and done(workers):
                return True
            if first and waiting is not None:
                waiting()
            first = False
            if self.host.now() >= deadline:
                return False
            self.host.sleep(min(self.bounds.poll_secs, poll))
