"""Running a rollout's steps on this host: its service manager (systemd or supervisord,
pdsvc/status/managers/) and the router, one step at a time.

Each engine step: take its engines out of the router (`DELETE /workers/{id}` on the control
plane both router generations have: sglang-router 0.3.2 and smg; the runtime's membership.py
does the same at every stop), wait until their in-flight requests have finished (the engine's
`sglang:num_running_reqs`; bounded here, since SGLang's own SIGTERM drain has no bound), then
restart (`systemctl restart`; supervisord: status/managers/), and wait until each unit is active
again in a new invocation (systemd's InvocationID; supervisord's pid and start time), its /health
answers 200, the pair canary has judged every pair good since the restart (the runtime's
NAME.canary.json: its own, or its peer's once it runs anew, since both ends probe the same
pair), and the router lists it healthy. A step that does not get there within its bound
fails, and the rollout stops there. It looks every 0.1 s (Bounds.poll_secs): with one pair
(1P1D) each late look is a moment of the outage; the service manager, a subprocess, is asked
every 0.5 s once the unit runs again.

The hold. Before it takes an engine out, apply writes the engine's hold file (the runtime's
NAME.hold.json, pdsvc/ship/runtime/hold.py): the runtime then neither joins the router nor
re-adds the engine, also once restarted, and its canary reports without healing. Once the
engine is healthy and every pair of it good, apply registers it itself (the step's engines
at once, what the runtime's own join waits for, Canary.admits) and releases it; the runtime
keeps that entry. Every hold apply wrote is removed when the rollout ends, fails or is
interrupted (release_all, called by the command in a `finally`); while it lasts it is leased
and renewed (lease.py), so a killed apply's hold ends by itself.

A pair-incompatible change by halves (rollout.halves, steps "restart half" and "switch
halves"): A restarts held out, its canary fenced to A's peers, while B serves fenced to B's
(old and new never meet: SGLang's decode dies on a page size or KV dtype mismatch, see
hold.py); the switch holds B out, then in the gap only router calls: B's DELETEs at once,
one look that the router lists none of B, A's POSTs at once (threads); A's hold lets it in
after. Between the DELETE and the POST no pair is listed: apply's part is ~0.02 s, the rest
the router's own add (0.15-0.2 s measured on smg 1.13: it probes the new worker first); a
request then gets the router's 503 "no available servers". sglang-router selects the pair
afresh inside its retry loop (src/routers/http/pd_router.rs execute_dual_dispatch:
handle_server_selection_error answers 503, a retryable status), backing off 200 ms doubling
(router.retry), so none fails there. smg's published source does the same
(model_gateway/src/routers/http/pd_router.rs execute_dual_dispatch_attempt), yet smg 1.13
(a compiled wheel) answers `no_available_workers` at once, without its retries, and its
prefill admission queue (--prefill-queue-size) does not hold a request for an empty pool
(measured): 1-2 of ~100 requests fail in the gap. No order avoids the gap: the halves are
disjoint, and any moment the router lists a prefill of one half with a decode of the other
routes mixed pairs. Then B restarts held, and at the end every hold is released and B joins
(its runtime, once its canary judged the pairs with A: those were never probed).

Everything outside (commands, HTTP, files, the clock) goes through `Host`, so the order of
things is tested without a systemd.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pdsvc.apply.lease import Lease
from pdsvc.apply.rollout import Step
from pdsvc.apply.units import Unit
from pdsvc.ship.runtime.hold import clear_hold, hold_path, write_hold
from pdsvc.ship.runtime.membership import Worker
from pdsvc.ship.runtime.statefile import read_json
from pdsvc.status.managers import ServiceManager, Systemd

RUNNING_REQS = "sglang:num_running_reqs"
T = TypeVar("T")
#: Between two looks at the router during the switch of halves, while no pair is listed.
SWITCH_POLL_S = 0.02
#: How long one `systemctl show` may take while a step waits (a busy systemd answers late).
SHOW_TIMEOUT_S = 30.0


class StepFailed(Exception):
    """A step did not end with its units serving; the message says what was last seen."""


class Host:
    """The real host: subprocesses, HTTP and files. Tests pass a fake with the same methods."""

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return 127, str(e)
        return proc.returncode, (proc.stdout + proc.stderr).strip()

    def http(self, method: str, url: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0, body: bytes | None = None) -> tuple[int, str]:
        """(status, body); status 0 when nothing answered."""
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (our URLs)
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")
        except (OSError, ValueError) as e:
            return 0, str(e)

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError:
            return None

    def write_hold(self, path: str, out: bool, peers: list[str] | None, why: str,
                   until: float | None = None, since: float | None = None) -> bool:
        """Write a hold file (lease.py: ``until``, ``since``); whether it now holds what was
        written (the runtime's state directory exists and the write went through)."""
        doc = write_hold(path, out=out, peers=peers, why=why, until=until, since=since)
        return read_json(path) == doc

    def clear_hold(self, path: str) -> None:
        clear_hold(path)

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, secs: float) -> None:
        time.sleep(secs)


