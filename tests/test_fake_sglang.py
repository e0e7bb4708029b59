"""Tests of tests/support/fake_sglang.py, the stand-in for ``python -m sglang.launch_server``.

Each test starts the stand-in as a subprocess on free loopback ports and always kills it (and any
orphan it spawned) in the ``engines`` fixture's teardown.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ports import free_ports

SUPPORT = Path(__file__).resolve().parent / "support"
FAKE = SUPPORT / "fake_sglang.py"

#: The argv a rendered prefill unit passes to sglang.launch_server (flags the stand-in ignores
#: included), plus a stray bare token that must not crash it.
EXTRA_ARGS = [
    "--trust-remote-code",
    "--dist-init-addr", "127.0.0.1:30335",
    "--disaggregation-transfer-backend", "nixl",
    "--mem-fraction-static", "0.70",
    "--chunked-prefill-size", "8192",
    "--moe-runner-backend", "marlin",
    "--cuda-graph-max-bs", "32",
    "stray-token",
]  # fmt: skip


def request(
    port: int,
    method: str,
    path: str,
    body: object = None,
    timeout: float = 5.0,
    headers: dict | None = None,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get_json(port: int, path: str, **kw) -> object:
    status, raw = request(port, "GET", path, **kw)
    assert status == 200, (path, status, raw)
    return json.loads(raw)


def wait_until(pred, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def status_or_none(port: int, path: str = "/health", timeout: float = 1.0) -> int | None:
    try:
        return request(port, "GET", path, timeout=timeout)[0]
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Engine:
    def __init__(self, proc: subprocess.Popen, port: int, bport: int, stderr: Path, state: Path):
        self.proc, self.port, self.bport = proc, port, bport
        self.stderr_path, self.state_dir = stderr, state

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 5.0) -> float:
        t0 = time.monotonic()
        wait_until(
            lambda: self.proc.poll() is not None or status_or_none(self.port) == 200,
            timeout,
            f"/health 200 on {self.port}",
        )
        assert self.proc.poll() is None, f"engine exited {self.proc.returncode}:\n{self.stderr}"
        return time.monotonic() - t0

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"engine still running after {timeout} s:\n{self.stderr}"
            ) from None


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "Fake-Model-1B"
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    return d


@pytest.fixture
def engines(tmp_path: Path, model_dir: Path):
    started: list[Engine] = []
    counter = iter(range(1000))

    def start(
        role: str = "null",
        *,
        env: dict | None = None,
        args: list[str] | None = None,
        port: int | None = None,
        bport: int | None = None,
        model: str | None = None,
        as_module: bool = False,
    ) -> Engine:
        n = next(counter)
        p, b = free_ports(2)
        port, bport = port or p, bport or b
        state = tmp_path / f"state-{n}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_SGLANG_")}
        full_env.pop("TRITON_CACHE_DIR", None)
        full_env.update(
            FAKE_SGLANG_LOAD_SECS="0.2",
            FAKE_SGLANG_COMPILE_COLD_SECS="1.0",
            FAKE_SGLANG_COMPILE_WARM_SECS="0.05",
            FAKE_SGLANG_MAX_LIFETIME="60",  # safety net should teardown ever fail
            FAKE_SGLANG_STATE_DIR=str(state),
        )
        full_env.update(env or {})
        argv = [
            "--model-path", model or str(model_dir),
            "--served-model-name", "Fake-Model-1B",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--disaggregation-mode", role,
            "--disaggregation-bootstrap-port", str(bport),
        ] + (args or [])  # fmt: skip
        if as_module:
            full_env["PYTHONPATH"] = os.pathsep.join(
                [str(SUPPORT)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else [])
            )
            cmd = [sys.executable, "-m", "fake_sglang", *argv]
        else:
            cmd = [sys.executable, str(FAKE), *argv]
        err = tmp_path / f"engine-{n}-{role}.stderr"
        with open(err, "wb") as f:
            proc = subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
        eng = Engine(proc, port, bport, err, state)
        started.append(eng)
        return eng

    yield start

    for eng in started:
        if eng.proc.poll() is None:
            eng.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            eng.proc.wait(timeout=5)
    for pidfile in tmp_path.glob("state-*/orphan.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def pd_body(room: int, bport: int | None, host: str = "127.0.0.1", **extra) -> dict:
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.0},
        "stream": False,
        "bootstrap_host": host,
        "bootstrap_port": bport,
        "bootstrap_room": room,
    }
    body.update(extra)
    return body


# ----------------------------------------------------------------------------------- startup


def test_health_is_503_while_loading_then_200(engines):
    eng = engines(
        "prefill",
        env={"FAKE_SGLANG_LOAD_SECS": "1.5"},
        args=["--tp", "4", *EXTRA_ARGS],
        as_module=True,
    )
    first = wait_until(lambda: status_or_none(eng.port), 3.0, "the HTTP port to answer")
    assert first == 503
    assert status_or_none(eng.port, "/health_generate") == 503
    eng.wait_healthy(timeout=5.0)
    assert status_or_none(eng.port, "/health_generate") == 200
    info = get_json(eng.port, "/server_info")
    assert info["disaggregation_mode"] == "prefill"
    assert info["tp_size"] == 4
    assert Path(info["model_path"]).is_dir()
    assert "stray-token" in eng.stderr  # logged as ignored, not fatal
    assert "The server is fired up and ready to roll!" in eng.stderr


def test_missing_model_path_exits_1_with_error_line(engines, tmp_path):
    missing = str(tmp_path / "no" / "such-model")
    eng = engines("decode", model=missing)
    assert eng.wait_exit(timeout=8) == 1
    lines = [ln for ln in eng.stderr.splitlines() if "Incorrect path_or_model_id" in ln]
    assert lines and lines[0].startswith("OSError:") and missing in lines[0], eng.stderr
    assert status_or_none(eng.port) is None


def test_api_surface(engines, model_dir):
    eng = engines("null", args=["--api-key", "sk-test", "--enable-metrics", "--tp", "2"])
    eng.wait_healthy()
    auth = {"Authorization": "Bearer sk-test"}
    assert status_or_none(eng.port, "/health") == 200  # /health* needs no key
    assert request(eng.port, "GET", "/server_info")[0] == 401
    for path in ("/server_info", "/get_server_info"):
        info = get_json(eng.port, path, headers=auth)
        assert info["model_path"] == str(model_dir)
        assert info["served_model_name"] == "Fake-Model-1B"
        assert info["tp_size"] == 2 and info["dp_size"] == 1
        assert info["disaggregation_mode"] == "null"
        assert info["disaggregation_bootstrap_port"] == eng.bport
        assert {"tokenizer_path", "load_balance_method", "max_running_requests"} <= set(info)
    for path in ("/model_info", "/get_model_info"):
        mi = get_json(eng.port, path, headers=auth)
        assert mi["model_path"] == str(model_dir)
        assert mi["architectures"] == ["LlamaForCausalLM"]
    models = get_json(eng.port, "/v1/models", headers=auth)
    assert models["data"][0]["id"] == "Fake-Model-1B"
    assert get_json(eng.port, "/get_load", headers=auth)[0]["num_reqs"] == 0
    status, raw = request(eng.port, "GET", "/metrics")
    assert status == 200 and b"sglang:num_running_reqs" in raw
    assert request(eng.port, "POST", "/flush_cache", headers=auth)[0] == 200
    status, raw = request(eng.port, "GET", "/nope", headers=auth)
    assert status == 404 and json.loads(raw) == {"detail": "Not Found"}
    assert request(eng.port, "GET", "/generate", headers=auth)[0] == 405

    # non-PD generation: no bootstrap fields needed
    status, raw = request(eng.port, "POST", "/generate", {"text": "hi"}, headers=auth)
    assert status == 200 and json.loads(raw)["text"].startswith(f"[null@{eng.port}]")
    status, raw = request(
        eng.port, "POST", "/v1/chat/completions",
        {"model": "Fake-Model-1B", "messages": [{"role": "user", "content": "hi"}]},
        headers=auth,
    )  # fmt: skip
    assert status == 200 and json.loads(raw)["object"] == "chat.completion"

    # keep-alive: two requests on one connection
    conn = http.client.HTTPConnection("127.0.0.1", eng.port, timeout=5)
    try:
        for _ in range(2):
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
    finally:
        conn.close()

    # HTTP/2 prior-knowledge preface (the router's gRPC probe): an error reply, then close
    with socket.create_connection(("127.0.0.1", eng.port), timeout=3) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 505")
    assert status_or_none(eng.port) == 200
    assert eng.proc.poll() is None


def test_metrics_404_without_enable_metrics(engines):
    eng = engines("decode")
    eng.wait_healthy()
    assert request(eng.port, "GET", "/metrics")[0] == 404


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

    warm = engines("prefill", env=env)
    warm_secs = warm.wait_healthy(timeout=6)
    assert "jit cache warm:" in warm.stderr and "jit cache cold" not in warm.stderr
    assert warm_secs < cold_secs - 1.0, (cold_secs, warm_secs)


def test_two_concurrent_cold_compiles_second_fails_loudly(engines, tmp_path):
    cache = tmp_path / "shared-triton"
    env = {"TRITON_CACHE_DIR": str(cache), "FAKE_SGLANG_COMPILE_COLD_SECS": "3"}
    first = engines("prefill", env=env)
    lock = cache / "fake-sglang" / ".compiling"
    wait_until(lock.exists, 4.0, "the first engine's compile lock")
    second = engines("decode", env=env)
    assert second.wait_exit(timeout=6) == 1
    err = second.stderr
    assert "RuntimeError: JIT cache race" in err, err
    assert f"pid {first.proc.pid}" in err and str(cache) in err
    first.wait_healthy(timeout=5)  # the first compiler is unaffected
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


# -------------------------------------------------------------------------------- PD checks


def test_prefill_bootstrap_server_answers_while_loading(engines):
    pre = engines("prefill", env={"FAKE_SGLANG_LOAD_SECS": "3"}, args=["--tp", "4"])
    wait_until(lambda: status_or_none(pre.bport) == 200, 3.0, "the bootstrap /health")
    assert status_or_none(pre.port) == 503  # the engine itself is still loading
    status, raw = request(pre.bport, "GET", "/route?engine_rank=-1&target_dp_group=-1")
    assert status == 200 and json.loads(raw)["prefill_attn_tp_size"] == 4

    dec = engines("decode")
    dec.wait_healthy()
    assert status_or_none(dec.bport) is None  # decode binds no bootstrap port


def test_pd_request_without_bootstrap_fields_is_400(engines):
    pre = engines("prefill")
    dec = engines("decode", bport=None)
    pre.wait_healthy()
    dec.wait_healthy()
    for eng in (pre, dec):
        status, raw = request(eng.port, "POST", "/generate", {"text": "hi"})
        assert status == 400, raw
        err = json.loads(raw)["error"]
        assert err["param"] == "bootstrap_host" and "bootstrap_host" in err["message"]
        body = pd_body(room=1, bport=pre.bport)
        del body["bootstrap_room"]
        status, raw = request(eng.port, "POST", "/v1/chat/completions", body)
        assert status == 400 and "bootstrap_room" in json.loads(raw)["error"]["message"]


def test_decode_with_reachable_prefill_bootstrap_returns_200_and_echoes_room(engines, tmp_path):
    reqlog = tmp_path / "requests.jsonl"
    env = {"FAKE_SGLANG_LOG": str(reqlog)}
    pre = engines("prefill", env=env)
    dec = engines("decode", env=env, bport=pre.bport)  # same bootstrap port on both (fact 4)
    pre.wait_healthy()
    dec.wait_healthy()

    # like the router: the same body to both roles at the same moment
    room = 4505680217004773795
    body = pd_body(room=room, bport=pre.bport)
    results: dict[str, tuple[int, bytes]] = {}

    def send(name: str, port: int) -> None:
        results[name] = request(port, "POST", "/generate", body)

    threads = [threading.Thread(target=send, args=a) for a in (("p", pre.port), ("d", dec.port))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results["p"][0] == 200 and json.loads(results["p"][1])["text"] == ""
    status, raw = results["d"]
    assert status == 200, raw
    out = json.loads(raw)
    assert out["text"].startswith(f"[decode@{dec.port}]")
    assert out["meta_info"]["bootstrap_room_seen"] == room

    # bootstrap_port null: decode falls back to its own --disaggregation-bootstrap-port
    status, raw = request(dec.port, "POST", "/generate", pd_body(room=7, bport=None))
    assert status == 200 and json.loads(raw)["meta_info"]["bootstrap_room_seen"] == 7

    # OpenAI chat, streamed
    chat = {"model": "Fake-Model-1B", "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "bootstrap_host": "127.0.0.1", "bootstrap_port": pre.bport,
            "bootstrap_room": 99}  # fmt: skip
    status, raw = request(dec.port, "POST", "/v1/chat/completions", chat)
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: ") :])["meta_info"]["bootstrap_room_seen"] == 99

    # batch completions carry lists of bootstrap values
    batch = {"prompt": ["a", "b"], "bootstrap_host": ["127.0.0.1"] * 2,
             "bootstrap_port": [pre.bport] * 2, "bootstrap_room": [1, 2]}  # fmt: skip
    status, raw = request(dec.port, "POST", "/v1/completions", batch)
    assert status == 200, raw
    out = json.loads(raw)
    assert len(out["choices"]) == 2
    assert [m["bootstrap_room_seen"] for m in out["meta_info"]] == [1, 2]

    lines = [json.loads(ln) for ln in reqlog.read_text().splitlines()]
    gens = [ln for ln in lines if ln["path"] == "/generate" and ln["method"] == "POST"]
    assert {(ln["role"], ln["port"]) for ln in gens} >= {
        ("prefill", pre.port),
        ("decode", dec.port),
    }
    assert any(ln["body"].get("bootstrap_room") == room for ln in gens)


def test_decode_with_unreachable_bootstrap_is_500(engines):
    dec = engines("decode")
    dec.wait_healthy()
    (dead_port,) = free_ports(1)
    status, raw = request(dec.port, "POST", "/generate", pd_body(room=5, bport=dead_port))
    assert status == 500, raw
    msg = json.loads(raw)["error"]["message"]
    assert msg.startswith(f"KV transfer failed: cannot reach prefill bootstrap server "
                          f"127.0.0.1:{dead_port}")  # fmt: skip
    # SGLang's own warmup/health host never touches a peer
    status, _ = request(dec.port, "POST", "/generate", pd_body(room=0, bport=None, host="2.2.2.2"))
    assert status == 200


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


def test_sigterm_dies_by_sigkill_and_orphan_survives(engines):
    eng = engines("decode", env={"FAKE_SGLANG_SPAWN_ORPHAN": "1"})
    eng.wait_healthy()
    assert int((eng.state_dir / "engine.pid").read_text()) == eng.proc.pid
    orphan = int((eng.state_dir / "orphan.pid").read_text())
    try:
        assert pid_alive(orphan)
        eng.proc.send_signal(signal.SIGTERM)
        assert eng.wait_exit(timeout=5) == -signal.SIGKILL
        assert "SIGTERM received" in eng.stderr
        time.sleep(0.3)
        assert pid_alive(orphan), "the orphan should outlive the engine"
        os.kill(orphan, signal.SIGTERM)  # it ignores SIGTERM, as a wedged worker would
        time.sleep(0.3)
        assert pid_alive(orphan)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
    wait_until(lambda: not pid_alive(orphan), 3.0, "the orphan to die")


def test_sigterm_drains_inflight_request_first(engines):
    eng = engines("null")
    eng.wait_healthy()
    request(eng.port, "POST", "/_fake/control", {"gen_delay": 1.5})
    result: list = []
    t = threading.Thread(
        target=lambda: result.append(request(eng.port, "POST", "/generate", {"text": "x"}))
    )
    t.start()
    wait_until(lambda: get_json(eng.port, "/get_load")[0]["num_reqs"] == 1, 2.0, "in-flight")
    eng.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: status_or_none(eng.port) == 503, 1.0, "/health 503 while draining")
    assert eng.proc.poll() is None
    t.join(5)
    assert result and result[0][0] == 200
    assert eng.wait_exit(timeout=3) == -signal.SIGKILL


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
    time.sleep(0.8)
    assert eng.proc.poll() is None, "a stuck request keeps the drain going"
    assert eng.wait_exit(timeout=4) == -signal.SIGKILL
    assert "FAKE_SGLANG_DRAIN_MAX_SECS" in eng.stderr


def test_sigterm_clean_exit_knob(engines):
    eng = engines("prefill", env={"FAKE_SGLANG_CLEAN_EXIT": "1"})
    eng.wait_healthy()
    eng.proc.send_signal(signal.SIGTERM)
    assert eng.wait_exit(timeout=5) == 0


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
    assert status_or_none(worker.port) is None  # ranks > 0 serve no HTTP
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
    assert eng.proc.poll() is None and status_or_none(eng.port) is None  # refused: not bound
    eng.wait_healthy(timeout=6)


# ------------------------------------------------------------------------- NIXL pair state
# sglang #33789 / PR #34289: a decode keeps a replaced prefill's endpoints ("decode is stale").
# smg #2382, vllm #49238: a prefill keeps a replaced decode's NIXL agent ("prefill is stale");
# the failures come back as HTTP 200 with finish_reason abort and empty text, /health stays 200.


def pd_pair(pre: Engine, dec: Engine, room: int, path: str = "/generate", **extra) -> dict:
    """What the router does for one PD request: the same body to prefill and decode at once."""
    body = pd_body(room=room, bport=pre.bport, **extra)
    results: dict[str, tuple[int, bytes]] = {}

    def send(name: str, port: int) -> None:
        results[name] = request(port, "POST", path, body, timeout=10)

    threads = [threading.Thread(target=send, args=a) for a in (("p", pre.port), ("d", dec.port))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    return results


def assert_pair_ok(result: tuple[int, bytes], role: str, port: int) -> dict:
    status, raw = result
    assert status == 200, raw
    out = json.loads(raw)
    assert out["meta_info"]["finish_reason"]["type"] == "length", out
    assert out["text"] == ("" if role == "prefill" else f"[decode@{port}] hello from fake engine")
    return out


def assert_pair_abort(result: tuple[int, bytes]) -> str:
    status, raw = result
    assert status == 200, raw
    out = json.loads(raw)
    assert out["text"] == "" and out["output_ids"] == [], out
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["message"].startswith("KV transfer failed"), out
    assert "stale agent for instance" in reason["message"]
    return reason["message"]


def control(eng: Engine, body: dict | None = None) -> dict:
    if body is None:
        return get_json(eng.port, "/_fake/control")
    status, raw = request(eng.port, "POST", "/_fake/control", body)
    assert status == 200, raw
    return json.loads(raw)


def instance_id(eng: Engine) -> str:
    iid = get_json(eng.port, "/server_info")["fake_instance_id"]
    assert iid == control(eng)["instance_id"]
    return iid


def test_pair_decode_goes_stale_when_prefill_is_replaced(engines):
    env = {"FAKE_SGLANG_STALE_PAIR": "decode"}
    pre = engines("prefill", env=env)
    dec = engines("decode", env=env, bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    pre_key, dec_key = f"127.0.0.1:{pre.bport}", f"127.0.0.1:{dec.port}"
    r = pd_pair(pre, dec, room=1)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)
    old_pre = instance_id(pre)
    assert get_json(pre.bport, "/_fake/pair")["instance_id"] == old_pre
    assert control(dec)["peers"][pre_key]["instance_id"] == old_pre
    assert control(pre)["peers"][dec_key]["instance_id"] == instance_id(dec)

    # the prefill is replaced by a new process behind the same (reachable) bootstrap address
    pre.proc.kill()
    pre.proc.wait(5)
    pre = engines("prefill", env=env, port=pre.port, bport=pre.bport)
    pre.wait_healthy()
    assert instance_id(pre) != old_pre
    for room in (2, 3, 4):
        r = pd_pair(pre, dec, room=room)
        assert_pair_ok(r["p"], "prefill", pre.port)  # the prefill itself is fine
        msg = assert_pair_abort(r["d"])
        assert old_pre in msg and pre_key in msg
    chat = {"messages": [{"role": "user", "content": "hi"}], "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pre.bport, "bootstrap_room": 5}  # fmt: skip
    status, raw = request(dec.port, "POST", "/v1/chat/completions", chat)
    choice = json.loads(raw)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "abort"
    assert choice["message"]["content"] == ""
    assert status_or_none(pre.port) == 200 and status_or_none(dec.port) == 200
    state = control(dec)
    assert state["stale_peers"][pre_key]["remembered_instance"] == old_pre
    assert state["stale_peers"][pre_key]["seen_instance"] == instance_id(pre)
    assert control(pre)["stale_peers"] == {}
    assert f"NIXL transfer to peer {pre_key} failed: stale agent for instance {old_pre}" in (
        dec.stderr
    )

    # error500: the same failure as an HTTP 500
    control(dec, {"pair_failure": "error500"})
    status, raw = pd_pair(pre, dec, room=6)["d"]
    assert status == 500 and "stale agent for instance" in json.loads(raw)["error"]["message"]

    # only restarting the stale decode heals it
    dec.proc.kill()
    dec.proc.wait(5)
    dec = engines("decode", env=env, port=dec.port, bport=pre.bport)
    dec.wait_healthy()
    r = pd_pair(pre, dec, room=7)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)
    assert control(dec)["stale_peers"] == {}


def test_pair_prefill_goes_stale_when_decode_is_replaced(engines):
    env = {"FAKE_SGLANG_STALE_PAIR": "prefill"}
    pre = engines("prefill", env=env, as_module=True)  # imports fake_pair as a module, too
    dec = engines("decode", env=env, bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    dec_key = f"127.0.0.1:{dec.port}"
    r = pd_pair(pre, dec, room=10)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)
    old_dec = instance_id(dec)

    # the decode is "replaced" without its port ever closing
    new_dec = control(dec, {"new_instance": True})["instance_id"]
    assert new_dec != old_dec and control(dec)["peers"] == {}
    for room in (11, 12, 13):
        r = pd_pair(pre, dec, room=room)
        assert old_dec in assert_pair_abort(r["p"])  # the prefill's own response fails
        assert old_dec in assert_pair_abort(r["d"])  # and so does what the router returns
    assert status_or_none(pre.port) == 200 and status_or_none(dec.port) == 200
    assert control(pre)["stale_peers"][dec_key]["seen_instance"] == new_dec
    assert control(dec)["stale_peers"] == {}
    assert f"NIXL transfer to peer {dec_key} failed: stale agent for instance {old_dec}" in (
        pre.stderr
    )

    # restarting the decode does not help: the prefill is poisoned
    dec.proc.kill()
    dec.proc.wait(5)
    dec = engines("decode", env={**env, "FAKE_SGLANG_PAIR_FAILURE": "error500"},
                  port=dec.port, bport=pre.bport)  # fmt: skip
    dec.wait_healthy()
    control(pre, {"pair_failure": "error500"})
    r = pd_pair(pre, dec, room=14)
    assert r["p"][0] == 500 and r["d"][0] == 500, r
    assert "stale agent for instance" in json.loads(r["d"][1])["error"]["message"]

    # restarting the stale prefill heals it
    pre.proc.kill()
    pre.proc.wait(5)
    pre = engines("prefill", env=env, port=pre.port, bport=pre.bport)
    pre.wait_healthy()
    r = pd_pair(pre, dec, room=15)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)


def test_pair_switch_off_means_no_staleness_and_runtime_switch(engines):
    pre = engines("prefill")
    dec = engines("decode", bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    assert control(pre)["stale_pair"] == "off" and control(dec)["pair_failure"] == "abort200"
    pre_key = f"127.0.0.1:{pre.bport}"
    assert_pair_ok(pd_pair(pre, dec, room=20)["d"], "decode", dec.port)
    for eng in (pre, dec, pre):
        control(eng, {"new_instance": True})
        r = pd_pair(pre, dec, room=21)
        assert_pair_ok(r["p"], "prefill", pre.port)
        assert_pair_ok(r["d"], "decode", dec.port)
    assert control(pre)["stale_peers"] == {} and control(dec)["stale_peers"] == {}
    assert control(dec)["peers"][pre_key]["instance_id"] == instance_id(pre)
    # the decode's own new_instance forgot its memory; the prefill was replaced once since
    assert control(dec)["peers"][pre_key]["replacements"] == 1

    # switched on at run time: the next replacement makes the decode stale
    assert control(dec, {"stale_pair": "both"})["stale_enabled"] is True
    control(pre, {"new_instance": True})
    assert_pair_abort(pd_pair(pre, dec, room=22)["d"])
    # switching it off again does not heal a stale side; a new instance (restart) does
    control(dec, {"stale_pair": "off"})
    assert_pair_abort(pd_pair(pre, dec, room=23)["d"])
    control(dec, {"new_instance": True})
    assert_pair_ok(pd_pair(pre, dec, room=24)["d"], "decode", dec.port)


def test_pair_knobs_are_validated(engines):
    bad = engines("decode", env={"FAKE_SGLANG_STALE_PAIR": "sideways"})
    assert bad.wait_exit(timeout=5) == 2
    assert "stale_pair must be one of" in bad.stderr
    eng = engines("decode")
    eng.wait_healthy()
    for body in ({"stale_pair": "sideways"}, {"pair_failure": "teapot"}, {"stale_pair": 3}):
        status, _ = request(eng.port, "POST", "/_fake/control", body)
        assert status == 400, body
    assert control(eng, {"pair_failure": "error500"})["pair_failure"] == "error500"


def test_pair_wildcard_decode_is_known_by_its_source_address(engines):
    pre = engines("prefill")
    dec = engines("decode", bport=pre.bport, args=["--host", "0.0.0.0"])
    pre.wait_healthy()
    dec.wait_healthy()
    assert_pair_ok(pd_pair(pre, dec, room=30)["d"], "decode", dec.port)
    assert list(control(pre)["peers"]) == [f"127.0.0.1:{dec.port}"]


def _metric(raw: bytes, name: str) -> float:
    """The sum of a family's samples named exactly ``name`` (any labels)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in raw.decode().splitlines()
               if line.startswith(name + "{"))


