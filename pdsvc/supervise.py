#!/usr/bin/env python3
"""Run one SGLang engine or the sglang-router as the main process of a systemd unit.

Why this exists: the units are ``Type=notify`` with ``NotifyAccess=main`` and ``WatchdogSec=``,
but SGLang and sglang-router do not speak sd_notify, and systemd has no HTTP liveness check.
This supervisor starts the real command as its child and

* before the start (engines), refuses to start while another process holds one of the unit's
  GPUs, so an automatic restart does not run into a CUDA out-of-memory crash loop;
* serialises cold JIT compiles of engines that share one cache directory (concurrent cold
  compiles into one DeepGEMM/TVM cache race and crash), while warm engines start in parallel;
* tells systemd ``READY=1`` only once the engine's ``/health`` answers 200, or, for the
  router, once ``/readiness`` answers 200 *and* one real generation through it succeeds
  (``/readiness`` turns 200 before a prefill/decode pair can actually serve);
* afterwards sends ``WATCHDOG=1`` only while the liveness URL answers 200, so a hung engine is
  killed and restarted by systemd's ``WatchdogSec=`` (the bound lives in the unit, not here);
* forwards SIGTERM/SIGINT/SIGHUP to the child and maps its exit status so that a
  ``systemctl stop`` does not leave the unit "failed".

Under a process manager without systemd (the supervisord bundle) there is no NOTIFY_SOCKET, no
watchdog, no readiness ordering and no cgroup, so the same program takes those jobs itself, each
behind an option that the systemd units do not pass (under systemd nothing changes):

* ``--wait-for URL``: start the command only once URL answers 200 (the router waits for both
  engines' ``/health``, which systemd's ``After=`` + ``Type=notify`` do for the units);
* ``--watchdog-secs S``: when no liveness probe has succeeded for S seconds (the units'
  ``WatchdogSec=``), SIGKILL the command and exit 124, so the manager restarts it;
* ``--kill-tree``: become a child subreaper, so the command's descendants stay ours even when
  they leave its process group or session, and SIGKILL every one left once the command is gone
  (``KillMode=mixed`` does this with the unit's cgroup); ``--stop-timeout S`` bounds a stop;
* ``eventlistener`` mode: a supervisord event listener that restarts decode whenever prefill
  (re)starts (the units' ``PartOf=``).

It is standard-library only (Python >= 3.9) because it is copied verbatim next to the rendered
units and runs under the SGLang venv's interpreter on the GPU host.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import xmlrpc.client
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, NamedTuple

EXIT_REFUSED = 1  # GPU busy, nvidia-smi broken, cache dir unusable: Restart= retries later
EXIT_USAGE = 2  # argparse's own exit status for usage errors
EXIT_PEER = 75  # a --restart-with peer restarted: stopped the engine to be restarted with it
EXIT_HUNG = 124  # --watchdog-secs ran out: killed a hung child (timeout(1)'s convention)
EXIT_CANNOT_EXEC = 126  # the shell's convention for "found but could not run"
EXIT_NOT_FOUND = 127  # the shell's convention for "command not found"

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
NVIDIA_SMI_TIMEOUT_S = 30.0  # nvidia-smi can take seconds per call without persistence mode
START_PROBE_TIMEOUT_S = 5.0  # a start-phase probe that times out just means "not yet"
STOP_GRACE_S = 30.0  # after this long without exit following a stop, say so in the log
CHILD_WAIT_SLICE_S = 1.0  # longest a loop blocks before re-checking for a stop request
KILL_WAIT_S = 30.0  # after SIGKILL, how long to wait for the tree to be gone (GPU memory freed)
PR_SET_CHILD_SUBREAPER = 36  # prctl(2), Linux >= 3.4
READINESS_PROBE_BODY = {
    "text": "pdsvc readiness probe",
    "sampling_params": {"max_new_tokens": 1, "temperature": 0},
}

# Probes go straight to the service: an http_proxy in the unit's environment must not
# intercept loopback health checks.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

if TYPE_CHECKING:  # aliases for annotations only: "int | None" cannot be evaluated on 3.9
    Clock = Callable[[], float]
    ChildWait = Callable[[float], int | None]


# --------------------------------------------------------------------------------------------
# Logging and sd_notify


class Log:
    """Write one flushed line per message to stderr, prefixed with the unit's name.

    journald stores stderr line by line; a prefix keeps our lines apart from the child's,
    which share the same stream.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def _line(self, message: str) -> str:
        return f"{self.name}: {' '.join(message.splitlines())}\n"

    def __call__(self, message: str) -> None:
        stream = sys.stderr
        stream.write(self._line(message))
        stream.flush()

    def from_signal_handler(self, message: str) -> None:
        """Log from a signal handler: a raw write(2) cannot re-enter Python's buffered stream."""
        with contextlib.suppress(OSError):
            os.write(2, self._line(message).encode("utf-8", "replace"))


def notify(*fields: str, env: Mapping[str, str] | None = None) -> bool:
    """Send sd_notify fields (``READY=1``, ``STATUS=...``) as one datagram to ``$NOTIFY_SOCKET``.

    Implemented by hand because libsystemd's Python bindings are not in the SGLang venv. A
    leading ``@`` names a socket in the abstract namespace. Returns False without error when
    the variable is unset (not under systemd) or the datagram could not be sent.
    """
    env = os.environ if env is None else env
    address = env.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a vsock address (VM guests only), which we do not need
    payload = "\n".join(field.replace("\n", " ") for field in fields).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(payload, address)
    except OSError:
        return False
    return True


