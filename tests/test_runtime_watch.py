"""SERVING as events (pdsvc/ship/runtime/watch.py, events.py, serving.py): the decisions as a
pure function fed events, without a socket or a clock; then the loop with real threads, each
test holding a poller inside its I/O (a probe, a router call) to show that a stop, an exit or a
verdict is acted on while it waits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from pdsvc.ship.runtime.endings import Ending
from pdsvc.ship.runtime.events import (
    ChildExited,
    CureDue,
    HealSaid,
    Inbox,
    PairsJudged,
    PeerRestarted,
    Probed,
    StopAsked,
    Wake,
)
from pdsvc.ship.runtime.membership import Routers, Worker
from pdsvc.ship.runtime.notify import Notifier
from pdsvc.ship.runtime.options import Options
from pdsvc.ship.runtime.phases import End
from pdsvc.ship.runtime.policy import RestartPolicy
from pdsvc.ship.runtime.probe import HttpReply, NoAnswerKind, ProbeResult
from pdsvc.ship.runtime.serving import Serving
from pdsvc.ship.runtime.watch import (
    AskTurn,
    Decision,
    Notify,
    PairGood,
    Say,
    Wait,
    Watch,
    step,
)

OK = ProbeResult(True, "HTTP 200")
TIMED_OUT = ProbeResult(False, "timed out after 20 s", NoAnswerKind.TIMEOUT)


def feed(events: list, state: Watch | None = None, **kw) -> tuple[Watch, list, Decision]:
    """Decision through ``events`` until an outcome: the last state, every effect, the last step."""
    state = state or Watch(last_ok=0.0)
    effects: list = []
    done = Decision(state)
    for event in events:
        done = step(state, event, **kw)
        state = done.state
        effects += done.effects
        if done.outcome is not None:
            break
    return state, effects, done


# ---------------------------------------------------------------------------------------------
# the decisions


def test_a_ping_only_after_a_good_probe_and_failures_said_once_each() -> None:
    _, effects, done = feed([Probed(OK, 1), Probed(TIMED_OUT, 2), Probed(TIMED_OUT, 3),
                             Probed(OK, 4)], serving_status="serving on x")
    pings = [e for e in effects if isinstance(e, Notify) and "WATCHDOG=1" in e.fields]
    assert len(pings) == 2 and pings[-1].fields == ("WATCHDOG=1", "STATUS=serving on x")
    assert [e.text for e in effects if isinstance(e, Say)] == [
        "liveness probe failed: timed out after 20 s",
        "liveness probe failed: timed out after 20 s",
        "liveness probe OK again after 2 failure(s)"]
    assert Notify(("STATUS=liveness probe failing (2x, no watchdog ping): timed out after "
                   "20 s",)) in effects
    assert done.state.alive and done.state.failures == 0 and done.state.last_ok == 4


@pytest.mark.parametrize("events, hung_at", [
    ([Wake(59.9), Wake(60.0)], 60.0),  # nothing good since serving began
    ([Probed(OK, 30.0), Wake(60.0), Wake(55.0), Wake(90.0)], 90.0),  # the bound restarts
    ([Probed(TIMED_OUT, 30.0), Wake(60.0)], 60.0),  # a failed probe does not restart it
    ([Probed(OK, 60.5)], 60.5),  # a good answer after the bound is too late
])
def test_the_watchdog_bound_without_a_manager_watchdog(events, hung_at) -> None:
    """--watchdog-secs (supervisord): no good probe for that long -> HUNG, at the bound, not
    at the end of a probe that was waiting out its timeout (the loop wakes at the deadline)."""
    _, _, done = feed(events, hang_after=60.0)
    assert done.outcome is not None and done.outcome.kind is Ending.HUNG
    assert events[-1].at == hung_at
    _, _, free = feed(events, hang_after=None)  # systemd's WatchdogSec= is the bound
    assert free.outcome is None


@pytest.mark.parametrize("event, kind, detail", [
    (ChildExited(3), End.EXITED, ""),
    (StopAsked(15), End.STOP, ""),
    (PeerRestarted("p restarted"), Ending.PEER, "p restarted"),
    (CureDue("the cure"), Ending.HEAL, "the cure"),
])
def test_events_that_end_serving(event, kind, detail) -> None:
    _, _, done = feed([Probed(OK, 1), event])
    assert done.outcome is not None and done.outcome.kind is kind
    assert done.outcome.detail == detail
    if kind is End.EXITED:
        assert done.outcome.returncode == 3


def test_a_failing_pair_asks_for_a_turn_once_then_heals_when_it_may() -> None:
    state, effects, done = feed([PairsJudged("pair stale", False, 10.0),
                                 PairsJudged("pair stale", False, 11.0)])
    assert [e for e in effects if isinstance(e, AskTurn)] == [AskTurn("pair stale", 0.0)]
    assert state.asking and state.failing_since == 10.0
    # not its turn: said, and the next round asks again, with the time the pairs have failed
    state, effects, _ = feed([HealSaid("pair stale", wait="its turn comes 3 s in",
                                       status="pair failing, heal waits"),
                              PairsJudged("pair stale", False, 13.5)], state)
    assert effects[0] == Wait("pair stale", "its turn comes 3 s in", "pair failing, heal waits")
    assert effects[1] == AskTurn("pair stale", 3.5)
    _, _, done = feed([HealSaid("pair stale", detail="heal cascade: the cure")], state)
    assert done.outcome is not None and done.outcome.kind is Ending.HEAL
    assert done.outcome.detail == "heal cascade: the cure"


def test_a_good_round_or_a_dead_engine_clears_the_heal_clock() -> None:
    state, _, _ = feed([PairsJudged("stale", False, 10.0)])
    state, effects, _ = feed([PairsJudged(None, True, 11.0)], state)
    assert state.failing_since is None and effects == [PairGood()]
    # its own probe fails: the pairs fail because of this engine; its own restart comes first
    state, effects, _ = feed([Probed(TIMED_OUT, 12.0), PairsJudged("stale", False, 13.0)], state)
    assert state.failing_since is None and not [e for e in effects if isinstance(e, AskTurn)]


# ---------------------------------------------------------------------------------------------
# the loop, with real threads


def serving(options: Options, **kw) -> Serving:
    policy = RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1, attempts=1)
    return Serving(options, print, Notifier(print), policy, kw.pop("membership", None), None,
                   None, None, None, **kw)


def run_aside(s: Serving, probe: Callable[[], ProbeResult], **kw) -> tuple[threading.Thread,
                                                                          list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(s.run(probe, serving_status="s", **kw)),
                         daemon=True)
    t.start()
    return t, out


def test_a_stop_is_acted_on_while_the_liveness_probe_hangs() -> None:
    """The probe of a hung engine waits out its timeout (here: until the test lets it go);
    the stop posted meanwhile ends SERVING, and the probe is still waiting when it does."""
    entered, release = threading.Event(), threading.Event()

    def hung() -> ProbeResult:
        entered.set()
        release.wait(30)
        return TIMED_OUT

    s = serving(Options(liveness_interval=0.01))
    t, out = run_aside(s, hung)
    try:
        assert entered.wait(10), "the liveness poller never probed"
        s.inbox.post(StopAsked(15))  # what the signal handler posts
        t.join(10)
        assert out and out[0].kind is End.STOP
        assert not release.is_set() and entered.is_set()  # acted on while the probe hung
    finally:
        release.set()


class BlockingRouter:
    """A router whose first GET /workers blocks until released (a router that hangs once);
    every later call answers at once."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.posts = 0
        self.workers: list[dict] = []

    def __call__(self, url, timeout, body=None, headers=None, method=None, **kw) -> HttpReply:
        if method == "DELETE":
            self.workers.clear()
            return HttpReply(200, b"{}", "HTTP 200")
        if body is not None:
            self.posts += 1
            self.workers.append({"id": "w", "url": "http://e:1", "worker_type": "decode"})
            return HttpReply(202, b"{}", "HTTP 202")
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(30)
        return HttpReply(200, json.dumps({"workers": self.workers}).encode(), "HTTP 200")


