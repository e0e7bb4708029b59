"""Tests for pdsvc/supervise.py, the sd_notify supervisor that every rendered unit runs.

supervise.py is copied verbatim into the rendered bundle and must stay stdlib-only, so it is
loaded here by file path (not as ``pdsvc.supervise``). Behaviour that needs a process runs
supervise.py as a subprocess against a stand-in child (a tiny stdlib HTTP server written into
tmp_path) and a fake NOTIFY_SOCKET; all traffic is on 127.0.0.1 and every process is bounded
by a timeout and killed (process group) in teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from ports import free_port

from pdsvc.ship.runtime import (
    child,
    cli,
    codes,
    gpu,
    jitlock,
    lifecycle,
    listener,
    notify,
    phases,
    probe,
    proctree,
)

#: The runtime as the units run it: a directory Python runs (``python DIR MODE ...``).
SUPERVISE = Path(__file__).resolve().parent.parent / "pdsvc" / "ship" / "runtime"
PROC_TIMEOUT = 20.0  # no single supervise run in this file should come near this
# The runtime runs under the SGLang venv's interpreter (Python >= 3.9), not pdsvc's: point this
# at another interpreter to check the subprocess tests there too.
SUPERVISE_PYTHON = os.environ.get("PDSVC_SUPERVISE_PYTHON", sys.executable)

#: Every public name of the runtime's modules, for the in-process tests below.
sup = SimpleNamespace(**{
    name: value
    for module in (codes, notify, gpu, jitlock, probe, proctree, child, phases, listener, cli,
                   lifecycle)
    for name, value in vars(module).items() if not name.startswith("__")
})


# ---------------------------------------------------------------------------------------------
# Stand-ins


CHILD_SCRIPT = textwrap.dedent(
    '''
    """Stand-in for an SGLang engine or the router: records events as JSON lines in --log."""
    import argparse, json, os, signal, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--mode", choices=["engine", "router"], default="engine")
    p.add_argument("--healthy-after", type=float, default=0.0)  # /health, router: /readiness
    p.add_argument("--generate-after", type=float, default=0.0)  # router: /generate 503 before
    p.add_argument("--exit-after", type=float)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--exit-signal", type=int)
    p.add_argument("--on-sigterm", choices=["exit0", "sigkill"], default="exit0")
    a = p.parse_args()
    start = time.time()
    lock = threading.Lock()

    def record(event, **fields):
        line = json.dumps(dict(event=event, t=time.time(), pid=os.getpid(), **fields))
        with lock, open(a.log, "a") as f:
            f.write(line + "\\n")

    def on_sigterm(signo, frame):
        record("sigterm")
        if a.on_sigterm == "sigkill":  # what SGLang's SIGTERM watchdog does to itself
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)

    def die():
        record("exit")
        if a.exit_signal:
            os.kill(os.getpid(), a.exit_signal)
        os._exit(a.exit_code)

    signal.signal(signal.SIGTERM, on_sigterm)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code, body=None):
            body = body or (b"ok" if code == 200 else b'{"status":"not ready"}')
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            up = time.time() - start
            ready = 200 if up >= a.healthy_after else 503
            routes = {"engine": {"/health": ready},
                      "router": {"/readiness": ready, "/liveness": 200}}[a.mode]
            code = routes.get(self.path, 404)
            record("get", path=self.path, code=code)
            self.reply(code)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            up = time.time() - start
            code = 404
            if a.mode == "router" and self.path == "/generate":
                code = 200 if up >= a.generate_after else 503
            record("post", path=self.path, code=code, body=json.loads(body or b"null"),
                   auth=self.headers.get("Authorization"))
            # a good completion, as SGLang's /generate answers one (the router passes it on)
            self.reply(code, json.dumps({"text": "Paris", "meta_info": {
                "finish_reason": {"type": "length"}, "completion_tokens": 1}}).encode()
                if code == 200 else None)

    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # a probe that timed out hung up
    record("start", healthy_from=start + a.healthy_after,
           generate_from=start + a.generate_after)
    if a.exit_after is not None:
        threading.Timer(a.exit_after, die).start()
    server.serve_forever()
    '''
)

FAKE_NVIDIA_SMI = textwrap.dedent(
    """\
    #!{python}
    import sys
    args = " ".join(sys.argv[1:])
    if {fail}:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        sys.exit(9)
    if "--query-gpu=index,pci.bus_id" in args:
        print("0, 00000000:18:00.0")
        print("1, 00000000:19:00.0")
        print("2, 00000000:3A:00.0")
        print("3, 00000000:3B:00.0")
    elif "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory" in args:
        sys.stdout.write({apps!r})
    else:
        sys.exit(2)
    """
)


def write_nvidia_smi(directory: Path, apps: str = "", fail: bool = False) -> Path:
    """A fake nvidia-smi that prints real-format CSV for the two queries supervise makes."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable, apps=apps, fail=fail))
    path.chmod(0o755)
    return path


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class NotifyListener:
    """A fake $NOTIFY_SOCKET: an AF_UNIX datagram socket that timestamps what it receives."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.time(), data.decode().split("\n")))

    def times(self, field: str) -> list[float]:
        return [t for t, fields in list(self.messages) if field in fields]

    def statuses(self) -> list[str]:
        return [f for _, fields in list(self.messages) for f in fields if f.startswith("STATUS=")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    if len(str(path)) > 100:  # sun_path holds 108 bytes
        path = Path(tempfile.mkdtemp(prefix="pdsvc-")) / "notify.sock"
    listener = NotifyListener(str(path))
    yield listener
    listener.close()


class Runner:
    """Starts supervise.py subprocesses in their own process group; kills them all at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.count = 0

    def child(self, port: int, log: Path, *args: str) -> list[str]:
        script = self.tmp_path / "child.py"
        if not script.exists():
            script.write_text(CHILD_SCRIPT)
        return [sys.executable, str(script), "--port", str(port), "--log", str(log), *args]

    def start(self, args: list[str], notify=None, env: dict | None = None):
        self.count += 1
        stderr = self.tmp_path / f"supervise-{self.count}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHDOG_")}
        full_env.pop("NOTIFY_SOCKET", None)
        if notify is not None:
            full_env["NOTIFY_SOCKET"] = notify.path
        full_env.update(env or {})
        with open(stderr, "wb") as out:
            proc = subprocess.Popen(
                [SUPERVISE_PYTHON, str(SUPERVISE), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
            )
        proc.log_path = stderr  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    @staticmethod
    def log(proc) -> str:
        return proc.log_path.read_text()

    @staticmethod
    def wait(proc, timeout: float = PROC_TIMEOUT) -> int:
        return proc.wait(timeout=timeout)

    def cleanup(self) -> None:
        for proc in self.procs:
            # the whole group: supervise and its child, even if the child was orphaned
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


@pytest.fixture
def procs(tmp_path):
    """Named procs, not runner: tests/conftest.py's runner is click's CliRunner."""
    r = Runner(tmp_path)
    yield r
    r.cleanup()


def engine_args(port: int, name: str = "dsv4-prefill", *extra: str) -> list[str]:
    return [
        "engine",
        "--name",
        name,
        "--health-url",
        f"http://127.0.0.1:{port}/health",
        "--poll-interval",
        "0.1",
        "--progress-every",
        "0.5",
        "--liveness-interval",
        "0.2",
        "--liveness-timeout",
        "0.5",
        *extra,
    ]


def child_pid(events_path: Path) -> int:
    starts = wait_for(
        lambda: [e for e in read_events(events_path) if e["event"] == "start"],
        what="child start",
    )
    return starts[0]["pid"]


# ---------------------------------------------------------------------------------------------
# Pure functions, in-process


def test_notify_path_and_abstract_and_unset(tmp_path):
    assert sup.notify("READY=1", env={}) is False
    path = tmp_path / "n.sock"
    if len(str(path)) > 100:
        path = Path(tempfile.mkdtemp(prefix="pdsvc-")) / "n.sock"
    for address, bind_to in (
        (str(path), str(path)),
        (f"@pdsvc-test-{os.getpid()}", f"\0pdsvc-test-{os.getpid()}"),
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
            receiver.bind(bind_to)
            receiver.settimeout(2)
            assert sup.notify("READY=1", "STATUS=a\nb", env={"NOTIFY_SOCKET": address})
            assert receiver.recv(4096) == b"READY=1\nSTATUS=a b"
    assert sup.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "absent")}) is False


