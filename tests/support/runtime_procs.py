"""Stand-ins for the runtime's tests (tests/test_runtime_*.py), which run it as the units do:
a directory Python runs, as a subprocess, against a stand-in child (a tiny stdlib HTTP server
written into tmp_path) and a fake NOTIFY_SOCKET. All traffic is on 127.0.0.1 and every process is
bounded by a timeout and killed (process group) in teardown.

The runtime is shipped as plain files and must stay stdlib-only (Python >= 3.9): set
PDSVC_SUPERVISE_PYTHON to another interpreter to run the subprocess tests under it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "pdsvc" / "ship" / "runtime"
PROC_TIMEOUT = 20.0  # no single runtime run in a test should come near this
# The runtime runs under the SGLang venv's interpreter (Python >= 3.9), not pdsvc's: point this
# at another interpreter to check the subprocess tests there too.
RUNTIME_PYTHON = os.environ.get("PDSVC_RUNTIME_PYTHON", sys.executable)


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
    p.add_argument("--drain-secs", type=float, default=0.0)  # SIGTERM: exit0 after draining
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
        if a.drain_secs:  # still answers /health meanwhile (the server runs in a thread)
            threading.Timer(a.drain_secs, lambda: os._exit(0)).start()
            return
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
    """A fake nvidia-smi that prints real-format CSV for the two queries the runtime makes."""
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
    """Starts runtime subprocesses in their own process group; kills them all at teardown."""

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
        stderr = self.tmp_path / f"runtime-{self.count}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHDOG_")}
        full_env.pop("NOTIFY_SOCKET", None)
        if notify is not None:
            full_env["NOTIFY_SOCKET"] = notify.path
        full_env.update(env or {})
        with open(stderr, "wb") as out:
            proc = subprocess.Popen(
                [RUNTIME_PYTHON, str(RUNTIME), *args],
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
            # the whole group: the runtime and its child, even if the child was orphaned
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


def first_event(events: Path, kind: str) -> dict:
    return next(e for e in read_events(events) if e["event"] == kind)


def child_pid(events_path: Path) -> int:
    starts = wait_for(
        lambda: [e for e in read_events(events_path) if e["event"] == "start"],
        what="child start",
    )
    return starts[0]["pid"]



class FakeClock:
    """A clock a test moves: call it for the time, wait() or set .now to move it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds

