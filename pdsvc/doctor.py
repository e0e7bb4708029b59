"""`pdsvc doctor`: does this GPU host fit the plan? A preflight to run before install and start.

Every check reads the host, compares it with the plan and yields rows: ✓ ok, ✗ failed (the
host does not fit the plan; exit 3) or ! warning (it may run, but read the line), each with a
one-line detail and, for ✗ and !, a one-line fix. The checks:

* driver, gpus, gpus idle, gpu memory: the NVIDIA driver is loaded, the plan's GPUs exist
  (matched by PCI bus id), no compute process holds them, and they have the memory the plan's
  ``--mem-fraction-static`` asks for (NVML via pynvml when importable, else nvidia-smi);
* topology, numa: the GPUs are where the plan put them (bus ids, NUMA nodes, CPUs), re-read from
  sysfs, and what the plan did where the kernel reports ``numa_node = -1``;
* ports: every port the plan opens can be bound here (and SGLang's dist-init span is free);
* python, flags …: the configured interpreter has sglang, sglang-router and the transfer
  library, and the installed versions' own parsers accept every command line the units run;
* memlock, /dev/shm, jit cache, systemd: ``LimitMEMLOCK=infinity`` can be granted, shared
  memory and cache disk are large enough, and systemd is new enough and running.

Every host input is injectable (``Host``: sysfs and proc roots, nvidia-smi, systemctl, the
/dev/shm and /run/systemd/system paths) so tests run against fixture hosts. A missing tool is
a row, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import click

from .clikit import (
    EPILOG,
    config_option,
    handle_errors,
    host_option,
    json_option,
    load_host_plan,
    sysfs_option,
    topology_option,
)
from .errors import TopologyError
from .plan import DIST_INIT_SPAN, JIT_CACHE_ENV, SYSTEMD_MIN, EnginePlan, Plan
from .topology import Topology, format_cpulist, read_sysfs

Status = Literal["ok", "warning", "failed"]
SYMBOL: dict[str, str] = {"ok": "✓", "warning": "!", "failed": "✗"}
COLOUR: dict[str, str] = {"ok": "green", "warning": "yellow", "failed": "red"}

EXIT_OK = 0
EXIT_UNFIT = 3  # as TopologyError: the plan does not fit this host

GIB = 1 << 30
SHM_WARN_BYTES = 16 * GIB  # NCCL and SGLang put buffers in /dev/shm; docker's default is 64 MiB
JIT_WARN_BYTES = 20 * GIB
JIT_FAIL_BYTES = 5 * GIB
IDLE_USED_FRACTION = 0.01  # "memory.used ~ 0": an idle H200 shows 0 MiB, some drivers reserve a bit
DP_ZMQ_PORTS = 6  # with --enable-dp-attention SGLang binds base+1…base+6 (PortArgs.init_new)
CAP_SYS_RESOURCE = 24  # capability(7) bit: may raise a hard rlimit
SMI_TIMEOUT_S = 30.0  # nvidia-smi can take seconds per call without persistence mode
VERSION_PROBE_TIMEOUT_S = 60.0
PARSER_PROBE_TIMEOUT_S = 300.0  # importing sglang (torch, triton) takes tens of seconds cold

ENGINE_LAUNCHER = "sglang.launch_server"
ROUTER_LAUNCHER = "sglang_router.launch_router"
QUERY_GPU = ["--query-gpu=index,pci.bus_id,memory.total,memory.used", "--format=csv,noheader"]
QUERY_APPS = [
    "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory", "--format=csv,noheader",
]
QUERY_DRIVER = ["--query-gpu=driver_version", "--format=csv,noheader"]


class GpuQueryError(Exception):
    """nvidia-smi (or NVML) gave no usable answer."""


def normalize_bus_id(bus_id: str) -> str:
    """supervise.normalize_bus_id (imported on use: pdsvc.supervise is a standalone script
    whose imports would slow every pdsvc command once doctor is registered)."""
    from .runtime.gpu import normalize_bus_id as normalize

    return normalize(bus_id)


# --------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    check: str
    status: Status
    detail: str
    fix: str | None = None


def _ok(check: str, detail: str) -> Row:
    return Row(check, "ok", detail)


def _warn(check: str, detail: str, fix: str) -> Row:
    return Row(check, "warning", detail, fix)


def _fail(check: str, detail: str, fix: str) -> Row:
    return Row(check, "failed", detail, fix)


def exit_code(rows: Sequence[Row]) -> int:
    """0 when no row failed (warnings allowed), 3 when the host does not fit the plan."""
    return EXIT_UNFIT if any(r.status == "failed" for r in rows) else EXIT_OK


# --------------------------------------------------------------------------------------------
# The host, as doctor reads it


@dataclass(frozen=True)
class Host:
    """Where doctor reads the host from. Defaults are the real host."""

    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    nvidia_smi: str | None = None  # None: NVML via pynvml if importable, else nvidia-smi on PATH
    shm_path: Path = Path("/dev/shm")
    systemctl: str | None = None  # None: systemctl on PATH
    systemd_run_dir: Path = Path("/run/systemd/system")  # exists iff systemd is PID 1


def fs_space(path: Path) -> tuple[int, int]:
    """(size, bytes available to unprivileged users) of the filesystem holding ``path``."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def _run(argv: Sequence[str], timeout: float, stdin: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a host tool; OSError and TimeoutExpired are the caller's to turn into a row."""
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
        env=env,
    )


def _said(proc: subprocess.CompletedProcess[str], limit: int = 200) -> str:
    """The gist of a failed command's output, on one line."""
    text = " ".join(((proc.stderr or "") + " " + (proc.stdout or "")).split())
    return text[-limit:] if text else f"exit status {proc.returncode}"


def _find_tool(explicit: str | None, name: str) -> str | None:
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    return shutil.which(name)


# --------------------------------------------------------------------------------------------
# GPUs: NVML or nvidia-smi


@dataclass(frozen=True)
class HostGpu:
    index: int
    bus_id: str  # as the tool prints it
    total_mib: int | None
    used_mib: int | None


@dataclass(frozen=True)
class ComputeApp:
    bus_id: str
    pid: int
    name: str
    used: str  # "69000 MiB" as printed


@dataclass(frozen=True)
class GpuFacts:
    """What the driver says about the GPUs. ``error`` set: gpus/apps are unknown."""

    source: str
    gpus: tuple[HostGpu, ...] = ()
    apps: tuple[ComputeApp, ...] = ()
    driver: str | None = None
    error: str | None = None
    tool_missing: bool = False

    def by_bus(self) -> dict[str, HostGpu]:
        return {normalize_bus_id(g.bus_id): g for g in self.gpus}


def _mib(text: str) -> int | None:
    """"143771 MiB" / "143771" -> 143771; "[N/A]" (MIG, some vGPUs) -> None."""
    m = re.fullmatch(r"\s*(\d+)\s*(MiB)?\s*", text)
    return int(m.group(1)) if m else None


