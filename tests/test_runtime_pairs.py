"""The runtime's pair-level healing, in-process: router membership
(pdsvc/ship/runtime/membership.py) and the pair canary (canary.py), against fakes of the
router's /workers API and of the engines' replies. The whole loop under a real systemd and the
real routers is tests/test_e2e_faults.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pair_fakes import WORKER, FakeRouter, rounds
from runtime_procs import FakeClock

from pdsvc.ship.runtime import canary, membership, probe, timings
from pdsvc.ship.runtime import rounds as canary_rounds
from pdsvc.ship.runtime.canary import Canary, Pair, Round
from pdsvc.ship.runtime.cascade import Cascade, marker_path
from pdsvc.ship.runtime.hold import Hold, write_hold
from pdsvc.ship.runtime.membership import Membership, Routers, Worker
from pdsvc.ship.runtime.notify import Notifier
from pdsvc.ship.runtime.options import Options
from pdsvc.ship.runtime.policy import RestartPolicy
from pdsvc.ship.runtime.probe import HttpReply
from pdsvc.ship.runtime.serving import Serving

# --------------------------------------------------------------------------- membership




@pytest.mark.parametrize("smg", [False, True], ids=["sglang-router", "smg"])
def test_join_leave_and_rejoin_after_the_router_restarts(smg: bool) -> None:
    router, lines, clock = FakeRouter(smg), [], FakeClock(1000.0)
    m = Membership("http://10.0.0.1:8000", WORKER, "k", lines.append, call=router, clock=clock)
    assert m.join() and [w["url"] for w in router.workers] == [WORKER.url]
    posted = json.loads(membership.Worker.payload(WORKER))
    assert posted == {"url": WORKER.url, "worker_type": "prefill", "bootstrap_port": 8998,
                      "health": {"drain_settle_secs": 0}}  # smg: no fixed 5 s Draining
    m.check(True)
    assert len(router.workers) == 1  # still there: nothing posted twice
    router.up = False  # the router dies...
    m.check(True)
    m.check(True)
    assert sum("unreachable" in line for line in lines) == 1  # one line for the outage
    router.up, router.workers = True, []  # ...and comes back empty
    m.check(True)
    assert [w["url"] for w in router.workers] == [WORKER.url]
    m.leave()
    if smg:  # smg drains the deleted entry a while; a new instance waits it out, then joins
        assert router.workers[0]["status"] == "draining"
        m2 = Membership("http://10.0.0.1:8000", WORKER, "k", lines.append, call=router)
        before = len(router.calls)
        assert not m2.join()
        m2.check(True)
        assert not any(c[0] == "DELETE" for c in router.calls[before:])
        router.workers = []
        m2.check(True)
        assert m2.joined and router.workers[0]["status"] == "ready"
    else:
        assert router.workers == []


def test_an_entry_held_unhealthy_while_the_engine_is_healthy_is_posted_afresh() -> None:
    router, clock = FakeRouter(smg=True), FakeClock(1000.0)
    m = Membership("http://r", WORKER, "k", lambda s: None, call=router, clock=clock)
    m.join()
    router.workers[0].update(status="failed", is_healthy=False)
    m.check(True)
    assert router.workers[0]["status"] == "failed"  # not yet: the router probes it itself
    clock.now += timings.STUCK_UNHEALTHY_S
    m.check(True)
    assert [w["status"] for w in router.workers] == ["draining"]  # deleted, then waits
    m.check(False)  # the engine itself unhealthy: the router is right, leave it
    router.workers = []
    m.check(True)
    assert [w["status"] for w in router.workers] == ["ready"]


def test_a_wrong_key_is_refused_and_said_without_the_key() -> None:
    router, lines = FakeRouter(key="right"), []
    m = Membership("http://r", WORKER, "wrong-key-123", lines.append, call=router)
    assert not m.join()
    assert lines and all("wrong-key-123" not in line for line in lines)


def test_the_key_is_read_from_a_credential_and_never_shown(tmp_path: Path) -> None:
    (tmp_path / "router-key").write_text("abc123\n")
    assert membership.read_key("credential:router-key",
                               {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "abc123"
    (tmp_path / "bad").write_text("two words\n")
    with pytest.raises(ValueError) as e:
        membership.read_key(str(tmp_path / "bad"), {})
    assert "two words" not in str(e.value)
    with pytest.raises(ValueError, match="CREDENTIALS_DIRECTORY is not set"):
        membership.read_key("credential:router-key", {})


# --------------------------------------------------------------------------- the canary

P0, P1, D = "http://127.0.0.1:30000", "http://127.0.0.1:30002", "http://127.0.0.1:30001"


def reply(status: int, doc: dict) -> HttpReply:
    return HttpReply(status, json.dumps(doc).encode(), f"HTTP {status}")


GOOD = reply(200, {"text": "x", "meta_info": {"finish_reason": {"type": "length"},
                                              "completion_tokens": 1}})
ABORT = reply(200, {"text": "", "meta_info": {"finish_reason": {
    "type": "abort", "message": "KV transfer failed"}, "completion_tokens": 0}})


@pytest.mark.parametrize("answer, verdict", [
    (GOOD, None),
    (ABORT, "HTTP 200 with finish_reason abort: KV transfer failed"),
    (reply(200, {"text": "", "meta_info": {"finish_reason": {"type": "length"}}}),
     "HTTP 200 with an empty completion"),
    (reply(500, {"error": "x"}), "HTTP 500"),
    (HttpReply(200, b"ok", "HTTP 200"), "HTTP 200 but the body is not a JSON object: ok"),
])
def test_a_completion_is_judged_by_content_not_status(answer: HttpReply, verdict) -> None:
    assert probe.judge_generation(answer) == verdict


def test_the_canary_sends_what_the_router_sends_to_both_sides() -> None:
    sent: dict[str, dict] = {}

    def call(url, timeout, body=None, headers=None, method=None):
        if url.endswith("/health"):
            return HttpReply(200, b"", "HTTP 200")
        sent[url] = json.loads(body)
        return GOOD

    pair = Pair(P0, 8998, D)
    assert canary_rounds.probe_pair(pair, D, 5.0, call=call, room=lambda: 42).ok
    assert set(sent) == {f"{P0}/generate", f"{D}/generate"}
    body = sent[f"{D}/generate"]
    assert body == sent[f"{P0}/generate"]  # the same body, both sides
    assert (body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]) == (
        "127.0.0.1", 8998, 42)
    assert body["sampling_params"]["max_new_tokens"] == 1


def test_a_peer_that_is_down_is_not_a_pair_failure() -> None:
    r = canary_rounds.probe_pair(Pair(P0, 8998, D), D, 1.0,
                          call=lambda url, *a, **k: HttpReply(None, b"", "connection refused"))
    assert r.skipped and not r.error


def test_the_side_that_served_the_pair_before_heals_and_the_fresh_side_does_not(
        tmp_path: Path) -> None:
    pair = Pair(P0, 8998, D)
    stale = Canary(P0, [pair], failures_to_act=3, log=lambda s: None,
                   path=str(tmp_path / "p.canary.json"))
    fresh = Canary(D, [pair], failures_to_act=3, log=lambda s: None)
    stale.record(rounds(pair, True))  # the prefill served with the old decode
    for _ in range(3):
        stale.record(rounds(pair, False))
        fresh.record(rounds(pair, False))  # the new decode never had a good round
    assert "this engine served that pair before" in stale.verdict()
    assert fresh.verdict() is None  # ... and leaves it to the prefill
    saved = json.loads((tmp_path / "p.canary.json").read_text())
    assert saved["pairs"][0]["state"] == "failing" and saved["pairs"][0]["failures"] == 3
    for _ in range(3):
        fresh.record(rounds(pair, False))
    assert "no pair works from this engine" in fresh.verdict()  # both fresh: together


def test_a_coupled_pair_is_healed_by_its_prefill_whichever_side_is_stale() -> None:
    """The decode restarts with its prefill (--follower): the prefill's restart renews both
    sides at once, so the prefill heals even when it is the fresh side (replaced behind its
    address), and the decode, stale or not, leaves it to the prefill."""
    pair = Pair(P0, 8998, D)
    prefill = Canary(P0, [pair], failures_to_act=3, log=lambda s: None, followers=[D])
    decode = Canary(D, [pair], failures_to_act=3, log=lambda s: None, followers=[D])
    decode.record(rounds(pair, True))  # the decode served the pair with the old prefill
    for _ in range(3):
        prefill.record(rounds(pair, False))  # the new prefill never had a good round
        decode.record(rounds(pair, False))
    assert "restarting this prefill renews both sides at once" in prefill.verdict()
    assert decode.verdict() is None  # stale, but its restart would poison the new prefill
    for _ in range(3 * (canary.LAST_RESORT - 1) - 1):  # the prefill did not act (its budget)
        decode.record(rounds(pair, False))
        assert decode.verdict() is None  # no race with the prefill's own heal
    decode.record(rounds(pair, False))
    assert "as a last resort" in decode.verdict()


def test_only_followers_make_the_prefill_the_healer() -> None:
    coupled, loose = Pair(P0, 8998, D), Pair(P0, 8998, "http://127.0.0.1:30003")
    prefill = Canary(P0, [coupled, loose], failures_to_act=2, log=lambda s: None,
                     followers=[D])
    for _ in range(2):
        prefill.record([*rounds(coupled, True), *rounds(loose, False)])
    assert prefill.verdict() is None  # the loose pair: never served, another works
    assert [s.heals_by for s in prefill.states.values()] == ["me", "stale side"]


def test_one_flapping_pair_does_not_take_down_a_decode_that_serves_its_other_pair() -> None:
    bad, good = Pair(P0, 8998, D), Pair(P1, 8999, D)
    decode = Canary(D, [bad, good], failures_to_act=2, log=lambda s: None)
    for _ in range(10):
        decode.record([*rounds(bad, False), *rounds(good, True)])
    assert decode.verdict() is None  # it never served the bad pair, and another one works


# --------------------------------------------------------------------------- when rounds run


def _thread(interval: float = 30.0, **kw) -> canary_rounds.CanaryThread:
    c = Canary(P0, [Pair(P0, 8998, D)], failures_to_act=3, log=lambda s: None)
    return canary_rounds.CanaryThread(c, interval, 5.0, **kw)


def test_after_a_bad_round_every_second_then_slower_then_steady_once_good() -> None:
    t = _thread()
    bad, good = rounds(Pair(P0, 8998, D), False), rounds(Pair(P0, 8998, D), True)
    delays = [t.next_delay(bad) for _ in range(12)]
    assert delays[:6] == [1.0] * 6  # 2 x failures rounds at the retry pace
    assert delays[6:] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]  # then doubling, up to the interval
    assert t.next_delay(good) == 30.0 and t.bad_rounds == 0
    skipped = [Round(Pair(P0, 8998, D), False, skipped="peer down")]
    # a round that found the peer not healthy yet is retried sooner: it comes up any moment
    delays = [t.next_delay(skipped) for _ in range(8)]
    assert delays == [0.25] * 6 + [0.5, 1.0]  # then slower while it stays down


def test_looks_while_a_peer_loads_do_not_stretch_the_failed_rounds_after_it() -> None:
    """A replaced decode loads (12 looks that found it not up), then every pair through it
    fails (stale): the 3 failed rounds that decide a heal still come a second apart (they
    came 8 and 16 s apart when the looks counted towards the failed rounds' doubling: a
    kill -9 of a 1P1D decode took 20 s, not 12, to heal under the shipped defaults)."""
    t = _thread()
    skipped = [Round(Pair(P0, 8998, D), False, skipped="peer down")]
    bad = rounds(Pair(P0, 8998, D), False)
    looks = [t.next_delay(skipped) for _ in range(12)]
    assert looks[:6] == [0.25] * 6 and max(looks) <= 30.0
    assert [t.next_delay(bad) for _ in range(3)] == [1.0, 1.0, 1.0]


def test_a_peer_whose_port_opens_again_was_replaced() -> None:
    looks = iter([True, False, False, True, True])
    t = _thread(reachable=lambda url: next(looks))
    seen: dict[str, bool] = {}
    said = [t.replaced_peers(seen) for _ in range(5)]
    assert said == [[], [], [], [D], []]


def test_the_first_round_runs_as_soon_as_the_engine_is_ready_not_an_interval_later() -> None:
    t = _thread(interval=30.0, probe=lambda pair, peer, timeout: Round(pair, True),
                reachable=lambda url: True)
    t0 = time.monotonic()
    t.start()
    try:
        while not t.results and time.monotonic() - t0 < 5:
            time.sleep(0.05)
    finally:
        t.stop()
    assert t.results and time.monotonic() - t0 < 2.0


def test_a_replaced_peer_gets_a_round_at_once_even_mid_interval() -> None:
    ports = {"open": True}
    t = _thread(interval=30.0, probe=lambda pair, peer, timeout: Round(pair, True),
                reachable=lambda url: ports["open"], watch=0.05)
    t.start()
    try:
        deadline = time.monotonic() + 5
        while len(t.results) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        ports["open"] = False  # the peer restarts...
        time.sleep(0.3)
        ports["open"] = True  # ... and is back: a round now, not 30 s later
        while len(t.results) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        t.stop()
    assert len(t.results) == 2


def test_failure_counters_are_read_from_the_engines_own_metrics() -> None:
    text = ("# TYPE sglang:num_transfer_failed_reqs_total counter\n"
            'sglang:num_transfer_failed_reqs_total{model_name="m",engine_type="decode"} 3.0\n'
            "sglang:num_bootstrap_failed_reqs_total 2\n"
            'sglang:num_requests_total{model_name="m"} 99.0\n')
    counters = canary_rounds.FAILURE_COUNTERS
    assert canary_rounds.sample_sum(text, counters) == 5.0
    assert canary_rounds.sample_sum("sglang:num_requests_total 9\n", counters) is None  # off


def test_real_traffic_failing_gets_a_round_at_once_even_mid_interval(monkeypatch) -> None:
    monkeypatch.setattr(canary_rounds, "COUNTERS_LOOK_S", 0.05)
    counts = iter([0.0, 0.0, 0.0] + [4.0] * 1000)  # requests through a pair began to fail
    t = _thread(interval=30.0, probe=lambda pair, peer, timeout: Round(pair, True),
                reachable=lambda url: True, watch=0.05, failures=lambda: next(counts))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while len(t.results) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        t.stop()
    assert len(t.results) == 2  # the round at ready, then one for the failures, not 30 s on


def test_rising_counters_do_not_reset_the_pace_of_failing_rounds() -> None:
    counts = iter([1.0, 2.0, 3.0])
    t = _thread(failures=lambda: next(counts))
    last: list[float | None] = [None]
    assert t.failures_rose(last) is None  # the first look only learns the count
    assert "rose (1 -> 2)" in t.failures_rose(last)
    t.bad_rounds = 4  # rounds are failing (and raising the counters): no reset of the pace
    assert t.failures_rose(last) is None and last == [3.0]


# --------------------------------------------------------------------------- pdsvc status


def test_status_reads_why_a_unit_gave_up_and_the_pair_matrix(tmp_path: Path) -> None:
    from dataclasses import replace

    from pdsvc.config.load import parse_config
    from pdsvc.plan.build import build_plan
    from pdsvc.status import runstate
    from pdsvc.topology import load_topology_file

    repo = Path(__file__).resolve().parent.parent
    text = (repo / "etc/examples/2p1d.yaml").read_text()
    plan = build_plan(parse_config(text, "c.yaml"),
                      load_topology_file(repo / "etc/seed-host.topology.json"),
                      config_source="c.yaml", config_text=text)
    plan = replace(plan, paths=replace(plan.paths, run_dir=str(tmp_path)))
    clock = FakeClock(1000.0)
    for _ in range(3):  # dsv4-prefill-1 never became healthy
        p = RestartPolicy(str(tmp_path / "dsv4-prefill-1.restart.json"), restart_delay=1,
                          max_delay=8, reset_after=600, attempts=3, clock=clock)
        p.on_start()
        p.on_failed_start("OSError: Incorrect path_or_model_id")
    (p0, port, d), _ = [e for e in plan.engines if e.name == "dsv4-decode"][0].pairs
    decode = Canary(d, [Pair(p0, port, d)], failures_to_act=3, log=lambda s: None,
                    path=str(tmp_path / "dsv4-decode.canary.json"), wall=lambda: 100.0)
    decode.record(rounds(Pair(p0, port, d), False))
    runs = runstate.unit_runs(plan, Path(plan.paths.run_dir))
    pairs = runstate.pair_views(plan, Path(plan.paths.run_dir))
    heals = RestartPolicy(str(tmp_path / "dsv4-decode.restart.json"), restart_delay=1,
                          max_delay=8, reset_after=600, attempts=3)
    heals.record_heal()
    heals.record_heal()  # two heals that brought nothing back: slowed down
    runs = runstate.unit_runs(plan, Path(plan.paths.run_dir))
    assert runstate.problems(runs, pairs, heal_budget=2)[1] == (
        "dsv4-decode.service: 2 pair heals within the hour brought no pair back: it heals "
        "again only every 5 minutes (`systemctl restart dsv4-decode.service` starts afresh)")
    assert len(runstate.problems(runs, pairs, heal_budget=3)) == 2  # within the budget
    said = runstate.problems(runs, pairs)
    assert said[0] == ("dsv4-prefill-1.service gave up: gave up after 3 starts in a row that "
                       "never became healthy; last: OSError: Incorrect path_or_model_id")
    assert said[1].startswith(f"pair {p0} -> {d} failing (dsv4-decode): decode: HTTP 200")
    table = runstate.format_pairs(pairs, now=130.0)
    assert table[1].split() == ["prefill", "\\", "decode", d]
    assert table[2].split() == [p0, "FAILING", "30s"]
    assert table[3].split() == ["http://127.0.0.1:30002", "unknown"]  # nobody judged it yet


# --------------------------------------------------------------------------- the router's wait


def test_the_router_stops_waiting_for_an_engine_that_gave_up(tmp_path: Path) -> None:
    from pdsvc.ship.runtime.policy import gave_up_engines
    from pdsvc.ship.runtime.timings import GAVE_UP_GRACE_S

    clock = FakeClock(1000.0)
    clock.now = 1000.0
    p = RestartPolicy(str(tmp_path / "dsv4-decode.restart.json"), restart_delay=1, max_delay=8,
                      reset_after=600, attempts=1, clock=clock)
    p.on_start()
    assert gave_up_engines(str(tmp_path), ["dsv4-prefill", "dsv4-decode"], 999.0, 1000.0) == []
    p.on_failed_start("OSError: Incorrect path_or_model_id")  # during the router's start
    assert gave_up_engines(str(tmp_path), ["dsv4-prefill", "dsv4-decode"], 999.0, 1000.0) == [
        "dsv4-decode gave up (gave up after 1 starts in a row that never became healthy; "
        "last: OSError: Incorrect path_or_model_id)"]
    # a give-up before the router started may be a stale file the engine is about to rewrite:
    # believed only once it is still there GAVE_UP_GRACE_S later
    assert gave_up_engines(str(tmp_path), ["dsv4-decode"], 1001.0, 1002.0) == []
    assert gave_up_engines(str(tmp_path), ["dsv4-decode"], 1001.0, 1001.0 + GAVE_UP_GRACE_S)


def test_a_give_up_under_supervisord_waits_out_startsecs() -> None:
    """supervisord honours exitcodes= only for a process that ran startsecs: a give-up
    (78) sooner would be retried as a failed spawn (supervisord's process.py)."""
    from pdsvc.ship.runtime.cli import parse_args
    from pdsvc.ship.runtime.endings import Exit
    from pdsvc.ship.runtime.lifecycle import run

    args, command = parse_args(["engine", "--name", "x", "--health-url",
                                "http://127.0.0.1:9/health", "--start-attempts", "1",
                                "--min-uptime", "1.5", "--", "false"])
    t0 = time.monotonic()
    assert run(args, command) == Exit.GAVE_UP
    assert time.monotonic() - t0 >= 1.5
    args, command = parse_args(["engine", "--name", "x", "--health-url",
                                "http://127.0.0.1:9/health", "--start-attempts", "1",
                                "--", "false"])
    t0 = time.monotonic()
    assert run(args, command) == Exit.GAVE_UP
    assert time.monotonic() - t0 < 1.5  # systemd: no wait


# --------------------------------------------------------------------------- coupling scope


def _plan(prefills: int, decodes: int, backend: str = "nixl"):
    from pdsvc.config.load import parse_config
    from pdsvc.plan.build import build_plan
    from pdsvc.topology import load_topology_file
    text = (f"model: {{path: /srv/m}}\ntransfer: {{backend: {backend}}}\n"
            f"prefill: {[{'gpus': [i]} for i in range(prefills)]}\n"
            f"decode: {[{'gpus': [4 + i]} for i in range(decodes)]}\n")
    topo = load_topology_file(Path(__file__).parent.parent / "etc/seed-host.topology.json")
    return build_plan(parse_config(text, "t.yaml"), topo, config_source="t.yaml",
                      config_text=text)


@pytest.mark.parametrize(("prefills", "decodes", "coupled"), [
    (1, 1, True),   # 1P1D: the prefill's restart stops serving anyway; one step heals both
    (1, 2, True),   # the only prefill: the same, the decodes reload in its shadow
    (2, 1, False),  # the other prefill keeps serving with the decode
    (2, 2, False),  # one engine's restart reloads that engine only
])
def test_auto_couples_decodes_only_to_a_single_prefill(prefills: int, decodes: int,
                                                       coupled: bool) -> None:
    plan = _plan(prefills, decodes)
    for d in (e for e in plan.engines if e.role == "decode"):
        assert bool(d.restarts_with) is coupled, d.name
    for p in (e for e in plan.engines if e.role == "prefill"):
        assert bool(p.followers) is coupled, p.name  # who heals: the prefill, or the stale side
    assert not any(e.restarts_with for e in _plan(1, 1, "mooncake").engines)


def test_a_fresh_side_of_several_pairs_waits_for_its_stale_peers_to_heal_in_turn() -> None:
    """A prefill replaced in 2P2D fails with both decodes (they are stale toward it): it has
    served neither, so it waits while they heal one at a time, instead of restarting at
    2 x failures and becoming new again toward the decode that already healed."""
    pairs = [Pair(P0, 8998, D), Pair(P0, 8998, "http://127.0.0.1:30003")]
    fresh = Canary(P0, pairs, failures_to_act=3, log=lambda s: None)
    for _ in range(2 * 3):
        fresh.record([Round(p, False, "decode: HTTP 200 with finish_reason abort") for p in pairs])
    assert fresh.verdict() is None
    for _ in range(canary.LAST_RESORT * 3 - 2 * 3):
        fresh.record([Round(p, False, "decode: abort") for p in pairs])
    assert "no pair works" in (fresh.verdict() or "")
    one = Canary(P0, pairs[:1], failures_to_act=3, log=lambda s: None)  # 1P1D: as before
    for _ in range(2 * 3):
        one.record([Round(pairs[0], False, "decode: abort")])
    assert "no pair works" in (one.verdict() or "")


# --------------------------------------------------------------------------- admission, turns


D1 = "http://127.0.0.1:30003"


@pytest.mark.parametrize("smg", [False, True], ids=["sglang-router", "smg"])
def test_a_replaced_engine_joins_only_once_its_pairs_with_listed_engines_are_good(
        smg: bool) -> None:
    """HTTP 200 + finish_reason abort is not retried by either router: a prefill replaced in
    2P2D stays out of the router while a pair with a listed decode fails its canary; decodes
    the router does not list (healing) do not hold it back."""
    router, lines = FakeRouter(smg), []
    for url in (D, D1):
        router.workers.append({"id": url, "url": url, "worker_type": "decode",
                               "is_healthy": True})
    pairs = [Pair(P1, 8999, D), Pair(P1, 8999, D1)]
    c = Canary(P1, pairs, failures_to_act=3, log=lambda s: None)
    m = Membership("http://r", Worker(P1, "prefill", 8999), "k", lines.append, call=router)
    m.admit = c.admits
    assert not m.join() and "no canary round yet" in lines[-1]  # before its first round
    c.record([Round(pairs[0], True), Round(pairs[1], False, "decode: abort")])
    assert not m.join() and P1 not in [w["url"] for w in router.workers]
    router.workers = [w for w in router.workers if w["url"] != D1]  # D1 heals: leaves
    assert m.join() and P1 in [w["url"] for w in router.workers]


def serving(sibling: list[str], turn: int, membership: Membership) -> Serving:
    """SERVING's duties of an engine with these siblings, at this turn among its role."""
    return Serving(Options(sibling=sibling, heal_turn=turn), print, Notifier(print),
                   RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1, attempts=1),
                   membership, None, None, None, None)


def test_engines_of_one_role_heal_one_at_a_time(monkeypatch) -> None:
    """Two decodes stale toward the same replaced prefill: the first in turn heals at once,
    the second waits its turn, then sees the first gone from the router and waits on."""
    router = FakeRouter()
    for wid, url in (("d0", D), ("d1", D1)):
        router.workers.append({"id": wid, "url": url, "worker_type": "decode",
                               "is_healthy": True})
    first = serving([D1], 0, Membership("http://r", Worker(D, "decode", None), "k", print,
                                        call=router))
    second = serving([D], 1, Membership("http://r", Worker(D1, "decode", None), "k", print,
                                        call=router))
    assert first.not_my_turn(0.0) is None  # D1 is listed: D heals now
    first.membership.leave()  # as a heal does first
    assert "turn" in (second.not_my_turn(0.0) or "")
    assert "no other healthy engine" in (second.not_my_turn(timings.HEAL_STAGGER_S) or "")
    router.workers.append({"id": "x", "url": D, "worker_type": "decode", "is_healthy": True})
    assert second.not_my_turn(timings.HEAL_STAGGER_S) is None  # D is back and listed
    alone = serving([], 0, second.membership)
    assert alone.not_my_turn(0.0) is None  # the only engine of its role waits for no one


def deadlock_lab(tmp_path, up: dict[str, bool], listed: list[tuple[str, str]]):
    """D1's SERVING, 2P2D (prefills P0, P1; decodes D, D1), the router listing ``listed``
    (url, role), each engine up or not as ``up`` says, on a clock the test moves."""
    router = FakeRouter()
    for url, role in listed:
        router.workers.append({"id": url, "url": url, "worker_type": role, "is_healthy": True})
    pairs = [Pair(P0, 8998, D1), Pair(P1, 8999, D1)]
    clock = FakeClock(100.0)
    s = Serving(Options(sibling=[D], heal_turn=0, role="decode"), print, Notifier(print),
                RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1, attempts=1),
                Routers(["http://r"], Worker(D1, "decode", None), "k", print, call=router),
                Cascade(str(tmp_path), "dep", "dep-decode-1", "systemctl restart dep-engines",
                        print),
                Canary(D1, pairs, failures_to_act=3, log=print), None, None, clock=clock,
                up=lambda urls, timeout: {u: up.get(u, True) for u in urls})
    return s, clock, marker_path(str(tmp_path), "dep")


