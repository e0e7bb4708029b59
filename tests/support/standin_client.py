"""Client side of the SGLang stand-in's tests (tests/test_fake_sglang_*.py): start it as a
subprocess on free loopback ports (the ``engines`` fixture always kills it, and any orphan it
spawned, at teardown), talk HTTP to it, and send PD requests as the router does.

Each test file imports the fixtures it uses: ``from standin_client import engines, model_dir``.
"""

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
from pathlib import Path

import pytest
from ports import free_ports

from pdsvc.doctor.ports import port_use

SUPPORT = Path(__file__).resolve().parent
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

    def listens(self, port: int) -> bool:
        """Whether this engine's own process holds a listening socket on ``port``, read from
        /proc. Asking the port over HTTP cannot tell: once nothing of ours binds it, another
        test's server may take it (CI saw a 404 there from a neighbour)."""
        use = port_use(Path("/proc"), port)
        return "0A" in use.states and any(pid == self.proc.pid for pid, _ in use.holders)

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


def _metric(raw: bytes, name: str) -> float:
    """The sum of a family's samples named exactly ``name`` (any labels)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in raw.decode().splitlines()
               if line.startswith(name + "{"))
