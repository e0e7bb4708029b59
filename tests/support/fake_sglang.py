"""fake_sglang: a TEST STAND-IN for ``python -m sglang.launch_server``.

Test support only: it is NOT part of the rendered product and pdsvc never installs or renders it.
pdsvc's tests run it where a real unit would run SGLang, so that rendered units, the real
sglang-router and the failure handling can be exercised on a machine without a GPU. It is
stdlib-only (Python >= 3.10) and takes exactly the argv that ``sglang.launch_server`` gets::

    python -m fake_sglang ARGS            # with tests/support on PYTHONPATH
    python tests/support/fake_sglang.py ARGS

Flags it reads (every other ``--flag [value]`` and any stray token is accepted and ignored):
``--model-path/--model`` (must be an existing directory, else
``OSError: Incorrect path_or_model_id`` and exit 1), ``--served-model-name``, ``--tokenizer-path``,
``--host`` (127.0.0.1), ``--port`` (30000),
``--disaggregation-mode {null,prefill,decode}``, ``--disaggregation-bootstrap-port`` (8998),
``--disaggregation-transfer-backend``, ``--tp/--tp-size``, ``--dp/--dp-size``, ``--dist-init-addr``,
``--api-key``, ``--max-running-requests``, ``--enable-metrics`` (``/metrics`` is 404 without it,
as in SGLang), ``--nnodes``/``--node-rank`` (one engine over several hosts: rank 0 listens at
``--dist-init-addr`` and waits for the other ranks, which connect and serve no HTTP; a lost
peer is fatal on both sides, like an NCCL error).

Behaviour, in the order it happens:

* binds the prefill bootstrap server (prefill only) and the HTTP port at once; ``/health`` and
  ``/health_generate`` answer 503 until loading is done, then 200;
* "loads weights" for ``FAKE_SGLANG_LOAD_SECS`` (0.5), then "JIT-compiles" into
  ``$TRITON_CACHE_DIR/fake-sglang/<role>.kernels`` (skipped if ``TRITON_CACHE_DIR`` is unset):
  cold = ``FAKE_SGLANG_COMPILE_COLD_SECS`` (2.0) under an O_EXCL lock file
  ``fake-sglang/.compiling`` (a live holder makes the second compiler fail loudly, as DeepGEMM
  does; a dead holder's lock is taken over), warm = ``FAKE_SGLANG_COMPILE_WARM_SECS`` (0.1);
* PD generation requests must carry ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``
  (400 otherwise); decode GETs ``/health`` on the prefill bootstrap server named in the request
  (500 "KV transfer failed" if unreachable), then POSTs its registration to ``/_fake/pair``
  there and learns the prefill's instance id;
* NIXL pair state (tests/support/fake_pair.py): each process has a fresh uuid4 instance id
  (``fake_instance_id`` in ``/server_info``; ``GET /_fake/pair`` and ``GET /route`` on the
  bootstrap server). Each side remembers the peer instance it paired with per peer key; when a
  peer is replaced behind the same address and ``FAKE_SGLANG_STALE_PAIR`` (``decode`` |
  ``prefill`` | ``both``; unset = off) names this side's role, this side goes stale for that peer
  and every transfer with it fails until this process restarts, while ``/health`` stays 200
  (sglang #33789 / PR #34289; smg #2382, vllm #49238). ``FAKE_SGLANG_PAIR_FAILURE`` picks the
  form: ``abort200`` (HTTP 200, empty text, ``finish_reason {"type": "abort", ...}``) or
  ``error500``. The decode's response fails either way; a stale prefill's own does too;
* SIGTERM: log, answer /health 503, drain in-flight generations (a hung one counts; unbounded,
  like SGLang, unless ``SGLANG_FORCE_SHUTDOWN=1`` or ``FAKE_SGLANG_DRAIN_MAX_SECS``), stop
  listening, SIGKILL any descendants and then itself (exit by signal 9 / status 137).
  ``FAKE_SGLANG_CLEAN_EXIT=1``: exit 0 instead.

Test knobs (environment): ``FAKE_SGLANG_CRASH_AFTER`` / ``FAKE_SGLANG_HANG_AFTER`` (seconds after
becoming healthy: ``os._exit(1)`` / stop answering HTTP), ``FAKE_SGLANG_HANG_BOOTSTRAP=1`` (a hang
also covers the bootstrap port), ``FAKE_SGLANG_SPAWN_ORPHAN=1`` (a SIGTERM-ignoring sleeper in its
own session, reparented away from the engine, ``FAKE_SGLANG_ORPHAN_SECS`` <= 900),
``FAKE_SGLANG_STATE_DIR`` (``engine.pid``, ``orphan.pid``), ``FAKE_SGLANG_MAX_LIFETIME`` (1800 s
safety net, then exit 0), ``FAKE_SGLANG_LOG`` (JSONL request log), ``FAKE_SGLANG_GEN_DELAY``
(seconds before answering a generation), ``FAKE_SGLANG_BOOTSTRAP_TIMEOUT`` (2.0 s, decode's probe),
``FAKE_SGLANG_ACCESS_LOG=1`` (uvicorn-style access lines on stderr),
``FAKE_SGLANG_KNEE_RATE`` and the other knobs of tests/support/fake_latency.py (a latency model
with a knee, token streaming, empty completions, transfer-failure counter),
``FAKE_SGLANG_HTTP_AFTER_LOAD=1`` (bind the HTTP and bootstrap ports only after "loading
weights", as SGLang does: the ports are closed, not 503, during the load).

Runtime control (main port, never needs the API key, never hangs): ``POST /_fake/control`` with a
JSON object of ``hang`` (bool), ``hang_bootstrap`` (bool), ``health`` ("ok"|"fail"),
``gen_delay`` (seconds), ``crash`` (true: exit 1 right after replying), ``stale_pair``
(off|decode|prefill|both), ``pair_failure`` (abort200|error500), ``new_instance`` (true: a fresh
instance id and empty peer memory, a replaced process behind the same ports);
``GET /_fake/control`` returns the current state (including ``instance_id``, ``peers``,
``stale_peers``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import fake_latency
import fake_metrics
import fake_pair

VERSION = "0.5.23+fake"
#: SGLang's warmup/health probes use this bootstrap host so that they never touch the peer.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
ORPHAN_MAX_SECS = 900.0

_LOG_LOCK = threading.Lock()


# --------------------------------------------------------------------------------------- helpers


def log(msg: str, tag: str = "") -> None:
    """One SGLang-like line on stderr: ``[2026-11-29 09:46:00 TP0] msg``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    _emit(f"[{stamp}{' ' + tag if tag else ''}] {msg}")


def _emit(line: str) -> None:
    with _LOG_LOCK:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        _emit(f"ValueError: environment variable {name}={raw!r} is not a number")
        sys.exit(2)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _descendants(root: int) -> list[int]:
    """PIDs whose parent chain leads to ``root`` (what psutil's children(recursive=True) sees)."""
    parent_of: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent_of[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found: list[int] = []
    frontier = {root}
    while frontier:
        kids = {pid for pid, ppid in parent_of.items() if ppid in frontier and pid not in found}
        found.extend(sorted(kids))
        frontier = kids
    return found


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fake_sglang",
        description="Test stand-in for python -m sglang.launch_server (not SGLang).",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument(
        "--tp", "--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1
    )
    p.add_argument("--dp", "--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    return p


# ------------------------------------------------------------------------------------ the engine


class Engine:
    def __init__(self, args: argparse.Namespace, ignored: list[str]) -> None:
        self.args = args
        self.ignored = ignored
        self.role = args.disaggregation_mode
        self.pd = self.role in ("prefill", "decode")
        self.served_name = args.served_model_name or args.model_path
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.state = "starting"  # -> "ready"
        self.graceful_exit = False
        self.term_requested = False
        self.hang = False
        self.hang_bootstrap = _env_flag("FAKE_SGLANG_HANG_BOOTSTRAP")
        self.health_override = "ok"
        self.gen_delay = _env_float("FAKE_SGLANG_GEN_DELAY", 0.0) or 0.0
        self.load_secs = _env_float("FAKE_SGLANG_LOAD_SECS", 0.5)
        self.cold_secs = _env_float("FAKE_SGLANG_COMPILE_COLD_SECS", 2.0)
        self.warm_secs = _env_float("FAKE_SGLANG_COMPILE_WARM_SECS", 0.1)
        self.crash_after = _env_float("FAKE_SGLANG_CRASH_AFTER", None)
        self.hang_after = _env_float("FAKE_SGLANG_HANG_AFTER", None)
        self.max_lifetime = _env_float("FAKE_SGLANG_MAX_LIFETIME", 1800.0)
        self.drain_max = _env_float("FAKE_SGLANG_DRAIN_MAX_SECS", None)
        self.bootstrap_timeout = _env_float("FAKE_SGLANG_BOOTSTRAP_TIMEOUT", 2.0)
        self.access_log = _env_flag("FAKE_SGLANG_ACCESS_LOG")
        self.state_dir = os.environ.get("FAKE_SGLANG_STATE_DIR") or None
        self.reqlog_path = os.environ.get("FAKE_SGLANG_LOG") or None
        try:
            self.pair = fake_pair.PairState(
                self.role,
                os.environ.get("FAKE_SGLANG_STALE_PAIR"),
                os.environ.get("FAKE_SGLANG_PAIR_FAILURE"),
                log=lambda msg: log(msg, "TP0"),
            )
        except ValueError as e:
            _emit(f"ValueError: FAKE_SGLANG_STALE_PAIR/FAKE_SGLANG_PAIR_FAILURE: {e}")
            sys.exit(2)
        self.pair_wait = _env_float("FAKE_SGLANG_PAIR_WAIT_SECS", 2.0) or 0.0
        #: how a prefill knows this decode: its own address (SGLang registers it likewise)
        self.pair_key = f"{args.host}:{args.port}"
        self._lock = threading.Lock()
        self.inflight = 0
        self.counters = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.metrics = fake_metrics.EngineMetrics()  # /metrics (fake_metrics.py)
        self.http: _Server | None = None
        self.bootstrap: _Server | None = None
        self._threads: list[threading.Thread] = []

    # ---- process lifecycle ------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        signal.signal(signal.SIGTERM, self._on_sigterm)
        log(
            f"fake_sglang {VERSION} (test stand-in, not SGLang) pid={os.getpid()} "
            f"server_args: model_path={a.model_path!r} served_model_name={self.served_name!r} "
            f"host={a.host} port={a.port} disaggregation_mode={self.role} "
            f"disaggregation_bootstrap_port={a.disaggregation_bootstrap_port} "
            f"disaggregation_transfer_backend={a.disaggregation_transfer_backend} "
            f"tp_size={a.tp_size} dp_size={a.dp_size} dist_init_addr={a.dist_init_addr}"
        )
        if self.pd:
            log(
                f"NIXL agent name: {self.pair.instance_id} (fresh uuid4 per process; "
                f"stale_pair={self.pair.stale_mode} pair_failure={self.pair.failure_mode})",
                tag="TP0",
            )
        if self.ignored:
            log(f"fake_sglang: ignoring {len(self.ignored)} argv item(s): {' '.join(self.ignored)}")

        if not os.path.isdir(a.model_path):
            # What transformers (AutoConfig, via SGLang's get_config) raises for a local path that
            # does not exist: it is not a valid Hub repo id either.
            _emit(
                f"OSError: Incorrect path_or_model_id: '{a.model_path}'. Please provide either "
                "the path to a local folder or the repo_id of a model on the Hub."
            )
            return 1

        if self.state_dir:
            os.makedirs(self.state_dir, exist_ok=True)
            _write_atomic(os.path.join(self.state_dir, "engine.pid"), f"{os.getpid()}\n")
        if _env_flag("FAKE_SGLANG_SPAWN_ORPHAN"):
            self._spawn_orphan()

        if a.nnodes > 1 and not a.dist_init_addr:
            _emit("ValueError: --dist-init-addr is required when --nnodes > 1")
            return 1
        # SGLang itself starts its HTTP server only once the schedulers loaded the weights (the
        # port is closed meanwhile); by default the stand-in binds at once (503 while loading),
        # FAKE_SGLANG_HTTP_AFTER_LOAD=1 keeps SGLang's order
        late_bind = _env_flag("FAKE_SGLANG_HTTP_AFTER_LOAD")
        if a.node_rank == 0 and not late_bind:
            rc = self._bind()
            if rc:
                return rc
        elif a.node_rank:  # SGLang: ranks > 0 run no tokenizer/detokenizer, hence no HTTP
            log(f"node_rank={a.node_rank}: no HTTP server (rank 0 serves {a.port})", tag="TP0")
        if a.nnodes > 1:
            rc = _Rendezvous(self).join()
            if rc:
                return rc

        # Loading: weights, then JIT kernels (warmup). /health stays 503 meanwhile.
        log(f"Load weight begin. role={self.role}", tag="TP0")
        t = time.monotonic()
        self._sleep(self.load_secs or 0.0)
        log(f"Load weight end. type=FakeForCausalLM, elapsed={time.monotonic() - t:.2f} s", "TP0")
        if a.node_rank == 0 and late_bind:
            rc = self._bind()
            if rc:
                return rc
        rc = self._jit_compile()
        if rc:
            return rc
        if self.role == "prefill":
            log("Cuda graph is disabled for prefill server (fake)", tag="TP0")
        self.state = "ready"
        ready_at = time.monotonic()
        log(
            f"The server is fired up and ready to roll! (fake_sglang {self.role} on "
            f"{a.host}:{a.port}, startup {ready_at - self.started:.2f} s)"
        )

        crash_at = ready_at + self.crash_after if self.crash_after is not None else None
        hang_at = ready_at + self.hang_after if self.hang_after is not None else None
        while True:
            self._sleep(0.05)
            now = time.monotonic()
            if crash_at is not None and now >= crash_at:
                log(
                    f"Scheduler hit an exception: RuntimeError: fake crash "
                    f"(FAKE_SGLANG_CRASH_AFTER={self.crash_after}); exiting with status 1"
                )
                os._exit(1)
            if hang_at is not None and now >= hang_at:
                hang_at = None
                self.hang = True
                log(
                    f"fake_sglang: hanging now (FAKE_SGLANG_HANG_AFTER={self.hang_after}): "
                    "connections are accepted, requests are never answered"
                )

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Runs in the main thread between bytecodes; only set a flag (no I/O, no locks).
        self.term_requested = True

    def _sleep(self, secs: float) -> None:
        """Sleep in short steps; act on SIGTERM and the lifetime limit in the meantime."""
        end = time.monotonic() + max(0.0, secs)
        while True:
            if self.term_requested:
                self._terminate()
            age = time.monotonic() - self.started
            if self.max_lifetime is not None and age > self.max_lifetime:
                log(
                    f"fake_sglang: FAKE_SGLANG_MAX_LIFETIME={self.max_lifetime} s reached; "
                    "exiting (safety net)"
                )
                os._exit(0)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.05, left))

    def _terminate(self) -> None:
        """SGLang's SIGTERM path: drain, then kill the process tree including itself."""
        self.term_requested = False
        if self.graceful_exit:
            return  # already draining (nested call from _sleep)
        self.graceful_exit = True
        log(
            "SIGTERM received. signum=15. Draining requests and shutting down... "
            f"(fake_sglang {self.role})"
        )
        force = _env_flag("SGLANG_FORCE_SHUTDOWN") or _env_flag("SGL_FORCE_SHUTDOWN")
        t0 = last_note = time.monotonic()
        while not force and self.inflight > 0:
            if self.drain_max is not None and time.monotonic() - t0 >= self.drain_max:
                log(f"fake_sglang: FAKE_SGLANG_DRAIN_MAX_SECS={self.drain_max} s reached")
                break
            if time.monotonic() - last_note >= 5.0:
                last_note = time.monotonic()
                log(f"Gracefully exiting... Remaining number of requests {self.inflight}.")
            self._sleep(0.05)
        for srv in (self.http, self.bootstrap):
            if srv is not None:
                srv.stop()
        victims = _descendants(os.getpid())
        if _env_flag("FAKE_SGLANG_CLEAN_EXIT"):
            for pid in victims:
                _kill_quietly(pid)
            log("fake_sglang: FAKE_SGLANG_CLEAN_EXIT=1, exiting with status 0")
            os._exit(0)
        log(
            f"Killing process tree of pid {os.getpid()} with SIGKILL, including itself "
            f"({len(victims)} descendant(s)); exit status will be 137"
        )
        for pid in victims:
            _kill_quietly(pid)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(5)  # not reached
        os._exit(137)

    # ---- startup pieces ---------------------------------------------------------------------

    def _bind(self) -> int:
        a = self.args
        binding = (a.host, a.disaggregation_bootstrap_port)
        try:
            if self.role == "prefill":  # SGLang starts it for prefill only, on --host
                self.bootstrap = _Server(binding, _BootstrapHandler, self, "bootstrap")
                self.bootstrap.start()
                log(
                    f"Bootstrap server listening on {a.host}:{a.disaggregation_bootstrap_port} "
                    "(GET /health, GET/PUT /route)"
                )
            binding = (a.host, a.port)
            self.http = _Server(binding, _EngineHandler, self, "http")
            self.http.start()
        except OSError as e:
            _emit(
                f"OSError: [Errno {e.errno}] error while attempting to bind on address "
                f"('{binding[0]}', {binding[1]}): {(e.strerror or str(e)).lower()}"
            )
            return 1
        log(f"Uvicorn running on http://{a.host}:{a.port} (fake_sglang; /health: 503 until loaded)")
        return 0

    def _spawn_orphan(self) -> None:
        secs = min(ORPHAN_MAX_SECS, _env_float("FAKE_SGLANG_ORPHAN_SECS", ORPHAN_MAX_SECS) or 0.0)
        sleeper = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            f"time.sleep({secs!r})\n"
        )
        # Double fork: the sleeper starts in its own session and is reparented (to PID 1 or the
        # nearest subreaper) as soon as the launcher exits, like SGLang scheduler processes that
        # outlive their launcher (sglang #23627). Only killing its cgroup gets rid of it.
        launcher = (
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], 'fake-sglang-orphan'],"
            " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
            " stderr=subprocess.DEVNULL, close_fds=True)\n"
            "print(p.pid)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", launcher, sleeper],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        pid = int(out.stdout.strip())
        log(
            f"fake_sglang: spawned orphan pid={pid} (own session, ignores SIGTERM, "
            f"sleeps {secs:g} s; FAKE_SGLANG_SPAWN_ORPHAN=1)"
        )
        if self.state_dir:
            _write_atomic(os.path.join(self.state_dir, "orphan.pid"), f"{pid}\n")

    def _jit_compile(self) -> int:
        base = os.environ.get("TRITON_CACHE_DIR")
        if not base:
            log("jit cache: TRITON_CACHE_DIR is not set; skipping the fake kernel compile", "TP0")
            return 0
        cdir = os.path.join(base, "fake-sglang")
        try:
            os.makedirs(cdir, exist_ok=True)
        except OSError as e:
            _emit(f"{type(e).__name__}: cannot create JIT cache dir {cdir}: {e}")
            return 1
        artifact = os.path.join(cdir, f"{self.role}.kernels")
        t0 = time.monotonic()
        if os.path.exists(artifact):
            log(f"jit cache warm: loading kernels for role={self.role} from {artifact}", "TP0")
            self._sleep(self.warm_secs or 0.0)
            log(f"jit cache warm: loaded {artifact} in {time.monotonic() - t0:.2f} s", "TP0")
            return 0
        lock = os.path.join(cdir, ".compiling")
        err = self._acquire_compile_lock(lock, cdir)
        if err:
            _emit(err)
            return 1
        log(
            f"jit cache cold: compiling kernels for role={self.role} into {cdir} "
            f"(lock {lock}, ~{self.cold_secs:g} s)",
            "TP0",
        )
        try:
            # A SIGTERM here leaves the lock behind, as a killed compile does; a later start
            # takes the stale lock over because its pid is dead.
            self._sleep(self.cold_secs or 0.0)
            payload = {
                "fake": True,
                "role": self.role,
                "model_path": self.args.model_path,
                "tp_size": self.args.tp_size,
                "compiled_by_pid": os.getpid(),
                "compiled_at": time.time(),
                "kernels": ["fused_moe_fake", "attention_fake", "sampling_fake"],
            }
            _write_atomic(artifact, json.dumps(payload) + "\n")
        finally:
            if self._read_lock_pid(lock, wait=False) == os.getpid():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
        log(f"jit cache cold: compiled {artifact} in {time.monotonic() - t0:.2f} s", "TP0")
        return 0

    def _acquire_compile_lock(self, lock: str, cdir: str) -> str | None:
        holder: int | None = None
        for _ in range(5):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read_lock_pid(lock, wait=True)
                if holder is not None and holder != os.getpid() and _pid_alive(holder):
                    return (
                        f"RuntimeError: JIT cache race: another process (pid {holder}) is "
                        f"compiling into cold cache {cdir} (FileExistsError EEXIST, "
                        "cf. DeepGEMM #301)"
                    )
                log(
                    f"jit cache: taking over stale compile lock {lock} "
                    f"(holder pid {holder} is not running)",
                    "TP0",
                )
                if self._read_lock_pid(lock, wait=False) == holder:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(lock)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            return None
        return (
            f"RuntimeError: JIT cache race: another process (pid {holder}) is compiling into "
            f"cold cache {cdir} (FileExistsError EEXIST, cf. DeepGEMM #301)"
        )

    @staticmethod
    def _read_lock_pid(lock: str, wait: bool) -> int | None:
        # The holder writes its pid right after the O_EXCL create; give it a moment.
        for _ in range(10 if wait else 1):
            try:
                with open(lock, encoding="utf-8") as f:
                    text = f.read().strip()
            except FileNotFoundError:
                return None
            if text.isdigit():
                return int(text)
            if wait:
                time.sleep(0.05)
        return None

    # ---- request-side state -----------------------------------------------------------------

    @contextlib.contextmanager
    def in_flight(self, counted: bool):
        if counted:
            with self._lock:
                self.inflight += 1
        try:
            yield
        finally:
            if counted:
                with self._lock:
                    self.inflight -= 1

    def wait_while_hung(self, kind: str) -> None:
        while self.hang and (kind == "http" or self.hang_bootstrap):
            time.sleep(0.05)

    def record(
        self, kind: str, port: int, method: str, path: str, headers: dict, body: Any
    ) -> None:
        if not self.reqlog_path:
            return
        line = json.dumps(
            {
                "t": time.time(),
                "role": self.role,
                "port": port,
                "server": kind,
                "pid": os.getpid(),
                "method": method,
                "path": path,
                "headers": headers,
                "body": body,
            }
        )
        try:
            fd = os.open(self.reqlog_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as e:
            log(f"fake_sglang: cannot write request log {self.reqlog_path}: {e}")

    def control_state(self) -> dict:
        return {
            "role": self.role,
            "pid": os.getpid(),
            "state": self.state,
            "graceful_exit": self.graceful_exit,
            "hang": self.hang,
            "hang_bootstrap": self.hang_bootstrap,
            "health": self.health_override,
            "gen_delay": self.gen_delay,
            "inflight": self.inflight,
            **self.pair.snapshot(),
        }

    def server_info(self) -> dict:
        a = self.args
        return {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "served_model_name": self.served_name,
            "host": a.host,
            "port": a.port,
            "tp_size": a.tp_size,
            "dp_size": a.dp_size,
            "dist_init_addr": a.dist_init_addr,
            "disaggregation_mode": self.role,
            "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
            "disaggregation_transfer_backend": a.disaggregation_transfer_backend,
            "load_balance_method": (
                "follow_bootstrap_room" if self.role == "prefill" else "round_robin"
            ),
            "max_running_requests": a.max_running_requests or 256,
            "enable_metrics": a.enable_metrics,
            "version": VERSION,
            "status": self.state,
            "internal_states": [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}],
            "fake_sglang": True,
            "fake_instance_id": self.pair.instance_id,
        }

    def model_info(self) -> dict:
        a = self.args
        model_type, archs = "fake", ["FakeForCausalLM"]
        try:
            with open(os.path.join(a.model_path, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            model_type = cfg.get("model_type", model_type)
            archs = cfg.get("architectures", archs)
        except (OSError, ValueError, AttributeError):
            pass
        return {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": model_type,
            "architectures": archs,
        }


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------ HTTP layer


class _Rendezvous:
    """``--nnodes N > 1``: torch.distributed's rendezvous at ``--dist-init-addr`` (a TCP store
    on rank 0's host) and the NCCL group it stands for. Rank 0 listens there and waits for
    ranks 1…N-1 (each says ``rank R``); the others connect, retrying, and stay connected. A
    lost peer afterwards is fatal on both sides, as an NCCL communicator error is (exit 1).
    ``FAKE_SGLANG_RENDEZVOUS_TIMEOUT`` (600 s) bounds the wait, as SGLang's dist timeout does."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        a = engine.args
        host, _, port = a.dist_init_addr.rpartition(":")
        self.addr = (host.strip("[]"), int(port))
        self.rank, self.nnodes = a.node_rank, a.nnodes
        self.timeout = _env_float("FAKE_SGLANG_RENDEZVOUS_TIMEOUT", 600.0)

    def join(self) -> int:
        log(f"Init torch distributed begin. rank={self.rank} nnodes={self.nnodes} "
            f"dist_init_addr={self.addr[0]}:{self.addr[1]}", tag="TP0")
        peers = self._lead() if self.rank == 0 else self._follow()
        if peers is None:
            return 1
        for rank, conn in peers:
            threading.Thread(target=self._watch, args=(rank, conn), daemon=True).start()
        log(f"Init torch distributed ends. {self.nnodes} nodes joined", tag="TP0")
        return 0

    def _lead(self) -> list[tuple[int, socket.socket]] | None:
        try:
            srv = socket.create_server(self.addr, reuse_port=False)
        except OSError as e:
            _emit(f"RuntimeError: The server socket has failed to listen on any local network "
                  f"address. port: {self.addr[1]}, useIpv6: 0, code: -{e.errno}, name: "
                  f"EADDRINUSE, message: {(e.strerror or str(e)).lower()}")
            return None
        srv.settimeout(0.2)
        peers: list[tuple[int, socket.socket]] = []
        deadline = time.monotonic() + self.timeout
        while len(peers) < self.nnodes - 1:
            self.engine._sleep(0)  # SIGTERM and the lifetime limit still apply
            if time.monotonic() > deadline:
                _emit(f"torch.distributed.DistStoreError: Timed out after {self.timeout:g} s "
                      f"waiting for {self.nnodes - 1 - len(peers)} node(s) to join")
                return None
            try:
                conn, (ip, _) = srv.accept()
            except OSError:
                continue
            conn.settimeout(5)
            try:
                rank = int(conn.recv(64).decode().split()[1])
            except (OSError, ValueError, IndexError):
                conn.close()
                continue
            conn.settimeout(None)
            log(f"node rank {rank} joined from {ip}", tag="TP0")
            peers.append((rank, conn))
        srv.close()
        return peers

    def _follow(self) -> list[tuple[int, socket.socket]] | None:
        deadline = time.monotonic() + self.timeout
        while True:
            self.engine._sleep(0)
            try:
                conn = socket.create_connection(self.addr, timeout=2)
                conn.sendall(f"rank {self.rank}\n".encode())
                conn.settimeout(None)
                log(f"connected to rank 0 at {self.addr[0]}:{self.addr[1]}", tag="TP0")
                return [(0, conn)]
            except OSError as e:
                if time.monotonic() > deadline:
                    _emit(f"torch.distributed.DistNetworkError: cannot connect to "
                          f"{self.addr[0]}:{self.addr[1]} after {self.timeout:g} s: {e}")
                    return None
                time.sleep(0.2)

    def _watch(self, rank: int, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(64):
                pass
        if self.engine.term_requested:
            return  # our own shutdown closed it
        _emit(f"[rank{self.rank}] NCCL error: connection to node rank {rank} lost "
              f"(remote process exited or there was a network error); exiting with status 1")
        os._exit(1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], handler: type, engine: Engine, kind: str) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.engine = engine
        self.kind = kind
        self._thread: threading.Thread | None = None
        super().__init__(addr, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup; skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.server_address[1]

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name=f"fake-sglang-{self.kind}",
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.shutdown()
        self.server_close()


class _BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    timeout = 120  # idle keep-alive connections do not pin a thread forever
    server: _Server

    def parse_request(self) -> bool:
        # The router's gRPC health probes open with the HTTP/2 prior-knowledge preface. The
        # stdlib would answer it HTTP/0.9-style (a bare body); send a proper HTTP/1.1 505 and
        # close the connection instead.
        if self.raw_requestline.startswith(b"PRI * HTTP/2"):
            self.command = None
            self.request_version = "HTTP/1.1"
            self.requestline = "PRI * HTTP/2.0"
            self.close_connection = True
            self.send_error(505, "HTTP/2 is not supported (fake_sglang speaks HTTP/1.1)")
            return False
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.engine.access_log:
            log(f"INFO:     {self.client_address[0]}:{self.client_address[1]} - {format % args}")

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            try:
                raw = self._read_body()
            except ValueError as e:
                self.close_connection = True
                self._json(400, {"error": {"message": f"bad request body: {e}"}})
                return
            body, parse_error = _parse_body(raw)
            self.server.engine.record(
                self.server.kind,
                self.server.server_port,
                self.command,
                self.path,
                dict(self.headers.items()),
                body if parse_error is None else raw.decode("latin-1"),
            )
            self.route(urlsplit(self.path), body, parse_error)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def route(self, url: Any, body: Any, parse_error: str | None) -> None:
        raise NotImplementedError

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size_line = self.rfile.readline(65537)
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError as e:
                    raise ValueError("bad chunk size") from e
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(65537)
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            n = int(length)
        except ValueError as e:
            raise ValueError("bad Content-Length") from e
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    # chunked SSE
    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _sse(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        chunk = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    def _sse_end(self) -> None:
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


def _parse_body(raw: bytes) -> tuple[Any, str | None]:
    if not raw.strip():
        return None, None
    try:
        return json.loads(raw), None
    except ValueError as e:
        return None, str(e)


class _BootstrapHandler(_BaseHandler):
    """The prefill's bootstrap server (SGLang: CommonKVBootstrapServer, aiohttp)."""

    def route(self, url: Any, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        eng.wait_while_hung("bootstrap")
        a = eng.args
        path, method = url.path, self.command
        if path == "/health" and method == "GET":
            self._text(200, "OK")
        elif path == "/route" and method == "GET":
            q = parse_qs(url.query)
            rank = int(q.get("engine_rank", ["-1"])[0] or -1)
            if rank == -1:
                self._json(
                    200,
                    {
                        "prefill_attn_tp_size": a.tp_size,
                        "prefill_dp_size": a.dp_size,
                        "prefill_pp_size": 1,
                        "prefill_page_size": 1,
                        "fake_sglang": True,
                        "fake_instance_id": eng.pair.instance_id,
                    },
                )
            else:
                self._json(200, {"rank_ip": a.host, "rank_port": a.disaggregation_bootstrap_port})
        elif path == "/route" and method == "PUT":
            self._text(200, "OK")
        elif path in ("/register_dp_rank", "/query_dp_ranks") and method == "POST":
            self._json(200, {"dp_rank": 0, "fake_sglang": True})
        elif path == fake_pair.PAIR_PATH and method == "GET":
            self._json(200, {"role": eng.role, **eng.pair.snapshot()})
        elif path == fake_pair.PAIR_PATH and method == "POST":
            self._pair(body)
        else:
            self._text(404, "404: Not Found")

    def _pair(self, body: Any) -> None:
        """A decode registers (its KV args, in SGLang) and learns our instance id."""
        eng = self.server.engine
        rooms = body.get("bootstrap_rooms") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("peer"), str)
            or not isinstance(body.get("instance_id"), str)
            or not isinstance(rooms, list)
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in rooms)
        ):
            self._json(400, {"error": "expected {peer: str, instance_id: str, "
                                      "bootstrap_rooms: [int]}"})  # fmt: skip
            return
        # A decode bound to a wildcard address is known by the address it connects from (SGLang's
        # decode registers its own reachable IP likewise), so that two decode hosts listening
        # on 0.0.0.0:30000 stay two peers.
        host, _, port = body["peer"].rpartition(":")
        peer = body["peer"]
        if host.strip("[]") in ("0.0.0.0", "::", ""):
            peer = f"{self.client_address[0]}:{port}"
        # see the peer first: a room's registration must find the staleness already decided
        message = eng.pair.see_peer(peer, body["instance_id"])
        eng.pair.register_rooms(peer, rooms)
        self._json(
            200,
            {
                "instance_id": eng.pair.instance_id,
                "role": eng.role,
                "stale": message is not None,
                "message": message,
            },
        )


