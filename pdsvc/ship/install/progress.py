"""What systemd itself says: the state block the installer ends with, and `--start`'s wait with
a progress line per unit not yet up."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

from .host import journal_last, systemctl_value


def elapsed(s: int) -> str:
    """42s, 3m05s, 1h02m."""
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def unit_state(unit: str) -> tuple[str, str, str]:
    """(load, enabled, active) as systemctl says them; '-' where it says nothing."""
    return (systemctl_value("show", "-p", "LoadState", "--value", unit) or "-",
            systemctl_value("is-enabled", unit) or "-",
            systemctl_value("is-active", unit) or "-")


def show_state(units: list[str], say: Callable[[str], None]) -> None:
    say("state (from systemd):")
    for u in units:
        load, en, act = unit_state(u)
        print(f"  {u:<28} load={load:<10} enabled={en:<10} active={act}", flush=True)


def start_with_progress(target: str, units: list[str], every: int | None = None) -> int:
    """`systemctl start TARGET`, which returns once the stack serves — with a cold JIT cache
    that can take up to an hour (lifecycle.start_budget_secs). Meanwhile, every `every`
    seconds (PDSVC_PROGRESS_SECS, default 15), one line per service not yet active: the time
    elapsed, its phase (the runtime's status line, else systemd's state) and the engine's last
    log line. Returns systemctl's exit status."""
    if every is None:
        every = int(os.environ.get("PDSVC_PROGRESS_SECS", "15"))
    t0 = time.monotonic()

    def now() -> int:
        return int(time.monotonic() - t0)

    nxt = every
    proc = subprocess.Popen(["systemctl", "start", target])
    while proc.poll() is None:
        time.sleep(1)
        if now() < nxt or proc.poll() is not None:
            continue
        nxt = now() + every
        for u in units:
            if not u.endswith(".service"):
                continue
            act = systemctl_value("show", "-p", "ActiveState", "--value", u)
            if act == "active":
                continue
            phase = systemctl_value("show", "-p", "StatusText", "--value", u)
            last = journal_last(u)
            log = f" | log: {last[:160]}" if last else ""
            print(f"... {elapsed(now())}  {u}: {phase or act or '?'}{log}", flush=True)
    print(f">>> systemctl start {target} returned after {elapsed(now())}", flush=True)
    return proc.returncode
