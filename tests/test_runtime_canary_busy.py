"""Measuring never causes a heal: a canary round that waits behind a queue (a search pushing an
engine past its capacity) is *busy*, not failed, so no side restarts for it; a round that
times out while no engine of its pair has requests waiting, or while this engine's KV
transfers fail, is still judged (pdsvc/ship/runtime/rounds.py CanaryThread.busy, canary.py).
The last test runs the canary's own request and queue look against stand-in engines whose
scheduler is flooded (tests/support/fake_latency.py: a FIFO scheduler with a capacity)."""

from __future__ import annotations

import json
import threading

from standin_client import engines, model_dir, wait_until  # noqa: F401 - fixtures

from pdsvc.ship.runtime import rounds as canary_rounds
from pdsvc.ship.runtime.canary import Canary, Pair, PairHealth, Round

P0, D = "http://10.0.0.1:30000", "http://10.0.0.1:30001"
PAIR = Pair(P0, 8998, D)
TIMED_OUT = Round(PAIR, False, "decode: no reply within 5 s", timed_out=True)


def _thread(queue: dict[str, float | None], failures: list[float]) -> canary_rounds.CanaryThread:
    c = Canary(D, [PAIR], failures_to_act=3, log=lambda s: None, wall=lambda: 100.0)
    looks = iter(failures)
    return canary_rounds.CanaryThread(c, 30.0, 5.0, queue=lambda url: queue.get(url),
                                      failures=lambda: next(looks))


def test_a_round_that_waits_behind_a_queue_is_busy_and_never_heals() -> None:
    t = _thread({D: 7.0, P0: 0.0}, [2.0] * 100)
    t.canary.record([Round(PAIR, True)])  # served: a failing pair would be healed by this side
    for _ in range(10):
        judged = t.busy([TIMED_OUT], 2.0)
        t.canary.record(judged)
    assert judged[0].busy.startswith(f"decode: no reply within 5 s while {D} had 7 request(s)")
    s = t.canary.states[PAIR.name]
    assert (s.state, s.failures, t.canary.verdict()) == (PairHealth.BUSY, 0, None)
    assert t.next_delay(judged) == canary_rounds.CANARY_PEER_RETRY_S  # paced as not judged


def test_a_timeout_with_empty_queues_is_a_failure_and_heals() -> None:
    t = _thread({D: 0.0, P0: None}, [2.0] * 100)  # P0: no /metrics to read
    t.canary.record([Round(PAIR, True)])
    for _ in range(3):
        judged = t.busy([TIMED_OUT], 2.0)
        t.canary.record(judged)
    assert judged == [TIMED_OUT]
    assert "failed 3 canary rounds in a row" in (t.canary.verdict() or "")


def test_transfers_failing_during_the_round_judge_it_even_when_queued() -> None:
    t = _thread({D: 7.0}, [3.0])  # the counters rose from 2 during the round
    assert t.busy([TIMED_OUT], 2.0) == [TIMED_OUT]


def test_without_queue_looks_a_timeout_is_judged_as_before() -> None:
    c = Canary(D, [PAIR], failures_to_act=3, log=lambda s: None)
    t = canary_rounds.CanaryThread(c, 30.0, 5.0)
    assert t.busy([TIMED_OUT], None) == [TIMED_OUT]
    ok_and_abort = [Round(PAIR, False, "decode: HTTP 200 with finish_reason abort")]
    t2 = _thread({D: 7.0}, [2.0])
    assert t2.busy(ok_and_abort, 2.0) == ok_and_abort  # no timeout: a broken pair, judged


def test_ok_stays_ok_since_across_busy_rounds_and_failures_keep_counting() -> None:
    now = [100.0]
    c = Canary(D, [PAIR], failures_to_act=3, log=lambda s: None, wall=lambda: now[0])
    busy = Round(PAIR, False, "x", timed_out=True, busy="queued")
    bad = Round(PAIR, False, "decode: HTTP 200 with finish_reason abort")
    for when, r in ((100.0, Round(PAIR, True)), (110.0, busy), (120.0, Round(PAIR, True))):
        now[0] = when
        c.record([r])
    # a bench run's canary gate reads "ok since": a busy round between is no re-proof
    assert c.states[PAIR.name].last_ok == 100.0
    for when, r in ((130.0, bad), (140.0, bad), (150.0, busy), (160.0, Round(PAIR, True))):
        now[0] = when
        c.record([r])
    assert c.states[PAIR.name].last_ok == 160.0  # it failed in between: ok since now
    for r in (bad, bad, busy, bad):  # a busy round neither resets nor adds a failure
        c.record([r])
    assert c.states[PAIR.name].failures == 3 and c.verdict() is not None


def test_a_flooded_stand_in_decode_makes_the_canary_busy_not_failed(engines) -> None:  # noqa: F811
    """Stand-in engines whose scheduler takes 4 requests/s: 24 streamed requests queue 6 s of
    work on the decode, the canary's request (1 s timeout) waits behind them, and the queue
    look reads the decode's sglang:num_queue_reqs."""
    env = {"FAKE_SGLANG_KNEE_RATE": "4", "FAKE_SGLANG_TTFT_MS": "0"}
    pre, dec = (engines(role, env=env, args=["--enable-metrics"]) for role in ("prefill", "decode"))
    pre.wait_healthy(), dec.wait_healthy()
    pair = Pair(f"http://127.0.0.1:{pre.port}", pre.bport, f"http://127.0.0.1:{dec.port}")
    c = Canary(pair.decode, [pair], failures_to_act=3, log=lambda s: None)
    t = canary_rounds.CanaryThread(c, 30.0, 1.0, queue=canary_rounds.queued)
    assert t.probes()[0].ok and canary_rounds.queued(pair.decode) == 0  # idle: a good round

    def stream(room: int) -> None:
        body = json.loads(pair.body(room))
        body.update(stream=True, sampling_params={"max_new_tokens": 1})
        canary_rounds.http_call(f"{pair.decode}/generate", 30.0, json.dumps(body).encode(),
                                {"Content-Type": "application/json"})

    flood = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(24)]
    for f in flood:
        f.start()
    try:
        wait_until(lambda: (canary_rounds.queued(pair.decode) or 0) >= 10, 10,
                   "the flood queued on the decode")
        rounds = t.busy(t.probes(), None)
    finally:
        for f in flood:
            f.join(30)
    assert rounds[0].timed_out and "request(s) waiting in its queue" in rounds[0].busy
    assert f"{pair.decode} had" in rounds[0].busy
