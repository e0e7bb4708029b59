"""apply's control-plane calls with several routers (router.replicas ≥ 2, apply/router.py):
an engine is posted to and deleted from every router its unit names, counts as registered
only once each lists it, and as out only once none does."""

from __future__ import annotations

import json

from pdsvc.apply.bounds import Bounds
from pdsvc.apply.rollout import StepKind, format_rollout, plan_rollout
from pdsvc.apply.router import RouterClient, entry_in, routable
from pdsvc.apply.units import Unit
from pdsvc.config.load import parse_config
from pdsvc.plan.build import build_plan
from pdsvc.render.systemd import render_systemd

A, B = "http://127.0.0.1:8100", "http://127.0.0.1:8101"


def prefill_unit() -> Unit:
    text = "model: {path: /srv/m}\nrouter: {replicas: 2}\n"
    plan = build_plan(parse_config(text, "c.yaml"), None, config_source="c.yaml",
                      config_text=text)
    files = {f.path: f.content for f in render_systemd(plan, "t")}
    return Unit.parse("dsv4-prefill.service", files["dsv4-prefill.service"])


class Routers:
    """Two routers' /workers, as the apply Host's http() reaches them; a clock."""

    def __init__(self) -> None:
        self.lists: dict[str, list[dict]] = {A: [], B: []}
        self.down: set[str] = set()
        self.calls: list[str] = []
        self.t = 0.0

    def http(self, method: str, url: str, headers=None, timeout: float = 0,
             body: bytes | None = None) -> tuple[int, str]:
        base = next(b for b in self.lists if url.startswith(b))
        self.calls.append(f"{method} {base}")
        if base in self.down:
            return 0, ""
        if method == "GET":
            return 200, json.dumps({"workers": self.lists[base]})
        if method == "POST":
            doc = json.loads(body or b"{}")  # a URL listed already stays once (202 / 409)
            if all(w["url"] != doc["url"] for w in self.lists[base]):
                self.lists[base].append({"id": f"id-{len(self.calls)}", "url": doc["url"]})
        if method == "DELETE":
            wid = url.rsplit("/", 1)[1]
            self.lists[base] = [w for w in self.lists[base] if w["id"] != wid]
        return 202, "{}"

    def read(self, path: str) -> str | None:
        return "key"

    def now(self) -> float:
        return self.t

    def sleep(self, secs: float) -> None:
        self.t += secs


def test_the_unit_names_both_routers() -> None:
    assert RouterClient.routers(prefill_unit()) == (A, B)


def test_registered_only_once_each_router_lists_it_and_out_once_none_does() -> None:
    u, host = prefill_unit(), Routers()
    client = RouterClient(host, Bounds(10, 10, 0.5))  # type: ignore[arg-type]
    client.register(u)
    assert sorted(c for c in host.calls if c.startswith("POST")) == [f"POST {A}", f"POST {B}"]
    entry, answered = client.entry(u)
    assert answered and routable(entry)
    host.lists[B].clear()  # B restarted: not in rotation everywhere
    assert client.entry(u) == (None, True)
    host.down.add(B)
    assert client.entry(u) == (None, False)
    host.down.clear()
    client.register(u)
    assert client.deregister(u)
    assert host.lists == {A: [], B: []}
    assert not client.deregister(u)  # listed nowhere: nothing to take out


def test_until_waits_for_every_router() -> None:
    u, host = prefill_unit(), Routers()
    client = RouterClient(host, Bounds(10, 2, 0.5))  # type: ignore[arg-type]
    host.lists[A].append({"id": "x", "url": u.url})
    listed = lambda w: routable(entry_in(w, u))  # noqa: E731
    assert not client.until(listed, u)  # B never lists it: the bound passes
    assert host.t >= 2
    host.lists[B].append({"id": "y", "url": u.url})
    assert client.until(listed, u)


def rendered(text: str) -> dict[str, str]:
    plan = build_plan(parse_config(text, "c.yaml"), None, config_source="c.yaml",
                      config_text=text)
    return {f.path: f.content for f in render_systemd(plan, "pdsvc render")}


def test_a_router_change_rolls_one_router_at_a_time_and_serving_goes_on() -> None:
    old = rendered("model: {path: /srv/m}\nrouter: {replicas: 2}\n")
    new = rendered("model: {path: /srv/m}\nrouter: {replicas: 2, policy: round_robin}\n")
    r = plan_rollout(old, new)
    assert [(s.action, s.units, s.serving_stops) for s in r.steps] == [
        (StepKind.RESTART_ROUTER, ("dsv4-router-0.service",), False),
        (StepKind.RESTART_ROUTER, ("dsv4-router-1.service",), False)]
    text = format_rollout(r)
    assert "serving: never stops" in text and "serving STOPS" not in text
    assert "drained out of the front first" in text
    # one router alone: its restart still stops serving, and says so
    one = plan_rollout(rendered("model: {path: /srv/m}\n"),
                       rendered("model: {path: /srv/m}\nrouter: {policy: round_robin}\n"))
    assert [s.serving_stops for s in one.steps] == [True]
    assert "serving STOPS while the router restarts" in format_rollout(one)


def test_a_front_config_change_is_a_reload_that_never_stops_serving() -> None:
    old = rendered("model: {path: /srv/m}\nrouter: {replicas: 2}\n")
    new = rendered("model: {path: /srv/m}\nrouter: {replicas: 2, front: {retries: 5}}\n")
    r = plan_rollout(old, new)
    assert [(c.unit, c.role, [x.kind for x in c.reasons]) for c in r.changes] == [
        ("dsv4-front.service", "front", ["config"])]
    assert [(s.action, s.units, s.serving_stops) for s in r.steps] == [
        (StepKind.RELOAD_FRONT, ("dsv4-front.service",), False)]


def test_going_to_two_routers_starts_the_front_then_the_routers_and_says_serving_stops() -> None:
    r = plan_rollout(rendered("model: {path: /srv/m}\n"),
                     rendered("model: {path: /srv/m}\nrouter: {replicas: 2}\n"))
    assert [(s.action, s.units) for s in r.steps][1:] == [
        (StepKind.START, ("dsv4-front.service",)),
        (StepKind.START, ("dsv4-router-0.service",)),
        (StepKind.START, ("dsv4-router-1.service",))]
    assert all(s.serving_stops for s in r.steps)
    text = format_rollout(r)
    assert "the installer removes dsv4-router.service, so serving stops" in text
    assert "drained out of the front first" not in text  # a start drains nothing
