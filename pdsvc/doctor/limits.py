"""What the kernel grants the units: locked memory (``LimitMEMLOCK=infinity``), shared memory
(/dev/shm) and disk for the JIT cache."""

from __future__ import annotations

import os
from pathlib import Path

from pdsvc.plan.build import Plan

from .host import Host, human
from .rows import Row, fail, ok, warn

GIB = 1 << 30
SHM_WARN_BYTES = 16 * GIB  # NCCL and SGLang put buffers in /dev/shm; docker's default is 64 MiB
JIT_WARN_BYTES = 20 * GIB
JIT_FAIL_BYTES = 5 * GIB
CAP_SYS_RESOURCE = 24  # capability(7) bit: may raise a hard rlimit


def fs_space(path: Path) -> tuple[int, int]:
    """(size, bytes available to unprivileged users) of the filesystem holding ``path``."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


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
        return [warn("memlock", f"cannot read {pid1 / 'limits'}: {exc.strerror or exc}",
                     "check `grep 'locked memory' /proc/1/limits` as root")]
    if limit is None:
        return [warn("memlock", f"no 'Max locked memory' line in {pid1 / 'limits'}",
                     "check `ulimit -l` inside a started unit")]
    soft, hard = limit
    if hard == "unlimited":
        return [ok("memlock", "units get ulimit -l unlimited (LimitMEMLOCK=infinity; PID 1's "
                              "hard limit is unlimited)")]
    shown = human(int(hard)) if hard.isdigit() else hard
    try:
        cap = _has_cap((pid1 / "status").read_text(), CAP_SYS_RESOURCE)
    except OSError:
        cap = None
    if cap:
        return [ok("memlock", f"units get ulimit -l unlimited: PID 1's hard limit is {shown} "
                              "but it holds CAP_SYS_RESOURCE, so LimitMEMLOCK=infinity is "
                              "granted")]
    if cap is False:
        return [fail("memlock", f"PID 1's hard memlock limit is {shown} and it lacks "
                                "CAP_SYS_RESOURCE: LimitMEMLOCK=infinity cannot be granted, "
                                "the units would fail to start",
                     "raise the container's limit (docker --ulimit memlock=-1, LXC "
                     "lxc.prlimit.memlock = unlimited)")]
    return [warn("memlock", f"PID 1's hard memlock limit is {shown}; cannot tell whether it "
                            "may raise it (CapEff unreadable)",
                 "check `ulimit -l` inside a started unit (must say unlimited)")]


def check_shm(host: Host) -> list[Row]:
    try:
        size, avail = fs_space(host.shm_path)
    except OSError as exc:
        return [fail("/dev/shm", f"{host.shm_path}: {exc.strerror or exc}",
                     f"mount a tmpfs on {host.shm_path} (NCCL and SGLang need shared memory)")]
    detail = f"{host.shm_path}: {human(size)} ({human(avail)} free)"
    if size < SHM_WARN_BYTES:
        return [warn("/dev/shm", detail + f", under {human(SHM_WARN_BYTES)}",
                     f"mount -o remount,size=64G {host.shm_path} (docker: --shm-size=64g)")]
    return [ok("/dev/shm", detail)]


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
        return [warn("jit cache", f"{path}: cannot stat {where}: {exc.strerror or exc}",
                     f"check `df -h {where}`")]
    on = "" if where == path else f" (on {where})"
    detail = f"{path}{on}: {human(avail)} free"
    fix = f"free space on {where} or set runtime.jit_cache to a larger disk"
    if avail < JIT_FAIL_BYTES:
        return [fail("jit cache", detail + f", under {human(JIT_FAIL_BYTES)}", fix)]
    if avail < JIT_WARN_BYTES:
        return [warn("jit cache", detail + f", under {human(JIT_WARN_BYTES)}", fix)]
    return [ok("jit cache", detail)]