_GET = frozenset({"GET"})
_POST = frozenset({"POST"})

#: path -> (allowed methods, handler name)
_ROUTES: dict[str, tuple[frozenset[str], str]] = {
    "/health": (_GET, "h_health"),
    "/health_generate": (_GET, "h_health"),
    "/server_info": (_GET, "h_server_info"),
    "/get_server_info": (_GET, "h_server_info"),
    "/model_info": (_GET, "h_model_info"),
    "/get_model_info": (_GET, "h_model_info"),
    "/v1/models": (_GET, "h_models"),
    "/get_load": (_GET, "h_get_load"),
    "/metrics": (_GET, "h_metrics"),
    "/flush_cache": (frozenset({"GET", "POST"}), "h_flush_cache"),
    "/generate": (frozenset({"POST", "PUT"}), "h_generate"),
    "/v1/completions": (_POST, "h_generate"),
    "/v1/chat/completions": (_POST, "h_generate"),
}


class _EngineHandler(_BaseHandler):
    """The engine's HTTP API (SGLang: FastAPI under uvicorn)."""

    def route(self, url: Any, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        path = url.path
        if path == "/_fake/control":
            self.h_control(body, parse_error)
            return
        entry = _ROUTES.get(path)
        generation = entry is not None and entry[1] == "h_generate" and self.command in entry[0]
        # A generation counts as in flight from arrival, hung or not, so a SIGTERM drains it
        # (without bound, like SGLang) while /health already answers 503.
        with eng.in_flight(generation):
            eng.wait_while_hung("http")
            self._route(path, entry, body, parse_error)

    def _route(self, path: str, entry: tuple | None, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        key = eng.args.api_key
        if (
            key
            and not path.startswith(("/health", "/metrics"))
            and self.headers.get("Authorization") != f"Bearer {key}"
        ):
            self._json(401, {"error": "Unauthorized"})
            return
        if entry is None or (path == "/metrics" and not eng.args.enable_metrics):
            self._json(404, {"detail": "Not Found"})
            return
        methods, name = entry
        if self.command not in methods:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        getattr(self, name)(path, body, parse_error)

    # ---- simple endpoints -------------------------------------------------------------------

    def h_health(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        ok = eng.state == "ready" and not eng.graceful_exit and eng.health_override == "ok"
        self._send(200 if ok else 503, b"", "text/plain; charset=utf-8")

    def h_server_info(self, path: str, body: Any, parse_error: str | None) -> None:
        self._json(200, self.server.engine.server_info())

    def h_model_info(self, path: str, body: Any, parse_error: str | None) -> None:
        self._json(200, self.server.engine.model_info())

    def h_models(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        self._json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": eng.served_name,
                        "object": "model",
                        "created": int(eng.started_wall),
                        "owned_by": "sglang",
                        "root": eng.served_name,
                        "max_model_len": 4096,
                    }
                ],
            },
        )

    def h_get_load(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        self._json(
            200,
            [
                {
                    "dp_rank": r,
                    "num_reqs": eng.inflight if r == 0 else 0,
                    "num_waiting_reqs": 0,
                    "num_tokens": 0,
                }
                for r in range(max(1, eng.args.dp_size))
            ],
        )

    def h_metrics(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        kind = eng.role if eng.role in ("prefill", "decode") else "unified"
        text = eng.metrics.text(eng.served_name, kind, eng.inflight)
        # pdsvc bench's knobs (fake_latency) count into the same counters; it adds only what
        # the text lacks
        text += fake_latency.MODEL.metric_text(f'{{model_name="{eng.served_name}"}}', text)
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def h_flush_cache(self, path: str, body: Any, parse_error: str | None) -> None:
        self._text(
            200,
            "Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n",
        )

    def h_control(self, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        if self.command == "GET":
            self._json(200, eng.control_state())
            return
        if self.command != "POST":
            self._json(405, {"detail": "Method Not Allowed"})
            return
        if parse_error is not None or not isinstance(body, dict):
            self._json(400, {"error": {"message": "control body must be a JSON object"}})
            return
        unknown = set(body) - {
            "hang", "hang_bootstrap", "health", "gen_delay", "crash",
            "stale_pair", "pair_failure", "new_instance",
        }  # fmt: skip
        if unknown:
            self._json(400, {"error": {"message": f"unknown control keys: {sorted(unknown)}"}})
            return
        if "health" in body and body["health"] not in ("ok", "fail"):
            self._json(400, {"error": {"message": "health must be 'ok' or 'fail'"}})
            return
        try:
            stale_mode = (
                fake_pair.parse_stale_mode(body["stale_pair"]) if "stale_pair" in body else None
            )
            failure_mode = (
                fake_pair.parse_failure_mode(body["pair_failure"])
                if "pair_failure" in body
                else None
            )
        except (ValueError, AttributeError) as e:
            self._json(400, {"error": {"message": str(e)}})
            return
        if stale_mode is not None:
            eng.pair.stale_mode = stale_mode
        if failure_mode is not None:
            eng.pair.failure_mode = failure_mode
        if body.get("new_instance"):
            eng.pair.new_instance()
        if "hang" in body:
            eng.hang = bool(body["hang"])
        if "hang_bootstrap" in body:
            eng.hang_bootstrap = bool(body["hang_bootstrap"])
        if "health" in body:
            eng.health_override = body["health"]
        if "gen_delay" in body:
            eng.gen_delay = float(body["gen_delay"] or 0.0)
        log(f"fake_sglang: control {json.dumps(body)}")
        self._json(200, eng.control_state())
        if body.get("crash"):

            def crash() -> None:
                log("Scheduler hit an exception: RuntimeError: fake crash (control); exiting 1")
                os._exit(1)

            threading.Timer(0.1, crash).start()

    # ---- generation -------------------------------------------------------------------------

    def h_generate(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        self._t0 = time.monotonic()  # arrival, for the TTFT fake_metrics observes
        if parse_error is not None or not isinstance(body, dict):
            why = parse_error or f"got {type(body).__name__}"
            self._json(400, _err(f"request body must be a JSON object ({why})", 400))
            return
        if eng.state != "ready":
            self._json(
                503,
                _err(
                    "The server is still starting (loading weights / warming up).",
                    503,
                    "ServiceUnavailable",
                ),
            )
            return
        if eng.graceful_exit:
            self._json(
                503, _err("The server is shutting down (graceful exit).", 503, "ServiceUnavailable")
            )
            return
        kind = {"/generate": "generate", "/v1/completions": "completions"}.get(path, "chat")
        prompts = _prompts(kind, body)
        n = len(prompts)
        boot: dict[str, list] = {}
        if eng.pd:
            boot, problem = _bootstrap_fields(body, n)
            if problem is not None:
                field, msg = problem
                self._json(400, _err(f"PD disaggregation ({eng.role}) {msg}", 400, param=field))
                return
            if len(boot["bootstrap_room"]) != n:  # one prompt per bootstrap entry
                n = len(boot["bootstrap_room"])
                prompts = [prompts[min(i, len(prompts) - 1)] for i in range(n)]
        failures: dict[int, str] = {}  # item index -> why its KV transfer failed (pair state)
        if eng.role == "decode":
            failure, failures = self._reach_prefill(boot)
            if failure is not None:
                eng.metrics.bootstrap_failure()
                self._json(500, _err(failure, 500, "InternalServerError"))
                return
        elif eng.role == "prefill":
            failures = self._pair_failures(boot)
        if failures and eng.pair.failure_mode == "error500":
            self._json(500, _err(next(iter(failures.values())), 500, "InternalServerError"))
            return
        if eng.gen_delay > 0:
            time.sleep(eng.gen_delay)
        if not failures and fake_latency.MODEL.serve(self, kind, body, eng.role):
            return  # the latency model answered (tests/support/fake_latency.py)
        self._answer(kind, body, prompts, boot, failures)

    def _reach_prefill(self, boot: dict[str, list]) -> tuple[str | None, dict[int, str]]:
        """Decode side: contact the prefill bootstrap server(s) named in the request, register
        with each (its NIXL pair exchange) and learn the prefill's instance id. Returns a hard
        failure (500 whatever the failure mode) or the items whose transfer fails by pair
        state."""
        eng = self.server.engine
        peers: dict[tuple[str, int], list[int]] = {}  # (host, port) -> item indices
        for i, (host, port) in enumerate(
            zip(boot["bootstrap_host"], boot["bootstrap_port"], strict=True)
        ):
            if port is None:  # SGLang's decode scheduler substitutes its own flag value
                port = eng.args.disaggregation_bootstrap_port
            if host != FAKE_BOOTSTRAP_HOST:
                peers.setdefault((host, port), []).append(i)
        failures: dict[int, str] = {}
        timeout = eng.bootstrap_timeout or 2.0
        for (host, port), items in peers.items():
            rooms = [boot["bootstrap_room"][i] for i in items]
            reason = _probe_bootstrap(host, port, timeout)
            if reason is None:
                reply, reason = fake_pair.exchange(
                    host, port, eng.pair_key, eng.pair.instance_id, rooms, timeout
                )
            if reason is not None:
                log(
                    f"KV transfer failed for bootstrap_room={rooms[0]}: cannot reach prefill "
                    f"bootstrap server {host}:{port} ({reason})",
                    "TP0",
                )
                return (
                    f"KV transfer failed: cannot reach prefill bootstrap server {host}:{port} "
                    f"({reason}); bootstrap_room={rooms[0]}"
                ), {}
            if reply is None:  # a bootstrap server without pair state: nothing to check
                continue
            # sglang #33789: a decode keeps the dead prefill's endpoints (this side is stale);
            # smg #2382 / vllm #49238: the prefill kept a replaced decode's agent (that side is)
            why = eng.pair.see_peer(f"{host}:{port}", reply["instance_id"])
            if why is None and reply.get("stale"):
                why = str(reply.get("message") or "KV transfer failed: prefill peer is stale")
            if why is not None:
                for i in items:
                    failures[i] = why
                log(f"KV transfer failed for bootstrap_room={rooms[0]}: {why}", "TP0")
        return None, failures

    def _pair_failures(self, boot: dict[str, list]) -> dict[int, str]:
        """Prefill side: the items whose decode peer this prefill is stale for (smg #2382,
        vllm #49238). Only a prefill that may go stale (or already is) waits for the decode's
        registration of each bootstrap_room; otherwise nothing changes."""
        eng = self.server.engine
        if not boot or not (eng.pair.stale_enabled or eng.pair.stale):
            return {}
        failures: dict[int, str] = {}
        deadline = time.monotonic() + eng.pair_wait
        for i, (host, room) in enumerate(
            zip(boot["bootstrap_host"], boot["bootstrap_room"], strict=True)
        ):
            if host == FAKE_BOOTSTRAP_HOST:
                continue
            peer = eng.pair.wait_room(room, deadline - time.monotonic())
            why = eng.pair.stale_for(peer) if peer is not None else None
            if why is not None:
                failures[i] = why
                log(f"KV transfer failed for bootstrap_room={room}: {why}", "TP0")
        return failures

    def _answer(
        self,
        kind: str,
        body: dict,
        prompts: list,
        boot: dict[str, list],
        failures: dict[int, str] | None = None,
    ) -> None:
        eng = self.server.engine
        port = self.server.server_port
        ok_text = "" if eng.role == "prefill" else f"[{eng.role}@{port}] hello from fake engine"
        failures = failures or {}
        # an item whose KV transfer failed comes back like SGLang's aborted request: HTTP 200,
        # empty text, finish_reason {"type": "abort", ...} (smg #2382, vllm #49238)
        texts = ["" if i in failures else ok_text for i in range(len(prompts))]
        text, words = texts[0], texts[0].split()
        batch = len(prompts) > 1 or _is_batch(kind, body)
        stream = bool(body.get("stream"))
        model = body.get("model") if isinstance(body.get("model"), str) else None
        model = model if model and model != "unknown" else eng.served_name
        created = int(time.time())
        items = []
        for i, prompt in enumerate(prompts):
            ptoks = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
            n_words = len(texts[i].split())
            finish: dict[str, Any] = (
                {"type": "abort", "message": failures[i]}
                if i in failures
                else {"type": "length", "length": n_words}
            )
            meta = {
                "id": uuid.uuid4().hex,
                "finish_reason": finish,
                "prompt_tokens": ptoks,
                "completion_tokens": n_words,
                "cached_tokens": 0,
                "e2e_latency": 0.001,
                "role": eng.role,
                "port": port,
                "pid": os.getpid(),
            }
            if boot:
                meta["bootstrap_room_seen"] = boot["bootstrap_room"][i]
                meta["bootstrap_host_seen"] = boot["bootstrap_host"][i]
                meta["bootstrap_port_seen"] = boot["bootstrap_port"][i]
            items.append(meta)
        with eng._lock:
            eng.counters["requests"] += len(items)
            eng.counters["prompt_tokens"] += sum(m["prompt_tokens"] for m in items)
            eng.counters["generation_tokens"] += sum(m["completion_tokens"] for m in items)
        eng.metrics.served(items, len(failures), time.monotonic() - self._t0)
        meta_out: Any = items if batch else items[0]
        # OpenAI choices carry the finish_reason's type ("length", or "abort" for a failure)
        reasons = [m["finish_reason"]["type"] for m in items]

        if kind == "generate":
            if not stream:
                outs = [
                    {"text": texts[i], "output_ids": list(range(len(texts[i].split()))),
                     "meta_info": m}
                    for i, m in enumerate(items)
                ]  # fmt: skip
                self._json(200, outs if batch else outs[0])
                return
            self._sse_start()
            for i, m in enumerate(items):
                text, words = texts[i], texts[i].split()
                for k in range(1, len(words) + 1):
                    chunk = {
                        "text": " ".join(words[:k]),
                        "output_ids": list(range(k)),
                        "meta_info": {**m, "completion_tokens": k, "finish_reason": None},
                    }
                    if batch:
                        chunk["index"] = i
                    self._sse(chunk)
                final = {"text": text, "output_ids": list(range(len(words))), "meta_info": m}
                if batch:
                    final["index"] = i
                self._sse(final)
            self._sse_end()
            return

        usage = {
            "prompt_tokens": sum(m["prompt_tokens"] for m in items),
            "completion_tokens": sum(m["completion_tokens"] for m in items),
            "total_tokens": sum(m["prompt_tokens"] + m["completion_tokens"] for m in items),
            "prompt_tokens_details": None,
        }
        if kind == "chat":
            rid = "chatcmpl-" + uuid.uuid4().hex
            if not stream:
                self._json(
                    200,
                    {
                        "id": rid,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {
                                    "role": "assistant",
                                    "content": text,
                                    "reasoning_content": None,
                                    "tool_calls": None,
                                },
                                "logprobs": None,
                                "finish_reason": reasons[0],
                                "matched_stop": None,
                            }
                        ],
                        "usage": usage,
                        "meta_info": meta_out,
                    },
                )
                return
            self._sse_start()
            base = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
            }
            self._sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            for k, w in enumerate(words):
                self._sse(
                    {
                        **base,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": w if k == 0 else " " + w},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            self._sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": reasons[0],
                            "matched_stop": None,
                        }
                    ],
                    "usage": usage,
                    "meta_info": meta_out,
                }
            )
            self._sse_end()
            return

        rid = "cmpl-" + uuid.uuid4().hex
        if not stream:
            self._json(
                200,
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": i,
                            "text": texts[i],
                            "logprobs": None,
                            "finish_reason": reasons[i],
                            "matched_stop": None,
                        }
                        for i in range(len(items))
                    ],
                    "usage": usage,
                    "meta_info": meta_out,
                },
            )
            return
        self._sse_start()
        base = {"id": rid, "object": "text_completion", "created": created, "model": model}
        for i in range(len(items)):
            for k, w in enumerate(texts[i].split()):
                self._sse(
                    {
                        **base,
                        "choices": [
                            {
                                "index": i,
                                "text": w if k == 0 else " " + w,
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            self._sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": i,
                            "text": "",
                            "logprobs": None,
                            "finish_reason": reasons[i],
                            "matched_stop": None,
                        }
                    ],
                }
            )
        self._sse({**base, "choices": [], "usage": usage, "meta_info": meta_out})
        self._sse_end()