def test_a_stale_side_dead_lock_is_cured_once_it_has_held(tmp_path) -> None:
    """The stale sides (P1, D1) serve; P0 and D are up and left out, each stale toward one of
    them: D1 cannot heal (the router lists no other decode). Held DEADLOCK_S, it writes the
    cure (every engine restarts together) instead of waiting for the last resort."""
    s, clock, marker = deadlock_lab(tmp_path, {}, [(P1, "prefill"), (D1, "decode")])
    said = s.decide_heal("pair stale", 9.0)
    assert said.wait and "no other healthy engine" in said.wait
    assert said.ask_after == timings.DEADLOCK_S and not Path(marker).exists()
    clock.now += timings.DEADLOCK_S / 2
    half = s.decide_heal("pair stale", 19.0)
    assert half.wait and half.ask_after == timings.DEADLOCK_S / 2  # not yet: asked when it will be
    clock.now += timings.DEADLOCK_S / 2
    cured = s.decide_heal("pair stale", 29.0)
    assert cured.wait is None
    assert "heal cascade (a stale-side dead-lock) in deployment dep" in cured.detail
    assert Path(marker).exists() and f"not {P0}" in cured.detail


@pytest.mark.parametrize("up, listed", [
    ({D: False}, [(P1, "prefill"), (D1, "decode")]),  # the sibling loads: its heal under way
    ({P0: False}, [(P1, "prefill"), (D1, "decode")]),  # a peer loads
    ({}, [(P0, "prefill"), (P1, "prefill"), (D1, "decode")]),  # no peer left out
])
def test_no_dead_lock_while_a_load_can_end_it(tmp_path, up, listed) -> None:
    s, clock, marker = deadlock_lab(tmp_path, up, listed)
    for _ in range(4):
        said = s.decide_heal("pair stale", 9.0)
        assert said.wait and "no other healthy engine" in said.wait
        assert said.ask_after == timings.HEAL_STAGGER_S  # looks again soon: one may form
        clock.now += timings.DEADLOCK_S
    assert not Path(marker).exists()


def test_a_heal_asked_just_before_a_hold_was_taken_waits_instead(tmp_path) -> None:
    """The verdict came, the question went off the loop, and meanwhile `pdsvc profile` (or
    apply) took a hold: the answer is a wait, never a restart of a held engine."""
    hold = Hold(str(tmp_path / "d1.hold.json"))
    s = Serving(Options(role="decode"), print, Notifier(print),
                RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1, attempts=3),
                None, None, Canary(D1, [Pair(P0, 8998, D1)], failures_to_act=3, log=print,
                                   hold=hold), None, None)
    assert s.decide_heal("pair stale", 9.0).wait is None  # no hold: it heals
    write_hold(hold.path, out=False, peers=[], by="pdsvc profile", profile="r1")
    said = s.decide_heal("pair stale", 9.0)
    assert said.wait == "a hold is in force: no heal while it lasts"