def test_metrics_move_under_load_and_faults(engines):
    """SGLang's names (metrics_collector.py): a served request counts and observes its TTFT
    (a slow one lands in a high bucket); a bootstrap that fails counts too (fake_metrics.py)."""
    pre = engines("prefill", args=["--enable-metrics"])
    dec = engines("decode", bport=pre.bport, args=["--enable-metrics"])
    pre.wait_healthy()
    dec.wait_healthy()
    assert request(dec.port, "POST", "/generate", pd_body(room=1, bport=pre.bport))[0] == 200
    request(dec.port, "POST", "/_fake/control", {"gen_delay": 1.2})
    assert request(dec.port, "POST", "/generate", pd_body(room=2, bport=pre.bport))[0] == 200
    (dead_port,) = free_ports(1)
    assert request(dec.port, "POST", "/generate", pd_body(room=3, bport=dead_port))[0] == 500
    raw = request(dec.port, "GET", "/metrics")[1]
    assert _metric(raw, "sglang:num_requests_total") == 2
    assert _metric(raw, "sglang:time_to_first_token_seconds_count") == 2
    assert 'engine_type="decode"' in raw.decode()
    fast = next(line for line in raw.decode().splitlines()
                if line.startswith("sglang:time_to_first_token_seconds_bucket") and
                'le="1.0"' in line)
    assert fast.endswith(" 1.0")  # the 1.2 s one is above that bucket
    assert _metric(raw, "sglang:num_bootstrap_failed_reqs_total") == 1
    assert _metric(raw, "sglang:num_transfer_failed_reqs_total") == 0