def test_a_stop_is_acted_on_while_a_router_call_hangs_and_no_join_follows_the_leave() -> None:
    router = BlockingRouter()
    routers = Routers(["http://r"], Worker("http://e:1", "decode", None), "k", print,
                      call=router)
    s = serving(Options(liveness_interval=60, membership_interval=0.01), membership=routers)
    t, out = run_aside(s, lambda: OK)
    try:
        assert router.entered.wait(10), "the membership poller never called the router"
        s.inbox.post(StopAsked(15))
        t.join(10)
        assert out and out[0].kind is End.STOP and not router.release.is_set()
        # the stop path's leave waits for the call in progress, and nothing joins after it
        leaving = threading.Thread(target=routers.leave, daemon=True)
        leaving.start()
        leaving.join(0.2)
        assert leaving.is_alive(), "leave did not wait for the router call in progress"
        router.release.set()
        leaving.join(10)
        posts = router.posts
        routers.check(True)
        assert routers.left and router.posts == posts and not router.workers
    finally:
        router.release.set()


def test_the_child_exit_ends_serving_whatever_the_peers_poller_does() -> None:
    """A peer probe that hangs (an unreachable host) does not hold up the child's exit."""
    entered, release = threading.Event(), threading.Event()

    def peer_probe(url: str, timeout: float) -> ProbeResult:
        entered.set()
        release.wait(30)
        return TIMED_OUT

    s = serving(Options(liveness_interval=60, restart_with=["http://p:1/health"]))
    assert s.peers is not None
    s.peers.probe = peer_probe
    s.peers.timeout = 30
    t, out = run_aside(s, lambda: OK)
    try:
        assert entered.wait(10)
        s.inbox.post(ChildExited(0))
        t.join(10)
        assert out and out[0].kind is End.EXITED and not release.is_set()
    finally:
        release.set()


