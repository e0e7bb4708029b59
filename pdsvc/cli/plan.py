"""`pdsvc plan`: the resolved plan, what runs where, with its exact command lines."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from pdsvc.cli.kit import (
    load_plan,
    plan_command,
    warn_plan,
)
from pdsvc.plan.connections import connections
from pdsvc.topology import format_cpulist


@plan_command("plan")
def plan_cmd(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
             as_json: bool) -> None:
    """Show the resolved plan: role, GPUs, NUMA node, CPUs, ports, cache dir, command lines."""
    plan = load_plan(config_path, sysfs_root, topology_file)
    if as_json:  # the plan's own `format` is its bundle's: the schema tag is `schema`
        click.echo(json.dumps({"schema": "pdsvc-plan/1", **plan.to_dict(),
                               "connections": [c.to_dict() for c in connections(plan)]},
                              indent=2))
        return
    warn_plan(plan)
    click.echo(f"{plan.target}  (config {plan.config_source}, topology {plan.topology_source})\n")
    hosted = bool(plan.hosts)
    rows = [("HOST",) * hosted + ("UNIT", "ROLE", "GPUS", "NUMA", "CPUS", "PORTS")]
    for e in plan.engines:
        numa = "-" if e.pinning.numa_node is None else str(e.pinning.numa_node)
        ports = f"http {e.port}, dist-init {e.dist_init_port}"
        if e.role == "prefill":
            ports += f", bootstrap {e.bootstrap_port}"
        if e.nnodes > 1:
            ports += f" (node {e.node_rank} of {e.nnodes})"
        where = (f"{e.machine} {e.host}",) * hosted
        rows.append((*where, e.unit, e.role, format_cpulist(e.gpus), numa,
                     e.pinning.cpulist or "-", ports))
    for r in plan.routers:  # the whole plan always has its router
        rows.append(((f"{r.machine} {plan.host(r.machine).address}",) if hosted else ())
                    + (r.unit, "router", "-", "-", "-",
                       f"http {r.port} on {r.host}, metrics {r.prometheus_port}"))
    beside = []  # on each router host: the front, and keepalived with routers on several
    if plan.front:
        beside.append((plan.front.unit, "front", "-", "-", "-",
                       f"http {plan.front.port} on {plan.front.host} (HAProxy)"))
    if plan.vip:
        beside.append((plan.vip.unit, "address", "-", "-", "-",
                       f"{plan.vip.address} on {plan.vip.interface} (keepalived, VRRP "
                       f"{plan.vip.vrrp_id})"))
    for m in dict.fromkeys(r.machine for r in plan.routers):
        where = (f"{m} {plan.host(m).address}",) if hosted else ()
        rows += [(*where, *row) for row in beside]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"\nJIT cache (shared by the engines{' of a host' * hosted}): "
               f"{plan.paths.jit_cache}")
    click.echo(f"Service user: {plan.user}:{plan.group}   "
               f"Requests: {plan.client_url}/v1/chat/completions")
    for e in plan.engines:
        on = f" on {e.machine}" if hosted else ""
        click.echo(f"\n{e.unit}{on}: pinned to {e.pinning.why}")
        click.echo("  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in e.env
                                   if k.startswith(("CUDA_VISIBLE", "SGLANG_DISAGG"))))
        click.echo("  " + shlex.join(e.argv))
    click.echo(f"\n{r.unit}:\n  {shlex.join(r.argv)}")
    if hosted:
        click.echo("\nConnections between hosts (open them in host firewalls):")
        for c in connections(plan):
            click.echo(f"  {c.source:<10} -> {c.target:<22} {c.why}")