def _err(message: str, code: int, etype: str = "BadRequestError", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def _is_batch(kind: str, body: dict) -> bool:
    if kind == "generate":
        ids = body.get("input_ids")
        return isinstance(body.get("text"), list) or (
            isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        )
    if kind == "completions":
        p = body.get("prompt")
        return isinstance(p, list) and bool(p) and not isinstance(p[0], int)
    return False


def _prompts(kind: str, body: dict) -> list:
    if kind == "generate":
        src = body.get("text") if body.get("text") is not None else body.get("input_ids")
    elif kind == "completions":
        src = body.get("prompt")
    else:
        msgs = body.get("messages")
        src = (
            " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            if isinstance(msgs, list)
            else ""
        )
        return [src]
    if _is_batch(kind, body):
        return list(src) or [""]
    return [src if src is not None else ""]


_BOOT_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def _bootstrap_fields(body: dict, n: int) -> tuple[dict[str, list], tuple[str, str] | None]:
    """The router's injected fields, broadcast to lists; or (field, problem)."""
    out: dict[str, list] = {}
    for field in _BOOT_FIELDS:
        if field not in body or (body[field] is None and field != "bootstrap_port"):
            return out, (
                field,
                f"requires '{field}' in the request body (the router injects "
                "bootstrap_host, bootstrap_port and bootstrap_room)",
            )
    lengths = {len(body[f]) for f in _BOOT_FIELDS if isinstance(body[f], list)}
    if len(lengths) > 1:
        return out, ("bootstrap_room", "got bootstrap_* lists of different lengths")
    size = lengths.pop() if lengths else n
    for field in _BOOT_FIELDS:
        value = body[field]
        values = list(value) if isinstance(value, list) else [value] * size
        for v in values:
            ok = (
                isinstance(v, str) and v != ""
                if field == "bootstrap_host"
                else (v is None or (isinstance(v, int) and not isinstance(v, bool)))
                if field == "bootstrap_port"
                else isinstance(v, int) and not isinstance(v, bool)
            )
            if not ok:
                return out, (field, f"got an invalid '{field}': {v!r}")
        out[field] = values
    return out, None


def _probe_bootstrap(host: str, port: int, timeout: float) -> str | None:
    """GET http://host:port/health without proxies; None if it answered 200."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return f"GET /health returned {resp.status}"
        return None
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    args, ignored = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    engine = Engine(args, ignored)
    try:
        return engine.run()
    except KeyboardInterrupt:
        log("fake_sglang: KeyboardInterrupt, exiting")
        return 130


if __name__ == "__main__":
    sys.exit(main())
