"""`pdsvc status`, the facts: ask the service manager about every unit of the plan and probe
every endpoint at once (a hung endpoint costs one timeout, not one per probe), then hand them to
judge.py. The service manager answers `state(unit) -> ServiceState` (managers/);
`http_get()` probes an engine's `/health`, the router's `/readiness` and `/workers` through the
one HTTP client (pdsvc.ship.runtime.probe). Nothing here raises when systemd or an endpoint
cannot be reached: each such fact becomes a row that says why.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from pdsvc.plan.build import Plan, RouterPlan
from pdsvc.ship.runtime.front import ask, server_row
from pdsvc.ship.runtime.probe import MAX_BODY, http_call
from pdsvc.status import runstate
from pdsvc.status.judge import judge
from pdsvc.status.managers import ServiceManager
from pdsvc.status.model import FrontServer, Probe, Report, RouterList, UnitView, Worker

HTTP_TIMEOUT = 2.0  # seconds per probe: a status command must answer quickly


def http_get(url: str, *, timeout: float = HTTP_TIMEOUT,
             headers: Mapping[str, str] | None = None) -> Probe:
    """GET `url` without proxies (the endpoints are local); never raises. Up to MAX_BODY of
    any answer is read, an error's too (its reason is shown)."""
    reply = http_call(url, timeout, headers=headers, max_body=MAX_BODY, max_error_body=MAX_BODY)
    return Probe.of(url, reply)


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


def client_url(listen: str, port: int, hostname: str) -> str:
    """The chat endpoint as clients reach it: the router's (or the front's) listen address, or
    this machine's name when it listens on every address."""
    host = hostname if listen in ("0.0.0.0", "::", "") else listen
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}/v1/chat/completions"


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


def read_workers(probe: Probe) -> tuple[tuple[Worker, ...] | None, str | None]:
    """(the router's workers, or None and why not) from its GET /workers."""
    if not probe.ok:
        return None, f"HTTP {probe.code}" if probe.code is not None else probe.error
    try:
        return parse_workers(probe.body), None
    except (ValueError, AttributeError) as e:
        return None, f"unreadable answer: {e}"


def collect(
    plan: Plan,
    backend: ServiceManager,
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
    units += [("router", r.unit) for r in plan.routers]
    units += [("front", plan.front.unit)] if plan.front else []
    units += [("vip", plan.vip.unit)] if plan.vip else []
    # each router's readiness (another host's: the one), then each one's worker list
    readies = [r.readiness_url for r in plan.routers] or [router.readiness_url]
    lists = [f"{r.url}/workers" for r in plan.routers[1:]]
    urls = [*(e.health_url for e in plan.engines), *readies, f"{router.url}/workers", *lists]
    state_of, answers = _ask_all(backend, [u for _, u in units], urls, headers, http_timeout)
    n = len(plan.engines)
    health, readiness_of = answers[:n], answers[n:n + len(readies)]
    workers_probe, *more_probes = answers[n + len(readies):]
    readiness = readiness_of[0]
    engines = zip(plan.engines, state_of[1:1 + n], health, strict=True)
    routed = zip(state_of[1 + n:], readiness_of, strict=False)
    views = (
        UnitView("target", state_of[0], None),
        *(UnitView(e.role, s, p) for e, s, p in engines),
        *(UnitView("router", s, p) for s, p in routed if plan.routers),
        *(UnitView(role, state, None) for (role, _), state in zip(units, state_of, strict=True)
          if role in ("front", "vip")),
    )
    workers, workers_error = read_workers(workers_probe)
    more = tuple(RouterList(p, *read_workers(p)) for p in more_probes)
    expected = tuple(dict.fromkeys((e.role, e.url) for e in whole.engines))
    serving, problems = judge(views, workers, workers_error, expected,
                              None if plan.router else readiness, more)
    where = runstate.state_dir(plan, backend.name)
    runs, pairs = runstate.unit_runs(plan, where), runstate.pair_views(plan, where)
    problems += runstate.problems(runs, pairs, plan.lifecycle.canary_heal_attempts)
    front, front_error = front_view(plan)
    problems += front_problems(plan, front, front_error)
    url = _send_to(plan, whole, router, hostname)
    return Report(
        name=plan.name, backend=backend.name, units=views, workers=workers,
        workers_probe=workers_probe, workers_error=workers_error, url=url, serving=serving,
        problems=(*problems, *findings), runs=tuple(runs), pairs=tuple(pairs), more=more,
        front=front, front_error=front_error,
        address=None if plan.vip is None else (plan.vip.address, holds(plan.vip.address)),
    )


def _send_to(plan: Plan, whole: Plan, router: RouterPlan, hostname: str) -> str:
    """Where clients send requests, as this host names it."""
    if whole.vip is not None:  # the moving address, on whichever router host has it
        return f"{whole.client_url}/v1/chat/completions"
    if plan.front:  # the front (on this host: several routers run on one)
        return client_url(plan.front.host, plan.front.port, hostname)
    # the router of another host: where this host reaches it, not at this host's name
    return client_url(router.host, router.port, hostname) if plan.router else \
        f"{router.url}/v1/chat/completions"


def holds(address: str) -> bool:
    """Whether this host has ``address`` now (keepalived's moving address): a socket can be
    bound to an address of its own only (bind(2): EADDRNOTAVAIL; unless
    net.ipv4.ip_nonlocal_bind is set, which HAProxy setups sometimes do: then always True)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def front_view(plan: Plan) -> tuple[tuple[FrontServer, ...] | None, str | None]:
    """Each router as the front sees it (HAProxy's ``show stat`` on its runtime socket:
    root or the service group may read it); (None, why) when it cannot be read, (None, None)
    without a front."""
    f = plan.front
    if f is None:
        return None, None
    try:
        text = ask(f.socket, "show stat")
    except OSError as e:
        return None, f"cannot read HAProxy's runtime API at {f.socket}: {e.strerror or e}"
    servers = []
    for name, _ in f.servers:
        row = server_row(text, f.backend, name) or {}
        scur = row.get("scur", "")
        servers.append(FrontServer(name, row.get("status", "") or "not in its config",
                                   int(scur) if scur.isdigit() else 0))
    return tuple(servers), None


def front_problems(plan: Plan, front: tuple[FrontServer, ...] | None,
                   error: str | None) -> list[str]:
    """A router the front does not send requests to, or a front that cannot be read."""
    if plan.front is None:
        return []
    if front is None:
        return [f"the front: {error}"]
    out = [f"the front does not send requests to {s.name} ({s.status})"
           for s in front if not s.in_rotation]
    if front and not any(s.in_rotation for s in front):
        out.append("the front has no router in rotation: every request gets its 503")
    return out


def _ask_all(backend: ServiceManager, units: list[str], urls: list[str],
             headers: dict[str, str], timeout: float) -> tuple[list, list[Probe]]:
    """Every unit's state and every URL's answer, all at once (a hung endpoint costs one
    timeout, not one per probe); the control plane's key only to /workers."""
    with ThreadPoolExecutor(max_workers=len(units) + len(urls)) as pool:
        states = [pool.submit(backend.state, unit) for unit in units]
        probes = [pool.submit(http_get, u, timeout=timeout,
                              headers=headers if u.endswith("/workers") else {}) for u in urls]
        return [f.result() for f in states], [f.result() for f in probes]


