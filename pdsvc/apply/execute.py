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

from pdsvc.apply.managers import Manager, Systemd
from pdsvc.apply.rollout import Step
from pdsvc.apply.units import Unit

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
             timeout: float = 3.0) -> tuple[int, str]:
        """(status, body); status 0 when nothing answered."""
        req = urllib.request.Request(url, method=method, headers=headers or {})
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

    # ------------------------------------------------------------------ a step
    def run_step(self, step: Step) -> float:
        """Run one step; the seconds it took. Raises StepFailed."""
        t0 = self.host.now()
        down = [self.units[n] for n in step.down if n in self.units]
        engines = [u for u in down if u.kind == "engine"]
        before = {u.name: self.manager.invocation(u.local_name) for u in down}
        if step.action != "start":
            self._drain(engines)
        verb = "start" if step.action == "start" else "restart"
        since = self.host.wall()
        names = [self.units[n].local_name if n in self.units else n for n in step.units]
        rc, out = self.manager.act(verb, names, self.bounds.ready_secs)
        if rc != 0:
            raise StepFailed(f"{self.manager.name}: {verb} {' '.join(names)} failed ({rc}): "
                             f"{out.splitlines()[-1] if out else ''}")
        self._wait_ready(down, before, since)
        if engines:
            self._settle()
        return self.host.now() - t0

    def _router_check_secs(self) -> float:
        """The router's health-check interval (--health-check-interval-secs of its command):
        a worker added to smg is routed to only once its health checker has passed it, while
        /workers lists it at once; so the next step, which may take out the only other engine
        of a role, waits that long. 0 when no router of this host names one."""
        for u in self.units.values():
            if u.kind == "router":
                words = u.engine_argv
                if "--health-check-interval-secs" in words:
                    i = words.index("--health-check-interval-secs")
                    try:
                        return float(words[i + 1])
                    except (IndexError, ValueError):
                        return 0.0
        return 0.0

    def _settle(self) -> None:
        wait = self._router_check_secs()
        if wait > 0:
            self.say(f"  waiting {wait:g} s: the router's health check routes to it by then")
            self.host.sleep(wait)

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

    def _wait_ready(self, down: list[Unit], before: dict[str, str], since: float) -> None:
        deadline = self.host.now() + self.bounds.ready_secs
        pending = {u.name: "not restarted yet" for u in down}
        while pending:
            for u in down:
                if u.name not in pending:
                    continue
                why = self._not_ready(u, before.get(u.name, ""), since)
                if why is None:
                    pending.pop(u.name)
                    self.say(f"  {u.name}: serving again")
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

    def _not_ready(self, u: Unit, invocation: str, since: float) -> str | None:
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
        if u.option("--router"):
            entry, answered = self._router_entry(u)
            if entry is None or entry.get("is_healthy") is False:
                return "not registered with the router yet" if answered else "router unreachable"
        return self._canary_lacks(u, since)

    def _canary_lacks(self, u: Unit, since: float) -> str | None:
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
        bad = [str(p.get("pair")) for p in pairs if isinstance(p, dict) and not (
            p.get("state") == "ok" and float(p.get("last_ok") or 0) >= since)]
        return f"pair canary not good yet: {', '.join(bad)}" if bad else None
