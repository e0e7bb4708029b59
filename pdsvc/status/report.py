"""`pdsvc status`: does the stack serve right now, and if not, why.

Two layers, kept apart so that a service manager is one class:

* the query layer gathers facts and never formats: a service-manager backend answers
  `state(unit) -> ServiceState` (`SystemdBackend` asks `systemctl show`; `SupervisordBackend`
  asks the supervisord of `pdsvc render --format supervisord` over its control socket, by
  XML-RPC — what `supervisorctl status` does), `http_get()` probes an
  engine's `/health`, the router's `/readiness` and `/workers`; `collect()` puts them into a
  `Report` and `judge()` decides whether the stack serves;
* `format_text()` and `report_dict()` turn a Report into the table or the JSON.

Serving means: every service unit of the plan is active and the router's `/readiness` is 200
(sglang-router 0.3.2 answers 200 only with at least one healthy prefill and one healthy decode,
as its /readiness handler does). Nothing here raises when systemd or an endpoint cannot be
reached: each such fact becomes a row that says why.

`--backend auto` (the default) asks the manager the config's `format` renders for.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from pdsvc.plan.build import Plan, RouterPlan
from pdsvc.status import runstate
from pdsvc.status.managers import ServiceBackend, ServiceState

HTTP_TIMEOUT = 2.0  # seconds per probe: a status command must answer quickly
MAX_BODY = 1 << 20  # /workers of a big deployment stays far below this
CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase the screen
STATUS_EPILOG = """\b
Exit codes: 0 serving (every unit active, router /readiness 200), 1 not serving,
            2 bad config or usage. A plan that does not fit the host's topology (a GPU
            fell off the bus) is one more finding: the units are shown all the same.
"""
#: The schema tag of `status --json` (as doctor's and topology's carry theirs).
STATUS_SCHEMA = "pdsvc-status/1"

BACKENDS = ("auto", "systemd", "supervisord")


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Probe:
    """One GET: the HTTP status and latency, or why no HTTP answer came."""

    url: str
    code: int | None = None  # None: no HTTP answer (see error)
    latency_ms: float | None = None
    error: str | None = None  # connection refused, no answer within 2s, …
    body: str = field(default="", repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.code == 200

    def summary(self) -> str:
        """`200 (3 ms)`, `503 (2 ms)`, `connection refused`."""
        if self.code is None:
            return self.error or "no answer"
        return f"{self.code} ({self.latency_ms:.0f} ms)"

    def reason(self) -> str:
        """The `reason` (or `status`) a JSON error body gives, e.g. the router's
        `insufficient healthy workers`; empty when there is none."""
        try:
            doc = json.loads(self.body)
        except ValueError:
            return ""
        if isinstance(doc, dict):
            return str(doc.get("reason") or doc.get("status") or "")
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "code": self.code, "latency_ms": self.latency_ms,
                "error": self.error}


def http_get(url: str, *, timeout: float = HTTP_TIMEOUT,
             headers: Mapping[str, str] | None = None) -> Probe:
    """GET `url` without proxies (the endpoints are local); never raises."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=dict(headers or {}))
    t0 = time.monotonic()
    try:
        try:
            with opener.open(request, timeout=timeout) as response:
                code, body = response.status, response.read(MAX_BODY)
        except urllib.error.HTTPError as e:  # an answer all the same: 4xx/5xx
            code, body = e.code, e.read(MAX_BODY)
    except urllib.error.URLError as e:
        return Probe(url, error=_why(e.reason, timeout))
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Probe(url, error=_why(e, timeout))
    latency_ms = round((time.monotonic() - t0) * 1000, 1)
    return Probe(url, code, latency_ms, body=body.decode("utf-8", "replace"))


def _why(reason: object, timeout: float) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError since 3.10
        return f"no answer within {timeout:g}s"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve host ({reason.strerror})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


@dataclass(frozen=True)
class Worker:
    """One worker in the router's own view (GET /workers)."""

    url: str
    type: str  # prefill, decode (regular outside PD mode)
    healthy: bool


def parse_workers(body: str) -> tuple[Worker, ...]:
    """sglang-router 0.3.2 `/workers`: `{"workers": [{"url", "worker_type", "is_healthy", …}],
    "stats": …}` (sglang-router's GET /workers). ValueError when the body is not that."""
    doc = json.loads(body)
    items = doc.get("workers") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ValueError("no 'workers' list in the answer")
    workers = []
    for item in items:
        if not isinstance(item, dict) or "url" not in item:
            raise ValueError(f"unexpected worker entry {item!r:.80}")
        kind = item.get("worker_type", "")
        if isinstance(kind, dict):  # an enum with data, e.g. {"Prefill": {"bootstrap_port": …}}
            kind = next(iter(kind), "")
        workers.append(Worker(str(item["url"]), str(kind).lower(), item.get("is_healthy") is True))
    return tuple(workers)


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class UnitView:
    role: str  # target, prefill, decode, router
    state: ServiceState
    probe: Probe | None  # engines: /health; router: /readiness; target: none