@dataclass(frozen=True)
class Bounds:
    drain_secs: float = 60.0  # in-flight requests of an engine taken out of the router
    ready_secs: float = 3600.0  # restarted to serving (healthy, registered, canary good)
    #: between two looks while a step waits (loopback HTTP, a state file): every look later
    #: than the moment it waits for is a moment serving waits too (1P1D: the outage)
    poll_secs: float = 0.1
    #: between two asks of the service manager once a unit runs again (a subprocess each)
    manager_secs: float = 0.5


def running_requests(metrics: str) -> int | None:
    """The sum of `sglang:num_running_reqs` in a Prometheus text page; None when absent."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith(RUNNING_REQS) and not line.startswith(RUNNING_REQS + "_"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return int(total) if seen else None


class Executor:
    """Runs steps against one host's service manager (status/managers/: systemd or supervisord)
    and the router the units name. A unit of a deployment over several hosts (HOST/UNIT) is
    asked for by its own name on its host."""

    def __init__(self, units: dict[str, Unit], host: Host, bounds: Bounds,
                 say: Callable[[str], None], manager: ServiceManager | None = None) -> None:
        self.units = units
        self.host = host
        self.bounds = bounds
        self.say = say
        self.manager = manager or Systemd(host, timeout=SHOW_TIMEOUT_S)
        self.holds: dict[str, str] = {}  # hold file -> unit, every one written and not removed
        self.lease = Lease(host, say)  # renews them (lease.py; the command starts its thread)

    # ------------------------------------------------------------------ router
    def _headers(self, u: Unit) -> dict[str, str]:
        key = (self.host.read(u.key_file) or "").strip() if u.key_file else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _workers(self, u: Unit) -> list[dict] | None:
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

    @staticmethod
    def _entry_in(workers: list[dict], u: Unit) -> dict | None:
        for entry in workers:
            if str(entry.get("url", "")).rstrip("/") == u.url:
                return entry
        return None

    def _router_entry(self, u: Unit) -> tuple[dict | None, bool]:
        """(the router's entry for this engine, whether the router answered)."""
        workers = self._workers(u)
        return (None, False) if workers is None else (self._entry_in(workers, u), True)

    def _delete(self, u: Unit, entry: dict) -> None:
        wid = urllib.parse.quote(str(entry.get("id", "")), safe="")
        self.host.http("DELETE", f"{u.option('--router').rstrip('/')}/workers/{wid}",
                       self._headers(u))

    def _deregister(self, u: Unit) -> bool:
        """Take the engine out of the router; True when it was listed."""
        entry, _ = self._router_entry(u)
        if entry is None:
            return False
        self._delete(u, entry)
        return True

    def _register(self, u: Unit) -> None:
        """POST the engine to the router as its runtime would (membership.Worker)."""
        port = u.option("--bootstrap-port")
        worker = Worker(u.url, u.role, int(port) if port.isdigit() else None)
        self.host.http("POST", f"{u.option('--router').rstrip('/')}/workers",
                       {**self._headers(u), "Content-Type": "application/json"},
                       body=worker.payload())

    @staticmethod
    def _at_once(call: Callable[[T], object], items: Sequence[T]) -> None:
        """``call`` for every item at the same moment (threads): the control-plane calls of one
        change, each a round trip the router answers from memory."""
        if len(items) < 2:
            for item in items:
                call(item)
            return
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            list(pool.map(call, items))

    @staticmethod
    def _routable(entry: dict | None) -> bool:
        return entry is not None and entry.get("is_healthy") is not False and str(
            entry.get("status", "")).lower() not in ("draining", "failed")

    # ------------------------------------------------------------------ holds
    def _hold(self, u: Unit, *, out: bool, peers: list[str] | None, why: str) -> bool:
        """Write the engine's hold (runtime/hold.py); False without a state directory."""
        path = hold_path(u.option("--state-dir") or None,
                         u.option("--name", u.local_name.removesuffix(".service")))
        if path is None or u.kind != "engine":
            return False
        self.holds[path] = u.name
        return self.lease.hold(path, out=out, peers=peers, why=why)

    def release_all(self) -> list[str]:
        """Remove every hold this rollout wrote (at its end, on failure, on Ctrl-C); the
        units released."""
        released = []
        for path, name in list(self.holds.items()):
            self.lease.release(path)
            released.append(name)
            del self.holds[path]
        return released

    def _urls(self, names: tuple[str, ...]) -> list[str]:
        return [self.units[n].url for n in names if n in self.units and self.units[n].url]

    # ------------------------------------------------------------------ a step
    def run_step(self, step: Step) -> float:
        """Run one step; the seconds it took. Raises StepFailed."""
        t0 = self.host.now()
        if step.action == "switch halves":
            self._switch(step)
            return self.host.now() - t0
        down = [self.units[n] for n in step.down if n in self.units]
        engines = [u for u in down if u.kind == "engine"]
        before = {u.name: self.manager.invocation(u.local_name) for u in down}
        first_half = bool(step.halves) and tuple(step.units) == tuple(step.halves[0])
        among = self._urls(tuple(step.units)) if step.halves else None
        took: list[tuple[str, float]] = []  # (phase, when it ended), for the step's last line
        if step.action != "start":
            self._wait_for_others(engines)
            for u in engines:  # out, and kept out once restarted, until released
                self._hold(u, out=True, peers=among, why=f"{step.action} {u.name}")
            if first_half:  # B serves meanwhile, its canary never probing the new A
                for n in step.halves[1]:
                    self._hold(self.units[n], out=False, peers=self._urls(step.halves[1]),
                               why="the other half restarts with a pair-incompatible change")
            self._drain(engines)
            took.append(("out and drained", self.host.now()))
        verb = "start" if step.action == "start" else "restart"
        since = self.host.wall()
        names = [self.units[n].local_name if n in self.units else n for n in step.units]
        rc, out = self.manager.act(verb, names, self.bounds.ready_secs)
        if rc != 0:
            raise StepFailed(f"{self.manager.name}: {verb} {' '.join(names)} failed ({rc}): "
                             f"{out.splitlines()[-1] if out else ''}")
        took.append((f"{verb}ed (stop, start, load: {self.manager.name})", self.host.now()))
        held = {u.name for u in engines if any(h == u.name for h in self.holds.values())}
        anew: dict[str, float] = {}
        self._wait_ready(down, before, since, held=held, among=among, anew=anew)
        took.append(("healthy, pairs proven by the canary", self.host.now()))
        if first_half:
            self._took(t0, took)
            return self.host.now() - t0  # A stays out until the switch
        if among is None:
            # every pair of each proven since the restart (what the runtime's own join waits
            # for, Canary.admits): apply registers them at once, not one membership check later
            # each; a half's cross pairs were never probed, so there its runtime joins itself
            posted = [u for u in engines if u.name in held and u.option("--router")]
            self._at_once(self._register, posted)
            if posted:
                self.say(f"  {', '.join(u.name for u in posted)}: registered with the router")
        for name in self.release_all():
            self.say(f"  {name}: released (joins the router)")
        self._wait_ready(down, before, since, anew=anew)
        took.append(("listed by the router", self.host.now()))
        self._took(t0, took)
        return self.host.now() - t0

    def _took(self, t0: float, took: list[tuple[str, float]]) -> None:
        """The step's seconds by phase, in one line."""
        parts, last = [], t0
        for phase, end in took:
            parts.append(f"{phase} {end - last:.2f}")
            last = end
        self.say(f"  took (s): {', '.join(parts)}")

    def _wait_for_others(self, going: list[Unit]) -> None:
        """Serving must not stop: before engines leave the router, it lists a healthy engine of
        each of their roles outside this step, where the deployment has one. An engine that
        has not (re-)joined yet (just started, back from a crash or a heal, its runtime still
        waiting for its canary) is waited for, up to the step's bound: the plan's "serving
        never stops" counts engines, the router counts the ones it can route to."""
        out = {u.name for u in going}
        others = [u for u in self.units.values()
                  if u.kind == "engine" and u.name not in out and u.url]
        roles = sorted({u.role for u in going} & {u.role for u in others})
        if not roles:
            return
        missing: list[str] = []

        def none_missing(workers: list[dict]) -> bool:
            missing[:] = [r for r in roles if not any(
                u.role == r and self._routable(self._entry_in(workers, u)) for u in others)]
            return not missing

        def waiting() -> None:
            self.say(f"  waiting until the router lists another {' and '.join(missing)} "
                     f"before {', '.join(sorted(out))} leaves it (serving must not stop)")

        if not self._until(none_missing, others[0], poll=self.bounds.poll_secs,
                           waiting=waiting):
            raise StepFailed(f"the router lists no other healthy {' or '.join(missing)} "
                             f"within {self.bounds.ready_secs:g} s: taking "
                             f"{', '.join(sorted(out))} out would stop serving")

    def _switch(self, step: Step) -> None:
        """B out of the router, then A in; the gap between is what the router serves with no
        pair (smg 1.13 answers 503 then), so nothing else happens in it: B is held (its
        runtime then re-adds nothing) and its entries are read before; in the gap, B's DELETEs
        at once, one look that the router lists none of B, A's POSTs at once. A's runtime is
        held out meanwhile and keeps the entry apply posted once its hold lets it in."""
        a, b = ([self.units[n] for n in half] for half in step.halves)
        for u in b:
            self._hold(u, out=True, peers=self._urls(step.halves[1]),
                       why="switch to the new half")
        old = [(u, e) for u in b for e in [self._router_entry(u)[0]] if e is not None]
        t0 = self.host.now()
        self._at_once(lambda ue: self._delete(*ue), old)
        # never a new engine beside an old one (a mixed pair): A only once B is gone
        if not self._until(lambda w: not any(self._routable(self._entry_in(w, u)) for u in b),
                           b[0]):
            raise StepFailed(f"within {self.bounds.ready_secs:g} s: still listed after its "
                             f"DELETE: {', '.join(u.name for u in b)}")
        self._at_once(self._register, a)
        t_post = self.host.now()
        for u in a:
            self._hold(u, out=False, peers=self._urls(step.halves[0]),
                       why="serving; the old half restarts")
        for u, _ in old:
            self.say(f"  {u.name}: out of the router")
        if not self._until(lambda w: all(self._routable(self._entry_in(w, u)) for u in a), a[0]):
            raise StepFailed(f"within {self.bounds.ready_secs:g} s: not listed by the router: "
                             f"{', '.join(u.name for u in a)}")
        self.say(f"  {', '.join(u.name for u in a)}: serving with the new definition (listed "
                 f"by the router {self.host.now() - t0:.2f} s after the first DELETE; posted "
                 f"{t_post - t0:.2f} s after it)")

    def _until(self, done: Callable[[list[dict]], bool], u: Unit, poll: float = SWITCH_POLL_S,
               waiting: Callable[[], None] | None = None) -> bool:
        """Look at the router's worker list (the one ``u`` names) until ``done``, every
        ``poll`` s at most (``waiting``: called once, after the first look that was not);
        False once the step's bound passed."""
        deadline = self.host.now() + self.bounds.ready_secs
        first = True
        while True:
            workers = self._workers(u)
            if workers is not None and done(workers):
                return True
            if first and waiting is not None:
                waiting()
            first = False
            if self.host.now() >= deadline:
                return False
            self.host.sleep(min(self.bounds.poll_secs, poll))

    def _drain(self, engines: list[Unit]) -> None:
        """Out of the router (at once), then wait (bounded) until no request runs on them. The
        runtime re-registers an engine it finds missing unless apply holds it: one without a
        hold (no state directory) is taken out again at every look."""
        out = {u.name for u in engines}
        self._at_once(lambda u: out.discard(u.name) if not self._deregister(u) else None,
                      engines)
        for u in engines:
            if u.name in out:
                self.say(f"  {u.name}: out of the router {u.option('--router')}")
        unheld = [u for u in engines if u.name not in self.holds.values()]
        deadline = self.host.now() + self.bounds.drain_secs
        while True:
            counts: dict[str, int | None] = {}
            for u in engines:
                code, body = self.host.http("GET", f"{u.url}/metrics")
                counts[u.name] = running_requests(body) if code == 200 else None
            busy = {n: c for n, c in counts.items() if c}
            if not busy:
                unknown = [n for n, c in counts.items() if c is None]
                if unknown:
                    self.say(f"  {', '.join(unknown)}: no sglang:num_running_reqs (metrics off?):"
                             " SGLang's own SIGTERM drain finishes what runs")
                elif engines:
                    self.say(f"  {', '.join(counts)}: no request in flight")
                return
            if self.host.now() >= deadline:
                self.say(f"  drain bound ({self.bounds.drain_secs:g} s) reached with "
                         f"{sum(busy.values())} requests still running on {', '.join(busy)}: "
                         "restarting; SGLang drains them on SIGTERM within the unit's "
                         "TimeoutStopSec=")
                return
            for u in unheld:
                self._deregister(u)
            self.host.sleep(self.bounds.poll_secs)

    def _wait_ready(self, down: list[Unit], before: dict[str, str], since: float,
                    held: set[str] = frozenset(), among: list[str] | None = None,
                    anew: dict[str, float] | None = None) -> None:
        """Until each unit serves again: ``held`` ones need not be in the router (apply keeps
        them out); ``among``: only the pairs among these engines are judged; ``anew``: unit
        -> when it was first seen run anew (wall clock), filled here. The service manager is
        asked every ``manager_secs`` once a unit runs again, the rest every ``poll_secs``;
        /health until it answers 200 once in this run."""
        deadline = self.host.now() + self.bounds.ready_secs
        pending = {u.name: "not restarted yet" for u in down}
        running: dict[str, float] = {}  # unit -> when the manager last said it runs anew
        anew = {} if anew is None else anew
        healthy: set[str] = set()
        while pending:
            for u in down:
                if u.name not in pending:
                    continue
                why = None
                if self.host.now() - running.get(u.name, float("-inf")) >= \
                        self.bounds.manager_secs:
                    why = self._not_running(u, before.get(u.name, ""))
                    if why is None:
                        running[u.name] = self.host.now()
                        anew.setdefault(u.name, self.host.wall())
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
            entry, answered = self._router_entry(u)
            if entry is None or entry.get("is_healthy") is False:
                return "not registered with the router yet" if answered else "router unreachable"
        return self._canary_lacks(u, since, among, anew)

    def _canary(self, u: Unit) -> dict | None:
        """The engine's pair canary state (the runtime's NAME.canary.json), or None."""
        if not u.option("--state-dir"):
            return None
        name = u.option("--name", u.name.removesuffix(".service"))
        text = self.host.read(f"{u.option('--state-dir')}/{name}.canary.json")
        try:
            doc = json.loads(text) if text else None
        except ValueError:
            doc = None
        return doc if isinstance(doc, dict) and isinstance(doc.get("pairs"), list) else None

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
                     p.get("state") == "ok" and float(p.get("last_ok") or 0) >= floor}
        bad = [pair for pair in want if pair not in good]
        if not bad:
            return None
        mine = sources[0][0]
        if mine is None or float(mine.get("at") or 0) < since:
            return "no canary round since the restart yet"
        return f"pair canary not good yet: {', '.join(bad)}"