def test_gpu_holders_parses_real_nvidia_smi_csv(tmp_path):
    apps = (
        "00000000:3A:00.0, 1234, python, 69000 MiB\n"
        "00000000:18:00.0, 77, /usr/bin/weird, name, [N/A]\n"
        "00000000:3B:00.0, 99, other, 10 MiB\n"
    )
    smi = write_nvidia_smi(tmp_path / "bin", apps=apps)
    holders = sup.gpu_holders(str(smi), [0, 1, 2])
    assert [h.describe() for h in holders] == [
        "GPU 0 (00000000:18:00.0) is held by pid 77 /usr/bin/weird, name [N/A]",
        "GPU 2 (00000000:3A:00.0) is held by pid 1234 python 69000 MiB",
    ]
    assert sup.gpu_holders(str(smi), [1]) == []
    # nvidia-smi versions differ in domain width and case; the join must not care
    assert sup.normalize_bus_id("0000:3a:00.0") == sup.normalize_bus_id("00000000:3A:00.0")
    with pytest.raises(sup.GpuCheckError, match="GPU 7 not present"):
        sup.gpu_holders(str(smi), [0, 7])
    broken = write_nvidia_smi(tmp_path / "broken", fail=True)
    with pytest.raises(sup.GpuCheckError, match="exited with status 9: NVIDIA-SMI has failed"):
        sup.gpu_holders(str(broken), [0])


