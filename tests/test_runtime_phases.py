"""The runtime's loops (pdsvc/ship/runtime/phases.py): the start phase and the peer watch,
in-process on a fake clock (SERVING's liveness: test_runtime_watch.py).
"""

from __future__ import annotations

import time

import pytest
from runtime_procs import (
    FakeClock,
)

from pdsvc.ship.runtime.phases import Outcome, PeerWatch, wait_until_healthy
from pdsvc.ship.runtime.probe import NoAnswerKind, ProbeResult


def test_wait_until_healthy_logs_progress_and_returns_on_200():
    clock = FakeClock()
    answers = iter([ProbeResult(False, "HTTP 503")] * 40 + [ProbeResult(True, "HTTP 200")])
    lines: list[str] = []
    outcome = wait_until_healthy(
        lambda: next(answers),
        clock.wait,
        what="http://x/health",
        log=lines.append,
        status=lambda text: None,
        poll_interval=1.0,
        progress_every=15.0,
        should_stop=lambda: False,
        clock=clock,
    )
    assert outcome.kind == "healthy" and outcome.elapsed == pytest.approx(40.0)
    assert lines == [
        "waiting for http://x/health (HTTP 503) — 15 s since start",
        "waiting for http://x/health (HTTP 503) — 30 s since start",
    ]


def test_wait_until_healthy_returns_child_exit():
    clock = FakeClock()
    exits = iter([None, None, None, 3])
    outcome = wait_until_healthy(
        lambda: ProbeResult(False, "connection refused"),
        lambda timeout: next(exits),
        what="u",
        log=lambda line: None,
        status=lambda text: None,
        poll_interval=1.0,
        progress_every=15.0,
        should_stop=lambda: False,
        clock=clock,
    )
    assert outcome == Outcome("exited", 3)


# ---------------------------------------------------------------------------------------------
# --restart-with: a peer on another host restarted


def _peer(results: list[str]):
    """A probe answering from a script: 'ok', 'refused' or 'timeout' per call, then the
    script's last answer for every call after it."""
    it = iter(results)

    def probe(url: str, timeout: float):
        r = next(it, results[-1])
        return (ProbeResult(True, "HTTP 200") if r == "ok" else
                ProbeResult(False, "connection refused", NoAnswerKind.REFUSED)
                if r == "refused" else
                ProbeResult(False, f"timed out after {timeout:g} s", NoAnswerKind.TIMEOUT))
    return probe


@pytest.mark.parametrize("script, restarts_at", [
    (["ok", "refused", "refused", "refused", "ok"], 4),  # down 3x, port closed: at once
    (["ok", "timeout", "timeout", "timeout", "ok", "ok"], None),  # slow or partitioned: not
    (["ok", "refused", "refused", "ok", "ok"], None),  # fewer than down_after failures
    (["refused", "refused", "refused", "ok", "ok"], None),  # never seen up: still loading
    (["ok", "timeout", "refused", "timeout", "ok"], 4),  # one refusal in the run is enough
])
def test_peer_watch_tells_a_restart_from_slowness(script, restarts_at) -> None:
    lines: list[str] = []
    watch = PeerWatch(["http://10.0.0.2:30000/health"], down_after=3, timeout=1,
                          probe=_peer(script), log=lines.append)
    said = [watch.check() for _ in script]
    if script[0] == "ok" and not restarts_at:  # a recovery that is not a restart is said so
        assert any("not a restart" in line for line in lines), lines
    at = next((i + 1 for i, s in enumerate(said) if s), None)
    assert at == restarts_at, said
    if at:
        assert ("http://10.0.0.2:30000/health failed 3 probes in a row and its port was "
                "closed" in said[at - 1])


def test_peer_probes_run_at_once_so_many_dead_peers_cost_one_timeout() -> None:
    started: list[float] = []
    ended: list[float] = []

    def slow(url: str, timeout: float):
        started.append(time.monotonic())
        time.sleep(timeout)
        ended.append(time.monotonic())
        return ProbeResult(False, f"timed out after {timeout:g} s")

    urls = [f"http://10.0.0.{i}:30000/health" for i in range(2, 8)]  # 6 partitioned peers
    watch = PeerWatch(urls, down_after=3, timeout=0.4, probe=slow)
    assert watch.check() is None
    # at once: every probe had started before the first one ended (one after another, the
    # second would start only after the first's timeout), whatever the machine's load
    assert len(started) == 6 and max(started) < min(ended), (started, ended)
    assert all(n == 1 for n in watch.failures.values())




@pytest.mark.parametrize("script, confirming", [
    (["ok", "refused"], True),  # its port closed: confirm at once
    (["ok", "timeout"], False),  # slow or unreachable: the usual pace
    (["refused"], False),  # never seen up: still loading
    (["ok", "refused", "ok"], False),  # back: nothing to confirm
])
def test_a_refusal_of_a_peer_seen_up_is_confirmed_at_once(script, confirming) -> None:
    watch = PeerWatch(["http://10.0.0.2:30000/health"], down_after=3, timeout=1,
                      probe=_peer(script))
    for _ in script:
        watch.check()
    assert watch.confirming is confirming


def test_serving_confirms_a_peers_death_within_a_second_and_a_blip_at_the_pace() -> None:
    """SERVING's peer watch (serving.py): after a refusal it probes every PEER_CONFIRM_S, so
    --peer-down-probes refusals restart this engine well within a second of the first; a
    probe that timed out keeps the --peer-interval pace."""
    from pdsvc.ship.runtime.notify import Notifier
    from pdsvc.ship.runtime.options import Options
    from pdsvc.ship.runtime.policy import RestartPolicy
    from pdsvc.ship.runtime.serving import Serving
    from pdsvc.ship.runtime.timings import PEER_CONFIRM_S

    def serving(script: list[str]) -> tuple[Serving, FakeClock]:
        clock = FakeClock()
        s = Serving(Options(peer_interval=1.0), print, Notifier(print),
                    RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1,
                                  attempts=1), None, None, None, None, None, clock=clock)
        s.peers = PeerWatch(["http://10.0.0.2:30000/health"], down_after=3, timeout=1,
                            probe=_peer(script))
        return s, clock

    def run(s: Serving, clock: FakeClock) -> float | None:
        """The peers poller for 10 s: a check, then its pace (events.Poller): when it said
        restart."""
        while clock.now < 10:
            if s.watch_peers() is not None:
                return clock.now
            clock.now += s.peer_pace()
        return None

    s, clock = serving(["ok", "refused", "refused", "refused", "ok"])
    at = run(s, clock)  # ok at 0, the first refusal at 1 s, then two more a confirm apart
    assert at is not None and at - 1.0 <= 2 * PEER_CONFIRM_S + 0.1
    s, clock = serving(["ok", "timeout", "timeout", "timeout", "ok", "ok", "ok"])
    assert run(s, clock) is None and s.peers is not None and not s.peers.confirming
