"""The `pdsvc doctor` command and its output: rows as text (a fix said once) or JSON, and the
exit status."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from pdsvc.cli.kit import (
    EPILOG,
    config_option,
    handle_errors,
    host_option,
    json_option,
    load_host_plan,
    sysfs_option,
    topology_option,
)
from pdsvc.doctor.checks import run_checks
from pdsvc.doctor.host import Host
from pdsvc.doctor.kv import check_kv
from pdsvc.doctor.rows import EXIT_OK, EXIT_UNFIT, Row, exit_code, fail, guarded
from pdsvc.errors import TopologyError
from pdsvc.plan.build import Plan

SYMBOL: dict[str, str] = {"ok": "✓", "warning": "!", "failed": "✗"}
COLOUR: dict[str, str] = {"ok": "green", "warning": "yellow", "failed": "red"}


def format_rows(rows: Sequence[Row], colour: bool = True) -> list[str]:
    """One line a row; a fix already given on an earlier line is not said again."""
    width = max((len(r.check) for r in rows), default=0) + 2
    lines = []
    said: set[str] = set()
    for r in rows:
        symbol = SYMBOL[r.status]
        if colour:
            symbol = click.style(symbol, fg=COLOUR[r.status], bold=True)
        line = f" {symbol} {r.check.ljust(width)}{r.detail}"
        if r.fix and r.fix not in said:
            line += f"   fix: {r.fix}"
            said.add(r.fix)
        elif r.fix:
            line += "   (fix as above)"
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
@click.option("--kv", is_flag=True,
              help="Also prove the KV path: a real NIXL transfer for every prefill→decode pair, "
              "between two processes started as the two units are (user, CPUs, env, devices). "
              "Needs nixl in runtime.python; uses the GPUs, so stop the stack first.")
@click.option("--kv-as", "kv_as", type=click.Choice(["auto", "systemd", "direct"]),
              default="auto", show_default=True,
              help="How --kv starts each half: systemd (a transient unit with the unit's own "
              "settings and drop-ins; root on a systemd host) or direct (a child with the "
              "plan's env, pinned to its CPUs). auto: systemd when it can.")
@json_option
@host_option
@handle_errors
def doctor(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
           nvidia_smi: str | None, proc_root: Path, shm_path: Path, systemctl: str | None,
           systemd_run_dir: Path, kv: bool, kv_as: str, as_json: bool,
           host_name: str | None) -> None:
    """Check that this host fits the plan: driver, GPUs idle, topology, ports, python, limits.

    \b
    Each check prints one row: ✓ ok, ✗ failed (with a fix), ! warning (with a fix).
    --topology FILE checks the host against a plan made for FILE's layout (the one you
    rendered elsewhere); the host itself is always read from --sysfs-root (default /sys).
    --kv adds a row per prefill→decode pair: GB/s, the transport UCX chose, bytes intact.
    With `hosts:`, run `pdsvc doctor --kv --host NAME` on each host at about the same time.
    Exit 0 when nothing failed (warnings allowed), 3 when something did, 2 for a bad config.
    """
    host = Host(sysfs_root=sysfs_root or Path("/sys"), proc_root=proc_root,
                nvidia_smi=nvidia_smi, shm_path=shm_path, systemctl=systemctl,
                systemd_run_dir=systemd_run_dir)
    plan: Plan | None = None
    try:
        whole, plan = load_host_plan(config_path, None if topology_file else sysfs_root,
                                     topology_file, host_name)
    except TopologyError as err:  # the plan cannot be made for this host: say why, check the rest
        rows = [fail("plan", err.message, err.hint or "see `pdsvc topology` and the config"),
                *run_checks(None, host)]
    else:
        rows = run_checks(plan, host)
        if kv:  # progress on stderr, also with --json: the transfers take seconds each
            rows += guarded("kv path", lambda: check_kv(
                whole, plan, host, kv_as,
                progress=lambda line: click.echo(f"pdsvc doctor: {line}", err=True)))
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
