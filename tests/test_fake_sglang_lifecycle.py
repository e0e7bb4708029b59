"""The stand-in's process lifecycle (tests/support/standin/lifecycle.py, jit.py,
rendezvous.py): the JIT cache, fault knobs, SIGTERM as SGLang handles it, multi-node ranks."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import standin_client
from ports import free_ports
from standin_client import (
    get_json,
    pd_body,
    pid_alive,
    request,
    status_or_none,
    wait_until,
)

# the stand-in's fixtures (tests/support/standin_client.py)
engines, model_dir = standin_client.engines, standin_client.model_dir

# ------------------------------------------------------------------------------- JIT cache


def test_jit_cold_compile_then_warm_is_faster(engines, tmp_path):
    cache = tmp_path / "triton"
    env = {"TRITON_CACHE_DIR": str(cache), "FAKE_SGLANG_COMPILE_COLD_SECS": "1.5"}
    cold = engines("prefill", env=env)
    cold_secs = cold.wait_healthy(timeout=6)
    assert "jit cache cold: compiling" in cold.stderr
    artifact = cache / "fake-sglang" / "prefill.kernels"
    assert artifact.is_file() and json.loads(artifact.read_text())["role"] == "prefill"
    assert not (cache / "fake-sglang" / ".compiling").exists()
    cold.proc.kill()
    cold.proc.wait(timeout=5)

    compiled_by = json.loads(artifact.read_text())["compiled_by_pid"]
    warm = engines("prefill", env=env)
    warm_secs = warm.wait_healthy(timeout=6)
    # the mechanism (two starts timed at different moments compare nothing): the warm one
    # loaded what the cold one compiled, and compiled nothing itself
    assert "jit cache warm:" in warm.stderr and "jit cache cold" not in warm.stderr
    assert json.loads(artifact.read_text())["compiled_by_pid"] == compiled_by
    print(f"cold start {cold_secs:.1f} s, warm {warm_secs:.1f} s")


def test_two_concurrent_cold_compiles_second_fails_loudly(engines, tmp_path):
    cache = tmp_path / "shared-triton"
    # the second must start while the first still compiles: 10 s leaves room for a second
    # python to start on a machine the suite's other workers keep busy (3 s once did not)
    env = {"TRITON_CACHE_DIR": str(cache), "FAKE_SGLANG_COMPILE_COLD_SECS": "10"}
    first = engines("prefill", env=env)
    lock = cache / "fake-sglang" / ".compiling"
    wait_until(lock.exists, 10.0, "the first engine's compile lock")
    second = engines("decode", env=env)
    assert second.wait_exit(timeout=10) == 1
    err = second.stderr
    assert "RuntimeError: JIT cache race" in err, err
    assert f"pid {first.proc.pid}" in err and str(cache) in err
    first.wait_healthy(timeout=15)  # the first compiler is unaffected
    assert not lock.exists()


def test_stale_compile_lock_from_dead_pid_is_taken_over(engines, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "triton" / "fake-sglang" / ".compiling"
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{dead.pid}\n")
    eng = engines("decode", env={"TRITON_CACHE_DIR": str(tmp_path / "triton")})
    eng.wait_healthy(timeout=5)
    assert "taking over stale compile lock" in eng.stderr
    assert (lock.parent / "decode.kernels").is_file() and not lock.exists()


# ------------------------------------------------------------------------------ failure knobs


def test_hang_via_control_times_out_but_process_lives(engines):
    eng = engines("decode")
    eng.wait_healthy()
    status, raw = request(eng.port, "POST", "/_fake/control", {"hang": True})
    assert status == 200 and json.loads(raw)["hang"] is True
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        request(eng.port, "GET", "/health", timeout=1.0)  # connects, never gets a reply
    assert time.monotonic() - t0 >= 0.9
    assert eng.proc.poll() is None
    request(eng.port, "POST", "/_fake/control", {"hang": False})
    assert status_or_none(eng.port) == 200


def test_hang_after_env(engines):
    eng = engines("prefill", env={"FAKE_SGLANG_HANG_AFTER": "0.3"})
    eng.wait_healthy()
    wait_until(lambda: status_or_none(eng.port, timeout=0.5) is None, 3.0, "the hang")
    assert eng.proc.poll() is None
    assert status_or_none(eng.bport) == 200  # the bootstrap server still answers by default


def test_crash_after_exits_nonzero(engines):
    eng = engines("prefill", env={"FAKE_SGLANG_CRASH_AFTER": "0.5"})
    eng.wait_healthy()
    assert eng.wait_exit(timeout=5) == 1
    assert "fake crash" in eng.stderr


# SIGTERM as SGLang 0.5.23 handles it: python/sglang/srt/managers/tokenizer_manager.py
# (SignalHandler.sigterm_handler, TokenizerManager.sigterm_watchdog) and
# python/sglang/srt/entrypoints/http_server.py (health_generate, ready, generate_request).


def test_sigterm_exits_0_killing_its_children_but_not_an_orphan(engines):
    # the watchdog ends with kill_process_tree(os.getpid(), include_parent=False) and hands the
    # exit to uvicorn (sglang PRs #28779, #39560): status 0; a child that left the tree survives
    eng = engines("decode", env={"FAKE_SGLANG_SPAWN_ORPHAN": "1"})
    eng.wait_healthy()
    assert int((eng.state_dir / "engine.pid").read_text()) == eng.proc.pid
    orphan = int((eng.state_dir / "orphan.pid").read_text())
    try:
        assert pid_alive(orphan)
        eng.proc.send_signal(signal.SIGTERM)
        assert eng.wait_exit(timeout=5) == 0
        assert "SIGTERM received" in eng.stderr
        assert "include_parent=False" in eng.stderr
        time.sleep(0.3)
        assert pid_alive(orphan), "the orphan should outlive the engine"
        os.kill(orphan, signal.SIGTERM)  # it ignores SIGTERM, as a wedged worker would
        time.sleep(0.3)
        assert pid_alive(orphan)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
    wait_until(lambda: not pid_alive(orphan), 3.0, "the orphan to die")


def test_sigterm_drains_in_flight_and_keeps_accepting_new_requests(engines):
    eng = engines("null", env={"FAKE_SGLANG_DRAIN_POLL_SECS": "0.2"})
    eng.wait_healthy()
    request(eng.port, "POST", "/_fake/control", {"gen_delay": 1.5})
    results: list = []

    def send() -> None:
        results.append(request(eng.port, "POST", "/generate", {"text": "x"}, timeout=10))

    first = threading.Thread(target=send)
    first.start()
    wait_until(lambda: get_json(eng.port, "/get_load")[0]["num_reqs"] == 1, 2.0, "in-flight")
    t_term = time.monotonic()
    eng.proc.send_signal(signal.SIGTERM)
    # gracefully_exit: /health, /health_generate and /ready answer 503 at once
    wait_until(lambda: status_or_none(eng.port) == 503, 1.0, "/health 503 while draining")
    assert status_or_none(eng.port, "/health_generate") == 503
    assert status_or_none(eng.port, "/ready") == 503
    # a NEW request meanwhile is accepted and served (generate_request checks nothing) ...
    second = threading.Thread(target=send)
    second.start()
    wait_until(lambda: get_json(eng.port, "/get_load")[0]["num_reqs"] == 2, 1.0, "2 in flight")
    first.join(5)
    assert eng.proc.poll() is None, "the second request keeps the drain going"
    second.join(5)
    assert [r[0] for r in results] == [200, 200], results
    assert json.loads(results[1][1])["text"].startswith("[null@")
    # ... and the process exits 0 at the watchdog's first tick with nothing left
    assert eng.wait_exit(timeout=3) == 0
    assert time.monotonic() - t_term >= 1.5
    assert "Gracefully exiting... Remaining number of requests 2." in eng.stderr


def test_sigterm_on_hung_engine_waits_for_its_stuck_request(engines, tmp_path):
    # SGLang drains without bound; the stand-in's drain cap stands in for systemd's TimeoutStopSec.
    reqlog = tmp_path / "hung.jsonl"
    env = {"FAKE_SGLANG_DRAIN_MAX_SECS": "1.5", "FAKE_SGLANG_LOG": str(reqlog)}
    eng = engines("decode", env=env)
    eng.wait_healthy()
    request(eng.port, "POST", "/_fake/control", {"hang": True})

    def stuck() -> None:
        with contextlib.suppress(OSError):
            request(eng.port, "POST", "/generate", pd_body(room=3, bport=None), timeout=5)

    threading.Thread(target=stuck, daemon=True).start()
    wait_until(lambda: reqlog.exists() and '"/generate"' in reqlog.read_text(), 2.0, "the request")
    eng.proc.send_signal(signal.SIGTERM)
    assert eng.wait_exit(timeout=4) == 0
    # the order, not a sleep against the cap: the drain saw the stuck request, kept going,
    # and ended at the cap, never at "0 remaining"
    err = eng.stderr
    assert "Remaining number of requests 1." in err, err
    assert err.index("Remaining number of requests 1.") < \
        err.index("FAKE_SGLANG_DRAIN_MAX_SECS=1.5 s reached")
    assert "Remaining number of requests 0." not in err


def test_sigterm_skips_the_drain_when_unhealthy_or_forced(engines):
    # sigterm_watchdog: ServerStatus.UnHealthy (a failed health check) or SGL_FORCE_SHUTDOWN
    # exits at once; SGLANG_FORCE_SHUTDOWN alone is not what it reads
    cases = [({}, {"health": "fail"}, True), ({"SGL_FORCE_SHUTDOWN": "1"}, {}, True),
             ({"SGLANG_FORCE_SHUTDOWN": "1"}, {}, False)]  # fmt: skip
    for env, ctl, forced in cases:
        eng = engines("null", env=env)
        eng.wait_healthy()
        request(eng.port, "POST", "/_fake/control", {"gen_delay": 2.0, **ctl})
        results: list = []

        def send(port: int = eng.port, out: list = results) -> None:
            try:
                out.append(request(port, "POST", "/generate", {"text": "x"}, timeout=5)[0])
            except (OSError, http.client.HTTPException) as e:
                out.append(type(e).__name__)

        t = threading.Thread(target=send)
        t.start()
        wait_until(lambda p=eng.port: get_json(p, "/get_load")[0]["num_reqs"] == 1, 2.0,
                   "in-flight")  # fmt: skip
        t0 = time.monotonic()
        eng.proc.send_signal(signal.SIGTERM)
        assert eng.wait_exit(timeout=5) == 0
        t.join(5)
        took = time.monotonic() - t0
        if forced:
            assert took < 1.0, (env, ctl, took)
            assert results != [200], (env, ctl, results)  # the in-flight request was cut
            assert "Force exiting." in eng.stderr
        else:
            assert took >= 1.0 and results == [200], (env, ctl, took, results)


def test_sigterm_exit_137_knob_for_sglang_before_the_graceful_stop(engines):
    eng = engines("prefill", env={"FAKE_SGLANG_SIGTERM_EXIT": "137"})
    eng.wait_healthy()
    eng.proc.send_signal(signal.SIGTERM)
    assert eng.wait_exit(timeout=5) == -signal.SIGKILL
    old = engines("prefill", env={"FAKE_SGLANG_CLEAN_EXIT": "1"})  # the former knob for 0
    old.wait_healthy()
    old.proc.send_signal(signal.SIGTERM)
    assert old.wait_exit(timeout=5) == 0
    bad = engines("prefill", env={"FAKE_SGLANG_SIGTERM_EXIT": "15"})
    assert bad.wait_exit(timeout=5) == 2 and "FAKE_SGLANG_SIGTERM_EXIT" in bad.stderr


def test_max_lifetime_safety_net(engines):
    eng = engines("decode", env={"FAKE_SGLANG_MAX_LIFETIME": "1"})
    assert eng.wait_exit(timeout=5) == 0
    assert "FAKE_SGLANG_MAX_LIFETIME" in eng.stderr


def test_nnodes_rank0_waits_for_the_others_and_a_lost_rank_is_fatal(engines):
    (dist,) = free_ports(1)
    multi = ["--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist}"]
    leader = engines("prefill", args=[*multi, "--node-rank", "0"])
    assert wait_until(lambda: status_or_none(leader.port), 3.0, "rank 0's HTTP") == 503
    time.sleep(1.0)  # loaded long ago, were it alone: it waits for node rank 1
    assert status_or_none(leader.port) == 503 and leader.proc.poll() is None
    worker = engines("prefill", args=[*multi, "--node-rank", "1"])
    leader.wait_healthy(timeout=8)
    assert "node rank 1 joined from 127.0.0.1" in leader.stderr
    assert leader.listens(leader.port) and not worker.listens(worker.port)  # ranks > 0: no HTTP
    assert "no HTTP server (rank 0 serves" in worker.stderr
    worker.proc.kill()
    assert leader.wait_exit(timeout=8) == 1
    assert "NCCL error: connection to node rank 1 lost" in leader.stderr


def test_nnodes_worker_exits_when_rank0_goes_and_times_out_alone(engines):
    (dist,) = free_ports(1)
    multi = ["--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist}"]
    alone = engines("decode", args=[*multi, "--node-rank", "1"],
                    env={"FAKE_SGLANG_RENDEZVOUS_TIMEOUT": "1"})
    assert alone.wait_exit(timeout=8) == 1
    assert "DistNetworkError: cannot connect to 127.0.0.1" in alone.stderr
    leader = engines("decode", args=[*multi, "--node-rank", "0"])
    worker = engines("decode", args=[*multi, "--node-rank", "1"])
    leader.wait_healthy(timeout=8)
    leader.proc.kill()
    assert worker.wait_exit(timeout=8) == 1
    assert "connection to node rank 0 lost" in worker.stderr


def test_http_after_load_keeps_the_port_closed_while_loading(engines):
    eng = engines("prefill", env={"FAKE_SGLANG_LOAD_SECS": "1.5",
                                  "FAKE_SGLANG_HTTP_AFTER_LOAD": "1"})
    time.sleep(0.5)
    assert eng.proc.poll() is None and not eng.listens(eng.port)  # not bound while loading
    eng.wait_healthy(timeout=6)