def parse_query_gpu(csv_text: str) -> list[HostGpu]:
    """Parse ``--query-gpu=index,pci.bus_id,memory.total,memory.used --format=csv,noheader``."""
    gpus = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            raise GpuQueryError(f"unexpected nvidia-smi --query-gpu line: {line.strip()!r}")
        gpus.append(HostGpu(int(fields[0]), fields[1], _mib(fields[2]), _mib(fields[3])))
    return gpus


def _parse_compute_apps(csv_text: str) -> list[tuple[str, int, str, str]]:
    from .runtime.gpu import GpuCheckError, parse_compute_apps

    try:
        return parse_compute_apps(csv_text)
    except GpuCheckError as exc:
        raise GpuQueryError(str(exc)) from None


def _smi(path: str, args: Sequence[str]) -> str:
    argv = [path, *args]
    try:
        proc = _run(argv, SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"{' '.join(argv)} timed out after {SMI_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise GpuQueryError(f"cannot run {path}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise GpuQueryError(f"{path} {args[0]} failed: {_said(proc)}")
    return proc.stdout


def query_nvidia_smi(path: str | None, explicit: bool, want_driver: bool) -> GpuFacts:
    """The GPUs and their compute processes, as nvidia-smi prints them."""
    if path is None:
        return GpuFacts(source="nvidia-smi", tool_missing=True, error=(
            "nvidia-smi not found" + (" (--nvidia-smi)" if explicit else " on PATH")))
    try:
        gpus = parse_query_gpu(_smi(path, QUERY_GPU))
        apps = [ComputeApp(*a) for a in _parse_compute_apps(_smi(path, QUERY_APPS))]
        driver = None
        if want_driver:
            lines = _smi(path, QUERY_DRIVER).split()
            driver = lines[0] if lines else None
    except GpuQueryError as exc:
        return GpuFacts(source=path, error=str(exc))
    return GpuFacts(source=path, gpus=tuple(gpus), apps=tuple(apps), driver=driver)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _comm(proc_root: Path, pid: int) -> str:
    try:
        return (proc_root / str(pid) / "comm").read_text().strip() or "?"
    except OSError:
        return "?"


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
            gpus.append(HostGpu(i, bus, mem.total >> 20, mem.used >> 20))
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(p, "usedGpuMemory", None)
                apps.append(ComputeApp(bus, int(p.pid), _comm(proc_root, int(p.pid)),
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
    smi = query_nvidia_smi(_find_tool(host.nvidia_smi, "nvidia-smi"),
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


FIX_DRIVER = ("install and load the NVIDIA driver (modprobe nvidia nvidia_uvm); "
              "`nvidia-smi` must list the GPUs")


def check_driver(host: Host, facts: GpuFacts) -> list[Row]:
    loaded = proc_driver_version(host.proc_root)
    via = "NVML" if facts.source == "NVML" else "nvidia-smi"
    if loaded:
        return [_ok("driver", f"NVIDIA {loaded} loaded")]
    if facts.error is None:
        version = facts.driver or "(version unknown)"
        return [_ok("driver", f"NVIDIA {version} loaded (per {via}; no "
                              f"{host.proc_root}/driver/nvidia/version)")]
    return [_fail("driver", f"NVIDIA driver not loaded: no {host.proc_root}/driver/nvidia/version"
                            f" and {facts.error}", FIX_DRIVER)]


def mem_fraction(argv: Sequence[str]) -> float | None:
    """The ``--mem-fraction-static`` value on an engine command line, or None."""
    for i, word in enumerate(argv):
        value = None
        if word == "--mem-fraction-static" and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith("--mem-fraction-static="):
            value = word.split("=", 1)[1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def check_gpus(plan: Plan, host: Host, facts: GpuFacts) -> list[Row]:
    """The plan's GPUs exist (by bus id, with the plan's index), are idle, have the memory."""
    if facts.error is not None:
        if proc_driver_version(host.proc_root) is None:
            return []  # the driver row already says it all
        fix = ("install nvidia-smi (the units' GPU idle guard uses it too) or pass --nvidia-smi"
               if facts.tool_missing else FIX_DRIVER)
        return [_fail("gpus", f"cannot list the GPUs: {facts.error}", fix)]
    rows: list[Row] = []
    by_bus = facts.by_bus()
    listed = format_cpulist([g.index for g in facts.gpus]) or "none"
    missing, renumbered = [], []
    for e in plan.engines:
        for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True):
            g = by_bus.get(normalize_bus_id(bus))
            if g is None:
                missing.append(f"GPU {index} ({bus}) of {e.name}")
            elif g.index != index:
                renumbered.append(f"{bus} is GPU {g.index} there, GPU {index} in the plan")
    fix_rerender = "re-render on this host (`pdsvc render`, no --topology) and reinstall"
    for what in missing:
        rows.append(_fail("gpus", f"{what} is not listed by {_via(facts)} (it lists GPUs "
                                  f"{listed})", fix_rerender))
    for what in renumbered:
        rows.append(_fail("gpus", f"{_via(facts)} numbers GPUs differently: {what}",
                          fix_rerender + "; CUDA_VISIBLE_DEVICES would select other GPUs"))
    if not rows:
        planned = sorted(i for e in plan.engines for i in e.gpus)
        totals = {g.total_mib for g in facts.gpus}
        size = f", {totals.pop()} MiB each" if len(totals) == 1 and None not in totals else ""
        rows.append(_ok("gpus", f"GPUs {format_cpulist(planned)} of the plan present "
                                f"({len(facts.gpus)} listed by {_via(facts)}{size})"))
    rows += _idle_rows(plan, facts)
    rows += _memory_rows(plan, facts)
    return rows


def _via(facts: GpuFacts) -> str:
    return "NVML" if facts.source == "NVML" else "nvidia-smi"


def _planned_gpus(plan: Plan, facts: GpuFacts) -> list[tuple[EnginePlan, int, str, HostGpu]]:
    by_bus = facts.by_bus()
    out = []
    for e in plan.engines:
        for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True):
            g = by_bus.get(normalize_bus_id(bus))
            if g is not None:
                out.append((e, index, bus, g))
    return out


def _idle_rows(plan: Plan, facts: GpuFacts) -> list[Row]:
    planned = {normalize_bus_id(bus): (e, index, bus)
               for e in plan.engines for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True)}
    rows = []
    for app in sorted(facts.apps, key=lambda a: (normalize_bus_id(a.bus_id), a.pid)):
        hit = planned.get(normalize_bus_id(app.bus_id))
        if hit is None:
            continue
        e, index, bus = hit
        rows.append(_fail(
            "gpus idle",
            f"GPU {index} ({bus}, {e.name}) held by pid {app.pid} {app.name} ({app.used})",
            f"stop it (`systemctl status {app.pid}` names its unit) or wait for it to exit",
        ))
    if not rows:
        planned_list = format_cpulist(sorted(i for e in plan.engines for i in e.gpus))
        rows.append(_ok("gpus idle", f"no compute process on GPUs {planned_list}"))
    return rows


def _memory_rows(plan: Plan, facts: GpuFacts) -> list[Row]:
    rows = []
    fractions = []
    for e, index, bus, g in _planned_gpus(plan, facts):
        fraction = mem_fraction(e.argv)
        fractions.append(fraction)
        if g.total_mib is None or g.used_mib is None:
            rows.append(_warn("gpu memory", f"GPU {index} ({bus}): memory not reported by "
                                            f"{_via(facts)}", "check `nvidia-smi -q -d MEMORY`"))
            continue
        free = g.total_mib - g.used_mib
        if fraction is not None and free < fraction * g.total_mib:
            need = round(fraction * g.total_mib)
            rows.append(_fail(
                "gpu memory",
                f"GPU {index} ({bus}): {free} MiB free, {e.name} needs "
                f"{fraction:g} × {g.total_mib} = {need} MiB (mem-fraction-static)",
                f"free the GPU (see gpus idle) or lower {e.role}.args.mem-fraction-static",
            ))
        elif fraction is None and g.used_mib > IDLE_USED_FRACTION * g.total_mib:
            listed = any(normalize_bus_id(a.bus_id) == normalize_bus_id(g.bus_id)
                         for a in facts.apps)
            why = "see gpus idle" if listed else "no process listed: another container or VM?"
            rows.append(_warn(
                "gpu memory",
                f"GPU {index} ({bus}): {g.used_mib} of {g.total_mib} MiB already in use ({why})",
                f"free it: SGLang sizes its KV cache from what is free (or set {e.role}.args."
                "mem-fraction-static so doctor can check the need)",
            ))
    if not rows and fractions:
        set_fractions = sorted({f for f in fractions if f is not None})
        need = (f"; the plan needs ≥ {'/'.join(f'{f:g}' for f in set_fractions)} × total free"
                if set_fractions else "")
        rows.append(_ok("gpu memory", f"the plan's GPUs are free (memory.used ~ 0){need}"))
    return rows


def nvidia_smi_guard_row(host: Host, facts: GpuFacts) -> list[Row]:
    """With NVML the report needs no nvidia-smi, but the units' start guard does."""
    if facts.source != "NVML" or shutil.which("nvidia-smi"):
        return []
    return [_warn("gpus idle", "nvidia-smi is not on PATH: the units' GPU idle guard "
                               "(supervise.py) will skip its check",
                  "install the driver's utilities (nvidia-utils) so nvidia-smi is on PATH")]


# --------------------------------------------------------------------------------------------
# Topology and NUMA


def check_topology(plan: Plan, topo: Topology) -> list[Row]:
    """Each engine's GPUs have the plan's bus ids and NUMA node here; its CPUs exist here."""
    rows = []
    host_cpus = {c for n in topo.nodes for c in n.cpus}
    fix = ("re-render on this host (`pdsvc render` reads /sys) and reinstall, or give the role "
           "GPUs of one node (see `pdsvc topology`)")
    for e in plan.engines:
        for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True):
            g = topo.gpu(index)
            if g is None:
                rows.append(_fail("topology", f"GPU {index} ({bus}) of {e.name} is not in "
                                              f"{topo.source}", fix))
            elif g.pci_bus_id.lower() != bus.lower():
                rows.append(_fail("topology", f"GPU {index} of {e.name} is {g.pci_bus_id} here, "
                                              f"{bus} in the plan", fix))
            elif (e.pinning.numa_node is not None and g.numa_node is not None
                  and g.numa_node != e.pinning.numa_node):
                rows.append(_fail(
                    "topology",
                    f"GPU {index} ({bus}) is on NUMA node {g.numa_node} here; the plan pins "
                    f"{e.name} to node {e.pinning.numa_node}", fix))
        if e.pinning.numa_node is not None and topo.node(e.pinning.numa_node) is None:
            have = ", ".join(str(n.id) for n in topo.nodes) or "none"
            rows.append(_fail("topology", f"{e.name} is pinned to NUMA node "
                                          f"{e.pinning.numa_node}, which this host lacks "
                                          f"(nodes {have})", fix))
        elif host_cpus and set(e.pinning.cpus) - host_cpus:
            extra = format_cpulist(sorted(set(e.pinning.cpus) - host_cpus))
            rows.append(_fail("topology", f"{e.name}'s CPUAffinity= lists CPUs {extra}, which "
                                          "this host does not have", fix))
    if not rows:
        parts = []
        for e in plan.engines:
            where = f"node {e.pinning.numa_node}" if e.pinning.numa_node is not None else "no node"
            parts.append(f"{e.name} GPUs {format_cpulist(e.gpus)} ({where})")
        rows.append(_ok("topology", "; ".join(parts) + f" as planned ({topo.source})"))
    return rows


def check_numa(plan: Plan, topo: Topology) -> list[Row]:
    """`!` for every engine whose GPUs report numa_node -1 here, with what the plan did."""
    rows = []
    used_warnings = set()
    for e in plan.engines:
        unknown = [i for i in e.gpus if (g := topo.gpu(i)) is not None and g.numa_node is None]
        if not unknown:
            continue
        said = next((w for w in plan.warnings if w.startswith(f"{e.role}:")), None)
        if said:
            used_warnings.add(said)
            did = said.split(":", 1)[1].strip()
        elif e.pinning.numa_node is not None:
            did = (f"GPUs {format_cpulist(unknown)} report numa_node -1 (unknown) here; the plan "
                   f"({plan.topology_source}) pins to node {e.pinning.numa_node}, which this "
                   "host cannot confirm")
        else:
            did = f"GPUs {format_cpulist(unknown)} report numa_node -1 (unknown); not pinned"
        rows.append(_warn(
            "numa", f"{e.name}: {did}",
            f"nothing to do on a one-node VM; on a multi-node host set {e.role}.numa_node to "
            "the GPUs' node (nvidia-smi topo -m shows it)",
        ))
    for w in plan.warnings:
        if w not in used_warnings:
            rows.append(_warn("plan", w, "see the warning; `pdsvc plan` shows the pinning"))
    if not rows:
        rows.append(_ok("numa", "; ".join(
            f"{e.name} pinned to {e.pinning.why}" for e in plan.engines)))
    return rows


# --------------------------------------------------------------------------------------------
# Ports


@dataclass(frozen=True)
class PlannedPort:
    host: str
    port: int
    what: str


def planned_ports(plan: Plan) -> list[PlannedPort]:
    """Every port the plan's units bind, with the address they bind it on."""
    ports = []
    for e in plan.engines:
        ports.append(PlannedPort(e.host, e.port, f"{e.name} HTTP"))
        if e.role == "prefill":
            ports.append(PlannedPort(e.host, e.bootstrap_port, f"{e.name} KV bootstrap"))
        if e.node_rank == 0:  # the other ranks of an engine spanning hosts dial rank 0's
            dist_host, dist_port = e.dist_init_addr.rsplit(":", 1)
            ports.append(PlannedPort(dist_host, int(dist_port), f"{e.name} dist-init"))
    r = plan.router
    if r is not None:  # None: one host of several, without the router
        ports.append(PlannedPort(r.host, r.port, f"{r.name} HTTP"))
        ports.append(PlannedPort(r.prometheus_host, r.prometheus_port, f"{r.name} Prometheus"))
    return ports


def try_bind(host: str, port: int) -> int:
    """0 when ``host:port`` can be bound (SO_REUSEADDR off, so any socket on it counts); else
    the errno (EADDRINUSE, EADDRNOTAVAIL, EACCES …)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return errno.EADDRNOTAVAIL
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.errno or errno.EADDRINUSE
    return 0


@dataclass(frozen=True)
class PortUse:
    states: frozenset[str]  # /proc/net/tcp st column: 0A LISTEN, 06 TIME_WAIT, 01 ESTABLISHED
    holders: tuple[tuple[int, str], ...]  # (pid, comm)
    uids: frozenset[int]


def port_use(proc_root: Path, port: int) -> PortUse:
    """Who holds ``port``: /proc/net/tcp{,6} for the sockets, /proc/*/fd for their owners
    (other users' processes are visible to root only)."""
    states, inodes, uids = set(), set(), set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or ":" not in f[1]:
                continue
            try:
                local_port = int(f[1].rsplit(":", 1)[1], 16)
            except ValueError:
                continue
            if local_port != port:
                continue
            states.add(f[3].upper())
            with contextlib.suppress(ValueError):
                uids.add(int(f[7]))
            if f[9] != "0":
                inodes.add(f"socket:[{f[9]}]")
    holders: set[tuple[int, str]] = set()
    if inodes:
        try:
            pids = [p for p in os.listdir(proc_root) if p.isdigit()]
        except OSError:
            pids = []
        for pid in pids:
            fd_dir = proc_root / pid / "fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(fd_dir / fd)
                except OSError:
                    continue
                if link in inodes:
                    holders.add((int(pid), _comm(proc_root, int(pid))))
                    break
    return PortUse(frozenset(states), tuple(sorted(holders)), frozenset(uids))


def _time_wait_only(use: PortUse) -> bool:
    """Only closed connections waiting out TIME_WAIT: a server with SO_REUSEADDR binds."""
    return bool(use.states) and use.states <= {"06"}


def _describe_use(use: PortUse) -> str:
    if use.holders:
        return "in use by " + ", ".join(f"pid {pid} {comm}" for pid, comm in use.holders)
    if "0A" in use.states and use.uids:
        owner = ", ".join(str(u) for u in sorted(use.uids))
        return f"in use (listening, uid {owner}; run as root to see the process)"
    return "in use"


def _unprivileged_start(proc_root: Path) -> int:
    try:
        return int((proc_root / "sys/net/ipv4/ip_unprivileged_port_start").read_text().strip())
    except (OSError, ValueError):
        return 1024


def check_ports(plan: Plan, host: Host) -> list[Row]:
    rows = []
    low = _unprivileged_start(host.proc_root)
    free: list[PlannedPort] = []
    for p in planned_ports(plan):
        where = f"{p.host}:{p.port}"
        if p.port < low and plan.user != "root":
            rows.append(_fail("ports", f"{where} ({p.what}) is a privileged port (< {low}); the "
                                       f"units run as {plan.user} without capabilities",
                              f"use a port ≥ {low} in the config"))
            continue
        err = try_bind(p.host, p.port)
        if err == 0:
            free.append(p)
        elif err == errno.EADDRNOTAVAIL:
            rows.append(_fail("ports", f"{where} ({p.what}): {p.host} is not an address of this "
                                       "host", "set the host to an address of this machine "
                                               "(or 0.0.0.0)"))
        elif err == errno.EADDRINUSE:
            use = port_use(host.proc_root, p.port)
            if _time_wait_only(use):
                rows.append(_warn("ports", f"{where} ({p.what}) has only TIME_WAIT connections; "
                                           "servers that set SO_REUSEADDR (uvicorn) can bind it",
                                  "wait a minute and re-run pdsvc doctor"))
            else:
                rows.append(_fail("ports", f"{where} ({p.what}) {_describe_use(use)}",
                                  "stop what holds it (`ss -ltnp 'sport = :"
                                  f"{p.port}'`) or move the port in the config"))
        else:
            rows.append(_warn("ports", f"{where} ({p.what}): cannot test: "
                                       f"{os.strerror(err)}", "re-run pdsvc doctor as root"))
    rows += _span_rows(plan, host.proc_root)
    if not rows:
        by_host: dict[str, list[str]] = {}
        for p in free:
            by_host.setdefault(p.host, []).append(str(p.port))
        listed = "  ".join(f"{h}:{','.join(ps)}" for h, ps in by_host.items())
        spans = ", ".join(f"{b + 1}…{b + DIST_INIT_SPAN - 1}" for _, b in _dist_bases(plan))
        kept = f" (and {spans} kept for SGLang)" if spans else ""
        rows.append(_ok("ports", f"{len(free)} free: {listed}{kept}"))
    return rows


def _dist_bases(plan: Plan) -> list[tuple[EnginePlan, int]]:
    return [(e, e.dist_init_port) for e in plan.engines if e.node_rank == 0]


def _span_rows(plan: Plan, proc_root: Path) -> list[Row]:
    """SGLang takes ports above each dist-init base (ZMQ with --enable-dp-attention)."""
    rows = []
    for e, base in _dist_bases(plan):
        dist_host = e.dist_init_addr.rsplit(":", 1)[0]
        dp = "--enable-dp-attention" in e.argv
        busy = [port for port in range(base + 1, min(base + DIST_INIT_SPAN, 65536))
                if try_bind(dist_host, port) == errno.EADDRINUSE
                and not _time_wait_only(port_use(proc_root, port))]
        if not busy:
            continue
        needed = [p for p in busy if p <= base + DP_ZMQ_PORTS]
        text = (f"{e.name}: {format_cpulist(busy)} in use, within {base + 1}…"
                f"{base + DIST_INIT_SPAN - 1} kept for SGLang (dist-init {base})")
        fix = f"free them or move {e.role}.dist_init_port"
        if dp and needed:
            rows.append(_fail("ports", text + f"; with --enable-dp-attention SGLang binds "
                                              f"{base + 1}…{base + DP_ZMQ_PORTS}", fix))
        else:
            rows.append(_warn("ports", text + "; SGLang binds base+1…+6 with "
                                              "--enable-dp-attention", fix))
    return rows


# --------------------------------------------------------------------------------------------
# Python, packages and the launchers' own parsers

VERSIONS_MARKER = "pdsvc-doctor-versions"
PARSE_MARKER = "pdsvc-doctor-parse"
RESULT_PREFIX = "pdsvc-doctor-result "

#: Run by the configured python as ``PY -I -c VERSIONS_PROBE pdsvc-doctor-versions JSON``
#: (JSON: {label: {"dists": [...], "module": "name"}}). Stdlib only, Python >= 3.8.
VERSIONS_PROBE = r"""
import importlib.metadata as md, importlib.util, json, platform, sys
wanted = json.loads(sys.argv[-1])
found = {}
for label, spec in wanted.items():
    version = None
    for dist in spec["dists"]:
        try:
            version = md.version(dist)
            break
        except md.PackageNotFoundError:
            pass
    if version is None and importlib.util.find_spec(spec["module"]) is not None:
        version = "(importable, version unknown)"
    found[label] = version
print("pdsvc-doctor-result " + json.dumps(
    {"python": platform.python_version(), "executable": sys.executable, "versions": found}))
"""

#: Run by the configured python as ``PY -I -c PARSER_PROBE pdsvc-doctor-parse`` with
#: ``[{"kind": "sglang"|"router", "argv": [...], "env": {...}}, ...]`` on stdin. Does what
#: ``python -m sglang.launch_server`` / ``-m sglang_router.launch_router`` do before starting
#: anything (load_plugins + prepare_server_args; parse_router_args + validation + the Rust
#: config), and prints one {"ok", "error", "parser", "abbreviated"} per item.
PARSER_PROBE = r"""
import contextlib, io, json, os, sys

def stub_triton():
    # sglang imports triton at module level for nothing its parser needs; stub it only
    # when it is missing (it is installed on a GPU host).
    try:
        import triton  # noqa: F401
        return
    except Exception:
        pass
    import importlib.abc, importlib.machinery
    from unittest import mock

    class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "triton" or name.startswith("triton."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            module.__path__ = []
            module.__version__ = "0.0.0+pdsvc-stub"

            def getattr_(attr):
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return mock.MagicMock(name=module.__name__ + "." + attr)

            module.__getattr__ = getattr_

    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, Stub())

def parse_sglang(argv):
    from sglang.srt.server_args import prepare_server_args
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins is not None:
        load_plugins()
    prepare_server_args(argv)

def parse_router(argv):
    import copy
    import sglang_router.launch_router as launch_router
    sys.argv[0] = "sglang_router.launch_router"
    args = launch_router.parse_router_args(argv)
    validate = getattr(args, "_validate_router_args", None)
    if validate is not None:
        validate()
    try:
        from sglang_router.router import Router
    except ImportError:
        Router = None
    if Router is not None and hasattr(Router, "from_args"):
        Router.from_args(copy.deepcopy(args))

def abbreviated(parsers, argv):
    # options accepted only as argparse prefix abbreviations (allow_abbrev is on in both)
    if not parsers:
        return []
    known = parsers[-1]._option_string_actions
    found = []
    for word in argv:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            matches = sorted(o for o in known if o.startswith(name))
            if matches:
                found.append([name, matches[0]])
    return found

def last_error(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    errors = [l for l in lines if ": error: " in l]
    return (errors or lines or [""])[-1]

import argparse
parsers = []
real_parse_args = argparse.ArgumentParser.parse_args

def parse_args(self, *args, **kwargs):
    parsers.append(self)
    return real_parse_args(self, *args, **kwargs)

argparse.ArgumentParser.parse_args = parse_args
items = json.load(sys.stdin)
stub_triton()
results = []
for item in items:
    os.environ.update(item.get("env") or {})
    captured = io.StringIO()
    result = {"ok": False, "error": None, "parser": True, "abbreviated": []}
    del parsers[:]
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            (parse_sglang if item["kind"] == "sglang" else parse_router)(list(item["argv"]))
        result["ok"] = True
        result["abbreviated"] = abbreviated(parsers, item["argv"])
    except SystemExit as exc:
        result["error"] = last_error(captured.getvalue()) or "parser exited (%s)" % exc.code
    except BaseException as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, " ".join(str(exc).split())[:300])
        result["parser"] = False
    results.append(result)
sys.stdout.write("pdsvc-doctor-result " + json.dumps(results) + "\n")
sys.stdout.flush()
os._exit(0)  # no interpreter teardown: sglang's import may leave non-daemon threads
"""


@dataclass(frozen=True)
class Requirement:
    label: str
    dists: tuple[str, ...]
    module: str


def requirements(plan: Plan) -> list[Requirement]:
    """What the units import: SGLang, the router, and the KV transfer library."""
    reqs = [Requirement("sglang", ("sglang",), "sglang"),
            Requirement("sglang-router", ("sglang-router", "sglang_router"), "sglang_router")]
    if plan.transfer_backend == "nixl":
        reqs.append(Requirement("nixl", ("nixl", "nixl-cu12", "nixl-cu13", "nixl_cu12",
                                         "nixl_cu13"), "nixl"))
    elif plan.transfer_backend.startswith("mooncake"):
        reqs.append(Requirement("mooncake", ("mooncake-transfer-engine",), "mooncake"))
    return reqs


def _result_line(stdout: str) -> Any:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise ValueError("no result line")


def _resolve_python(python: str) -> str | None:
    if "/" not in python:
        return shutil.which(python)
    return python if os.path.isfile(python) and os.access(python, os.X_OK) else None


def check_python(plan: Plan) -> tuple[list[Row], dict[str, str | None] | None]:
    """The interpreter exists and has the packages; returns rows and {label: version}."""
    python = _resolve_python(plan.python)
    reqs = requirements(plan)
    venv = Path(plan.python).parent.parent
    fix_venv = (f"create it (python3 -m venv {venv} && {venv}/bin/pip install "
                f"{' '.join(r.dists[0] for r in reqs)}; pyproject.toml's serve extra pins the "
                "tested versions) or set runtime.python")
    if python is None:
        return [_fail("python", f"{plan.python} (runtime.python) not found or not executable",
                      fix_venv)], None
    wanted = json.dumps({r.label: {"dists": list(r.dists), "module": r.module} for r in reqs})
    proc = None
    try:
        proc = _run([python, "-I", "-c", VERSIONS_PROBE, VERSIONS_MARKER, wanted],
                    VERSION_PROBE_TIMEOUT_S)
        answer = _result_line(proc.stdout)
        versions: dict[str, str | None] = answer["versions"]
    except subprocess.TimeoutExpired:
        return [_fail("python", f"{python} did not answer within {VERSION_PROBE_TIMEOUT_S:g} s",
                      f"run {python} -c 'import sys' by hand and fix what hangs")], None
    except OSError as exc:
        return [_fail("python", f"cannot run {python}: {exc.strerror or exc}", fix_venv)], None
    except (ValueError, KeyError, TypeError):
        said = _said(proc) if proc is not None else "no answer"
        return [_fail("python", f"{python} failed the version probe: {said}",
                      f"run {python} -c 'import importlib.metadata' by hand")], None
    listed = ", ".join(f"{r.label} {versions.get(r.label) or 'MISSING'}" for r in reqs)
    detail = f"{python} (Python {answer.get('python', '?')}): {listed}"
    missing = [r.dists[0] for r in reqs if not versions.get(r.label)]
    if missing:
        return [_fail("python", detail, f"{python} -m pip install {' '.join(missing)}")], versions
    return [_ok("python", detail)], versions


def _probe_env(env: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The unit's environment for the parser probe, less HOME and the JIT cache directories
    (importing SGLang as root must not create the service user's cache directories)."""
    skip = {var for var, _ in JIT_CACHE_ENV} | {"HOME", "CUDA_CACHE_MAXSIZE"}
    return {k: v for k, v in env if k not in skip}


@dataclass(frozen=True)
class ParseJob:
    """One command line for a launcher's own parser."""

    check: str  # row name: "flags prefill", "flags router"
    unit: str
    kind: Literal["sglang", "router"]
    config_key: str  # where its extra flags come from in the config
    argv: tuple[str, ...]  # the full argv: [python, -m, module, flags...]
    env: dict[str, str]

    @property
    def launcher(self) -> str:
        return ENGINE_LAUNCHER if self.kind == "sglang" else ROUTER_LAUNCHER

    @property
    def dist(self) -> str:
        return "sglang" if self.kind == "sglang" else "sglang-router"


def parse_jobs(plan: Plan) -> list[ParseJob]:
    jobs = [ParseJob(f"flags {e.role}", e.name, "sglang", f"{e.role}.args", e.argv,
                     _probe_env(e.env)) for e in plan.engines]
    r = plan.router
    if r is not None:
        jobs.append(ParseJob("flags router", r.name, "router", "router.args", r.argv,
                             dict(r.env)))
    return jobs


def check_flags(plan: Plan, versions: dict[str, str | None] | None) -> list[Row]:
    """Ask the installed launchers' own parsers about every command line the units run."""
    if versions is None:
        return []  # the python row failed: nothing to ask
    rows: list[Row] = []
    asked: list[ParseJob] = []
    for job in parse_jobs(plan):
        module = job.argv[2] if len(job.argv) > 2 and job.argv[1] == "-m" else "?"
        if module != job.launcher:
            rows.append(_warn(job.check, f"{job.unit} runs {module}, not {job.launcher}: its "
                                         "flags were not checked",
                              f"check them with `{plan.python} -m {module} --help`"))
        elif versions.get(job.dist):  # else the python row names the missing package
            asked.append(job)
    if not asked:
        return rows
    python = _resolve_python(plan.python) or plan.python
    batch = [{"kind": j.kind, "argv": list(j.argv[3:]), "env": j.env} for j in asked]
    said = "it printed no result"
    try:
        proc = _run([python, "-I", "-c", PARSER_PROBE, PARSE_MARKER], PARSER_PROBE_TIMEOUT_S,
                    stdin=json.dumps(batch))
        said = _said(proc)
        results = _result_line(proc.stdout)
        if not isinstance(results, list) or len(results) != len(asked):
            raise ValueError("wrong number of results")
    except subprocess.TimeoutExpired:
        return rows + [_warn(j.check, f"{j.unit}: the parser probe took over "
                                      f"{PARSER_PROBE_TIMEOUT_S:g} s",
                             "re-run pdsvc doctor (a cold import can be slow)") for j in asked]
    except OSError as exc:
        said = exc.strerror or str(exc)
        results = None
    except (ValueError, KeyError, TypeError):
        results = None
    if results is None:
        return rows + [_fail(j.check, f"{j.unit}: the parser probe died: {said}",
                             f"run `{plan.python} -m {j.launcher} --help` and fix what it prints")
                       for j in asked]
    for job, result in zip(asked, results, strict=True):
        version = f"{job.dist} {versions.get(job.dist)}"
        flags = sum(1 for w in job.argv[3:] if w.startswith("--"))
        short = result.get("abbreviated") or []
        if result.get("ok") and short:
            named = ", ".join(f"{given} as {full}" for given, full in short)
            rows.append(_warn(job.check, f"{version} accepts {job.unit} only by abbreviation: "
                                         f"{named}",
                              f"spell the flags out in {job.config_key} (a new flag upstream "
                              "makes an abbreviation ambiguous)"))
        elif result.get("ok"):
            rows.append(_ok(job.check, f"{version} accepts {job.unit}'s {flags} flags"))
        elif result.get("parser", True):
            rows.append(_fail(job.check, f"{version} refuses {job.unit}: {result.get('error')}",
                              f"fix {job.config_key} in the config (or install the version it "
                              "was written for), then `pdsvc render`"))
        else:
            rows.append(_fail(job.check, f"{job.unit}: {job.launcher} fails before starting: "
                                         f"{result.get('error')}",
                              f"run `{plan.python} -m {job.launcher} --help` and fix what it "
                              "prints"))
    return rows


# --------------------------------------------------------------------------------------------
# Limits, shared memory, disk, systemd


def _limits_line(text: str, name: str) -> tuple[str, str] | None:
    for line in text.splitlines():
        if line.startswith(name):
            fields = line[len(name):].split()
            if len(fields) >= 2:
                return fields[0], fields[1]
    return None


def _has_cap(status_text: str, bit: int) -> bool | None:
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> bit & 1)
            except (IndexError, ValueError):
                return None
    return None


def check_memlock(host: Host) -> list[Row]:
    """The units set LimitMEMLOCK=infinity (NIXL/UCX/NCCL register memory); PID 1 must be
    able to grant it: its own hard limit is unlimited, or it holds CAP_SYS_RESOURCE."""
    pid1 = host.proc_root / "1"
    try:
        limit = _limits_line((pid1 / "limits").read_text(), "Max locked memory")
    except OSError as exc:
        return [_warn("memlock", f"cannot read {pid1 / 'limits'}: {exc.strerror or exc}",
                      "check `grep 'locked memory' /proc/1/limits` as root")]
    if limit is None:
        return [_warn("memlock", f"no 'Max locked memory' line in {pid1 / 'limits'}",
                      "check `ulimit -l` inside a started unit")]
    soft, hard = limit
    if hard == "unlimited":
        return [_ok("memlock", "units get ulimit -l unlimited (LimitMEMLOCK=infinity; PID 1's "
                               "hard limit is unlimited)")]
    shown = _human(int(hard)) if hard.isdigit() else hard
    try:
        cap = _has_cap((pid1 / "status").read_text(), CAP_SYS_RESOURCE)
    except OSError:
        cap = None
    if cap:
        return [_ok("memlock", f"units get ulimit -l unlimited: PID 1's hard limit is {shown} "
                               "but it holds CAP_SYS_RESOURCE, so LimitMEMLOCK=infinity is "
                               "granted")]
    if cap is False:
        return [_fail("memlock", f"PID 1's hard memlock limit is {shown} and it lacks "
                                 "CAP_SYS_RESOURCE: LimitMEMLOCK=infinity cannot be granted, "
                                 "the units would fail to start",
                      "raise the container's limit (docker --ulimit memlock=-1, LXC "
                      "lxc.prlimit.memlock = unlimited)")]
    return [_warn("memlock", f"PID 1's hard memlock limit is {shown}; cannot tell whether it "
                             "may raise it (CapEff unreadable)",
                  "check `ulimit -l` inside a started unit (must say unlimited)")]


def check_shm(host: Host) -> list[Row]:
    try:
        size, avail = fs_space(host.shm_path)
    except OSError as exc:
        return [_fail("/dev/shm", f"{host.shm_path}: {exc.strerror or exc}",
                      f"mount a tmpfs on {host.shm_path} (NCCL and SGLang need shared memory)")]
    detail = f"{host.shm_path}: {_human(size)} ({_human(avail)} free)"
    if size < SHM_WARN_BYTES:
        return [_warn("/dev/shm", detail + f", under {_human(SHM_WARN_BYTES)}",
                      f"mount -o remount,size=64G {host.shm_path} (docker: --shm-size=64g)")]
    return [_ok("/dev/shm", detail)]


def _existing_parent(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_jit_cache(plan: Plan) -> list[Row]:
    """Free disk where the JIT cache will live (DeepGEMM/Triton/FlashInfer kernels: GiBs)."""
    path = Path(plan.paths.jit_cache)
    where = _existing_parent(path)
    try:
        _, avail = fs_space(where)
    except OSError as exc:
        return [_warn("jit cache", f"{path}: cannot stat {where}: {exc.strerror or exc}",
                      f"check `df -h {where}`")]
    on = "" if where == path else f" (on {where})"
    detail = f"{path}{on}: {_human(avail)} free"
    fix = f"free space on {where} or set runtime.jit_cache to a larger disk"
    if avail < JIT_FAIL_BYTES:
        return [_fail("jit cache", detail + f", under {_human(JIT_FAIL_BYTES)}", fix)]
    if avail < JIT_WARN_BYTES:
        return [_warn("jit cache", detail + f", under {_human(JIT_WARN_BYTES)}", fix)]
    return [_ok("jit cache", detail)]


def systemd_needs(plan: Plan | None) -> str:
    """Which directives of the units set the version floor."""
    needs = ["ProtectClock= (245)"]
    if plan is not None and any(e.pinning.mode == "strict" for e in plan.engines):
        needs.insert(0, "AllowedCPUs= (244)")
    if plan is not None and any(e.pinning.numa_node is not None and e.pinning.mode != "off"
                                for e in plan.engines):
        needs.append("NUMAPolicy= (243)")
    return ", ".join(needs)


FIX_NO_SYSTEMD = ("systemd is not the init system here: run the stack under supervisord with "
                  "the supervisord bundle instead of the systemd units")


def check_systemd(plan: Plan | None, host: Host) -> list[Row]:
    running = host.systemd_run_dir.is_dir()
    systemctl = _find_tool(host.systemctl, "systemctl")
    if systemctl is None:
        if not running:
            return [_warn("systemd", f"systemd is not PID 1 here (no {host.systemd_run_dir}, no "
                                     "systemctl)", FIX_NO_SYSTEMD)]
        return [_fail("systemd", "systemd runs but systemctl was not found",
                      "install systemd's systemctl (or pass --systemctl)")]
    try:
        proc = _run([systemctl, "--version"], 10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [_warn("systemd", f"cannot run {systemctl} --version: {exc}",
                      "run `systemctl --version` by hand")]
    m = re.match(r"\s*systemd\s+(\d+)", proc.stdout or "")
    if proc.returncode != 0 or m is None:
        return [_warn("systemd", f"{systemctl} --version printed no version: {_said(proc)}",
                      "run `systemctl --version` by hand")]
    version = int(m.group(1))
    needs = systemd_needs(plan)
    rows = []
    if version < SYSTEMD_MIN:
        rows.append(_fail("systemd", f"systemd {version} is older than {SYSTEMD_MIN}, which the "
                                     f"units need ({needs})",
                          "upgrade the OS (Debian 12: 252, Ubuntu 22.04: 249, RHEL 9: 252) or "
                          "use the supervisord bundle"))
    if not running:
        rows.append(_warn("systemd", f"systemd {version} is installed but not PID 1 (no "
                                     f"{host.systemd_run_dir})", FIX_NO_SYSTEMD))
    if not rows:
        rows.append(_ok("systemd", f"systemd {version} is PID 1 (≥ {SYSTEMD_MIN}: {needs})"))
    return rows


# --------------------------------------------------------------------------------------------
# All checks


def _guarded(check: str, fn: Callable[[], list[Row]]) -> list[Row]:
    """A bug in one check is a row, not a traceback that hides every other row."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return [_warn(check, f"the check itself failed: {type(exc).__name__}: {exc}",
                      "report this as a pdsvc bug")]


def check_network(plan: Plan, host: Host) -> list[Row]:
    """One host of several: its address is this machine's (the engines bind it and peers dial
    it), and each UCX_NET_DEVICES entry is a link that is up (NIXL moves KV over it)."""
    if not plan.hosts:
        return []
    h = plan.hosts[0]
    rows = []
    if try_bind(h.address, 0) == 0:
        rows.append(_ok("network", f"{h.address} (hosts.{h.name}.address) is on this host"))
    else:
        rows.append(_fail("network", f"{h.address} (hosts.{h.name}.address) is not an address "
                          "of this host", f"run on {h.name} (or pass --host NAME), or configure "
                          f"{h.address} on its NIC"))
    devices = dict.fromkeys(d for e in plan.engines
                            for d in dict(e.env).get("UCX_NET_DEVICES", "").split(",") if d)
    for dev in devices:
        state, where = _link_state(host.sysfs_root, dev)
        if state is None:
            rows.append(_fail("network", f"UCX_NET_DEVICES {dev}: no such device ({where})",
                              f"set hosts.{h.name}.ucx_net_devices to a NIC of this host "
                              "(`ibdev2netdev`, `ip -br link`)"))
        elif state != "up":
            rows.append(_fail("network", f"UCX_NET_DEVICES {dev} is {state} ({where})",
                              "bring the link up, or pick another NIC"))
        else:
            rows.append(_ok("network", f"UCX_NET_DEVICES {dev} is up"))
    return rows


def _link_state(sysfs: Path, device: str) -> tuple[str | None, str]:
    """('up' | the link's state | None when absent, the sysfs path read) of a UCX device:
    an RDMA port `mlx5_0:1`, or a netdev `eth1`."""
    if device == "all":
        return "up", "all devices"
    name, _, port = device.partition(":")
    if port:
        path = sysfs / "class/infiniband" / name / "ports" / port / "state"
        try:
            state = path.read_text().split(":")[-1].strip().lower()  # "4: ACTIVE"
        except OSError:
            return None, str(path)
        return ("up" if state == "active" else state), str(path)
    path = sysfs / "class/net" / name / "operstate"
    try:
        state = path.read_text().strip().lower()
    except OSError:
        return None, str(path)
    return ("up" if state in ("up", "unknown") else state), str(path)


def host_rows(host: Host, plan: Plan | None) -> list[Row]:
    """The checks that need no plan."""
    return [
        *_guarded("memlock", lambda: check_memlock(host)),
        *_guarded("/dev/shm", lambda: check_shm(host)),
        *_guarded("systemd", lambda: check_systemd(plan, host)),
    ]


def run_checks(plan: Plan, host: Host) -> list[Row]:
    """Every check of the plan against the host, in report order."""
    rows: list[Row] = []
    if plan.engines:
        want_driver = proc_driver_version(host.proc_root) is None
        facts = gpu_facts(host, want_driver)
        rows += _guarded("driver", lambda: check_driver(host, facts))
        rows += _guarded("gpus", lambda: check_gpus(plan, host, facts))
        rows += _guarded("gpus idle", lambda: nvidia_smi_guard_row(host, facts))
        try:
            topo: Topology | None = read_sysfs(host.sysfs_root)
        except TopologyError as exc:
            rows.append(_fail("topology", f"cannot read {host.sysfs_root}: {exc}",
                              "pass --sysfs-root or run on the GPU host"))
            topo = None
        if topo is not None:
            rows += _guarded("topology", lambda: check_topology(plan, topo))
            rows += _guarded("numa", lambda: check_numa(plan, topo))
    else:  # one host of several that runs only the router: no GPU, no JIT cache
        rows.append(_ok("gpus", f"none planned here ({', '.join(plan.units)} only)"))
    rows += _guarded("network", lambda: check_network(plan, host))
    rows += _guarded("ports", lambda: check_ports(plan, host))
    versions: dict[str, str | None] | None = None

    def python_rows() -> list[Row]:
        nonlocal versions
        found, versions = check_python(plan)
        return found

    rows += _guarded("python", python_rows)
    rows += _guarded("flags", lambda: check_flags(plan, versions))
    if plan.engines:
        rows += _guarded("jit cache", lambda: check_jit_cache(plan))
    rows += host_rows(host, plan)
    return rows


# --------------------------------------------------------------------------------------------
# Output and the command


def format_rows(rows: Sequence[Row], colour: bool = True) -> list[str]:
    width = max((len(r.check) for r in rows), default=0) + 2
    lines = []
    for r in rows:
        symbol = SYMBOL[r.status]
        if colour:
            symbol = click.style(symbol, fg=COLOUR[r.status], bold=True)
        line = f" {symbol} {r.check.ljust(width)}{r.detail}"
        if r.fix:
            line += f"   fix: {r.fix}"
        lines.append(line)
    return lines


def summary(rows: Sequence[Row]) -> str:
    counts = {s: sum(1 for r in rows if r.status == s) for s in ("failed", "warning", "ok")}
    words = f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['failed']} failed"
    if counts["failed"]:
        return f"{words}: this host does not fit the plan (exit {EXIT_UNFIT})"
    return f"{words}: this host fits the plan (exit {EXIT_OK})"


def report_json(rows: Sequence[Row], *, config: Path, plan: Plan | None) -> dict[str, Any]:
    code = exit_code(rows)
    return {
        "format": "pdsvc-doctor/1",
        "config": str(config),
        "target": plan.target if plan else None,
        "topology_source": plan.topology_source if plan else None,
        "ok": code == EXIT_OK,
        "exit_code": code,
        "counts": {s: sum(1 for r in rows if r.status == s) for s in ("ok", "warning", "failed")},
        "checks": [asdict(r) for r in rows],
    }


@click.command(epilog=EPILOG)
@config_option
@sysfs_option
@topology_option
@click.option("--nvidia-smi", "nvidia_smi", metavar="PATH", default=None,
              help="nvidia-smi to ask about GPUs, processes and memory. Default: NVML (pynvml) "
              "if importable, else nvidia-smi on PATH.")
@click.option("--proc-root", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/proc"), show_default=True,
              help="Read driver/nvidia/version, 1/limits, net/tcp … from this /proc-like tree.")
@click.option("--shm-path", type=click.Path(path_type=Path), default=Path("/dev/shm"),
              show_default=True, help="Shared memory mount to size.")
@click.option("--systemctl", metavar="PATH", default=None,
              help="systemctl to ask for the systemd version. Default: systemctl on PATH.")
@click.option("--systemd-run-dir", type=click.Path(path_type=Path),
              default=Path("/run/systemd/system"), show_default=True,
              help="Exists iff systemd is PID 1 (sd_booted(3)).")
@json_option
@host_option
@handle_errors
def doctor(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
           nvidia_smi: str | None, proc_root: Path, shm_path: Path, systemctl: str | None,
           systemd_run_dir: Path, as_json: bool, host_name: str | None) -> None:
    """Check that this host fits the plan: driver, GPUs idle, topology, ports, python, limits.

    \b
    Each check prints one row: ✓ ok, ✗ failed (with a fix), ! warning (with a fix).
    --topology FILE checks the host against a plan made for FILE's layout (the one you
    rendered elsewhere); the host itself is always read from --sysfs-root (default /sys).
    Exit 0 when nothing failed (warnings allowed), 3 when something did, 2 for a bad config.
    """
    host = Host(sysfs_root=sysfs_root or Path("/sys"), proc_root=proc_root,
                nvidia_smi=nvidia_smi, shm_path=shm_path, systemctl=systemctl,
                systemd_run_dir=systemd_run_dir)
    plan: Plan | None = None
    try:
        plan = load_host_plan(config_path, None if topology_file else sysfs_root,
                              topology_file, host_name)[1]
    except TopologyError as err:  # the plan cannot be made for this host: say why, check the rest
        rows = [_fail("plan", err.message, err.hint or "see `pdsvc topology` and the config"),
                *_guarded("driver", lambda: check_driver(
                    host, gpu_facts(host, proc_driver_version(proc_root) is None))),
                *host_rows(host, None)]
    else:
        rows = run_checks(plan, host)
    if as_json:
        click.echo(json.dumps(report_json(rows, config=config_path, plan=plan), indent=2))
    else:
        here = f"host {plan.hosts[0].name}" if plan and plan.hosts else "this host"
        what = f"{plan.target} on {here}" if plan else "this host"
        click.echo(f"pdsvc doctor — {what} (config {config_path})")
        for line in format_rows(rows):
            click.echo(line)
        click.echo(summary(rows))
    sys.exit(exit_code(rows))


__all__ = ["Host", "Row", "doctor", "run_checks"]