@dataclass(frozen=True)
class Report:
    name: str
    backend: str
    units: tuple[UnitView, ...]  # the target first, then the services of the plan
    workers: tuple[Worker, ...] | None  # None: the router's view could not be read
    workers_probe: Probe
    workers_error: str | None
    url: str  # where clients send requests
    serving: bool
    problems: tuple[str, ...]
    runs: tuple[runstate.UnitRun, ...] = ()  # how each unit's last run ended (the runtime's)
    pairs: tuple[runstate.PairView, ...] = ()  # the pair canary's P x D matrix

    @property
    def verdict(self) -> str:
        if self.serving:
            return "serving" + (f", but: {'; '.join(self.problems)}" if self.problems else "")
        return "not serving: " + ("; ".join(self.problems) or "unknown reason")


def client_url(router: RouterPlan, hostname: str) -> str:
    """The chat endpoint as clients reach it: the router's host, or this machine's name when
    the router listens on every address."""
    host = hostname if router.host in ("0.0.0.0", "::", "") else router.host
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{router.port}/v1/chat/completions"


def router_headers(router: RouterPlan, key_file: str | None = None) -> dict[str, str]:
    """/workers is the control plane: its key (--control-plane-api-keys, from the file the
    runtime gives the router; readable by root and the service group), else `--api-key` in
    router.args, which guards /workers too (sglang-router's `--api-key` help)."""
    if key_file:
        from pdsvc.ship.runtime.membership import read_key

        try:
            key = read_key(key_file, {})
        except (OSError, ValueError):
            key = None
        if key:
            return {"Authorization": f"Bearer {key}"}
    argv = list(router.argv)
    if "--api-key" in argv and argv.index("--api-key") + 1 < len(argv):
        return {"Authorization": f"Bearer {argv[argv.index('--api-key') + 1]}"}
    return {}


def collect(
    plan: Plan,
    backend: ServiceBackend,
    *,
    hostname: str,
    http_timeout: float = HTTP_TIMEOUT,
    whole: Plan | None = None,
    findings: tuple[str, ...] = (),
) -> Report:
    """Ask the service manager about every unit and probe every endpoint, all at once (a
    hung endpoint costs one timeout, not one per probe).

    ``plan`` is what runs here; ``whole``, for one host of several (Plan.for_host), the whole
    deployment: the router is then probed where it runs, and every engine is expected in its
    view of the workers. ``findings``: what else is wrong (the plan does not fit this host's
    topology), one more problem each."""
    whole = whole or plan
    router = plan.router or whole.reachable_router()
    headers = router_headers(router, whole.paths.router_key)
    units = [("target", plan.target), *((e.role, e.unit) for e in plan.engines)]
    units += [("router", router.unit)] if plan.router else []
    urls = [(e.health_url, {}) for e in plan.engines]
    urls += [(router.readiness_url, {}), (f"{router.url}/workers", headers)]
    with ThreadPoolExecutor(max_workers=len(units) + len(urls)) as pool:
        states = [pool.submit(backend.state, unit) for _, unit in units]
        probes = [pool.submit(http_get, u, timeout=http_timeout, headers=h) for u, h in urls]
        state_of = [f.result() for f in states]
        *health, readiness, workers_probe = (f.result() for f in probes)
    engines = zip(plan.engines, state_of[1:1 + len(plan.engines)], health, strict=True)
    views = (
        UnitView("target", state_of[0], None),
        *(UnitView(e.role, s, p) for e, s, p in engines),
        *((UnitView("router", state_of[-1], readiness),) if plan.router else ()),
    )
    workers: tuple[Worker, ...] | None = None
    workers_error = None
    if workers_probe.ok:
        try:
            workers = parse_workers(workers_probe.body)
        except (ValueError, AttributeError) as e:
            workers_error = f"unreadable answer: {e}"
    else:
        workers_error = (f"HTTP {workers_probe.code}" if workers_probe.code is not None
                         else workers_probe.error)
    expected = tuple(dict.fromkeys((e.role, e.url) for e in whole.engines))
    serving, problems = judge(views, workers, workers_error, expected,
                              None if plan.router else readiness)
    where = runstate.state_dir(plan, backend.name)
    runs, pairs = runstate.unit_runs(plan, where), runstate.pair_views(plan, where)
    problems += runstate.problems(runs, pairs, plan.lifecycle.canary_heal_attempts)
    # the router of another host: where this host reaches it, not at this host's name
    url = client_url(router, hostname) if plan.router else f"{router.url}/v1/chat/completions"
    return Report(
        name=plan.name, backend=backend.name, units=views, workers=workers,
        workers_probe=workers_probe, workers_error=workers_error, url=url, serving=serving,
        problems=(*problems, *findings), runs=tuple(runs), pairs=tuple(pairs),
    )