class Notifier:
    """sd_notify with a log line the first time sending fails (a silent failure means no
    READY=1 and, much later, a start timeout that is hard to explain)."""

    def __init__(self, log: Log, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        self.env = os.environ if env is None else env
        self.enabled = bool(self.env.get("NOTIFY_SOCKET"))
        self._warned = False

    def __call__(self, *fields: str) -> None:
        if self.enabled and not notify(*fields, env=self.env) and not self._warned:
            self._warned = True
            self.log(f"cannot send to NOTIFY_SOCKET={self.env.get('NOTIFY_SOCKET')}")

    def status(self, text: str) -> None:
        self(f"STATUS={text}")


# --------------------------------------------------------------------------------------------
# GPU idle check


class GpuHolder(NamedTuple):
    """One compute process on one of the unit's GPUs, as nvidia-smi reports it."""

    index: int
    bus_id: str
    pid: int
    process_name: str
    used_memory: str

    def describe(self) -> str:
        return (
            f"GPU {self.index} ({self.bus_id}) is held by pid {self.pid} "
            f"{self.process_name} {self.used_memory}"
        )


class GpuCheckError(Exception):
    """nvidia-smi exists but gave no usable answer: a broken driver is not a reason to skip."""


def find_nvidia_smi(explicit: str | None) -> str | None:
    """The nvidia-smi to run, or None when there is none (no NVIDIA driver on this host)."""
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    return shutil.which("nvidia-smi")


def normalize_bus_id(bus_id: str) -> str:
    """Canonical PCI address: nvidia-smi prints the domain with 8 or 4 hex digits by version."""
    text = bus_id.strip().lower()
    if text.count(":") == 2:
        domain, rest = text.split(":", 1)
        try:
            return f"{int(domain, 16):08x}:{rest}"
        except ValueError:
            return text
    return text


def parse_gpu_indices(csv_text: str) -> dict[str, tuple[int, str]]:
    """Parse ``--query-gpu=index,pci.bus_id --format=csv,noheader`` into
    {canonical bus id: (index, bus id as printed)}."""
    gpus: dict[str, tuple[int, str]] = {}
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 2 or not fields[0].isdigit():
            raise GpuCheckError(f"unexpected nvidia-smi --query-gpu line: {line.strip()!r}")
        gpus[normalize_bus_id(fields[1])] = (int(fields[0]), fields[1])
    return gpus


def parse_compute_apps(csv_text: str) -> list[tuple[str, int, str, str]]:
    """Parse ``--query-compute-apps=gpu_bus_id,pid,process_name,used_memory`` CSV lines into
    (bus id, pid, process name, used memory). The name may itself contain ", "."""
    apps = []
    for line in csv_text.splitlines():
        if not line.strip() or line.strip().lower().startswith("no running"):
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 4 or not fields[1].isdigit():
            raise GpuCheckError(f"unexpected nvidia-smi --query-compute-apps line: {line!r}")
        name = ", ".join(fields[2:-1])
        apps.append((fields[0], int(fields[1]), name, fields[-1]))
    return apps


def _run_nvidia_smi(
    nvidia_smi: str, args: Sequence[str], timeout: float, run: Callable[..., object]
) -> str:
    argv = [nvidia_smi, *args]
    try:
        result = run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GpuCheckError(f"{' '.join(argv)} timed out after {timeout:g} s") from None
    except OSError as exc:
        raise GpuCheckError(f"cannot run {nvidia_smi}: {exc.strerror or exc}") from None
    returncode = getattr(result, "returncode", 1)
    stdout = getattr(result, "stdout", "") or ""
    if returncode != 0:
        stderr = getattr(result, "stderr", "") or ""
        said = " ".join((stdout + " " + stderr).split())[:300]
        raise GpuCheckError(f"{' '.join(argv)} exited with status {returncode}: {said}")
    return stdout


def gpu_holders(
    nvidia_smi: str,
    gpus: Sequence[int],
    run: Callable[..., object] = subprocess.run,
    timeout: float = NVIDIA_SMI_TIMEOUT_S,
) -> list[GpuHolder]:
    """The compute processes nvidia-smi reports on any of ``gpus`` (nvidia-smi indices).

    Bus ids join the two queries because ``--query-compute-apps`` has no GPU index column.
    Raises GpuCheckError when nvidia-smi fails, times out, prints something unparseable, or
    does not list one of ``gpus``.
    """
    index_csv = _run_nvidia_smi(
        nvidia_smi, ["--query-gpu=index,pci.bus_id", "--format=csv,noheader"], timeout, run
    )
    by_bus = parse_gpu_indices(index_csv)
    present = sorted(index for index, _ in by_bus.values())
    missing = [gpu for gpu in gpus if gpu not in present]
    if missing:
        listed = ",".join(str(index) for index in present) or "none"
        raise GpuCheckError(
            f"GPU {','.join(map(str, missing))} not present (nvidia-smi lists GPUs {listed})"
        )
    apps_csv = _run_nvidia_smi(
        nvidia_smi,
        [
            "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory",
            "--format=csv,noheader",
        ],
        timeout,
        run,
    )
    wanted = set(gpus)
    holders = []
    for bus_id, pid, name, memory in parse_compute_apps(apps_csv):
        index, printed = by_bus.get(normalize_bus_id(bus_id), (-1, bus_id))
        if index in wanted:
            holders.append(GpuHolder(index, printed, pid, name, memory))
    return sorted(holders, key=lambda holder: (holder.index, holder.pid))


def check_gpus_idle(nvidia_smi_option: str | None, gpus: Sequence[int], log: Log) -> bool:
    """Log the outcome of the GPU idle check; False means: refuse to start."""
    nvidia_smi = find_nvidia_smi(nvidia_smi_option)
    if nvidia_smi is None:
        where = f" at {nvidia_smi_option}" if nvidia_smi_option else " on PATH"
        log(
            "GPU idle check skipped: nvidia-smi not found (no NVIDIA driver on this host?)"
            f" [looked{where}]"
        )
        return True
    try:
        holders = gpu_holders(nvidia_smi, gpus)
    except GpuCheckError as exc:
        log(f"GPU idle check failed: {exc}")
        log("refusing to start: cannot tell whether the GPUs are free (driver problem?)")
        return False
    if holders:
        for holder in holders:
            log(holder.describe())
        log("refusing to start: GPUs busy; stop the holder or wait for it to exit")
        return False
    log(f"GPUs {','.join(map(str, gpus))} are idle")
    return True


# --------------------------------------------------------------------------------------------
# Cold JIT cache serialisation


class JitLock:
    """Serialise the first (cold) start of engines that share one JIT cache directory.

    Concurrent cold compiles into one DeepGEMM/TVM/FlashInfer cache race (sglang PR #27604,
    DeepGEMM#301). The marker ``DIR/.pdsvc/warm-KEY`` records that engine KEY became healthy
    once with this cache; until then the engine takes an exclusive flock on
    ``DIR/.pdsvc/compile.lock`` and holds it until it is healthy. Warm engines take no lock and
    start in parallel. flock is released by the kernel when the process dies, so a crash never
    leaves a stale lock; the lock fd is close-on-exec, so the child never holds it.
    """

    def __init__(
        self,
        cache_dir: str,
        key: str,
        owner: str,
        log: Log,
        progress_every: float,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        retry_every: float = 1.0,
    ) -> None:
        self.cache_dir = cache_dir
        self.key = key
        self.owner = owner
        self.log = log
        self.progress_every = progress_every
        self.clock = clock
        self.sleep = sleep
        self.retry_every = retry_every
        self.state_dir = os.path.join(cache_dir, ".pdsvc")
        self.marker = os.path.join(self.state_dir, f"warm-{key}")
        self.lock_path = os.path.join(self.state_dir, "compile.lock")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def is_warm(self) -> bool:
        return os.path.exists(self.marker)

    def holder(self) -> str:
        """Who holds the lock, as the holder wrote it into the lock file."""
        try:
            with open(self.lock_path, encoding="utf-8", errors="replace") as handle:
                text = handle.read().strip()
        except OSError:
            text = ""
        return text or "another engine"

    def acquire(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        on_wait: Callable[[str], None] = lambda holder: None,
    ) -> bool:
        """Block until this process holds the lock; False if ``should_stop()`` turned true.

        Raises OSError when the cache directory cannot be used.
        """
        os.makedirs(self.state_dir, mode=0o750, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        started = self.clock()
        next_log = started
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
            now = self.clock()
            if now >= next_log:
                holder = self.holder()
                waited = f" ({now - started:.0f} s so far)" if now > started else ""
                self.log(
                    f"JIT cache cold for {self.key}: waiting for {holder} to finish "
                    f"compiling into {self.cache_dir}{waited}"
                )
                on_wait(holder)
                next_log = now + self.progress_every
            if should_stop():
                os.close(fd)
                return False
            self.sleep(self.retry_every)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.owner} (pid {os.getpid()})\n".encode(), 0)
        self._fd = fd
        return True

    def mark_warm(self) -> None:
        """Write the marker atomically (tmp + rename), then release the lock."""
        tmp = f"{self.marker}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(f"{self.owner} healthy at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        os.replace(tmp, self.marker)
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the only fd of the open file releases the flock


# --------------------------------------------------------------------------------------------
# HTTP probes


class ProbeResult(NamedTuple):
    ok: bool
    detail: str  # "HTTP 200", "HTTP 503 {...}", "connection refused", "timed out after 5 s"


def _snippet(body: bytes) -> str:
    return " ".join(body.decode("utf-8", "replace").split())[:200]


def _describe_error(reason: object, timeout: float) -> str:
    if isinstance(reason, (socket.timeout, TimeoutError)):  # distinct classes on 3.9
        return f"timed out after {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason) or type(reason).__name__


def http_probe(
    url: str,
    timeout: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    opener: Callable[..., object] = _OPENER.open,
) -> ProbeResult:
    """GET ``url`` (POST when ``body`` is given); ok only on HTTP 200. Never raises."""
    request = urllib.request.Request(
        url, data=body, headers=dict(headers or {}), method="GET" if body is None else "POST"
    )
    try:
        with opener(request, timeout=timeout) as response:  # type: ignore[attr-defined]
            response.read(1 << 20)
            status = response.status
    except urllib.error.HTTPError as exc:
        try:
            said = _snippet(exc.read(400))
        except Exception:  # noqa: BLE001 - the status alone is enough
            said = ""
        finally:
            exc.close()
        return ProbeResult(False, f"HTTP {exc.code}" + (f" {said}" if said else ""))
    except urllib.error.URLError as exc:
        return ProbeResult(False, _describe_error(exc.reason, timeout))
    except (OSError, http.client.HTTPException) as exc:
        return ProbeResult(False, _describe_error(exc, timeout))
    if status != 200:
        return ProbeResult(False, f"HTTP {status}")
    return ProbeResult(True, "HTTP 200")


def router_start_probe(
    readiness_url: str,
    generate_url: str,
    api_key: str | None,
    generate_timeout: float,
    probe: Callable[..., ProbeResult] = http_probe,
) -> Callable[[], ProbeResult]:
    """Probe for the router's start phase: ``/readiness`` 200, then one real generation 200.

    ``/readiness`` turns 200 as soon as workers are registered, before a prefill/decode pair
    has served a request; only a generation through the router proves the pair works.
    """
    body = json.dumps(READINESS_PROBE_BODY).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def check() -> ProbeResult:
        ready = probe(readiness_url, START_PROBE_TIMEOUT_S)
        if not ready.ok:
            return ProbeResult(False, f"readiness: {ready.detail}")
        generated = probe(generate_url, generate_timeout, body=body, headers=headers)
        if not generated.ok:
            return ProbeResult(False, f"readiness OK, generation failed: {generated.detail}")
        return generated

    return check


# --------------------------------------------------------------------------------------------
# Start phase, liveness phase, stop


class Outcome(NamedTuple):
    kind: str  # "healthy", "exited" (returncode set), "stop" (a stop signal arrived), "hung",
    # "peer" (a --restart-with peer restarted; detail says which)
    returncode: int | None = None
    elapsed: float = 0.0
    detail: str = ""


class PeerWatch:
    """``--restart-with``: restart this engine when a peer on another host restarts.

    systemd's PartOf= couples units of one host only. A NIXL decode cannot serve a prefill
    that restarted under it (sglang #33789), so a decode whose prefill runs elsewhere watches
    that prefill's /health: seen healthy, then failing ``down_after`` probes in a row (dead by
    the same measure as the watchdog's) of which at least one was refused (its port closed:
    the process was gone, not merely slow or unreachable), then healthy again = it restarted.
    A peer never seen healthy (still loading when this engine came up) is not a restart.
    """

    def __init__(self, urls: Sequence[str], down_after: int, timeout: float,
                 probe: Callable[[str, float], ProbeResult] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.log = log or (lambda message: None)
        self.urls = list(urls)
        self.down_after = down_after
        self.timeout = timeout
        self.probe = probe or http_probe
        self.seen_up = dict.fromkeys(self.urls, False)
        self.failures = dict.fromkeys(self.urls, 0)
        self.refused = dict.fromkeys(self.urls, False)

    def check(self) -> str | None:
        """Probe every peer once, all at once (many unreachable peers cost one timeout, not
        one each, so they cannot starve this engine's own watchdog); the reason to restart,
        or None."""
        results: dict[str, ProbeResult] = {}

        def one(url: str) -> None:
            results[url] = self.probe(url, self.timeout)

        threads = [threading.Thread(target=one, args=(url,), daemon=True) for url in self.urls]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.timeout + 1.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for url in self.urls:
            result = results.get(url) or ProbeResult(False, f"timed out after {self.timeout:g} s")
            if not result.ok:
                if self.seen_up[url] and not self.failures[url]:
                    self.log(f"peer {url}: {result.detail}; watching for its return")
                self.failures[url] += 1
                self.refused[url] |= result.detail == "connection refused"
                continue
            down, refused = self.failures[url], self.refused[url]
            self.failures[url], self.refused[url] = 0, False
            if self.seen_up[url] and down >= self.down_after and refused:
                return (f"{url} is back after {down} failed probes (its port was closed): it "
                        f"restarted, and a NIXL decode must restart with it (sglang #33789)")
            if not self.seen_up[url]:
                self.log(f"peer {url} is up: a restart of it will restart this engine")
            elif down:
                self.log(f"peer {url} is back after {down} failed probe(s), "
                         f"{'not refused' if not refused else 'too few'}: not a restart")
            self.seen_up[url] = True
        return None


def wait_until_healthy(
    probe: Callable[[], ProbeResult],
    child_wait: ChildWait,
    *,
    what: str,
    log: Callable[[str], None],
    status: Callable[[str], None],
    poll_interval: float,
    progress_every: float,
    should_stop: Callable[[], bool],
    clock: Clock = time.monotonic,
    started: float | None = None,
) -> Outcome:
    """Probe every ``poll_interval`` s until 200, the child exits, or a stop arrives.

    No deadline here: systemd's ``TimeoutStartSec=`` bounds the start. ``child_wait(t)``
    waits up to t seconds and returns the child's returncode if it exited.
    """
    started = clock() if started is None else started
    next_log = clock() + progress_every
    while True:
        if should_stop():
            return Outcome("stop")
        returncode = child_wait(0)
        if returncode is not None:
            return Outcome("exited", returncode)
        attempt_at = clock()
        result = probe()
        if result.ok:
            return Outcome("healthy", elapsed=clock() - started)
        now = clock()
        if now >= next_log:
            line = f"waiting for {what} ({result.detail}) — {now - started:.0f} s since start"
            log(line)
            status(line)
            next_log = now + progress_every
        returncode = child_wait(max(0.0, attempt_at + poll_interval - clock()))
        if returncode is not None:
            return Outcome("exited", returncode)


def liveness_loop(
    probe: Callable[..., ProbeResult],
    child_wait: ChildWait,
    *,
    interval: float,
    log: Callable[[str], None],
    notify: Callable[..., None],
    serving_status: str,
    should_stop: Callable[[], bool],
    clock: Clock = time.monotonic,
    hang_after: float | None = None,
    peers: PeerWatch | None = None,
) -> Outcome:
    """Probe every ``interval`` s; ``WATCHDOG=1`` only after a 200. ``peers``: checked once
    per interval too; a restarted peer ends the loop as ``"peer"``.

    A failed probe is logged and not pinged; once ``WatchdogSec=`` passes without a ping,
    systemd kills and restarts the unit. Returns when the child exits or a stop arrives.

    ``hang_after`` is that watchdog for managers without one (supervisord): once no probe has
    succeeded for that long since the last good one (or since healthy), return ``"hung"``.
    ``probe`` is then called with the seconds left until that deadline, to cap its timeout, so
    that one slow probe cannot stretch the bound.
    """
    failures = 0
    last_ok = clock()
    next_probe = clock() + interval

    def left() -> float:
        return float("inf") if hang_after is None else last_ok + hang_after - clock()

    while True:
        slice_s = min(CHILD_WAIT_SLICE_S, max(0.0, next_probe - clock()), max(0.0, left()))
        returncode = child_wait(slice_s)
        if returncode is not None:
            return Outcome("exited", returncode)
        if should_stop():
            return Outcome("stop")
        if left() <= 0:
            return Outcome("hung", elapsed=clock() - last_ok)
        if clock() < next_probe:
            continue
        next_probe = clock() + interval
        result = probe() if hang_after is None else probe(left())
        if should_stop():
            return Outcome("stop")
        if result.ok:
            if failures:
                log(f"liveness probe OK again after {failures} failure(s)")
                notify("WATCHDOG=1", f"STATUS={serving_status}")
            else:
                notify("WATCHDOG=1")
            failures = 0
            last_ok = clock()
        else:
            failures += 1
            log(f"liveness probe failed: {result.detail}")
            notify(
                f"STATUS=liveness probe failing ({failures}x, no watchdog ping): {result.detail}"
            )
        restarted = peers.check() if peers is not None else None
        if restarted:
            return Outcome("peer", detail=restarted)


def wait_for_urls(
    urls: Sequence[str],
    *,
    log: Callable[[str], None],
    status: Callable[[str], None],
    poll_interval: float,
    progress_every: float,
    should_stop: Callable[[], bool],
    probe: Callable[[str], ProbeResult] = lambda url: http_probe(url, START_PROBE_TIMEOUT_S),
    sleep: Callable[[float], None] = time.sleep,
    clock: Clock = time.monotonic,
) -> bool:
    """Block until every URL answers 200 at once (``--wait-for``); False if a stop arrived.

    The ordering that systemd's ``After=`` on ``Type=notify`` units gives, for managers that
    only order spawns (supervisord's ``priority=``): the router must not start before both
    engines are healthy, because router 0.3.2 drops a worker that was not up in time.
    """

    def idle(timeout: float) -> None:
        sleep(min(timeout, CHILD_WAIT_SLICE_S))
        return None

    started = clock()
    log(f"waiting for {', '.join(urls)} before starting")
    while True:
        for url in urls:
            outcome = wait_until_healthy(
                lambda url=url: probe(url),
                idle,
                what=url,
                log=log,
                status=status,
                poll_interval=poll_interval,
                progress_every=progress_every,
                should_stop=should_stop,
                clock=clock,
                started=started,
            )
            if outcome.kind == "stop":
                return False
        if all(probe(url).ok for url in urls):  # none of them went down meanwhile
            log(f"{', '.join(urls)}: all healthy after {clock() - started:.1f} s")
            return True


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell would report it: death by signal N becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def supervisor_exit_code(returncode: int, stop_signal: int | None) -> int:
    """What supervise exits with once the child is gone.

    After a stop (SIGTERM/SIGINT/SIGHUP to supervise), exit 0, SIGTERM, SIGKILL (SGLang's
    SIGTERM handler SIGKILLs its own process tree, so 137) or death by the forwarded signal
    count as a clean stop, so ``systemctl stop`` does not mark the unit failed. Otherwise
    the child's status is passed on and ``Restart=on-failure`` decides.
    """
    status = exit_status(returncode)
    if stop_signal is not None:
        clean = {0, 128 + signal.SIGTERM, 128 + signal.SIGKILL, 128 + stop_signal}
        if status in clean:
            return 0
    return status


#: Words that mark a line of the child's stderr as the error worth repeating at its exit.
ERROR_MARKERS = ("Error", "error:", "Exception", "Traceback", "FATAL", "Fatal", "failed")


class StderrTap:
    """Pass the child's stderr through to ours line by line (so it still reaches the journal)
    and remember its last error line, repeated when the child exits: `systemctl status` shows
    only the last 10 journal lines, and systemd's own exit lines would push it out."""

    def __init__(self, pipe: IO[bytes], sink: IO[bytes], prefix: bytes = b"") -> None:
        self.last_error = ""
        self._pipe, self._sink, self._prefix = pipe, sink, prefix
        self._thread = threading.Thread(target=self._pump, name="stderr-tap", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for raw in iter(self._pipe.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                self._sink.write(self._prefix + raw)
                self._sink.flush()
            line = raw.decode("utf-8", "replace").strip()
            if line and any(marker in line for marker in ERROR_MARKERS):
                self.last_error = line

    def drain(self, timeout: float = 2.0) -> str:
        """Wait (briefly) for the child's last lines, then return its last error line."""
        self._thread.join(timeout)
        return self.last_error


# --------------------------------------------------------------------------------------------
# The process tree, for managers without cgroups (--kill-tree)


def become_subreaper() -> str | None:
    """Make orphaned descendants ours instead of init's: prctl(PR_SET_CHILD_SUBREAPER).

    A process that leaves the child's process group and session (SGLang schedulers, sglang
    #23627; supervisord cannot signal them, Supervisor #1101/#1396) is still reparented to us
    when its parent dies, so it can be found and killed. Returns an error text, None on success.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:  # no libc.prctl: not Linux
        return str(exc)
    return None


def process_table() -> dict[int, tuple[int, str, str]]:
    """{pid: (parent pid, state letter, command name)} of every process, read from /proc."""
    table: dict[int, tuple[int, str, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text[text.rindex(")") + 2 :].split()
            table[int(entry)] = (int(fields[1]), fields[0], name)
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return table


def descendants(root: int, table: Mapping[int, tuple[int, str, str]] | None = None) -> list[int]:
    """Every process whose parent chain leads to ``root`` (zombies included), parents first."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        kids = sorted(pid for parent in frontier for pid in children.get(parent, ()))
        kids = [pid for pid in kids if pid not in found and pid != root]
        found += kids
        frontier = kids
    return found


class Child:
    """The supervised command, plus signal forwarding to it."""

    def __init__(
        self, log: Log, notifier: Notifier, role: str, kill_tree: bool = False,
        prefix_output: bool = False,
    ) -> None:
        self.log = log
        self.notifier = notifier
        self.role = role
        self.kill_tree = kill_tree
        self.prefix = f"{log.name}: ".encode() if prefix_output else b""
        self._reaped_at = 0.0
        self.process: subprocess.Popen | None = None
        self.stop_signal: int | None = None
        self.stop_time: float | None = None
        self.tap: StderrTap | None = None

    def install_signal_handlers(self) -> None:
        for signo in STOP_SIGNALS:
            signal.signal(signo, self._on_signal)

    def stopping(self) -> bool:
        return self.stop_signal is not None

    def _on_signal(self, signo: int, _frame: object) -> None:
        name = signal.Signals(signo).name
        if self.stop_signal is None:
            self.stop_signal = signo
            self.stop_time = time.monotonic()
            # notify() directly: Notifier may log, which a signal handler must not do.
            notify("STOPPING=1", f"STATUS=stopping ({name})", env=self.notifier.env)
        process = self.process
        if process is not None and process.returncode is None:
            self.log.from_signal_handler(
                f"got {name}: forwarding it to {self.role} pid {process.pid}"
            )
            process.send_signal(signo)
        else:
            self.log.from_signal_handler(f"got {name}: stopping")

    def start(self, argv: Sequence[str]) -> int | None:
        """Start the command; returns an exit status if it could not be started at all."""
        env = dict(os.environ)
        # The child must not talk to systemd itself: with NotifyAccess=main its messages would
        # be dropped with a warning each, and only we decide when the unit is ready or alive.
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(name, None)
        try:
            self.process = subprocess.Popen(
                list(argv), env=env, close_fds=True, stderr=subprocess.PIPE,
                stdout=subprocess.PIPE if self.prefix else None,
            )
        except FileNotFoundError:
            self.log(f"cannot start {self.role}: {argv[0]}: command not found")
            return EXIT_NOT_FOUND
        except OSError as exc:
            self.log(f"cannot start {self.role}: {argv[0]}: {exc.strerror or exc}")
            return EXIT_CANNOT_EXEC
        assert self.process.stderr is not None
        self.tap = StderrTap(self.process.stderr, sys.stderr.buffer, self.prefix)
        if self.process.stdout is not None:  # --prefix-output: its stdout lines too
            StderrTap(self.process.stdout, sys.stdout.buffer, self.prefix)
        self.log(f"started {self.role} pid {self.process.pid}: {' '.join(argv)}")
        if self.stop_signal is not None:  # a stop arrived while we were starting it
            self.process.send_signal(self.stop_signal)
        return None

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s; the returncode if the child has exited."""
        assert self.process is not None
        try:
            returncode = self.process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            returncode = None
        if self.kill_tree and time.monotonic() - self._reaped_at >= CHILD_WAIT_SLICE_S:
            self.reap_adopted()  # at most once a second: it reads all of /proc
        return returncode

    def reap_adopted(self) -> None:
        """Reap exited orphans reparented to us (as subreaper), never the child itself: its
        status belongs to Popen."""
        self._reaped_at = time.monotonic()
        mine = self.process.pid if self.process is not None else None
        me = os.getpid()
        for pid, (ppid, state, _) in process_table().items():
            if ppid == me and pid != mine and state in ("Z", "X"):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def kill_everything(self, timeout: float = KILL_WAIT_S) -> list[str]:
        """SIGKILL the child and every descendant, and wait until they are all gone (so their
        GPU memory is free before a restart). Returns "pid (name)" of each one killed."""
        me = os.getpid()
        killed: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while True:
            table = process_table()
            tree = descendants(me, table)
            for pid in tree:
                if table[pid][1] not in ("Z", "X"):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                    killed.setdefault(pid, f"{pid} ({table[pid][2]})")
            if self.process is not None:
                self.process.poll()  # reaps the child once it is dead
            self.reap_adopted()
            if not tree:
                return list(killed.values())
            if time.monotonic() >= deadline:
                left = ", ".join(f"{pid} ({table[pid][2]})" for pid in tree if pid in table)
                self.log(f"still not gone {timeout:g} s after SIGKILL: {left}")
                return list(killed.values())
            time.sleep(0.05)

    def kill_leftovers(self) -> None:
        """After the child exited: SIGKILL whatever it left behind (``--kill-tree``), as
        systemd's KillMode=mixed does with what is left in the unit's cgroup."""
        if not self.kill_tree:
            return
        killed = self.kill_everything()
        if killed:
            self.log(
                f"killed {len(killed)} process(es) the {self.role} left behind: "
                + ", ".join(killed)
            )

    def kill_now(self, why: str) -> None:
        """SIGKILL the child (and with ``--kill-tree`` its whole tree) at once."""
        assert self.process is not None
        self.log(f"{why}: sending SIGKILL to the {self.role} pid {self.process.pid}"
                 + (" and all its descendants" if self.kill_tree else ""))
        if self.kill_tree:
            self.kill_everything()
        elif self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    def wait_after_stop(self, progress_every: float, timeout: float | None = None,
                        tick: Callable[[], None] | None = None) -> int:
        """Wait for the child's exit after a stop signal. Without ``timeout``, however long it
        takes: systemd's TimeoutStopSec= and its cgroup SIGKILL are the bound, not us (killing
        early would skip SGLang's cleanup). With it (``--stop-timeout``, for managers whose
        SIGKILL cannot reach every process), SIGKILL the child's tree once it runs out."""
        assert self.process is not None
        since = self.stop_time if self.stop_time is not None else time.monotonic()
        next_log = since + STOP_GRACE_S
        bound = "--stop-timeout" if timeout is not None else "systemd's TimeoutStopSec="
        while True:
            returncode = self.wait(CHILD_WAIT_SLICE_S)
            if returncode is not None:
                return returncode
            if tick is not None:
                tick()
            now = time.monotonic()
            if timeout is not None and now - since >= timeout:
                self.kill_now(f"still running {now - since:.0f} s after the stop signal "
                              f"(--stop-timeout {timeout:g})")
                return self.process.wait()
            if now >= next_log:
                self.log(
                    f"{self.role} pid {self.process.pid} still running {now - since:.0f} s "
                    f"after the stop signal; waiting ({bound} is the bound)"
                )
                next_log = now + progress_every


# --------------------------------------------------------------------------------------------
# supervisord event listener: restart decode whenever prefill (re)starts


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over supervisord's unix control socket (``unix:///run/x.sock``)."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost")
        self._path = path
        self._sock_timeout = timeout

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._sock_timeout)
        sock.connect(self._path)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__()
        self._path = path
        self._sock_timeout = timeout

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self._path, self._sock_timeout)


def supervisor_rpc(server_url: str, timeout: float | None = None) -> xmlrpc.client.ServerProxy:
    """supervisord's XML-RPC interface at ``SUPERVISOR_SERVER_URL`` (unix:// or http://)."""
    if server_url.startswith("unix://"):
        transport = _UnixTransport(server_url[len("unix://") :], timeout)
        return xmlrpc.client.ServerProxy("http://localhost/RPC2", transport=transport)
    return xmlrpc.client.ServerProxy(server_url.rstrip("/") + "/RPC2")


def _tokens(text: str) -> dict[str, str]:
    """supervisord's ``key:value key:value`` event header/payload (values have no spaces)."""
    return dict(item.split(":", 1) for item in text.split() if ":" in item)


def namespec(group: str, process: str) -> str:
    """supervisorctl's name of a process: ``group:process``, or ``process`` alone when the
    program is its own group."""
    return process if group == process else f"{group}:{process}"


class Restarter:
    """Restart each dependent program when its trigger (re)starts, unless the dependent is
    already younger than the trigger (both just started together, e.g. at boot)."""

    RESTARTABLE = ("STARTING", "RUNNING")

    def __init__(self, couples: Mapping[str, Sequence[str]], rpc: object, log: Log) -> None:
        self.couples = couples  # trigger namespec -> dependent namespecs
        self.rpc = rpc
        self.log = log

    def on_starting(self, payload: Mapping[str, str]) -> None:
        trigger = namespec(payload.get("groupname", ""), payload.get("processname", ""))
        for dependent in self.couples.get(trigger, ()):
            try:
                self._restart_if_older(trigger, dependent, payload.get("from_state", "?"))
            except (OSError, xmlrpc.client.Error) as exc:
                self.log(f"cannot restart {dependent} after {trigger} started: {exc}")

    def _restart_if_older(self, trigger: str, dependent: str, from_state: str) -> None:
        api = self.rpc.supervisor  # type: ignore[attr-defined]
        started = api.getProcessInfo(trigger)["start"]
        info = api.getProcessInfo(dependent)
        if info["statename"] not in self.RESTARTABLE or info["start"] >= started:
            return  # not running, or already an instance started with (or after) the trigger
        self.log(
            f"{trigger} (re)started (from {from_state}): restarting {dependent}, whose "
            f"instance (pid {info['pid']}) is {started - info['start']} s older"
        )
        try:
            api.stopProcess(dependent, True)  # waits; supervisord's stopwaitsecs bounds it
        except xmlrpc.client.Fault as fault:
            if "NOT_RUNNING" not in fault.faultString:
                raise
        try:
            api.startProcess(dependent, False)
        except xmlrpc.client.Fault as fault:
            if "ALREADY_STARTED" not in fault.faultString:
                raise
        self.log(f"{dependent} restarted")


def run_eventlistener(
    args: argparse.Namespace,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    rpc: object | None = None,
) -> int:
    """Speak supervisord's event listener protocol on stdin/stdout (so logs go to stderr):
    READY, read one event, act on it, RESULT 2 OK, again. Returns when stdin closes."""
    log = Log(args.name)
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout.buffer if stdout is None else stdout
    couples: dict[str, list[str]] = {}
    for dependent, trigger in args.restart_with:
        couples.setdefault(trigger, []).append(dependent)
    if rpc is None:
        server_url = args.server_url or os.environ.get("SUPERVISOR_SERVER_URL", "")
        if not server_url:
            log("no --server-url and SUPERVISOR_SERVER_URL is unset: run this as a "
                "supervisord [eventlistener:x] program")
            return EXIT_USAGE
        rpc = supervisor_rpc(server_url)
    restarter = Restarter(couples, rpc, log)
    for trigger, dependents in couples.items():
        log(f"will restart {', '.join(dependents)} whenever {trigger} (re)starts")
    while True:
        stdout.write(b"READY\n")
        stdout.flush()
        line = stdin.readline()
        if not line:
            return 0
        header = _tokens(line.decode("utf-8", "replace"))
        payload = stdin.read(int(header.get("len", "0"))).decode("utf-8", "replace")
        if header.get("eventname") == "PROCESS_STATE_STARTING":
            restarter.on_starting(_tokens(payload.split("\n", 1)[0]))
        stdout.write(b"RESULT 2\nOK")
        stdout.flush()


# --------------------------------------------------------------------------------------------
# Command line


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _gpu_list(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(item.isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1,2,3, got {text!r}")
    gpus = [int(item) for item in items]
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"GPU listed twice in {text!r}")
    return gpus


def _couple(text: str) -> tuple[str, str]:
    dependent, _, trigger = text.partition("=")
    if not dependent or not trigger:
        raise argparse.ArgumentTypeError(f"expected DEPENDENT=TRIGGER, got {text!r}")
    return dependent, trigger


def _http_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def liveness_url_for(readiness_url: str) -> str:
    """The router's ``/liveness`` on the same scheme, host and port as ``/readiness``."""
    parts = urllib.parse.urlsplit(readiness_url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/liveness", "", ""))


def base_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


DESCRIPTION = """\
Run one SGLang engine or sglang-router as the main process of a systemd unit
(Type=notify, NotifyAccess=main, WatchdogSec=). SGLang does not speak sd_notify and
systemd has no HTTP liveness check, so this sends READY=1, STATUS= and WATCHDOG=1 on
the service's behalf, gated on HTTP probes. Modes:

  engine         GPU idle check, cold JIT cache serialisation, READY=1 once /health is 200
  router         READY=1 once /readiness is 200 and one real generation returned 200
  eventlistener  (supervisord) restart decode whenever prefill (re)starts

Without systemd (supervisord), --wait-for, --watchdog-secs, --kill-tree and --stop-timeout
take over what the units get from After=, WatchdogSec= and KillMode=mixed.
"""

EPILOG = """\
Everything after "--" is the command to supervise, run as a child with the same stdout and
stderr (so its lines reach the journal) and without NOTIFY_SOCKET.

Exit status:
  0        after a stop (SIGTERM/SIGINT/SIGHUP) when the child then exits 0, by SIGTERM or
           by SIGKILL (SGLang kills its own process tree with SIGKILL: 137), or by the
           forwarded signal; also when a stop arrives while waiting for the JIT lock
  N        the child exited on its own with status N (death by signal S: 128+S)
  1        refused to start: a GPU of the unit is busy, nvidia-smi failed, or the JIT cache
           directory cannot be used (Restart= retries after RestartSec=)
  2        usage error
  75       a --restart-with peer restarted: the engine was stopped to be restarted with it
  124      --watchdog-secs ran out without a good liveness probe: the child was killed
  126/127  the command could not be executed / was not found
"""


EVENTLISTENER_EPILOG = """\
supervisord speaks to it on stdin/stdout (the event listener protocol), so it logs to stderr.
Exit status: 0 when supervisord closes its stdin, 2 on a usage error.
"""


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="supervise.py",
        usage="%(prog)s {engine,router,eventlistener} --name NAME [options] [-- CMD [ARGS...]]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modes = parser.add_subparsers(
        dest="mode", metavar="{engine,router,eventlistener}", required=True
    )

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--name",
        required=True,
        help="unit name used as the prefix of every log line and in STATUS= (e.g. dsv4-prefill)",
    )
    common.add_argument(
        "--liveness-interval",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="seconds between liveness probes once ready; each 200 sends WATCHDOG=1, so keep it "
        "well below the unit's WatchdogSec= (default: %(default)g)",
    )
    common.add_argument(
        "--progress-every",
        type=_positive_float,
        default=15.0,
        metavar="S",
        help="seconds between progress lines while waiting (for health, the JIT lock, or the "
        "child's exit); keeps long starts visible without flooding the journal "
        "(default: %(default)g)",
    )
    common.add_argument(
        "--poll-interval",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="seconds between start-phase probes; short so READY=1 follows health closely "
        "(default: %(default)g)",
    )
    common.add_argument(
        "--wait-for",
        type=_http_url,
        action="append",
        default=[],
        metavar="URL",
        help="start the command only once URL answers 200 (repeatable: all of them); for "
        "managers that order spawns but not readiness (supervisord): the router waits for both "
        "engines' /health, as After= on the Type=notify units makes it under systemd",
    )
    common.add_argument(
        "--watchdog-secs",
        type=_positive_float,
        metavar="S",
        help="without systemd's watchdog: once no liveness probe has succeeded for S seconds "
        "(pass the units' WatchdogSec=), SIGKILL the command and exit 124 so the process "
        "manager restarts it; probes are cut short so that S is the bound",
    )
    common.add_argument(
        "--kill-tree",
        action="store_true",
        help="for managers without cgroups: become a child subreaper (so descendants that leave "
        "the command's process group or session stay ours) and SIGKILL every descendant left "
        "once the command is gone, as KillMode=mixed does with a unit's cgroup",
    )
    common.add_argument(
        "--prefix-output",
        action="store_true",
        help="prefix every line of the command's stdout and stderr with 'NAME: ', as our own "
        "lines are, for a log that mixes programs (supervisord's stdout in a container; "
        "journald keeps units apart by itself)",
    )
    common.add_argument(
        "--stop-timeout",
        type=_positive_float,
        metavar="S",
        help="after a stop signal, SIGKILL the command (its tree with --kill-tree) if it has "
        "not exited within S seconds (default: wait; systemd's TimeoutStopSec= is the bound)",
    )

    engine = modes.add_parser(
        "engine",
        prog="supervise.py engine",
        parents=[common],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME --health-url URL [options] -- CMD [ARGS...]",
        help="supervise one SGLang server (prefill or decode)",
        description=(
            "Supervise one SGLang server: GPU idle check, cold-JIT serialisation,\n"
            "READY=1 once /health is 200, WATCHDOG=1 while /health stays 200."
        ),
    )
    engine.add_argument(
        "--health-url",
        type=_http_url,
        required=True,
        metavar="URL",
        help="the engine's /health; SGLang answers 503 until weights are loaded and warmup is "
        "done, so 200 means ready; also the liveness probe",
    )
    engine.add_argument(
        "--liveness-timeout",
        type=_positive_float,
        default=20.0,
        metavar="S",
        help="timeout of one liveness probe; SGLang's /health runs a 1-token generation and "
        "gives up after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) (default: %(default)g)",
    )
    engine.add_argument(
        "--restart-with",
        action="append",
        default=[],
        metavar="URL",
        help="/health of a peer on another host this engine must restart with (a NIXL "
        "decode's prefill, sglang #33789; on one host systemd's PartOf= does it): once the "
        "peer is back after --peer-down-probes failed probes in a row, stop the engine and "
        f"exit {EXIT_PEER} so that Restart=on-failure starts it afresh; repeatable",
    )
    engine.add_argument(
        "--peer-down-probes",
        type=int,
        default=3,
        metavar="N",
        help="failed probes in a row that make a --restart-with peer's recovery a restart "
        "(default: %(default)s; the units pass the liveness failure count)",
    )
    engine.add_argument(
        "--gpus",
        type=_gpu_list,
        metavar="LIST",
        help="nvidia-smi indices of the unit's GPUs (e.g. 0,1,2,3); before starting, refuse "
        "(exit 1) while any compute process holds one of them, so a restart does not run into "
        "the memory of a previous instance that is still being torn down",
    )
    engine.add_argument(
        "--nvidia-smi",
        metavar="PATH",
        help="nvidia-smi to run for --gpus (default: search PATH); when it is absent the check "
        "is skipped with a log line (no NVIDIA driver), when it fails the start is refused",
    )
    engine.add_argument(
        "--jit-cache",
        metavar="DIR",
        help="JIT cache directory shared with other engines; while DIR/.pdsvc/warm-KEY is "
        "missing, take DIR/.pdsvc/compile.lock and hold it until healthy, because concurrent "
        "cold compiles into one cache race; warm engines take no lock",
    )
    engine.add_argument(
        "--jit-key",
        metavar="KEY",
        help="name of this engine's warm marker (required with --jit-cache); include anything "
        "that invalidates the cache, e.g. the SGLang version",
    )

    router = modes.add_parser(
        "router",
        prog="supervise.py router",
        parents=[common],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME --readiness-url URL --generate-url URL [options] "
        "-- CMD [ARGS...]",
        help="supervise sglang-router in PD mode",
        description=(
            "Supervise sglang-router: READY=1 once /readiness is 200 and one real generation\n"
            "through the router returned 200; WATCHDOG=1 while /liveness stays 200."
        ),
    )
    router.add_argument(
        "--readiness-url",
        type=_http_url,
        required=True,
        metavar="URL",
        help="the router's /readiness: 503 until a prefill and a decode worker are healthy",
    )
    router.add_argument(
        "--generate-url",
        type=_http_url,
        required=True,
        metavar="URL",
        help="the router's /generate; one 1-token generation must return 200 before READY=1, "
        "because /readiness turns 200 before a prefill/decode pair can serve",
    )
    router.add_argument(
        "--liveness-url",
        type=_http_url,
        metavar="URL",
        help="probed every --liveness-interval once ready (default: /liveness next to "
        "--readiness-url); liveness, not readiness, so engine restarts do not kill the router",
    )
    router.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the router's --api-key; sent as 'Authorization: "
        "Bearer' with the probe generation (the key itself never goes on a command line)",
    )
    router.add_argument(
        "--liveness-timeout",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="timeout of one liveness probe (default: %(default)g)",
    )
    router.add_argument(
        "--generate-timeout",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="timeout of the probe generation; the first PD request may set up the KV "
        "transfer connection, which can take tens of seconds (default: %(default)g)",
    )
    listener = modes.add_parser(
        "eventlistener",
        prog="supervise.py eventlistener",
        epilog=EVENTLISTENER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME --restart-with DEPENDENT=TRIGGER [...]",
        help="supervisord event listener: restart decode whenever prefill (re)starts",
        description=(
            "A supervisord [eventlistener:x] for events=PROCESS_STATE_STARTING: whenever\n"
            "TRIGGER (re)starts, restart DEPENDENT through supervisord's XML-RPC interface,\n"
            "unless DEPENDENT was started with or after it (as at boot). systemd's PartOf=."
        ),
    )
    listener.add_argument("--name", required=True, help="prefix of every log line")
    listener.add_argument(
        "--restart-with",
        type=_couple,
        action="append",
        required=True,
        metavar="DEPENDENT=TRIGGER",
        help="supervisorctl names (group:program), e.g. dsv4-pd:dsv4-decode=dsv4-pd:dsv4-prefill"
        " (NIXL: a restarted prefill does not serve with the old decode, sglang #33789)",
    )
    listener.add_argument(
        "--server-url",
        metavar="URL",
        help="supervisord's RPC URL (default: $SUPERVISOR_SERVER_URL, which supervisord sets)",
    )
    return parser, {"engine": engine, "router": router, "eventlistener": listener}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split at the first ``--`` (the child's own options must not reach argparse)."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1 :]
    else:
        options, command = argv, []
    parser, modes = build_parser()
    args = parser.parse_args(options)
    mode = modes[args.mode]
    if args.mode == "eventlistener":
        if command:
            mode.error("eventlistener takes no '-- CMD'")
        return args, command
    if not command:
        mode.error("missing '-- CMD [ARGS...]': the command to supervise")
    if args.mode == "engine" and bool(args.jit_cache) != bool(args.jit_key):
        mode.error("--jit-cache and --jit-key go together")
    return args, command


# --------------------------------------------------------------------------------------------
# Main


def _watchdog_hint(args: argparse.Namespace, log: Log) -> None:
    """Warn when the liveness cadence cannot keep the unit's watchdog fed."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit():
        if os.environ.get("NOTIFY_SOCKET"):
            log("WatchdogSec= is not set for this unit: failed liveness probes are only logged")
        return
    watchdog = int(usec) / 1e6
    if args.liveness_interval + args.liveness_timeout >= watchdog:
        log(
            f"warning: --liveness-interval {args.liveness_interval:g} s + --liveness-timeout "
            f"{args.liveness_timeout:g} s >= WatchdogSec={watchdog:g} s: a single slow probe "
            "gets the unit killed"
        )


def engine_fingerprint() -> str:
    """What the cached kernels depend on besides the engine's name: the SGLang (and torch)
    versions of this interpreter — the engine's own venv. An upgrade makes the cache cold
    again, so engines serialise their compiles after it too."""
    from importlib import metadata

    parts = []
    for dist in ("sglang", "torch"):
        try:
            parts.append(f"{dist}-{metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"no-{dist}")
    return "_".join(parts)


def engine_preflight(
    args: argparse.Namespace, log: Log, notifier: Notifier, child: Child
) -> tuple[int | None, JitLock | None]:
    """GPU idle check, then the JIT compile lock when the cache is cold for this engine.

    Returns (exit status, None) when the engine must not start, else (None, the lock or None).
    """
    if args.gpus:
        notifier.status(f"checking that GPUs {','.join(map(str, args.gpus))} are idle")
        if not check_gpus_idle(args.nvidia_smi, args.gpus, log):
            notifier.status("refused to start: GPUs busy or nvidia-smi failed")
            return EXIT_REFUSED, None
    if not args.jit_cache:
        return None, None
    key = f"{args.jit_key}@{engine_fingerprint()}"
    jit = JitLock(args.jit_cache, key, args.name, log, args.progress_every)
    if jit.is_warm():
        log(f"JIT cache warm for {args.jit_key}: starting without the compile lock")
        return None, jit
    try:
        taken = jit.acquire(
            should_stop=child.stopping,
            on_wait=lambda holder: notifier.status(
                f"JIT cache cold: waiting for {holder} to finish compiling"
            ),
        )
    except OSError as exc:
        log(f"cannot use JIT cache {args.jit_cache}: {exc}")
        return EXIT_REFUSED, None
    if not taken:
        log("stopped while waiting for the JIT compile lock")
        return 0, None
    log(
        f"JIT cache cold for {args.jit_key}: holding {jit.lock_path} until healthy, "
        "so engines sharing this cache compile one at a time"
    )
    return None, jit


def probes_for(args: argparse.Namespace, log: Log) -> tuple[Callable[[], ProbeResult], str, str]:
    """(start-phase probe, what it waits for, liveness URL) for the mode."""
    if args.mode == "engine":
        url = args.health_url
        return (lambda: http_probe(url, START_PROBE_TIMEOUT_S)), url, url
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env) or None
        if api_key is None:
            log(f"--api-key-env {args.api_key_env}: variable not set; probing without a key")
    probe = router_start_probe(
        args.readiness_url, args.generate_url, api_key, args.generate_timeout
    )
    what = f"{args.readiness_url} + a generation via {args.generate_url}"
    return probe, what, args.liveness_url or liveness_url_for(args.readiness_url)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the supervisor; returns the exit status (see EPILOG)."""
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    if args.mode == "eventlistener":
        # supervisord stops it with SIGTERM while it blocks on stdin: a clean exit, not a crash
        signal.signal(signal.SIGTERM, lambda signo, frame: sys.exit(0))
        return run_eventlistener(args)
    log = Log(args.name)
    notifier = Notifier(log)
    role = args.mode
    child = Child(log, notifier, role, kill_tree=args.kill_tree,
                  prefix_output=args.prefix_output)
    child.install_signal_handlers()
    if args.kill_tree:
        failed_subreaper = become_subreaper()
        if failed_subreaper:
            log(f"cannot become a child subreaper ({failed_subreaper}): descendants that leave "
                "the process group may survive a stop")

    if args.wait_for and not wait_for_urls(
        args.wait_for,
        log=log,
        status=notifier.status,
        poll_interval=args.poll_interval,
        progress_every=args.progress_every,
        should_stop=child.stopping,
    ):
        log(f"stopped while waiting for {', '.join(args.wait_for)}")
        return 0

    jit: JitLock | None = None
    if role == "engine":
        refused, jit = engine_preflight(args, log, notifier, child)
        if refused is not None:
            return refused
    probe, what, liveness_url = probes_for(args, log)
    if child.stopping():
        log(f"stopped before the {role} was started")
        return 0

    notifier.status(f"starting {role}")
    failed = child.start(command)
    if failed is not None:
        return failed
    started = time.monotonic()
    notifier.status(f"waiting for {what}")

    outcome = wait_until_healthy(
        probe,
        child.wait,
        what=what,
        log=log,
        status=notifier.status,
        poll_interval=args.poll_interval,
        progress_every=args.progress_every,
        should_stop=child.stopping,
        started=started,
    )
    if outcome.kind == "healthy":
        if jit is not None and jit.held:
            jit.mark_warm()
            log(f"JIT cache for {args.jit_key} marked warm; compile lock released")
        serving = f"serving on {base_url(liveness_url)} (healthy after {outcome.elapsed:.1f} s)"
        notifier("READY=1", f"STATUS={serving}")
        log(f"healthy after {outcome.elapsed:.1f} s")
        _watchdog_hint(args, log)
        outcome = liveness_loop(
            lambda left=args.liveness_timeout: http_probe(
                liveness_url, max(0.05, round(min(args.liveness_timeout, left), 2))
            ),
            child.wait,
            interval=args.liveness_interval,
            log=log,
            notify=notifier,
            serving_status=serving,
            should_stop=child.stopping,
            hang_after=args.watchdog_secs,
            # a peer probe must not hold up this engine's own probes (and its watchdog)
            peers=PeerWatch(args.restart_with, args.peer_down_probes,
                            min(args.liveness_timeout, args.liveness_interval), log=log)
            if getattr(args, "restart_with", None) else None,
        )
    hung = outcome.kind == "hung"
    if outcome.kind == "peer":
        assert child.process is not None
        log(f"{outcome.detail}; stopping the {role} (SIGTERM) and exiting {EXIT_PEER} so that "
            f"the process manager restarts it")
        notifier.status(f"restarting with its peer: {outcome.detail}")
        child.stop_time = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)
    if hung:
        child.kill_now(
            f"no successful liveness probe for {outcome.elapsed:.0f} s "
            f"(--watchdog-secs {args.watchdog_secs:g}): the {role} is hung"
        )
    if outcome.kind == "stop":
        returncode = child.wait_after_stop(args.progress_every, args.stop_timeout)
    elif outcome.kind == "peer":
        # our own stop, not the manager's: its watchdog still runs, so keep it fed while the
        # engine drains (bounded by --stop-timeout, which the units pass for this)
        returncode = child.wait_after_stop(args.progress_every, args.stop_timeout,
                                           tick=lambda: notifier("WATCHDOG=1"))
    elif hung:
        returncode = child.wait(KILL_WAIT_S)
        returncode = -signal.SIGKILL if returncode is None else returncode
    else:
        returncode = outcome.returncode if outcome.returncode is not None else 1
    child.kill_leftovers()
    if jit is not None:
        jit.release()

    status = exit_status(returncode)
    last_error = child.tap.drain() if child.tap is not None and status != 0 else ""
    said = f"; its last error: {last_error}" if last_error and child.stop_signal is None else ""
    log(f"{role} exited with status {status}" + _signal_suffix(returncode) + said)
    if said:
        notifier.status(f"{role} exited with status {status}: {last_error}")
    code = supervisor_exit_code(returncode, child.stop_signal)
    if hung and child.stop_signal is None:
        log(f"exiting {EXIT_HUNG} so that the process manager restarts the {role}")
        return EXIT_HUNG
    if outcome.kind == "peer" and child.stop_signal is None:
        return EXIT_PEER
    if child.stop_signal is not None:
        stop_name = signal.Signals(child.stop_signal).name
        verdict = "a clean stop" if code == 0 else "a failed stop"
        log(f"after {stop_name}: treating it as {verdict}; exiting {code}")
    return code


def _signal_suffix(returncode: int) -> str:
    if returncode >= 0:
        return ""
    try:
        return f" (killed by {signal.Signals(-returncode).name})"
    except ValueError:
        return f" (killed by signal {-returncode})"


if __name__ == "__main__":
    sys.exit(main())
