"""Cold JIT compile serialisation (pdsvc/ship/runtime/jitlock.py): engines sharing a cold cache
compile one at a time; a warm one starts them together.
"""

from __future__ import annotations

import os
import signal

import pytest
from ports import free_port
from runtime_procs import (
    FakeClock,
    engine_args,
    first_event,
    read_events,
    wait_for,
)

from pdsvc.ship.runtime.jitlock import JitLock, engine_fingerprint
from pdsvc.ship.runtime.notify import Log

# ---------------------------------------------------------------------------------------------
# JIT cache serialisation


def _start_engine_with_cache(procs, notify, tmp_path, name, key, cache, healthy_after="1.5"):
    port, events = free_port(), tmp_path / f"{name}.jsonl"
    args = engine_args(port, name, "--jit-cache", str(cache), "--jit-key", key, "--")
    proc = procs.start(
        args + procs.child(port, events, "--healthy-after", healthy_after), notify=notify
    )
    return proc, events


def test_cold_jit_cache_serialises_engines(procs, notify_socket, tmp_path):
    cache = tmp_path / "jit"
    first, first_events = _start_engine_with_cache(
        procs, notify_socket, tmp_path, "dsv4-prefill", "prefill", cache
    )
    wait_for(lambda: read_events(first_events), what="first child start")
    second, second_events = _start_engine_with_cache(
        procs, notify_socket, tmp_path, "dsv4-decode", "decode", cache
    )
    wait_for(lambda: len(notify_socket.times("READY=1")) >= 2, timeout=15, what="both READY")
    first_start = first_event(first_events, "start")
    second_start = first_event(second_events, "start")
    assert second_start["t"] >= first_start["healthy_from"]
    log = procs.log(second)
    assert "JIT cache cold for decode@" in log
    assert f"waiting for dsv4-prefill (pid {first.pid})" in log
    assert f"to finish compiling into {cache}" in log
    assert (cache / ".pdsvc" / f"warm-prefill@{engine_fingerprint()}").exists()
    assert (cache / ".pdsvc" / f"warm-decode@{engine_fingerprint()}").exists()
    for proc in (first, second):
        proc.send_signal(signal.SIGTERM)
        assert procs.wait(proc) == 0


def test_warm_jit_cache_starts_engines_in_parallel(procs, notify_socket, tmp_path):
    cache = tmp_path / "jit"
    (cache / ".pdsvc").mkdir(parents=True)
    for key in ("prefill", "decode"):
        (cache / ".pdsvc" / f"warm-{key}@{engine_fingerprint()}").write_text("warm\n")
    engines = [
        _start_engine_with_cache(procs, notify_socket, tmp_path, name, key, cache)
        for name, key in (("dsv4-prefill", "prefill"), ("dsv4-decode", "decode"))
    ]
    wait_for(lambda: all(read_events(events) for _, events in engines), what="both children")
    (_, a), (_, b) = engines
    start_a, start_b = first_event(a, "start"), first_event(b, "start")
    assert start_b["t"] < start_a["healthy_from"] and start_a["t"] < start_b["healthy_from"]
    for proc, _ in engines:
        assert "JIT cache warm for" in procs.log(proc)
        proc.send_signal(signal.SIGTERM)
        assert procs.wait(proc) == 0


def test_jit_lock_released_and_no_marker_when_child_dies(procs, tmp_path):
    cache, port, events = tmp_path / "jit", free_port(), tmp_path / "c.jsonl"
    args = engine_args(port, "dsv4-prefill", "--jit-cache", str(cache), "--jit-key", "prefill")
    child = procs.child(port, events, "--healthy-after", "100", "--exit-after", "0.3")
    proc = procs.start([*args, "--", *child, "--exit-code", "4"])
    assert procs.wait(proc) == 4
    assert not (cache / ".pdsvc" / f"warm-prefill@{engine_fingerprint()}").exists()
    lock = JitLock(str(cache), "decode", "t", Log("t"), 1.0, sleep=pytest.fail)
    assert lock.acquire()  # would call sleep (= fail) if the lock were still held
    lock.release()


def test_jit_lock_waits_for_holder_in_process(tmp_path, capsys):
    holder = JitLock(str(tmp_path), "prefill", "dsv4-prefill", Log("a"), 1.0)
    assert holder.acquire()
    clock = FakeClock()

    def sleep(seconds):
        clock.now += seconds
        if clock.now >= 3:
            holder.mark_warm()

    waiter = JitLock(
        str(tmp_path), "decode", "dsv4-decode", Log("b"), 2.0, clock=clock, sleep=sleep
    )
    assert not waiter.is_warm()
    assert waiter.acquire()
    assert holder.is_warm() and waiter.held
    err = capsys.readouterr().err
    assert f"b: JIT cache cold for decode: waiting for dsv4-prefill (pid {os.getpid()})" in err
    assert err.count("waiting for") == 2  # at 0 s and at 2 s
    waiter.release()


