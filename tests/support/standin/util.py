"""Small process helpers of the stand-in: SGLang-like log lines, /proc walks, atomic writes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid

_LOG_LOCK = threading.Lock()


def log(msg: str, tag: str = "") -> None:
    """One SGLang-like line on stderr: ``[2026-11-29 09:46:00 TP0] msg``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    emit(f"[{stamp}{' ' + tag if tag else ''}] {msg}")


def emit(line: str) -> None:
    with _LOG_LOCK:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def pid_alive(pid: int) -> bool:
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


def descendants(root: int) -> list[int]:
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


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
