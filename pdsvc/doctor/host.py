"""The host as doctor reads it: where from (``Host``: every path and tool injectable, so tests
run against fixture hosts) and the small readers every check shares."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Host:
    """Where doctor reads the host from. Defaults are the real host."""

    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    nvidia_smi: str | None = None  # None: NVML via pynvml if importable, else nvidia-smi on PATH
    shm_path: Path = Path("/dev/shm")
    systemctl: str | None = None  # None: systemctl on PATH
    systemd_run_dir: Path = Path("/run/systemd/system")  # exists iff systemd is PID 1: sd_booted(3)


def run(argv: Sequence[str], timeout: float, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a host tool; OSError and TimeoutExpired are the caller's to turn into a row."""
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
        env=env,
    )


def said(proc: subprocess.CompletedProcess[str], limit: int = 200) -> str:
    """The gist of a failed command's output, on one line."""
    text = " ".join(((proc.stderr or "") + " " + (proc.stdout or "")).split())
    return text[-limit:] if text else f"exit status {proc.returncode}"


def find_tool(explicit: str | None, name: str) -> str | None:
    """``explicit`` when it is an executable file, else ``name`` on PATH; None when neither."""
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    return shutil.which(name)


def comm(proc_root: Path, pid: int) -> str:
    """A process's name (/proc/PID/comm), "?" when it is gone or hidden."""
    try:
        return (proc_root / str(pid) / "comm").read_text().strip() or "?"
    except OSError:
        return "?"


def human(n: float) -> str:
    """Bytes as "64.0 MiB", "252 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable
