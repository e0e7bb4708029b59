"""An engine in several routers (router.replicas ≥ 2, membership.Routers): it joins each on
that router's own list, re-joins the one that lost it, waits its heal turn until every router
that answers lists a sibling, and leaves all of them, also after its runtime died."""

from __future__ import annotations

from pathlib import Path

import pytest
from pair_fakes import FakeRouter

from pdsvc.ship.runtime.leaving import leave_after_end
from pdsvc.ship.runtime.membership import Routers, Worker, call_timeout
from pdsvc.ship.runtime.timings import ROUTER_CALL_MIN_S, ROUTER_CALL_TIMEOUT_S, ROUTER_DARK_S

URL, SIBLING = "http://10.0.0.2:30000", "http://10.0.0.3:30000"
A, B = "http://127.0.0.1:8100", "http://127.0.0.1:8101"


class TwoRouters:
    """Two fake routers, each answering the calls to its own base URL."""

    def __init__(self, smg: bool) -> None:
        self.by = {A: FakeRouter(smg), B: FakeRouter(smg)}

    def __call__(self, url: str, *args, **kw):  # noqa: ANN002, ANN003, ANN204
        return next(r for base, r in self.by.items() if url.startswith(base))(url, *args, **kw)

    def listed(self, base: str) -> list[str]:
        return [w["url"] for w in self.by[base].workers if w.get("is_healthy", True)]


def member(routers: TwoRouters, lines: list[str]) -> Routers:
    return Routers([A, B], Worker(URL, "prefill", 8998), "k", lines.append, call=routers)


@pytest.mark.parametrize("smg", [False, True], ids=["sglang-router", "smg"])
def test_it_joins_every_router_and_rejoins_the_one_that_restarted(smg: bool) -> None:
    routers, lines = TwoRouters(smg), []
    m = member(routers, lines)
    assert m.join() and m.joined
    assert routers.listed(A) == routers.listed(B) == [URL]
    routers.by[B].workers.clear()  # B restarted: empty
    m.check(engine_healthy=True)
    assert routers.listed(B) == [URL] and m.joined
    assert any("no longer lists" in line and B in line for line in lines)
    posts = [u for meth, u in routers.by[A].calls if meth == "POST"]
    assert len(posts) == 1  # A, which kept it, was not posted again


def test_a_router_that_is_down_does_not_keep_it_out_of_the_other() -> None:
    routers, lines = TwoRouters(False), []
    routers.by[B].up = False
    m = member(routers, lines)
    assert m.join()  # routable: A took it
    assert not m.joined  # B is looked at again soon
    assert routers.listed(A) == [URL]
    routers.by[B].up = True
    m.check(engine_healthy=True)
    assert routers.listed(B) == [URL] and m.joined


def test_the_heal_turn_needs_a_sibling_in_every_router_that_answers() -> None:
    routers, lines = TwoRouters(False), []
    m = member(routers, lines)
    for base in (A, B):
        routers.by[base].workers.append({"id": "s", "url": SIBLING, "worker_type": "prefill"})
    assert m.lists_any([SIBLING])
    routers.by[B].workers.clear()  # B lost the sibling: healing now leaves B no prefill
    assert not m.lists_any([SIBLING])
    routers.by[B].up = False  # B down: A alone decides
    assert m.lists_any([SIBLING])
    routers.by[A].up = False  # nobody answers: no
    assert not m.lists_any([SIBLING])


def test_admission_is_judged_on_each_routers_own_list() -> None:
    routers, lines = TwoRouters(False), []
    routers.by[B].workers.append({"id": "d", "url": "http://10.0.0.9:30001",
                                  "worker_type": "decode"})
    m = member(routers, lines)
    m.admit = lambda listed: "stale with d" if "http://10.0.0.9:30001" in listed else None
    assert m.join()
    assert routers.listed(A) == [URL] and URL not in routers.listed(B)
    assert any("not joining the router yet: stale with d" in line for line in lines)


@pytest.mark.parametrize("smg", [False, True], ids=["sglang-router", "smg"])
def test_it_leaves_every_router_on_a_stop_and_after_its_runtime_died(smg: bool,
                                                                      tmp_path: Path) -> None:
    routers, lines = TwoRouters(smg), []
    m = member(routers, lines)
    assert m.join()
    m.leave()
    assert routers.listed(A) == routers.listed(B) == []
    routers = TwoRouters(smg)  # a fresh start, then its runtime is killed
    assert member(routers, lines).join()
    key = tmp_path / "key"
    key.write_text("k")
    out: list[str] = []
    assert leave_after_end([A, B], URL, str(key), out.append, env={}, call=routers) == 0
    assert routers.listed(A) == routers.listed(B) == []
    assert [line.rsplit(" ", 1)[1] for line in out] == [A, B]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_router_whose_host_is_lost_costs_one_timeout_per_dark_period() -> None:
    """Its host gone (calls time out): one call finds it out, then it is dark for
    ROUTER_DARK_S (no call, no wait) while the other router goes on; then it is tried again,
    and joined once it answers."""
    routers, lines, clock = TwoRouters(False), [], Clock()
    m = Routers([A, B], Worker(URL, "prefill", 8998), "k", lines.append, call=routers,
                clock=clock, timeout=0.5)
    assert m.join() and m.joined
    routers.by[A].lost = True
    for _ in range(20):  # the main loop looks every 0.25 s while it is not joined
        m.check(engine_healthy=True)
        clock.now += 0.25
    assert routers.by[A].waited == 0.5 * 1  # 5 s: one timeout, then dark
    assert not m.joined and routers.listed(B) == [URL]
    assert len([ln for ln in lines if "unreachable" in ln and A in ln]) <= 2  # not per look
    clock.now += ROUTER_DARK_S
    m.check(engine_healthy=True)
    assert routers.by[A].waited == 0.5 * 2  # tried again after the dark period
    routers.by[A].lost = False
    clock.now += ROUTER_DARK_S
    m.check(engine_healthy=True)
    assert m.joined and routers.listed(A) == [URL]


def test_a_refused_router_is_not_dark() -> None:
    """A router that restarts refuses at once (no wait): it is asked again at the next look,
    so the engine is in it the moment it listens."""
    routers, lines, clock = TwoRouters(False), [], Clock()
    m = Routers([A, B], Worker(URL, "prefill", 8998), "k", lines.append, call=routers,
                clock=clock)
    assert m.join()
    routers.by[A].up = False
    routers.by[A].workers.clear()
    m.check(engine_healthy=True)
    routers.by[A].up = True
    clock.now += 0.25
    m.check(engine_healthy=True)
    assert routers.listed(A) == [URL] and m.joined


@pytest.mark.parametrize("watchdog, routers, want", [
    (None, 2, ROUTER_CALL_TIMEOUT_S),  # no watchdog: the full timeout
    (60.0, 2, ROUTER_CALL_TIMEOUT_S),  # the shipped lifecycle: 60 - 10 - 30 = 20 s spare
    (3.0, 2, 0.5),  # the e2e labs: 3 - 1 - 1 = 1 s spare, over two routers
    (3.0, 1, 1.0),
    (2.5, 4, ROUTER_CALL_MIN_S),  # never below the floor
])
def test_a_call_never_outlasts_what_the_watchdog_leaves(watchdog: float | None, routers: int,
                                                        want: float) -> None:
    interval, probe = (10.0, 30.0) if watchdog == 60.0 else (1.0, 1.0)
    assert call_timeout(watchdog, interval, probe, routers) == want
