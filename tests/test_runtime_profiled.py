"""A `pdsvc profile` hold in the runtime (pdsvc/ship/runtime/profiled.py, hold.py, watch.py,
membership.py): while it lasts a frozen engine is not judged hung, every router stops
health-checking it and membership changes nothing, the canary probes and heals nothing;
it ends when released, when its lease lapses or at PROFILE_HOLD_MAX_S, each said in the
journal, and everything is as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from pair_fakes import WORKER, FakeRouter
from runtime_procs import FakeClock

from pdsvc.ship.runtime.canary import Canary, Pair
from pdsvc.ship.runtime.endings import Ending
from pdsvc.ship.runtime.events import Probed, Wake
from pdsvc.ship.runtime.hold import Hold, clear_hold, hold_path, write_hold
from pdsvc.ship.runtime.membership import Routers
from pdsvc.ship.runtime.probe import NoAnswerKind, ProbeResult
from pdsvc.ship.runtime.profiled import Profiled
from pdsvc.ship.runtime.rounds import CanaryThread
from pdsvc.ship.runtime.statefile import Kind, read_state, state_path
from pdsvc.ship.runtime.timings import PROFILE_HOLD_MAX_S, PROFILE_VERIFY_S
from pdsvc.ship.runtime.watch import Notify, Say, Watch, step

OK = ProbeResult(True, "HTTP 200")
FROZEN = ProbeResult(False, "timed out after 30 s", NoAnswerKind.TIMEOUT)
WHY = "profile hold r1 (pdsvc profile) until 12:00:00 at the latest"


def feed(events: list, hang_after: float | None = 60.0) -> tuple[Watch, list, object]:
    state, effects, outcome = Watch(last_ok=0.0), [], None
    for event in events:
        done = step(state, event, hang_after=hang_after, serving_status="serving")
        state, outcome = done.state, done.outcome
        effects += done.effects
        if outcome is not None:
            break
    return state, effects, outcome


def test_an_excused_failure_feeds_the_watchdog_and_keeps_the_engine_alive() -> None:
    # 110 s of a frozen engine, probes every 30 s: never hung, always alive, one line
    events = [Probed(FROZEN, t, WHY) for t in (30.0, 60.0, 90.0, 110.0)]
    events.insert(3, Wake(100.0))
    state, effects, outcome = feed(events)
    assert outcome is None and state.alive and state.failures == 0 and state.excused == 4
    pings = [e for e in effects if isinstance(e, Notify) and "WATCHDOG=1" in e.fields]
    assert len(pings) == 4
    assert "not judged: profile hold r1" in pings[-1].fields[1]
    lines = [e.text for e in effects if isinstance(e, Say)]
    assert lines == [f"liveness probe failed: timed out after 30 s; not judged: {WHY}"]
    # the write is over: a good probe says how many were excused and restores the status
    done = step(state, Probed(OK, 120.0), hang_after=60.0, serving_status="serving")
    assert done.state.excused == 0 and done.state.alive
    assert Say("liveness probe OK again after 4 failure(s), 4 of them excused") in done.effects
    assert Notify(("WATCHDOG=1", "STATUS=serving")) in done.effects


def test_without_the_hold_the_same_freeze_is_a_hang() -> None:
    state, effects, outcome = feed([Probed(FROZEN, 30.0), Wake(60.0)])
    assert outcome is not None and outcome.kind is Ending.HUNG
    assert not any(isinstance(e, Notify) and "WATCHDOG=1" in e.fields for e in effects)
    # and a failure after the hold ended is judged again, not excused
    state, effects, outcome = feed([Probed(FROZEN, 30.0, WHY), Probed(FROZEN, 60.0),
                                    Wake(95.0)])
    assert not state.alive and outcome is not None and outcome.kind is Ending.HUNG


def test_a_profile_hold_lasts_its_lease_and_never_past_its_bound(tmp_path: Path) -> None:
    path, lines, clock = str(tmp_path / "d.hold.json"), [], FakeClock(1000.0)
    hold = Hold(path, lines.append, wall=clock)
    write_hold(path, out=False, peers=[], why="profiling", by="pdsvc profile",
               since=1000.0, until=1030.0, profile="r1")
    assert hold.profile() == ("r1", 1030.0) and hold.out() is None and hold.active()
    assert not hold.allows("http://any:1")  # the canary probes nothing
    clock.now = 1031.0
    assert hold.profile() is None and any("lease ran out" in x for x in lines)
    # renewed, over and over: still none past PROFILE_HOLD_MAX_S from its start
    write_hold(path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1000.0 + PROFILE_HOLD_MAX_S + 100, profile="r1")
    clock.now = 1000.0 + PROFILE_HOLD_MAX_S - 1
    assert hold.profile() == ("r1", 1000.0 + PROFILE_HOLD_MAX_S)
    clock.now = 1000.0 + PROFILE_HOLD_MAX_S
    assert hold.profile() is None and not hold.active()
    assert hold.profile() is None
    assert sum("past its bound of 600 s" in x for x in lines) == 1  # said once
    write_hold(path, out=True, why="apply")  # apply's hold is not a profile hold
    assert hold.profile() is None and hold.active()


def profiled(tmp_path: Path, router: FakeRouter, clock: FakeClock, *,
             routers: int = 1) -> tuple[Profiled, Routers, list[str]]:
    lines: list[str] = []
    urls = [f"http://r{i}" for i in range(routers)]
    members = Routers(urls, WORKER, "k", lines.append, call=router, clock=clock)
    assert members.join()
    hold = Hold(str(tmp_path / "p.hold.json"), lines.append, wall=clock)
    return Profiled(hold, str(tmp_path / "p.profile.json"), lines.append, members,
                    wall=clock), members, lines


@pytest.mark.parametrize("smg", [True, False], ids=["smg", "sglang-router-0.3.2"])
def test_the_routers_stop_health_checks_for_the_hold_and_resume_after(
        tmp_path: Path, smg: bool) -> None:
    router, clock = FakeRouter(smg), FakeClock(1000.0)
    p, members, lines = profiled(tmp_path, router, clock)
    p.look()
    assert router.checks_off == set() and p.run is None  # no hold: nothing asked
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    wid = router.workers[0]["id"]
    assert router.checks_off == {wid} and p.run == "r1"
    ack = read_state(str(tmp_path / "p.profile.json"))
    assert ack is not None and ack["run"] == "r1" and ack["routers"] == {"http://r0": ""}
    assert ack["until"] == 1030.0 and "ended" not in ack
    assert any("profile hold r1 by pdsvc profile: until" in x for x in lines)
    assert p.excuse() is not None and p.excuse().startswith("profile hold r1")
    # membership changes nothing meanwhile, even an entry the router lost
    calls = len(router.calls)
    members.check(True)
    assert len(router.calls) == calls
    clock.now = 1012.0
    clear_hold(p.hold.path)
    p.look()
    assert router.checks_off == set() and p.run is None and p.excuse() is None
    ack = read_state(str(tmp_path / "p.profile.json"))
    assert ack["ended"] == "released by pdsvc profile" and ack["ended_at"] == 1012.0
    assert any("profile hold r1 ended after 12 s (released by pdsvc profile): liveness is "
               "judged again; router http://r0: health checks resumed" in x for x in lines)


def test_a_lapsed_lease_ends_the_hold_and_says_so(tmp_path: Path) -> None:
    router, clock = FakeRouter(True), FakeClock(1000.0)
    p, _, lines = profiled(tmp_path, router, clock)
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    clock.now = 1031.0  # pdsvc profile was killed: nothing renews it
    p.look()
    assert router.checks_off == set()
    assert read_state(str(tmp_path / "p.profile.json"))["ended"] == \
        "its lease lapsed: pdsvc profile is gone"


def test_a_router_that_refuses_the_pause_is_asked_again_and_the_answer_says_why(
        tmp_path: Path) -> None:
    router, clock = FakeRouter(True), FakeClock(1000.0)
    p, _, lines = profiled(tmp_path, router, clock)
    router.up = False
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    ack = read_state(str(tmp_path / "p.profile.json"))
    assert "did not answer" in ack["routers"]["http://r0"]
    router.up = True
    p.look()
    assert read_state(str(tmp_path / "p.profile.json"))["routers"] == {"http://r0": ""}
    assert router.checks_off == {router.workers[0]["id"]}
    assert any("health checks of this engine paused" in x for x in lines)


def test_sglang_router_is_paused_by_a_registration_that_keeps_its_breaker(
        tmp_path: Path) -> None:
    """0.3.2 has no PATCH; its PUT takes the flag but rebuilds the worker with the default
    circuit breaker (and lists it twice): the pause and the resume are each a DELETE and a
    POST with the flat field instead, and leave one entry, governed by the router's own
    settings."""
    router, clock = FakeRouter(False), FakeClock(1000.0)
    p, members, lines = profiled(tmp_path, router, clock)
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    assert [(w["url"], w["disable_health_check"]) for w in router.workers] == [
        (WORKER.url, True)]
    assert router.checks_off == {router.workers[0]["id"]}
    clear_hold(p.hold.path)
    p.look()
    assert [(w["url"], w["disable_health_check"]) for w in router.workers] == [
        (WORKER.url, False)]
    assert router.checks_off == set()
    assert not any(method == "PUT" for method, _ in router.calls)
    assert router.breaker_reset == set() and router.listed_twice == {}
    assert [d.get("disable_health_check") for d in router.posted] == [None, True, False]
    assert any("health checks resumed" in x for x in lines)
    members.check(True)  # and membership, back, finds its entry as it left it
    assert [w["url"] for w in router.workers] == [WORKER.url] and members.joined


def test_every_router_of_the_deployment_is_paused(tmp_path: Path) -> None:
    router, clock = FakeRouter(True), FakeClock(1000.0)
    p, _, _ = profiled(tmp_path, router, clock, routers=2)
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    ack = read_state(str(tmp_path / "p.profile.json"))
    assert ack["routers"] == {"http://r0": "", "http://r1": ""}


def test_the_canary_probes_nothing_and_heals_nothing_under_a_profile_hold(
        tmp_path: Path) -> None:
    path = hold_path(str(tmp_path), "dsv4-decode")
    assert path == state_path(str(tmp_path), "dsv4-decode", Kind.HOLD)
    hold = Hold(path)
    pair = Pair("http://p:30000", 8998, "http://d:30001")
    canary = Canary("http://d:30001", [pair], failures_to_act=1, log=lambda s: None, hold=hold)
    write_hold(path, out=False, peers=[], by="pdsvc profile", profile="r1")
    assert CanaryThread(canary, 30.0, 5.0).probed() == []
    assert canary.verdict() is None
    clear_hold(path)
    assert CanaryThread(canary, 30.0, 5.0).probed() == [pair]


def test_an_engine_without_routers_keeps_the_hold_too(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    hold = Hold(str(tmp_path / "e.hold.json"), wall=clock)
    p = Profiled(hold, str(tmp_path / "e.profile.json"), lambda s: None, None, wall=clock)
    write_hold(hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r2")
    p.look()
    ack = read_state(str(tmp_path / "e.profile.json"))
    assert ack["run"] == "r2" and ack["routers"] == {} and p.excuse() is not None


def test_status_says_an_engine_is_profiled_and_until_when(tmp_path: Path) -> None:
    from pdsvc.status.runstate import hold_words

    path = hold_path(str(tmp_path), "dsv4-decode")
    assert path
    write_hold(path, out=False, peers=[], by="pdsvc profile", since=1000.0, until=1030.0,
               profile="r9")
    words = hold_words(tmp_path, "dsv4-decode", now=1010.0)
    assert words.startswith("profiled by pdsvc profile for 10 s (lease: 20 s left) (run r9): "
                            "liveness not judged")
    assert "router health checks paused" in words and path in words
    assert "pdsvc profile is gone" in hold_words(tmp_path, "dsv4-decode", now=1031.0)
    write_hold(path, out=False, peers=[], by="pdsvc profile", since=1000.0, until=1e12,
               profile="r9")
    assert "past its bound" in hold_words(tmp_path, "dsv4-decode",
                                          now=1000.0 + PROFILE_HOLD_MAX_S)


def test_a_router_that_restarts_during_the_hold_gets_the_engine_back_paused(
        tmp_path: Path) -> None:
    router, clock = FakeRouter(True), FakeClock(1000.0)
    p, _, _ = profiled(tmp_path, router, clock)
    p.clock = clock
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    router.workers, router.checks_off = [], set()  # restarted: empty
    clock.now += PROFILE_VERIFY_S
    p.look()
    assert [w["url"] for w in router.workers] == [WORKER.url]
    assert router.checks_off == {router.workers[0]["id"]}


def test_sglang_router_is_registered_once_per_change_however_often_it_is_asked(
        tmp_path: Path) -> None:
    router, clock = FakeRouter(False), FakeClock(1000.0)
    p, _, _ = profiled(tmp_path, router, clock)
    p.clock = clock
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1100.0, profile="r1")
    for _ in range(5):
        p.look()
        clock.now += PROFILE_VERIFY_S
    # 0.3.2 shows the flag: one DELETE and one POST with it, however often it is asked
    assert sum(method == "DELETE" for method, _ in router.calls) == 1
    assert [d.get("disable_health_check") for d in router.posted] == [None, True]


def test_a_resume_a_router_refused_is_asked_again_until_it_takes(tmp_path: Path) -> None:
    router, clock = FakeRouter(True), FakeClock(1000.0)
    p, _, lines = profiled(tmp_path, router, clock)
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    p.look()
    router.up = False
    clear_hold(p.hold.path)
    p.look()
    assert router.checks_off and any("could not resume" in x for x in lines)
    p.look()
    assert router.checks_off  # still down: still paused there
    router.up = True
    p.look()
    assert router.checks_off == set() and p.resuming == {}


def test_a_look_that_fails_is_logged_and_the_next_one_works(tmp_path: Path) -> None:
    router, clock = FakeRouter(True), FakeClock(1000.0)
    p, _, lines = profiled(tmp_path, router, clock)
    write_hold(p.hold.path, out=False, peers=[], by="pdsvc profile", since=1000.0,
               until=1030.0, profile="r1")
    real, broken = p.hold.profile, [True]

    def profile() -> tuple[str, float] | None:
        if broken.pop() if broken else False:
            raise OSError("EIO")
        return real()

    p.hold.profile = profile  # type: ignore[method-assign]
    p.look()
    assert any("profile hold: a look failed; looking again" in x and "EIO" in x for x in lines)
    p.look()
    assert p.run == "r1" and router.checks_off