def test_gpu_holders_timeout_is_an_error(tmp_path):
    def slow_run(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    with pytest.raises(sup.GpuCheckError, match="timed out after 30 s"):
        sup.gpu_holders("/usr/bin/nvidia-smi", [0], run=slow_run)


@pytest.mark.parametrize(
    ("returncode", "stop_signal", "expected"),
    [
        (0, None, 0),
        (3, None, 3),
        (-signal.SIGKILL, None, 137),
        (-signal.SIGSEGV, None, 139),
        (0, signal.SIGTERM, 0),
        (-signal.SIGTERM, signal.SIGTERM, 0),
        (-signal.SIGKILL, signal.SIGTERM, 0),
        (137, signal.SIGTERM, 0),
        (-signal.SIGINT, signal.SIGINT, 0),
        (1, signal.SIGTERM, 1),
        (-signal.SIGSEGV, signal.SIGTERM, 139),
    ],
)
def test_exit_code_mapping(returncode, stop_signal, expected):
    assert sup.runtime_exit_code(returncode, stop_signal) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


def test_wait_until_healthy_logs_progress_and_returns_on_200():
    clock = FakeClock()
    answers = iter([sup.ProbeResult(False, "HTTP 503")] * 40 + [sup.ProbeResult(True, "HTTP 200")])
    lines: list[str] = []
    outcome = sup.wait_until_healthy(
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
    outcome = sup.wait_until_healthy(
        lambda: sup.ProbeResult(False, "connection refused"),
        lambda timeout: next(exits),
        what="u",
        log=lambda line: None,
        status=lambda text: None,
        poll_interval=1.0,
        progress_every=15.0,
        should_stop=lambda: False,
        clock=clock,
    )
    assert outcome == sup.Outcome("exited", 3)


def test_liveness_loop_pings_only_on_200():
    clock = FakeClock()
    results = iter([True, False, False, True])
    sent: list[tuple[str, ...]] = []
    lines: list[str] = []

    def child_wait(timeout: float):
        clock.now += timeout
        return 0 if clock.now > 4.5 else None

    outcome = sup.liveness_loop(
        lambda: (
            sup.ProbeResult(True, "HTTP 200")
            if next(results)
            else sup.ProbeResult(False, "timed out after 20 s")
        ),
        child_wait,
        interval=1.0,
        log=lines.append,
        notify=lambda *fields: sent.append(fields),
        serving_status="serving",
        should_stop=lambda: False,
        clock=clock,
    )
    assert outcome == sup.Outcome("exited", 0)
    pings = [fields for fields in sent if "WATCHDOG=1" in fields]
    assert len(pings) == 2
    assert lines == [
        "liveness probe failed: timed out after 20 s",
        "liveness probe failed: timed out after 20 s",
        "liveness probe OK again after 2 failure(s)",
    ]


def test_http_probe_reports_status_and_refusal():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/ok" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert sup.http_probe(f"{base}/ok", 2) == sup.ProbeResult(True, "HTTP 200")
        assert sup.http_probe(f"{base}/health", 2) == sup.ProbeResult(False, "HTTP 503")
    finally:
        server.shutdown()
        server.server_close()
    refused = sup.http_probe(f"http://127.0.0.1:{free_port()}/health", 2)
    assert refused == sup.ProbeResult(False, "connection refused")


def test_router_liveness_url_default():
    assert (
        sup.liveness_url_for("http://127.0.0.1:8000/readiness?x=1")
        == "http://127.0.0.1:8000/liveness"
    )


# ---------------------------------------------------------------------------------------------
# CLI


def test_help_and_usage_errors():
    def run(*args):
        return subprocess.run(
            [SUPERVISE_PYTHON, str(SUPERVISE), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    for mode, options in (
        ("engine", ["--health-url", "--gpus", "--nvidia-smi", "--jit-cache", "--jit-key"]),
        ("router", ["--readiness-url", "--generate-url", "--liveness-url", "--api-key-env"]),
    ):
        result = run(mode, "--help")
        assert result.returncode == 0
        for option in [*options, "--name", "--liveness-interval", "--liveness-timeout"]:
            assert option in result.stdout
        assert "Exit status:" in result.stdout
    usage_errors = [
        ["engine", "--name", "x", "--health-url", "http://127.0.0.1:1/health"],  # no -- CMD
        ["engine", "--name", "x", "--health-url", "http://h/health", "--gpus", "0,a", "--", "t"],
        ["engine", "--name", "x", "--health-url", "http://h/h", "--jit-key", "k", "--", "t"],
        ["router", "--name", "x", "--readiness-url", "http://h/readiness", "--", "t"],
        ["engine", "--name", "x", "--health-url", "h:1/health", "--", "t"],
    ]
    for argv in usage_errors:
        result = run(*argv)
        assert result.returncode == 2, argv
        assert "Traceback" not in result.stderr


def test_missing_command_exits_127(procs, tmp_path):
    proc = procs.start(engine_args(free_port(), "x", "--", str(tmp_path / "no-such-binary")))
    assert procs.wait(proc) == 127
    assert "command not found" in procs.log(proc)


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


@pytest.mark.parametrize(
    ("child_args", "expected"),
    [
        (["--healthy-after", "100", "--exit-after", "0.3", "--exit-code", "3"], 3),
        (["--exit-after", "1.5", "--exit-signal", str(int(signal.SIGKILL))], 137),
    ],
    ids=["exit-3-before-healthy", "sigkill-after-healthy"],
)
def test_engine_child_crash_passes_status_on(procs, notify_socket, tmp_path, child_args, expected):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-prefill", "--") + procs.child(port, events, *child_args),
        notify=notify_socket,
    )
    assert procs.wait(proc) == expected
    assert f"dsv4-prefill: engine exited with status {expected}" in procs.log(proc)
    assert bool(notify_socket.times("READY=1")) == (expected == 137)


def test_engine_child_sigkilling_itself_on_sigterm_is_a_clean_stop(procs, notify_socket, tmp_path):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-prefill", "--")
        + procs.child(port, events, "--on-sigterm", "sigkill"),
        notify=notify_socket,
    )
    wait_for(lambda: notify_socket.times("READY=1"), what="READY=1")
    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0
    log = procs.log(proc)
    assert "engine exited with status 137 (killed by SIGKILL)" in log
    assert "treating it as a clean stop" in log


# ---------------------------------------------------------------------------------------------
# GPU idle check


HOLDER_ON_GPU2 = "00000000:3A:00.0, 1234, python, 69000 MiB\n"


def _quick_child(tmp_path: Path) -> list[str]:
    """A child that proves it was started and exits 5 at once (no need to get healthy)."""
    marker = tmp_path / "child-started"
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').close(); raise SystemExit(5)"]


def test_gpu_busy_waits_visibly_then_refuses_to_start(procs, notify_socket, tmp_path):
    smi = write_nvidia_smi(tmp_path / "bin", apps=HOLDER_ON_GPU2)
    args = engine_args(free_port(), "dsv4-prefill", "--gpus", "0,1,2,3", "--nvidia-smi",
                       str(smi), "--gpu-wait", "1.5")
    proc = procs.start([*args, "--", *_quick_child(tmp_path)], notify=notify_socket)
    assert procs.wait(proc) == 1
    log = procs.log(proc)
    assert "dsv4-prefill: waiting for GPUs 0,1,2,3 to be released (0/1.5 s): GPU 2 " \
        "(00000000:3A:00.0) is held by pid 1234 python 69000 MiB" in log
    assert "GPUs still busy after 1.5 s: giving up this start" in log
    assert any("waiting for GPUs 0,1,2,3 to be released" in m for m in notify_socket.statuses())
    assert not (tmp_path / "child-started").exists()


def test_gpu_released_while_waiting_starts_the_engine(procs, tmp_path):
    smi = write_nvidia_smi(tmp_path / "bin", apps=HOLDER_ON_GPU2)
    args = engine_args(free_port(), "dsv4-prefill", "--gpus", "0,1,2,3", "--nvidia-smi",
                       str(smi), "--gpu-wait", "30")
    proc = procs.start([*args, "--", *_quick_child(tmp_path)])
    wait_for(lambda: "waiting for GPUs" in procs.log(proc), what="the wait")
    write_nvidia_smi(tmp_path / "bin", apps="")  # the old process let go of its memory
    assert procs.wait(proc) == 5  # the child ran (and exited 5)
    assert (tmp_path / "child-started").exists()
    assert re.search(r"GPUs 0,1,2,3 are idle after \d+\.\d s", procs.log(proc))


def test_gpu_holder_on_another_gpu_starts(procs, tmp_path):
    bindir = tmp_path / "bin"
    write_nvidia_smi(bindir, apps=HOLDER_ON_GPU2)
    args = engine_args(free_port(), "dsv4-decode", "--gpus", "0,1")  # nvidia-smi found on PATH
    proc = procs.start([*args, "--", *_quick_child(tmp_path)], env={"PATH": str(bindir)})
    assert procs.wait(proc) == 5
    assert (tmp_path / "child-started").exists()
    assert "GPUs 0,1 are idle" in procs.log(proc)


def test_missing_nvidia_smi_skips_the_check(procs, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    args = engine_args(free_port(), "dsv4-decode", "--gpus", "4,5,6,7")
    proc = procs.start([*args, "--", *_quick_child(tmp_path)], env={"PATH": str(empty)})
    assert procs.wait(proc) == 5
    assert (tmp_path / "child-started").exists()
    assert (
        "GPU idle check skipped: nvidia-smi not found (no NVIDIA driver on this host?)"
        in procs.log(proc)
    )


def test_broken_nvidia_smi_refuses(procs, tmp_path):
    smi = write_nvidia_smi(tmp_path / "bin", fail=True)
    args = engine_args(free_port(), "dsv4-prefill", "--gpus", "0", "--nvidia-smi", str(smi))
    proc = procs.start([*args, "--", *_quick_child(tmp_path)])
    assert procs.wait(proc) == 1
    assert "GPU idle check failed:" in procs.log(proc)
    assert not (tmp_path / "child-started").exists()


# ---------------------------------------------------------------------------------------------
# JIT cache serialisation


def _start_engine_with_cache(procs, notify, tmp_path, name, key, cache, healthy_after="1.5"):
    port, events = free_port(), tmp_path / f"{name}.jsonl"
    args = engine_args(port, name, "--jit-cache", str(cache), "--jit-key", key, "--")
    proc = procs.start(
        args + procs.child(port, events, "--healthy-after", healthy_after), notify=notify
    )
    return proc, events


def _first(events: Path, kind: str) -> dict:
    return next(e for e in read_events(events) if e["event"] == kind)


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
    first_start = _first(first_events, "start")
    second_start = _first(second_events, "start")
    assert second_start["t"] >= first_start["healthy_from"]
    log = procs.log(second)
    assert "JIT cache cold for decode@" in log
    assert f"waiting for dsv4-prefill (pid {first.pid})" in log
    assert f"to finish compiling into {cache}" in log
    assert (cache / ".pdsvc" / f"warm-prefill@{sup.engine_fingerprint()}").exists()
    assert (cache / ".pdsvc" / f"warm-decode@{sup.engine_fingerprint()}").exists()
    for proc in (first, second):
        proc.send_signal(signal.SIGTERM)
        assert procs.wait(proc) == 0


def test_warm_jit_cache_starts_engines_in_parallel(procs, notify_socket, tmp_path):
    cache = tmp_path / "jit"
    (cache / ".pdsvc").mkdir(parents=True)
    for key in ("prefill", "decode"):
        (cache / ".pdsvc" / f"warm-{key}@{sup.engine_fingerprint()}").write_text("warm\n")
    engines = [
        _start_engine_with_cache(procs, notify_socket, tmp_path, name, key, cache)
        for name, key in (("dsv4-prefill", "prefill"), ("dsv4-decode", "decode"))
    ]
    wait_for(lambda: all(read_events(events) for _, events in engines), what="both children")
    (_, a), (_, b) = engines
    start_a, start_b = _first(a, "start"), _first(b, "start")
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
    assert not (cache / ".pdsvc" / f"warm-prefill@{sup.engine_fingerprint()}").exists()
    lock = sup.JitLock(str(cache), "decode", "t", sup.Log("t"), 1.0, sleep=pytest.fail)
    assert lock.acquire()  # would call sleep (= fail) if the lock were still held
    lock.release()


def test_jit_lock_waits_for_holder_in_process(tmp_path, capsys):
    holder = sup.JitLock(str(tmp_path), "prefill", "dsv4-prefill", sup.Log("a"), 1.0)
    assert holder.acquire()
    clock = FakeClock()

    def sleep(seconds):
        clock.now += seconds
        if clock.now >= 3:
            holder.mark_warm()

    waiter = sup.JitLock(
        str(tmp_path), "decode", "dsv4-decode", sup.Log("b"), 2.0, clock=clock, sleep=sleep
    )
    assert not waiter.is_warm()
    assert waiter.acquire()
    assert holder.is_warm() and waiter.held
    err = capsys.readouterr().err
    assert f"b: JIT cache cold for decode: waiting for dsv4-prefill (pid {os.getpid()})" in err
    assert err.count("waiting for") == 2  # at 0 s and at 2 s
    waiter.release()


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
    start = _first(events, "start")
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


def test_engine_error_line_is_repeated_at_its_exit(procs, notify_socket, tmp_path):
    """`systemctl status` shows 10 journal lines; the engine's own error must survive them."""
    script = tmp_path / "broken_engine.py"
    script.write_text(
        "import sys\n"
        "print('loading weights', file=sys.stderr)\n"
        "print(\"OSError: Incorrect path_or_model_id: '/srv/x'\", file=sys.stderr)\n"
        "print('shutting down', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    proc = procs.start(
        engine_args(free_port(), "dsv4-decode", "--") + [sys.executable, str(script)],
        notify=notify_socket,
    )
    assert procs.wait(proc) == 1
    log = procs.log(proc)
    assert "shutting down" in log  # the child's stderr still reaches ours, line by line
    assert ("dsv4-decode: engine exited with status 1; its last error: "
            "OSError: Incorrect path_or_model_id: '/srv/x'") in log
    assert any("Incorrect path_or_model_id" in s for s in notify_socket.statuses())


# ---------------------------------------------------------------------------------------------
# --restart-with: a peer on another host restarted


def _peer(results: list[str]):
    """A probe answering from a script: 'ok', 'refused' or 'timeout' per call."""
    it = iter(results)

    def probe(url: str, timeout: float):
        r = next(it)
        return (sup.ProbeResult(True, "HTTP 200") if r == "ok" else
                sup.ProbeResult(False, "connection refused") if r == "refused" else
                sup.ProbeResult(False, f"timed out after {timeout:g} s"))
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
    watch = sup.PeerWatch(["http://10.0.0.2:30000/health"], down_after=3, timeout=1,
                          probe=_peer(script), log=lines.append)
    said = [watch.check() for _ in script]
    if script[0] == "ok" and not restarts_at:  # a recovery that is not a restart is said so
        assert any("not a restart" in line for line in lines), lines
    at = next((i + 1 for i, s in enumerate(said) if s), None)
    assert at == restarts_at, said
    if at:
        assert ("http://10.0.0.2:30000/health failed 3 probes in a row and its port was "
                "closed" in said[at - 1])


def test_liveness_loop_ends_when_a_duty_says_a_peer_restarted() -> None:
    clock = FakeClock()

    def child_wait(timeout: float):
        clock.now += timeout
        return None

    watch = sup.PeerWatch(["http://p/health"], down_after=1, timeout=1,
                          probe=_peer(["ok", "refused", "ok"]))
    outcome = sup.liveness_loop(
        lambda: sup.ProbeResult(True, "HTTP 200"), child_wait, interval=1.0, log=lambda m: None,
        notify=lambda *f: None, serving_status="serving", should_stop=lambda: False,
        clock=clock,
        duties=lambda alive: (sup.Outcome("peer", detail=why) if (why := watch.check())
                              else None),
    )
    assert outcome.kind == "peer" and "http://p/health failed 1 probes" in outcome.detail


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


def test_peer_probes_run_at_once_so_many_dead_peers_cost_one_timeout() -> None:
    def slow(url: str, timeout: float):
        time.sleep(timeout)
        return sup.ProbeResult(False, f"timed out after {timeout:g} s")

    urls = [f"http://10.0.0.{i}:30000/health" for i in range(2, 8)]  # 6 partitioned peers
    watch = sup.PeerWatch(urls, down_after=3, timeout=0.4, probe=slow)
    t0 = time.monotonic()
    assert watch.check() is None
    assert time.monotonic() - t0 < 1.2  # one timeout (+ the join margin), not six
    assert all(n == 1 for n in watch.failures.values())


def test_a_drain_the_supervisor_began_keeps_the_watchdog_fed_and_is_bounded(tmp_path) -> None:
    log = sup.Log("t")
    child = sup.Child(log, sup.Notifier(log, env={}), "engine")
    assert child.start(["sleep", "30"]) is None  # ignores nothing, but never exits by itself
    ticks: list[float] = []
    t0 = time.monotonic()
    child.stop_time = t0
    returncode = child.wait_after_stop(10, timeout=1.5, tick=lambda: ticks.append(1))
    assert returncode == -signal.SIGKILL and 1.4 < time.monotonic() - t0 < 5
    assert len(ticks) >= 1  # the watchdog was pinged while it drained


def test_runtime_imports_only_the_standard_library() -> None:
    """The runtime runs under the SGLang venv's interpreter on the GPU host, shipped as plain
    files: every module it loads, for every mode, must come from the standard library."""
    probe = (
        "import importlib, sys\n"
        f"sys.path[:0] = [{str(SUPERVISE.parent)!r}]\n"
        "for m in ('cli', 'lifecycle', 'listener', 'gpu', 'probe', 'jitlock', 'phases'):\n"
        "    importlib.import_module('runtime.' + m)\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    out = subprocess.run([SUPERVISE_PYTHON, "-I", "-S", "-c", probe], capture_output=True,
                         text=True, timeout=PROC_TIMEOUT, check=True).stdout.split()
    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    assert "runtime" in out
    assert [name for name in out if name not in stdlib | {"runtime", "__main__"}] == []


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
