"""Run `systemd-analyze verify` / `security --offline` on a rendered bundle in a scratch root.

verify checks that ExecStart= binaries exist, so the scratch root gets the configured python
(a copy of /usr/bin/true is enough: verify only checks it is executable) and the distribution's
unit directory (for sysinit.target & co). It exits 0 even while printing "…, ignoring" for a
value it cannot parse: every line it prints is treated as a failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from pdsvc.plan.build import Plan

SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def missing() -> str | None:
    if shutil.which("systemd-analyze") is None:
        return "systemd-analyze not installed (apt-get install systemd)"
    if not SYSTEM_UNITS.is_dir():
        return f"{SYSTEM_UNITS} missing"
    return None


def scratch_root(root: Path, plan: Plan, bundle: Path) -> Path:
    """Lay out a root with the bundle installed where install.sh would put it."""
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    for unit in (plan.target, plan.gate, *plan.units):
        shutil.copy(bundle / unit, unit_dir / unit)
    front = [plan.front.haproxy, "/bin/kill"] if plan.front else []
    front += [plan.vip.keepalived] if plan.vip else []
    for exe in {plan.python, plan.router.python, "/usr/bin/systemctl", "/bin/sh", *front}:
        dest = root / exe.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy("/usr/bin/true", dest)
    runtime = root / plan.paths.runtime.lstrip("/")
    runtime.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(bundle / "runtime", runtime)
    return unit_dir


def verify(root: Path, plan: Plan) -> str:
    """All output of systemd-analyze verify ('' means clean)."""
    proc = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", plan.target, plan.gate, *plan.units],
        capture_output=True, text=True, timeout=60, cwd=root / "etc/systemd/system",
    )
    out = (proc.stdout + proc.stderr).strip()
    return out if (out or proc.returncode == 0) else f"exit {proc.returncode}"


def security(root: Path, unit: str) -> float:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--root={root}", unit],
        capture_output=True, text=True, timeout=60, cwd=root / "etc/systemd/system",
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    return float(m.group(1))