def test_a_peer_that_restarted_ends_serving_through_its_poller() -> None:
    answers = iter(["ok"] + ["refused"] * 10)

    def peer_probe(url: str, timeout: float) -> ProbeResult:
        if next(answers, "refused") == "ok":
            return OK
        return ProbeResult(False, "connection refused", NoAnswerKind.REFUSED)

    s = serving(Options(liveness_interval=60, restart_with=["http://p:1/health"],
                        peer_interval=0.01, peer_down_probes=3))
    assert s.peers is not None
    s.peers.probe = peer_probe
    t, out = run_aside(s, lambda: OK)
    t.join(10)
    assert out and out[0].kind is Ending.PEER and "failed 3 probes" in out[0].detail


def test_a_stop_recorded_before_the_loop_ran_is_not_lost() -> None:
    """A signal that came before the handler posted to this inbox: the loop's bound on
    waiting (CHILD_WAIT_SLICE_S) asks the recorded stop."""
    s = serving(Options(liveness_interval=60))
    t, out = run_aside(s, lambda: OK, stopping=lambda: True)
    t.join(10)
    assert out and out[0].kind is End.STOP


def test_an_inbox_wakes_with_the_time_when_nothing_came() -> None:
    inbox = Inbox(lambda: 42.0)
    assert inbox.get(0.01) == Wake(42.0)
    inbox.post(ChildExited(1))
    assert inbox.get(None) == ChildExited(1)


# ---------------------------------------------------------------------------------------------
# a heal's question asked again: a dead-lock is judged over time


def test_a_question_that_says_ask_again_is_asked_again_without_a_round() -> None:
    state, _, _ = feed([PairsJudged("stale", False, 10.0),
                        HealSaid("stale", wait="alone", status="s", ask_after=20.0, at=10.5)])
    assert state.ask_at == 30.5 and not state.asking
    _, effects, _ = feed([Wake(30.0)], state)
    assert effects == []  # not yet
    state, effects, _ = feed([Wake(30.5)], state)
    assert effects == [AskTurn("stale", 20.5)] and state.asking and state.ask_at is None
    # the pairs got well meanwhile: nothing is asked again
    state, _, _ = feed([PairsJudged("stale", False, 10.0),
                        HealSaid("stale", wait="alone", status="s", ask_after=20.0, at=10.5),
                        PairsJudged(None, True, 15.0), Wake(31.0)])
    assert not state.asking and state.ask_at is None


def test_the_loop_wakes_for_a_question_due_again() -> None:
    from pdsvc.ship.runtime.watch import wake_at
    state = Watch(last_ok=0.0, ask_at=5.0)
    assert wake_at(state, None) == 5.0 and wake_at(state, 3.0) == 3.0
    assert wake_at(Watch(last_ok=0.0), None) is None


def until(predicate: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``predicate`` held within ``seconds`` (looked at every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def test_rounds_before_the_loop_are_handed_over_first_then_each_as_it_ends() -> None:
    """The canary's thread runs from READY=1 on, before SERVING's loop asks for its rounds
    (CanaryThread.deliver): the rounds that ended before are handed over first, in order,
    and none is kept after."""
    from pdsvc.ship.runtime import rounds as canary_rounds
    from pdsvc.ship.runtime.canary import Canary, Pair, Round

    pair = Pair("http://p:1", 8998, "http://d:2")
    answers = iter([True, False] + [True] * 1000)
    more = threading.Event()

    def probe(p: Pair, peer: str, timeout: float) -> Round:
        ok = next(answers)
        if not ok:
            more.wait(10)  # the third round waits until the loop asked for the rounds
        return Round(p, ok)

    c = Canary("http://p:1", [pair], failures_to_act=3, log=lambda s: None)
    t = canary_rounds.CanaryThread(c, 0.01, 5.0, probe=probe, reachable=lambda url: True)
    t.start()
    try:
        assert until(lambda: bool(t.results)), "no round ran"
        got: list[bool] = []
        t.deliver(lambda rs: got.extend(r.ok for r in rs))
        more.set()
        assert until(lambda: len(got) >= 4), got
        assert got[:3] == [True, False, True] and not t.results
    finally:
        t.stop()
