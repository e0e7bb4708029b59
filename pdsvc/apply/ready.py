"""When a restarted unit serves again: its service manager runs it in a new invocation
(systemd's InvocationID; supervisord's pid and start time), its /health answers 200, the
router lists it healthy (unless apply holds it out), and the pair canary has judged every
pair good since the restart (the runtime's NAME.canary.json: its own, or its peer's once it
runs anew, since both ends probe the same pair). The service manager, a subprocess, is asked
every Bounds.manager_secs once the unit runs again; the rest every Bounds.poll_secs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdsvc.apply.bounds import Bounds, StepFailed
from pdsvc.apply.host import Host
from pdsvc.apply.router import RouterClient
from pdsvc.apply.units import Unit
from pdsvc.ship.runtime.canary import PairHealth
from pdsvc.ship.runtime.statefile import Kind, NewerFormat, parse_state, state_path
from pdsvc.status.managers import ServiceManager


class Readiness:
    """Waits until the units of a step serve again, on one host."""

    def __init__(self, units: dict[str, Unit], host: Host, bounds: Bounds,
                 manager: ServiceManager, router: RouterClient,
                 say: Callable[[str], None]) -> None:
        self.units = units
        self.host = host
        self.bounds = bounds
        self.manager = manager
        self.router = router
        self.say = say

    def wait(self, down: list[Unit], before: dict[str, str], since: float,
             held: set[str] | frozenset[str] = frozenset(), among: list[str] | None = None,
             anew: dict[str, float] | None = None) -> None:
        """Until each unit serves again: ``held`` ones need not be in the router (apply keeps
        them out); ``among``: only the pairs among these engines are judged; ``anew``: unit
        -> when it was first seen run anew (wall clock), filled here. /health is asked until it
        answers 200 once in this run. Raises StepFailed past the step's bound."""
        deadline = self.host.now() + self.bounds.ready_secs
        pending = {u.name: "not restarted yet" for u in down}
        running: dict[str, float] = {}  # unit -> when the manager last said it runs anew
        anew = {} if anew is None else anew
        healthy: set[str] = set()
        while pending:
            for u in down:
                if u.name not in pending:
                    continue
                why = self._lacks(u, before.get(u.name, ""), running, anew)
                if why is None:
                    why = self._not_serving(u, since, u.name in held, among, healthy,
                                            anew.get(u.name))
                if why is None:
                    pending.pop(u.name)
                    self.say(f"  {u.name}: " + ("healthy, its pairs good (held out of the "
                                                "router)" if u.name in held else "serving again"))
                elif why.startswith("FAILED"):
                    raise StepFailed(f"{u.name} {why}")
                else:
                    pending[u.name] = why
            if not pending:
                return
            if self.host.now() >= deadline:
                raise StepFailed("not serving within "
                                 f"{self.bounds.ready_secs:g} s: " + "; ".join(
                                     f"{n}: {w}" for n, w in pending.items()))
            self.host.sleep(self.bounds.poll_secs)

    def _lacks(self, u: Unit, invocation: str, running: dict[str, float],
               anew: dict[str, float]) -> str | None:
        """What the manager says is missing (None: it runs anew), asked at most every
        ``manager_secs`` once it said the unit runs anew (``running``: when it last did)."""
        if self.host.now() - running.get(u.name, float("-inf")) < self.bounds.manager_secs:
            return None
        why = self._not_running(u, invocation)
        if why is None:
            running[u.name] = self.host.now()
            anew.setdefault(u.name, self.host.wall())
        return why

    def _not_running(self, u: Unit, invocation: str) -> str | None:
        """None when the manager runs the unit in a new invocation ('FAILED …': never)."""
        state = self.manager.state(u.local_name).state
        if state == "failed":
            return f"FAILED ({self.manager.look(u.local_name)})"
        if state != "active" or self.manager.invocation(u.local_name) == invocation:
            return f"not active in a new run yet ({state})"
        return None

    def _not_serving(self, u: Unit, since: float, held: bool = False,
                     among: list[str] | None = None, healthy: set[str] | None = None,
                     anew: float | None = None) -> str | None:
        """None when the running unit serves again; else what it still lacks. ``healthy``:
        units whose /health said 200 in this run (asked no more); ``anew``: when apply first
        saw it run in a new invocation (wall clock)."""
        if u.kind == "router":
            url = u.option("--readiness-url")
            if url and self.host.http("GET", url)[0] != 200:
                return "router not ready"
            return None
        if u.kind != "engine":
            return None
        health = u.option("--health-url")
        if health and (healthy is None or u.name not in healthy):
            if self.host.http("GET", health, timeout=30)[0] != 200:
                return "/health not 200 yet"
            if healthy is not None:
                healthy.add(u.name)
        if u.option("--router") and not held:
            entry, answered = self.router.entry(u)
            if entry is None or entry.get("is_healthy") is False:
                return "not registered with the router yet" if answered else "router unreachable"
        return self._canary_lacks(u, since, among, anew)

    def _canary(self, u: Unit) -> dict[str, Any] | None:
        """The engine's pair canary state (the runtime's NAME.canary.json), or None."""
        if not u.option("--state-dir"):
            return None
        name = u.option("--name", u.name.removesuffix(".service"))
        text = self.host.read(state_path(u.option("--state-dir"), name, Kind.CANARY))
        try:
            doc = parse_state(text, name) if text else None
        except NewerFormat as e:
            raise StepFailed(str(e)) from None
        return doc if doc is not None and isinstance(doc.get("pairs"), list) else None

    def _peers(self, u: Unit) -> list[Unit]:
        """The engines at the other end of u's pairs that run on this host (their state)."""
        ends = {end for pair in u.pairs for end in pair} - {u.url}
        here = u.name.rpartition("/")[0]
        return [p for p in self.units.values() if p.kind == "engine" and p.url in ends
                and p.name.rpartition("/")[0] == here]

    def _canary_lacks(self, u: Unit, since: float, among: list[str] | None = None,
                      anew: float | None = None) -> str | None:
        """What the pair canary has not yet judged good since `since`: this engine's own,
        or, once it runs anew (``anew``: when apply saw it so, wall clock), its peer's. Both
        ends probe the same pair (one PD request through the two), and a round that turned
        good after the new run began went through the new engine (the old one was gone before
        it started): with both ends restarted (1P1D), the one healthy last proves the pair
        first, while the other's round found its peer not up yet."""
        if not u.pairs or not u.option("--state-dir"):
            return None
        want = [f"{p} -> {d}" for p, d in u.pairs
                if among is None or (p.rstrip("/") in among and d.rstrip("/") in among)]
        sources = [(self._canary(u), since)]
        if anew is not None:
            sources += [(self._canary(p), max(since, anew)) for p in self._peers(u)]
        good: set[str] = set()
        for doc, floor in sources:
            if doc is None or float(doc.get("at") or 0) < floor:
                continue
            good |= {str(p.get("pair")) for p in doc["pairs"] if isinstance(p, dict) and
                     p.get("state") == PairHealth.OK and float(p.get("last_ok") or 0) >= floor}
        bad = [pair for pair in want if pair not in good]
        if not bad:
            return None
        mine = sources[0][0]
        if mine is None or float(mine.get("at") or 0) < since:
            return "no canary round since the restart yet"
        return f"pair canary not good yet: {', '.join(bad)}"