def judge(
    units: tuple[UnitView, ...],
    workers: tuple[Worker, ...] | None,
    workers_error: str | None,
    expected: tuple[tuple[str, str], ...],
    remote_readiness: Probe | None = None,
) -> tuple[bool, list[str]]:
    """(serving, problems): serving = every service unit active and /readiness 200; the
    problems name what is wrong either way (a probe of a unit that is down is not repeated).
    ``remote_readiness``: the router's /readiness when it runs on another host."""
    problems: list[str] = []
    services = [u for u in units if u.role != "target"]
    errors = {u.state.error for u in services if u.state.error}
    if len(errors) == 1 and all(u.state.error for u in services):  # the manager itself is away
        problems.append(f"unit states unknown ({errors.pop()})")
        errors.clear()
    for u in services:
        s = u.state
        if s.error and errors:
            problems.append(f"{s.unit}: state unknown ({s.error})")
        elif not s.active and not s.error:
            # on the way up or down the status line says how far it got; once down, it is stale
            moving = s.state in ("activating", "deactivating", "reloading")
            text = f": {s.status_text}" if s.status_text and moving else ""
            problems.append(f"{s.unit} is {s.describe()}{text}")
            continue
        if u.probe is not None and not u.probe.ok:
            where = "/readiness" if u.role == "router" else "/health"
            reason = u.probe.reason() if u.probe.code is not None else ""
            what = "router not ready" if u.role == "router" else u.role
            problems.append(f"{what}: {where} {u.probe.summary()}"
                            + (f" — {reason}" if reason else ""))
    readiness = next((u.probe for u in services if u.role == "router"), remote_readiness)
    if remote_readiness is not None and not remote_readiness.ok:
        problems.append(f"router (another host) not ready: /readiness {remote_readiness.summary()}")
    if workers is not None:
        for w in workers:
            if not w.healthy:
                problems.append(f"{w.type} worker {w.url} unhealthy")
        listed = {w.url.rstrip("/") for w in workers}
        for role, url in expected:
            if url.rstrip("/") not in listed:
                problems.append(f"the router does not list the {role} worker {url}")
    elif readiness is not None and readiness.code is not None:  # the router answers, yet …
        problems.append(f"router /workers: {workers_error}")
    serving = bool(services) and all(u.state.active for u in services) and bool(
        readiness and readiness.ok)
    return serving, problems


# --------------------------------------------------------------------------- formatting


def human_age(secs: float | None) -> str:
    """42s, 3m12s, 2h05m, 3d04h; `-` when unknown."""
    if secs is None:
        return "-"
    s = int(secs)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_text(report: Report) -> str:
    """The table, the router's view of its workers, the client URL, and the verdict."""
    rows = [["UNIT", "STATE", "SINCE", "RESTARTS", "PROBE", "STATUS"]]
    for u in report.units:
        s = u.state
        probe = "-"
        if u.probe is not None:
            path = "/readiness" if u.role == "router" else "/health"
            probe = f"{path} {u.probe.summary()}"
        rows.append([
            s.unit, s.describe(), human_age(s.since_secs),
            "-" if s.restarts is None else str(s.restarts), probe, s.error or s.status_text,
        ])
    lines = [f"{report.name} PD stack ({report.backend})", "", *_table(rows), ""]
    lines.append(f"router workers (GET {report.workers_probe.url}):")
    if report.workers is None:
        lines.append(f"  unknown: {report.workers_error}")
    elif not report.workers:
        lines.append("  none")
    else:
        lines += ["  " + line for line in _table([
            [w.type, w.url, "healthy" if w.healthy else "UNHEALTHY"] for w in report.workers])]
    pairs = runstate.format_pairs(list(report.pairs))
    lines += ["", *pairs] if pairs else []
    lines += ["", f"send requests to: {report.url}", "", report.verdict]
    return "\n".join(lines)


def report_dict(report: Report) -> dict[str, Any]:
    """The same facts as the table, for machines."""
    return {
        "format": STATUS_SCHEMA,
        "name": report.name,
        "backend": report.backend,
        "serving": report.serving,
        "verdict": report.verdict,
        "problems": list(report.problems),
        "url": report.url,
        "units": [
            {"role": u.role, **asdict(u.state),
             "probe": u.probe.to_dict() if u.probe else None}
            for u in report.units
        ],
        "workers": None if report.workers is None else [asdict(w) for w in report.workers],
        "workers_error": report.workers_error,
        "workers_probe": report.workers_probe.to_dict(),
        **runstate.to_dict(list(report.runs), list(report.pairs)),
    }
