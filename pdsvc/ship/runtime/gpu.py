"""One nvidia-smi client: which compute processes hold which GPUs (by PCI bus id), and the
idle check a start makes. Used by the runtime and by `pdsvc doctor`."""

from __future__ import annotations

import enum
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .notify import Log
from .timings import NVIDIA_SMI_TIMEOUT_S
from .waiting import aside, rest


class GpuWait(str, enum.Enum):
    """How waiting for idle GPUs ended (wait_gpus_idle)."""

    IDLE = "idle"  # start
    BUSY = "busy"  # still held after the bound: this start gives up
    ERROR = "error"  # nvidia-smi failed: a driver problem, not something waiting fixes
    STOPPED = "stopped"  # a stop arrived while waiting

    def __str__(self) -> str:
        return self.value


class GpuHolder(NamedTuple):
    """One compute process on one of the unit's GPUs, as nvidia-smi reports it."""

    index: int  # type: ignore[assignment]  # nvidia-smi's word; shadows tuple.index
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


def query_gpu_rows(csv_text: str, columns: int) -> list[list[str]]:
    """The rows of a ``--query-gpu=index,… --format=csv,noheader`` answer, each ``columns``
    stripped fields, the first an index; GpuCheckError on any other line."""
    rows = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != columns or not fields[0].isdigit():
            raise GpuCheckError(f"unexpected nvidia-smi --query-gpu line: {line.strip()!r}")
        rows.append(fields)
    return rows


def parse_gpu_indices(csv_text: str) -> dict[str, tuple[int, str]]:
    """Parse ``--query-gpu=index,pci.bus_id --format=csv,noheader`` into
    {canonical bus id: (index, bus id as printed)}."""
    return {normalize_bus_id(bus): (int(index), bus)
            for index, bus in query_gpu_rows(csv_text, 2)}


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


def _found(nvidia_smi_option: str | None, log: Log) -> str | None:
    """nvidia-smi's path, or None (said in the log: the idle check is then skipped)."""
    nvidia_smi = find_nvidia_smi(nvidia_smi_option)
    if nvidia_smi is None:
        where = f" at {nvidia_smi_option}" if nvidia_smi_option else " on PATH"
        log(
            "GPU idle check skipped: nvidia-smi not found (no NVIDIA driver on this host?)"
            f" [looked{where}]"
        )
    return nvidia_smi


def wait_gpus_idle(
    nvidia_smi_option: str | None,
    gpus: Sequence[int],
    log: Log,
    status: Callable[[str], None],
    *,
    timeout: float,
    progress_every: float,
    should_stop: Callable[[], bool],
    holders: Callable[[str, Sequence[int]], list[GpuHolder]] = gpu_holders,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    poll: float = 1.0,
) -> GpuWait:
    """Wait until no compute process holds one of ``gpus``: a restart right after a crash
    meets the old process's memory for a fraction of a second (docs/benchmarks.md), an
    operator's job on the GPU for longer.
    Waiting is visible (log + STATUS= every ``progress_every`` s) and bounded by ``timeout``.

    Returns how the wait ended (GpuWait)."""
    nvidia_smi = _found(nvidia_smi_option, log)
    if nvidia_smi is None:
        return GpuWait.IDLE
    started = clock()
    next_log = started
    named = ",".join(map(str, gpus))
    while True:
        try:
            # aside: an nvidia-smi that hangs (up to NVIDIA_SMI_TIMEOUT_S, twice) must not
            # hide a stop from this thread
            held = aside(lambda: holders(nvidia_smi, gpus), should_stop)
        except GpuCheckError as exc:
            log(f"GPU idle check failed: {exc}")
            log("refusing to start: cannot tell whether the GPUs are free (driver problem?)")
            return GpuWait.ERROR
        if held is None:
            return GpuWait.STOPPED
        if not held:
            waited = clock() - started
            log(f"GPUs {named} are idle" + (f" after {waited:.1f} s" if waited >= poll else ""))
            return GpuWait.IDLE
        now = clock()
        if now - started >= timeout:
            for holder in held:
                log(holder.describe())
            log(f"GPUs still busy after {timeout:g} s: giving up this start (the process "
                "manager retries); stop the holder")
            return GpuWait.BUSY
        if now >= next_log:
            line = (f"waiting for GPUs {named} to be released ({now - started:.0f}/{timeout:g} s): "
                    + "; ".join(h.describe() for h in held))
            log(line)
            status(line)
            next_log = now + progress_every
        if rest(poll, should_stop, sleep, clock):
            return GpuWait.STOPPED
