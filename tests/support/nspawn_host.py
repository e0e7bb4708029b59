"""The host side of tests/support/nspawn.py: /proc and cgroup helpers, the detached
watchdog that outlives a crashed test process, and ``wait_for``. Stdlib only."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def _stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a process, or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    lpar, rpar = data.find("("), data.rfind(")")
    fields = data[rpar + 2 :].split()
    return data[lpar + 1 : rpar], int(fields[1])


def _children(ppid: int, comm: str | None = None) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st and st[1] == ppid and (comm is None or st[0] == comm):
            out.append(int(entry.name))
    return sorted(out)


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _alive(pid: int | None) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return data.rsplit(")", 1)[1].split()[0] != "Z"


def _cgroup_dirs() -> list[Path]:
    """Our cgroup in the hierarchies nspawn uses: name=systemd (v1) and the cgroup2 one."""
    mounts: dict[str, tuple[str, str]] = {}  # key -> (mount point, mount root)
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            f, p = pre.split(), post.split()
            if len(f) < 5 or len(p) < 3:
                continue
            root, mnt, fstype, opts = f[3], f[4], p[0], p[2]
            if fstype == "cgroup2":
                mounts.setdefault("", (mnt, root))
            elif fstype == "cgroup" and "name=systemd" in opts.split(","):
                mounts.setdefault("name=systemd", (mnt, root))
    dirs = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hid, ctrl, path = line.split(":", 2)
            key = "" if hid == "0" else ctrl
            if key not in mounts:
                continue
            mnt, root = mounts[key]
            rel = path
            if root != "/" and (path == root or path.startswith(root + "/")):
                rel = path[len(root) :]
            dirs.append(Path(mnt + "/" + rel.lstrip("/")))
    return dirs


def _rmdir_tree(top: Path) -> None:
    """rmdir a cgroup directory bottom-up (cgroup dirs can only be rmdir'ed, not unlinked)."""
    if not top.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


# Runs detached, one per container, for the case where the test process dies without stop():
# SIGKILLs the container's PID 1 (checked by PID-namespace identity, so a recycled PID is never
# hit) once max_lifetime + 20 s have passed, and removes the container's cgroups once it is gone.
_WATCHDOG = """
import os, signal, sys, time
pid, ns, delay, name = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
cgroups = sys.argv[5:]
def same():
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == ns
    except OSError:
        return False
end = time.monotonic() + delay
while same() and time.monotonic() < end:
    time.sleep(2)
if same():
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
for _ in range(50):
    if not same():
        break
    time.sleep(0.2)
time.sleep(1)
for top in cgroups:
    for d, _, _ in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
        try:
            os.rmdir(d)
        except OSError:
            pass
try:
    os.rmdir(f"/run/systemd/nspawn/propagate/{name}")
except OSError:
    pass
"""


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError after
    ``timeout`` seconds naming ``what`` (and the last exception the predicate raised)."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_exc = None
        except Exception as e:  # reported below
            last_exc = e
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(interval)
