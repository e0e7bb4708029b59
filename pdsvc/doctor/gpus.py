"""What the driver says about the GPUs: NVML (pynvml) when importable and --nvidia-smi was not
given, else nvidia-smi through the runtime's client (pdsvc.ship.runtime.gpu, the one the units' idle
guard uses: its runner, errors and compute-process parser; doctor adds the memory and driver
queries, kept here because every bundle ships pdsvc/ship/runtime as it is), and the loaded kernel
module's version from /proc."""

from __future__ import annotations

import contextlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pdsvc.ship.runtime.gpu import (
    GpuCheckError,
    _run_nvidia_smi,
    find_nvidia_smi,
    normalize_bus_id,
    parse_compute_apps,
    query_gpu_rows,
)
from pdsvc.ship.runtime.timings import NVIDIA_SMI_TIMEOUT_S

from .host import Host, comm

QUERY_GPU = ("--query-gpu=index,pci.bus_id,memory.total,memory.used", "--format=csv,noheader")
QUERY_APPS = ("--query-compute-apps=gpu_bus_id,pid,process_name,used_memory",
              "--format=csv,noheader")  # as gpu_holders asks
QUERY_DRIVER = ("--query-gpu=driver_version", "--format=csv,noheader")
GpuQueryError = GpuCheckError


class GpuMemory(NamedTuple):
    """One GPU's memory; None where the driver prints [N/A] (MIG, some vGPUs)."""

    index: int  # type: ignore[assignment]  # the field shadows tuple.index, on purpose
    bus_id: str  # as the tool prints it
    total_mib: int | None
    used_mib: int | None


def _mib(text: str) -> int | None:
    """"143771 MiB" / "143771" -> 143771; "[N/A]" -> None."""
    m = re.fullmatch(r"\s*(\d+)\s*(MiB)?\s*", text)
    return int(m.group(1)) if m else None


def parse_query_gpu(csv_text: str) -> list[GpuMemory]:
    """Parse ``QUERY_GPU``'s CSV (index, bus id, memory.total, memory.used)."""
    return [GpuMemory(int(index), bus, _mib(total), _mib(used))
            for index, bus, total, used in query_gpu_rows(csv_text, 4)]


def _smi(path: str, query: tuple[str, ...]) -> str:
    """One nvidia-smi query through the runtime's runner (GpuCheckError on any failure)."""
    return _run_nvidia_smi(path, query, NVIDIA_SMI_TIMEOUT_S, subprocess.run)


class ComputeApp(NamedTuple):
    bus_id: str
    pid: int
    name: str
    used: str  # "69000 MiB" as printed


@dataclass(frozen=True)
class GpuFacts:
    """What the driver says about the GPUs. ``error`` set: gpus/apps are unknown."""

    source: str  # "NVML" or the nvidia-smi run
    gpus: tuple[GpuMemory, ...] = ()
    apps: tuple[ComputeApp, ...] = ()
    driver: str | None = None
    error: str | None = None
    tool_missing: bool = False

    @property
    def via(self) -> str:
        return "NVML" if self.source == "NVML" else "nvidia-smi"

    def by_bus(self) -> dict[str, GpuMemory]:
        return {normalize_bus_id(g.bus_id): g for g in self.gpus}


def query_nvidia_smi(path: str | None, explicit: bool, want_driver: bool) -> GpuFacts:
    """The GPUs and their compute processes, as nvidia-smi prints them."""
    if path is None:
        return GpuFacts(source="nvidia-smi", tool_missing=True, error=(
            "nvidia-smi not found" + (" (--nvidia-smi)" if explicit else " on PATH")))
    try:
        gpus = parse_query_gpu(_smi(path, QUERY_GPU))
        apps = [ComputeApp(*app) for app in parse_compute_apps(_smi(path, QUERY_APPS))]
        driver = next(iter(_smi(path, QUERY_DRIVER).split()), None) if want_driver else None
    except GpuCheckError as exc:
        return GpuFacts(source=path, error=str(exc))
    return GpuFacts(source=path, gpus=tuple(gpus), apps=tuple(apps), driver=driver)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def query_nvml(proc_root: Path) -> GpuFacts | None:
    """The same facts through NVML (pynvml); None when pynvml is not importable."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_* (driver not loaded, lib not found)
        return GpuFacts(source="NVML", error=f"NVML: {exc}")
    gpus, apps = [], []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuMemory(i, bus, mem.total >> 20, mem.used >> 20))
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(p, "usedGpuMemory", None)
                apps.append(ComputeApp(bus, int(p.pid), comm(proc_root, int(p.pid)),
                                       f"{used >> 20} MiB" if isinstance(used, int) else "[N/A]"))
    except Exception as exc:  # noqa: BLE001 - any NVMLError: report, do not crash
        return GpuFacts(source="NVML", driver=None, error=f"NVML: {exc}")
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return GpuFacts(source="NVML", gpus=tuple(gpus), apps=tuple(apps), driver=driver)


def gpu_facts(host: Host, want_driver: bool) -> GpuFacts:
    """NVML when pynvml is importable and --nvidia-smi was not given, else nvidia-smi."""
    nvml = query_nvml(host.proc_root) if host.nvidia_smi is None else None
    if nvml is not None and nvml.error is None:
        return nvml
    smi = query_nvidia_smi(find_nvidia_smi(host.nvidia_smi),
                           explicit=host.nvidia_smi is not None, want_driver=want_driver)
    if nvml is not None and smi.error is not None:  # say both: NVML's reason is often clearer
        return GpuFacts(source=smi.source, error=f"{nvml.error}; {smi.error}",
                        tool_missing=smi.tool_missing)
    return smi


def proc_driver_version(proc_root: Path) -> str | None:
    """The loaded kernel module's version from /proc/driver/nvidia/version, or None."""
    try:
        text = (proc_root / "driver" / "nvidia" / "version").read_text()
    except OSError:
        return None
    m = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s", text)
    return m.group(1) if m else "(version unreadable)"
