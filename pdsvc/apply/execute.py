"""Running a rollout's steps on this host: its service manager (systemd or supervisord,
managers.py) and the router, one step at a time.

Each engine step: take its engines out of the router (`DELETE /workers/{id}` on the control
plane both router generations have: sglang-router 0.3.2 and smg; the runtime's membership.py
does the same at every stop), wait until their in-flight requests have finished (the engine's
`sglang:num_running_reqs`; bounded here, since SGLang's own SIGTERM drain has no bound), then
restart (`systemctl restart`; supervisord: managers.py), and wait until each unit is active
again in a new invocation (systemd's InvocationID; supervisord's pid and start time), its /health
answers 200, the router lists it healthy (the runtime registers it again by itself) and its own
pair canary has judged every pair good since the restart (the runtime's NAME.canary.json).
A step that does not get there within its bound fails, and the rollout stops there.

The hold. Before it takes an engine out, apply writes the engine's hold file (the runtime's
NAME.hold.json, pdsvc/ship/runtime/hold.py): the runtime then neither joins the router nor
re-adds the engine, also once restarted, and its canary reports without healing. apply
releases it once the engine is healthy and its pairs good, then waits for the runtime to
register it. Every hold apply wrote is removed when the rollout ends, fails or is
interrupted (release_all, called by the command in a `finally`); while it lasts it is leased
and renewed (lease.py), so a killed apply's hold ends by itself.

A pair-incompatible change by halves (rollout.halves, steps "restart half" and "switch
halves"): A restarts held out, its canary fenced to A's peers, while B serves fenced to B's
(old and new never meet: SGLang's decode dies on a page size or KV dtype mismatch, see
hold.py); the switch holds B out and deletes it from the router, then registers A itself.
Between the DELETE and the POST no pair is listed (measured: A listed 0.27 s after the
first DELETE, most of it the router's own add: it probes the new worker's /health first); a
request then gets the router's 503 "no available servers". sglang-router selects the pair
afresh inside its retry loop (src/routers/http/pd_router.rs execute_dual_dispatch:
handle_server_selection_error answers 503, a retryable status), backing off 200 ms doubling
(router.retry), so none fails there. smg's later source does the same
(model_gateway/src/routers/http/pd_router.rs execute_dual_dispatch_attempt), yet smg 1.13
(a compiled wheel) returned that 503 to clients in our runs: 1-2 of ~115 requests, plain and
streamed, failed in the gap. No order avoids the gap: the halves are disjoint, and any moment
the router lists a prefill of one half with a decode of the other routes mixed pairs. Then B
restarts held, and at the end every hold is released and B joins.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdsvc.apply.lease import Lease
from pdsvc.apply.managers import Manager, Systemd
from pdsvc.apply.rollout import Step
from pdsvc.apply.units import Unit
from pdsvc.ship.runtime.hold import clear_hold, hold_path, write_hold
from pdsvc.ship.runtime.membership import Worker
from pdsvc.ship.runtime.statefile import read_json

RUNNING_REQS = "sglang:num_running_reqs"


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
    poll_secs: float = 0.5


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
    """Runs steps against one host's service manager (managers.py: systemd or supervisord)
    and the router the units name. A unit of a deployment over several hosts (HOST/UNIT) is
    asked for by its own name on its host."""

    def __init__(self, units: dict[str, Unit], host: Host, bounds: Bounds,
                 say: Callable[[str], None], manager: Manager | None = None) -> None:
        self.units = units
        self.host = host
        self.bounds = bounds
        self.say = say
        self.manager = manager or Systemd(host)
        self.holds: dict[str, str] = {}  # hold file -> unit, every one written and not removed
        self.lease = Lease(host, say)  # renews them (lease.py; the command starts its thread)

    # ------------------------------------------------------------------ router
    def _headers(self, u: Unit) -> dict[str, str]:
        key = (self.host.read(u.key_file) or "").strip() if u.key_file else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _router_entry(self, u: Unit) -> tuple[dict | None, bool]:
        """(the router's entry for this engine, whether the router answered)."""
        router = u.option("--router")
        if not router:
            return None, False
        code, body = self.host.http("GET", f"{router.rstrip('/')}/workers", self._headers(u))
        try:
            doc = json.loads(body) if code == 200 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
            return None, False
        for entry in doc["workers"]:
            if isinstance(entry, dict) and str(entry.get("url", "")).rstrip("/") == u.url:
                return entry, True
        return None, True

    def _deregister(self, u: Unit) -> bool:
        """Take the engine out of the router; True when it was listed."""
        entry, _ = self._router_entry(u)
        if entry is None:
            return False
        wid = urllib.parse.quote(str(entry.get("id", "")), safe="")
        self.host.http("DELETE", f"{u.option('--router').rstrip('/')}/workers/{wid}",
                       self._headers(u))
        return True

    def _register(self, u: Unit) -> None:
        """POST the engine to the router as its runtime would (membership.Worker)."""
        port = u.option("--bootstrap-port")
        worker = Worker(u.url, u.role, int(port) if port.isdigit() else None)
        self.host.http("POST", f"{u.option('--router').rstrip('/')}/workers",
                       {**self._headers(u), "Content-Type": "application/json"},
                       body=worker.payload())

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
        if step.action != "start":
            self._wait_for_others(engines)
            for u in engines:  # out, and kept out once restarted, until released
                self._hold(u, out=True, peers=among, why=f"{step.action} {u.name}")
            if first_half:  # B serves meanwhile, its canary never probing the new A
                for n in step.halves[1]:
                    self._hold(self.units[n], out=False, peers=self._urls(step.halves[1]),
                               why="the other half restarts with a pair-incompatible change")
            self._drain(engines)
        verb = "start" if step.action == "start" else "restart"
        since = self.host.wall()
        names = [self.units[n].local_name if n in self.units else n for n in step.units]
        rc, out = self.manager.act(verb, names, self.bounds.ready_secs)
        if rc != 0:
            raise StepFailed(f"{self.manager.name}: {verb} {' '.join(names)} failed ({rc}): "
                             f"{out.splitlines()[-1] if out else ''}")
        held = {u.name for u in engines if any(h == u.name for h in self.holds.values())}
        self._wait_ready(down, before, since, held=held, among=among)
        if first_half:
            return self.host.now() - t0  # A stays out until the switch
        for name in self.release_all():
            self.say(f"  {name}: released (joins the router)")
        self._wait_ready(down, before, since)
        return self.host.now() - t0

    def _switch(self, step: Step) -> None:
        """B out of the router (held, so it stays out), then A in: apply posts A itself, the
        gap is two control-plane calls; A's runtime would post it within its next check."""
        a, b = step.halves
        for n in b:
            self._hold(self.units[n], out=True, peers=self._urls(b), why="switch to the new half")
        t0 = self.host.now()
        for n in b:
            if self._deregister(self.units[n]):
                self.say(f"  {n}: out of the router")
        for n in a:
            u = self.units[n]
            self._hold(u, out=False, peers=self._urls(a), why="serving; the old half restarts")
            self._register(u)
        deadline = self.host.now() + self.bounds.ready_secs
        pending = list(a)
        while pending:
            pending = [n for n in pending if not self._listed_healthy(self.units[n])]
            if not pending:
                break
            if self.host.now() >= deadline:
                raise StepFailed(f"not listed by the router within {self.bounds.ready_secs:g}"
                                 f" s: {', '.join(pending)}")
            self.host.sleep(min(self.bounds.poll_secs, 0.1))
        self.say(f"  {', '.join(a)}: serving with the new definition (listed by the router "
                 f"{self.host.now() - t0:.2f} s after the first DELETE)")

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
        deadline = self.host.now() + self.bounds.ready_secs
        said = False
        while True:
            missing = [r for r in roles
                       if not any(u.role == r and self._listed_healthy(u) for u in others)]
            if not missing:
                return
            if not said:
                self.say(f"  waiting until the router lists another {' and '.join(missing)} "
                         f"before {', '.join(sorted(out))} leaves it (serving must not stop)")
                said = True
            if self.host.now() >= deadline:
                raise StepFailed(f"the router lists no other healthy {' or '.join(missing)} "
                                 f"within {self.bounds.ready_secs:g} s: taking "
                                 f"{', '.join(sorted(out))} out would stop serving")
            self.host.sleep(self.bounds.poll_secs)

    def _listed_healthy(self, u: Unit) -> bool:
        entry, _ = self._router_entry(u)
        return entry is not None and entry.get("is_healthy") is not False and str(
            entry.get("status", "")).lower() not in ("draining", "failed")

    def _drain(self, engines: list[Unit]) -> None:
        """Out of the router, then wait (bounded) until no request runs on them. The runtime
        re-registers an engine it finds missing (every few seconds): taken out again."""
        for u in engines:
            if self._deregister(u):
                self.say(f"  {u.name}: out of the router {u.option('--router')}")
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
            for u in engines:
                self._deregister(u)
            self.host.sleep(self.bounds.poll_secs)

    def _wait_ready(self, down: list[Unit], before: dict[str, str], since: float,
                    held: set[str] = frozenset(), among: list[str] | None = None) -> None:
        """Until each unit serves again: ``held`` ones need not be in the router (apply keeps
        them out); ``among``: only the pairs among these engines are judged."""
        deadline = self.host.now() + self.bounds.ready_secs
        pending = {u.name: "not restarted yet" for u in down}
        while pending:
            for u in down:
                if u.name not in pending:
                    continue
                why = self._not_ready(u, before.get(u.name, ""), since, u.name in held, among)
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

    def _not_ready(self, u: Unit, invocation: str, since: float, held: bool = False,
                   among: list[str] | None = None) -> str | None:
        """None when the unit serves again; else what it still lacks ('FAILED …': never)."""
        state = self.manager.state(u.local_name)
        if state == "failed":
            return f"FAILED ({self.manager.look(u.local_name)})"
        if state != "active" or self.manager.invocation(u.local_name) == invocation:
            return f"not active in a new run yet ({state})"
        if u.kind == "router":
            url = u.option("--readiness-url")
            if url and self.host.http("GET", url)[0] != 200:
                return "router not ready"
            return None
        if u.kind != "engine":
            return None
        health = u.option("--health-url")
        if health and self.host.http("GET", health, timeout=30)[0] != 200:
            return "/health not 200 yet"
        if u.option("--router") and not held:
            entry, answered = self._router_entry(u)
            if entry is None or entry.get("is_healthy") is False:
                return "not registered with the router yet" if answered else "router unreachable"
        return self._canary_lacks(u, since, among)

    def _canary_lacks(self, u: Unit, since: float, among: list[str] | None = None) -> str | None:
        """What this engine's own pair canary has not yet judged good since `since`."""
        if not u.pairs or not u.option("--state-dir"):
            return None
        name = u.option("--name", u.name.removesuffix(".service"))
        text = self.host.read(f"{u.option('--state-dir')}/{name}.canary.json")
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {}
        pairs = doc.get("pairs") if isinstance(doc, dict) else None
        if not isinstance(pairs, list) or float(doc.get("at") or 0) < since:
            return "no canary round since the restart yet"
        if among is not None:  # a half: its pairs with the other half are never probed
            pairs = [p for p in pairs if isinstance(p, dict) and all(
                end.strip().rstrip("/") in among for end in str(p.get("pair")).split(" -> "))]
        bad = [str(p.get("pair")) for p in pairs if isinstance(p, dict) and not (
            p.get("state") == "ok" and float(p.get("last_ok") or 0) >= since)]
        return f"pair canary not good yet: {', '.join(bad)}" if bad else None
