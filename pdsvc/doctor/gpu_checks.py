"""Driver and GPU checks: the NVIDIA driver is loaded, the plan's GPUs exist (matched by PCI bus
id), no compute process holds them, and they have the memory the plan's
``--mem-fraction-static`` asks for."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from pdsvc.plan.build import EnginePlan, Plan
from pdsvc.topology import format_cpulist

from .gpus import GpuFacts, GpuMemory, normalize_bus_id
from .rows import Row, fail, ok, warn

IDLE_USED_FRACTION = 0.01  # "memory.used ~ 0": some drivers reserve a bit (docs/benchmarks.md)

FIX_DRIVER = ("install and load the NVIDIA driver (modprobe nvidia nvidia_uvm); "
              "`nvidia-smi` must list the GPUs")
FIX_RERENDER = "re-render on this host (`pdsvc render`, no --topology) and reinstall"


def check_driver(proc_root: Path, loaded: str | None, gpus: GpuFacts) -> list[Row]:
    """The kernel module is loaded (``loaded``: its /proc version), or the driver answers."""
    if loaded:
        return [ok("driver", f"NVIDIA {loaded} loaded")]
    if gpus.error is None:
        version = gpus.driver or "(version unknown)"
        return [ok("driver", f"NVIDIA {version} loaded (per {gpus.via}; no "
                             f"{proc_root}/driver/nvidia/version)")]
    return [fail("driver", f"NVIDIA driver not loaded: no {proc_root}/driver/nvidia/version"
                           f" and {gpus.error}", FIX_DRIVER)]


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


def _engine_gpus(plan: Plan) -> list[tuple[EnginePlan, int, str]]:
    return [(e, index, bus) for e in plan.engines
            for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True)]


def _planned_gpus(plan: Plan, gpus: GpuFacts) -> list[tuple[EnginePlan, int, str, GpuMemory]]:
    by_bus = gpus.by_bus()
    return [(e, index, bus, by_bus[normalize_bus_id(bus)]) for e, index, bus in _engine_gpus(plan)
            if normalize_bus_id(bus) in by_bus]


def check_gpus(plan: Plan, loaded: str | None, gpus: GpuFacts) -> list[Row]:
    """The plan's GPUs exist here, by bus id, with the plan's index: one row per engine."""
    if not plan.engines:  # one host of several that runs only the router: no GPU, no JIT cache
        return [ok("gpus", f"none planned here ({', '.join(plan.units)} only)")]
    if gpus.error is not None:
        if loaded is None:
            return []  # the driver row already says it all
        fix = ("install nvidia-smi (the units' GPU idle guard uses it too) or pass --nvidia-smi"
               if gpus.tool_missing else FIX_DRIVER)
        return [fail("gpus", f"cannot list the GPUs: {gpus.error}", fix)]
    by_bus = gpus.by_bus()
    listed = format_cpulist([g.index for g in gpus.gpus]) or "none"
    rows = []
    for e in plan.engines:
        missing, renumbered = [], []
        for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True):
            g = by_bus.get(normalize_bus_id(bus))
            if g is None:
                missing.append(f"GPU {index} ({bus})")
            elif g.index != index:
                renumbered.append(f"{bus} is GPU {g.index} there, GPU {index} in the plan")
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            rows.append(fail("gpus", f"{', '.join(missing)} of {e.name} {verb} not listed by "
                                     f"{gpus.via} (it lists GPUs {listed})", FIX_RERENDER))
        if renumbered:
            rows.append(fail("gpus", f"{gpus.via} numbers {e.name}'s GPUs differently: "
                                     f"{'; '.join(renumbered)}",
                             FIX_RERENDER + "; CUDA_VISIBLE_DEVICES would select other GPUs"))
    if rows:
        return rows
    planned = sorted(i for e in plan.engines for i in e.gpus)
    totals = {g.total_mib for g in gpus.gpus}
    size = f", {totals.pop()} MiB each" if len(totals) == 1 and None not in totals else ""
    return [ok("gpus", f"GPUs {format_cpulist(planned)} of the plan present "
                       f"({len(gpus.gpus)} listed by {gpus.via}{size})")]


def check_gpus_idle(plan: Plan, gpus: GpuFacts) -> list[Row]:
    """No compute process holds a GPU of the plan."""
    if gpus.error is not None:
        return []  # the driver or gpus row says why nothing is known
    planned = {normalize_bus_id(bus): (e, index, bus) for e, index, bus in _engine_gpus(plan)}
    rows = []
    for app in sorted(gpus.apps, key=lambda a: (normalize_bus_id(a.bus_id), a.pid)):
        hit = planned.get(normalize_bus_id(app.bus_id))
        if hit is None:
            continue
        e, index, bus = hit
        rows.append(fail(
            "gpus idle",
            f"GPU {index} ({bus}, {e.name}) held by pid {app.pid} {app.name} ({app.used})",
            f"stop it (`systemctl status {app.pid}` names its unit) or wait for it to exit",
        ))
    present = sorted(index for _, index, _, _ in _planned_gpus(plan, gpus))
    if not rows and present:  # vouch only for GPUs the driver lists (the gpus row says the rest)
        rows.append(ok("gpus idle", f"no compute process on GPUs {format_cpulist(present)}"))
    return rows


def check_gpu_memory(plan: Plan, gpus: GpuFacts) -> list[Row]:
    """Each planned GPU has the free memory its engine's --mem-fraction-static needs (or, with
    none set, is not already in use)."""
    if gpus.error is not None:
        return []
    rows = []
    fractions = []
    for e, index, bus, g in _planned_gpus(plan, gpus):
        fraction = mem_fraction(e.argv)
        fractions.append(fraction)
        if g.total_mib is None or g.used_mib is None:
            rows.append(warn("gpu memory", f"GPU {index} ({bus}): memory not reported by "
                                           f"{gpus.via}", "check `nvidia-smi -q -d MEMORY`"))
            continue
        free = g.total_mib - g.used_mib
        if fraction is not None and free < fraction * g.total_mib:
            need = round(fraction * g.total_mib)
            rows.append(fail(
                "gpu memory",
                f"GPU {index} ({bus}): {free} MiB free, {e.name} needs "
                f"{fraction:g} × {g.total_mib} = {need} MiB (mem-fraction-static)",
                f"free the GPU (see gpus idle) or lower {e.role}.args.mem-fraction-static",
            ))
        elif fraction is None and g.used_mib > IDLE_USED_FRACTION * g.total_mib:
            listed = any(normalize_bus_id(a.bus_id) == normalize_bus_id(g.bus_id)
                         for a in gpus.apps)
            why = "see gpus idle" if listed else "no process listed: another container or VM?"
            rows.append(warn(
                "gpu memory",
                f"GPU {index} ({bus}): {g.used_mib} of {g.total_mib} MiB already in use ({why})",
                f"free it: SGLang sizes its KV cache from what is free (or set {e.role}.args."
                "mem-fraction-static so doctor can check the need)",
            ))
    if not rows and fractions:
        set_fractions = sorted({f for f in fractions if f is not None})
        needs = (f"; the plan needs ≥ {'/'.join(f'{f:g}' for f in set_fractions)} × total free"
                 if set_fractions else "")
        rows.append(ok("gpu memory", f"the plan's GPUs are free (memory.used ~ 0){needs}"))
    return rows


def check_idle_guard(gpus: GpuFacts) -> list[Row]:
    """With NVML the report needs no nvidia-smi, but the units' start guard does."""
    if gpus.source != "NVML" or shutil.which("nvidia-smi"):
        return []
    return [warn("gpus idle", "nvidia-smi is not on PATH: the units' GPU idle guard "
                              "(pdsvc.ship.runtime.gpu) will skip its check",
                 "install the driver's utilities (nvidia-utils) so nvidia-smi is on PATH")]
