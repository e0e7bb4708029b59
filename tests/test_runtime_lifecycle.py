"""One unit's life (pdsvc/ship/runtime/lifecycle.py), as a process: an engine and the router are
ready only once healthy, fed to the watchdog only while live, restarted with a peer, and
stopped at their own start deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
from ports import free_port
from runtime_procs import (
    child_pid,
    engine_args,
    first_event,
    read_events,
    wait_for,
)
from timing import within

# ---------------------------------------------------------------------------------------------
# Engine mode, as a process


def test_engine_ready_only_after_healthy_then_watchdog_and_sigterm_forwarded(
    procs, notify_socket, tmp_path
):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-prefill", "--", *procs.child(port, events, "--healthy-after", "1")),
        notify=notify_socket,
    )
    wait_for(lambda: notify_socket.times("READY=1"), what="READY=1")
    start = next(e for e in read_events(events) if e["event"] == "start")
    ready_at = notify_socket.times("READY=1")[0]
    assert ready_at >= start["healthy_from"]
    wait_for(lambda: len(notify_socket.times("WATCHDOG=1")) >= 3, what="watchdog pings")
    assert min(notify_socket.times("WATCHDOG=1")) > ready_at
    assert any(
        s.startswith("STATUS=serving on http://127.0.0.1:") for s in notify_socket.statuses()
    )
    assert any("waiting for" in s for s in notify_socket.statuses())

    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0
    assert [e for e in read_events(events) if e["event"] == "sigterm"]
    log = procs.log(proc)
    assert "dsv4-prefill: healthy after " in log
    assert f"dsv4-prefill: waiting for http://127.0.0.1:{port}/health (" in log
    assert "dsv4-prefill: engine exited with status 0" in log
    assert notify_socket.times("STOPPING=1")
    assert "Traceback" not in log


def test_the_watchdog_is_fed_while_the_engine_drains_after_the_managers_stop(
        procs, notify_socket, tmp_path):
    """systemd stops a unit's watchdog as its stop begins, but a WATCHDOG=1 read after that
    (a ping sent just before the stop, read late on a busy host) arms it again; unfed through
    a long drain it would kill the runtime (result 'watchdog'). So the pings go on until the
    engine exits."""
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-decode", "--",
                    *procs.child(port, events, "--healthy-after", "0", "--drain-secs", "3")),
        notify=notify_socket,
    )
    wait_for(lambda: notify_socket.times("WATCHDOG=1"), what="serving")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: [e for e in read_events(events) if e["event"] == "sigterm"],
             what="the SIGTERM forwarded")
    stopped_at = time.time()
    assert procs.wait(proc) == 0
    # fed while it drained: a ping a CHILD_WAIT_SLICE_S (1 s) of its 3 s
    assert len([t for t in notify_socket.times("WATCHDOG=1") if t > stopped_at]) >= 2


def test_engine_hung_child_gets_no_watchdog_pings(procs, notify_socket, tmp_path):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-decode", "--liveness-timeout", "0.3", "--")
        + procs.child(port, events),
        notify=notify_socket,
    )
    wait_for(lambda: len(notify_socket.times("WATCHDOG=1")) >= 2, what="watchdog pings")
    pid = child_pid(events)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.6)  # let a probe that was already answered land
        stopped_at = time.time()
        time.sleep(1.5)
        assert [t for t in notify_socket.times("WATCHDOG=1") if t > stopped_at] == []
        assert "dsv4-decode: liveness probe failed: timed out after 0.3 s" in procs.log(proc)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.time()
    wait_for(
        lambda: [t for t in notify_socket.times("WATCHDOG=1") if t > resumed_at],
        what="pings after SIGCONT",
    )
    assert "liveness probe OK again" in procs.log(proc)
    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0


def test_a_stop_of_a_hung_engine_is_seen_at_once_and_kills_it(procs, notify_socket, tmp_path):
    """SIGSTOP (as a hung CUDA/NCCL call looks from outside), then the manager's stop while a
    liveness probe waits out its 30 s timeout: the stop is acted on at once (the probe runs
    aside), the engine's /health gives no answer within STOP_JUDGE_S of the forwarded
    SIGTERM, so it is SIGKILLed instead of drained, and the stop is a clean one."""
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-decode", "--liveness-timeout", "30", "--")
        + procs.child(port, events),
        notify=notify_socket,
    )
    wait_for(lambda: notify_socket.times("WATCHDOG=1"), what="serving")
    pid = child_pid(events)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: len(notify_socket.times("WATCHDOG=1")) and
                 time.time() - max(notify_socket.times("WATCHDOG=1")) > 1.0,
                 what="a liveness probe hanging on the stopped engine")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "forwarding SIGTERM to engine pid" in procs.log(proc),
                 what="the stop acted on")
        seen = time.monotonic() - t0  # left SERVING, left the router, forwarded the signal
        assert procs.wait(proc) == 0  # a clean stop: the manager asked for it
        took = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    log = procs.log(proc)
    # the mechanism: acted on before the hanging probe ended (it never logged its timeout)
    assert "liveness probe failed" not in log, log
    assert "forwarding SIGTERM to engine pid" in log, log
    assert "gave no answer within 5 s of the stop signal: the engine is hung and cannot " \
           "drain: sending SIGKILL" in log, log
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    print(f"stop of a hung engine: acted on after {seen:.2f} s, stopped after {took:.1f} s")
    within(took, 5 + 1, "the stop of a hung engine")


# ---------------------------------------------------------------------------------------------
# Router mode


def test_router_ready_only_after_readiness_and_a_generation(procs, notify_socket, tmp_path):
    port, events = free_port(), tmp_path / "router.jsonl"
    base = f"http://127.0.0.1:{port}"
    args = [
        "router",
        "--name",
        "dsv4-router",
        "--readiness-url",
        f"{base}/readiness",
        "--generate-url",
        f"{base}/generate",
        "--api-key-env",
        "PDSVC_TEST_ROUTER_KEY",
        "--poll-interval",
        "0.1",
        "--progress-every",
        "0.3",
        "--liveness-interval",
        "0.2",
        "--",
        *procs.child(
            port, events, "--mode", "router", "--healthy-after", "0.5", "--generate-after", "1.2"
        ),
    ]
    proc = procs.start(args, notify=notify_socket, env={"PDSVC_TEST_ROUTER_KEY": "sk-test"})
    wait_for(lambda: notify_socket.times("READY=1"), what="READY=1")
    ready_at = notify_socket.times("READY=1")[0]
    start = first_event(events, "start")
    posts = [e for e in read_events(events) if e["event"] == "post"]
    assert ready_at >= start["generate_from"] >= start["healthy_from"]
    assert posts and all(p["t"] >= start["healthy_from"] for p in posts)  # gated on readiness
    assert posts[-1]["code"] == 200 and posts[0]["code"] == 503
    assert posts[-1]["auth"] == "Bearer sk-test"
    assert posts[-1]["body"] == {
        "text": "pdsvc readiness probe",
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    }
    log = procs.log(proc)
    assert "readiness: HTTP 503" in log and "generation failed: HTTP 503" in log
    wait_for(lambda: len(notify_socket.times("WATCHDOG=1")) >= 2, what="watchdog pings")
    assert any(
        e["path"] == "/liveness" for e in read_events(events) if e["event"] == "get"
    )  # default liveness URL derived from --readiness-url
    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0
    assert "dsv4-router: router exited with status 0" in procs.log(proc)


def test_engine_exits_75_after_draining_when_its_peer_restarts(procs, notify_socket, tmp_path):
    port, peer_port = free_port(), free_port()
    events, peer_events = tmp_path / "child.jsonl", tmp_path / "peer.jsonl"
    peer = subprocess.Popen(procs.child(peer_port, peer_events))  # the other host's prefill
    try:
        proc = procs.start(
            engine_args(port, "dsv4-decode", "--restart-with",
                        f"http://127.0.0.1:{peer_port}/health", "--peer-down-probes", "2",
                        "--peer-interval", "0.2",
                        "--watchdog-secs", "5",
                        "--", *procs.child(port, events)),
            notify=notify_socket,
        )
        wait_for(lambda: len(notify_socket.times("WATCHDOG=1")) >= 2, what="serving")
        peer.kill()  # the peer host's engine dies: its port closes
        peer.wait(5)
        # two refused probes (every 0.2 s): this engine restarts while the peer does
        assert procs.wait(proc) == 75
    finally:
        peer.kill()
        peer.wait(5)
    assert [e for e in read_events(events) if e["event"] == "sigterm"]  # drained, not killed
    log = procs.log(proc)
    assert f"peer http://127.0.0.1:{peer_port}/health is up" in log
    assert f"peer http://127.0.0.1:{peer_port}/health: connection refused; watching" in log
    assert f"http://127.0.0.1:{peer_port}/health failed 2 probes in a row" in log
    assert "exiting 75 so that the process manager restarts it" in log


def test_a_start_past_its_deadline_is_stopped_and_counts_as_a_failed_start(procs, tmp_path):
    """--start-timeout: the runtime's own start deadline (before systemd's TimeoutStartSec=,
    whose SIGTERM looks like any stop): the child is stopped, the start counts, and the last
    of --start-attempts gives up with 78."""
    port, events = free_port(), tmp_path / "child.jsonl"
    codes = []
    for _ in range(2):
        proc = procs.start(engine_args(port, "dsv4-prefill", "--start-timeout", "1",
                                       "--state-dir", str(tmp_path), "--start-attempts", "2",
                                       "--", *procs.child(port, events, "--healthy-after", "60")))
        codes.append(procs.wait(proc))
    assert codes == [1, 78]
    assert "not healthy within --start-timeout 1 s" in procs.log(proc)
    assert "gave up after 2 starts in a row that never became healthy" in procs.log(proc)
    assert [e["event"] for e in read_events(events)].count("sigterm") == 2  # stopped, not left


def test_an_engine_still_loading_restarts_with_a_heal_cascade_cure(procs, tmp_path):
    """A cure (runtime/cascade.py) restarts an engine whose process started before it, even
    one still loading (its own heal just before the cure), so that no engine's load ends
    while an old peer still drains: the child is stopped, and the runtime exits 75."""
    from pdsvc.ship.runtime.cascade import marker_path
    from pdsvc.ship.runtime.statefile import write_state
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(engine_args(
        port, "dep-prefill-0", "--state-dir", str(tmp_path), "--deployment", "dep",
        "--role", "prefill", "--pair", f"http://127.0.0.1:{port}", "8998",
        f"http://127.0.0.1:{free_port()}",
        "--", *procs.child(port, events, "--healthy-after", "60")))
    child_pid(events)  # loading
    time.sleep(0.7)  # past one look at no marker
    write_state(marker_path(str(tmp_path), "dep"),
               {"at": time.time(), "by": "dep-decode-0", "why": "a cascade"})
    assert procs.wait(proc) == 75
    log = procs.log(proc)
    assert "dep-decode-0 found a heal cascade" in log
    assert "restarting to heal its pair: stopping the engine (SIGTERM)" in log
    assert [e for e in read_events(events) if e["event"] == "sigterm"]  # stopped, not left
    state = json.loads((tmp_path / "dep-prefill-0.restart.json").read_text())
    assert state["phase"] == "stopped" and state["failed_starts"] == 0  # not a failed start


@pytest.mark.parametrize("healthy_after, phase", [(0.0, "crashed"), (None, "failed-start")])
def test_a_child_that_ends_on_its_own_with_status_0_is_restarted(
        procs, tmp_path, healthy_after, phase) -> None:
    """No stop was asked for, yet the engine exited 0: the runtime exits 70 (Exit.ENDED), not
    0, which systemd's Restart=on-failure and supervisord's exitcodes= would take for a wanted
    end and leave the engine down; the restart policy records it as what it is."""
    from pdsvc.ship.runtime.endings import Exit
    from pdsvc.ship.runtime.statefile import read_state

    port, events = free_port(), tmp_path / "child.jsonl"
    child = procs.child(port, events, "--exit-after", "1.5", "--exit-code", "0",
                        *(["--healthy-after", str(healthy_after)] if healthy_after is not None
                          else ["--healthy-after", "60"]))
    proc = procs.start(engine_args(port, "dsv4-prefill", "--state-dir", str(tmp_path / "s"),
                                   "--", *child))
    assert procs.wait(proc) == Exit.ENDED
    assert "ended on its own with status 0" in procs.log(proc)
    state = read_state(str(tmp_path / "s" / "dsv4-prefill.restart.json"))
    assert state is not None and state["phase"] == phase, state
