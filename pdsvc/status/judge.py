"""`pdsvc status`, the verdict: serving means every service unit of the plan is active and the
router's `/readiness` is 200 (sglang-router 0.3.2 answers 200 only with at least one healthy
prefill and one healthy decode, as its /readiness handler does); the problems name what is
wrong either way, serving or not.
"""

from __future__ import annotations

from pdsvc.status.model import Probe, RouterList, UnitView, Worker


def unlisted(workers: tuple[Worker, ...], expected: tuple[tuple[str, str], ...],
             where: str) -> list[str]:
    """One router's list against the engines it should route to."""
    problems = [f"{w.type} worker {w.url} unhealthy" + (f" in {where}" if where !=
                "the router" else "") for w in workers if not w.healthy]
    listed = {w.url.rstrip("/") for w in workers}
    return problems + [f"{where} does not list the {role} worker {url}"
                       for role, url in expected if url.rstrip("/") not in listed]


def judge(
    units: tuple[UnitView, ...],
    workers: tuple[Worker, ...] | None,
    workers_error: str | None,
    expected: tuple[tuple[str, str], ...],
    remote_readiness: Probe | None = None,
    others: tuple[RouterList, ...] = (),
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
        problems += unlisted(workers, expected, "the router")
    elif readiness is not None and readiness.code is not None:  # the router answers, yet …
        problems.append(f"router /workers: {workers_error}")
    for more in others:
        where = f"the router {more.probe.url.removesuffix('/workers')}"
        if more.workers is None:
            problems.append(f"{where} /workers: {more.error}")
        else:
            problems += unlisted(more.workers, expected, where)
    serving = bool(services) and all(u.state.active for u in services) and bool(
        readiness and readiness.ok)
    return serving, problems
