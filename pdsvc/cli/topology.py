"""`pdsvc topology`: the host's NVIDIA GPUs and NUMA nodes as pdsvc reads them."""

from __future__ import annotations

from pathlib import Path

import click

from pdsvc.cli.kit import (
    EPILOG,
    handle_errors,
    json_option,
    sysfs_option,
)
from pdsvc.errors import TopologyError
from pdsvc.topology import format_cpulist, read_sysfs


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@sysfs_option
@json_option
@handle_errors
def topology(sysfs_root: Path | None, as_json: bool) -> None:
    """Show the host's NVIDIA GPUs and NUMA nodes as pdsvc reads them.

    The --json output is what `--topology FILE` reads: run `pdsvc topology --json > host.json`
    on the GPU host to render for it elsewhere.
    """
    topo = read_sysfs(sysfs_root or Path("/sys"))
    if not topo.gpus:  # with --json too: a file of no GPU would only fail later
        raise TopologyError(f"no NVIDIA GPU found ({topo.source})",
                            hint="run it on the GPU host")
    if as_json:
        click.echo(topo.to_json(), nl=False)
        return
    click.echo(f"{len(topo.gpus)} GPUs, {len(topo.nodes)} NUMA nodes ({topo.source})")
    for g in topo.gpus:
        node = "unknown (-1)" if g.numa_node is None else str(g.numa_node)
        click.echo(f"  GPU {g.index}  {g.pci_bus_id}  node {node}  "
                   f"local CPUs {format_cpulist(g.local_cpus) or '-'}")
    for n in topo.nodes:
        click.echo(f"  node {n.id}  CPUs {format_cpulist(n.cpus) or '-'}")
