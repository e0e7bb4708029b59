"""systemd: new enough for the directives the units use, and PID 1 (else the supervisord
bundle is the way to run the stack)."""

from __future__ import annotations

import re
import subprocess

from pdsvc.plan.build import SYSTEMD_MIN, Plan

from .host import Host, find_tool, run, said
from .rows import Row, fail, ok, warn


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
    systemctl = find_tool(host.systemctl, "systemctl")
    if systemctl is None:
        if not running:
            return [warn("systemd", f"systemd is not PID 1 here (no {host.systemd_run_dir}, no "
                                    "systemctl)", FIX_NO_SYSTEMD)]
        return [fail("systemd", "systemd runs but systemctl was not found",
                     "install systemd's systemctl (or pass --systemctl)")]
    try:
        proc = run([systemctl, "--version"], 10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [warn("systemd", f"cannot run {systemctl} --version: {exc}",
                     "run `systemctl --version` by hand")]
    m = re.match(r"\s*systemd\s+(\d+)", proc.stdout or "")
    if proc.returncode != 0 or m is None:
        return [warn("systemd", f"{systemctl} --version printed no version: {said(proc)}",
                     "run `systemctl --version` by hand")]
    version = int(m.group(1))
    needs = systemd_needs(plan)
    rows = []
    if version < SYSTEMD_MIN:
        rows.append(fail("systemd", f"systemd {version} is older than {SYSTEMD_MIN}, which the "
                                    f"units need ({needs})",
                         "upgrade the OS (Debian 12: 252, Ubuntu 22.04: 249, RHEL 9: 252) or "
                         "use the supervisord bundle"))
    if not running:
        rows.append(warn("systemd", f"systemd {version} is installed but not PID 1 (no "
                                    f"{host.systemd_run_dir})", FIX_NO_SYSTEMD))
    if not rows:
        rows.append(ok("systemd", f"systemd {version} is PID 1 (≥ {SYSTEMD_MIN}: {needs})"))
    return rows
