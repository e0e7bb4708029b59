"""Where an engine may run: its NUMA node and CPUs, resolved from the GPUs it was given.

Part of building the plan (build.py): the checks that need the host — a GPU that does not
exist, GPUs across NUMA nodes, a node without CPUs — raise TopologyError; what the host does
not say (numa_node -1, common on VMs) is resolved as far as it safely can be, with a warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdsvc.errors import TopologyError
from pdsvc.plan.types import UNPLACED, Pinning
from pdsvc.topology import Gpu, Topology, format_cpulist

if TYPE_CHECKING:  # the plan only reads the validated config; importing it costs pydantic
    from pdsvc.config.schema import Config, RoleConfig


def resolve_pinning(
    key: str, role: RoleConfig, topology: Topology | None, config: Config, warnings: list[str],
    where: str = "this host",
) -> tuple[Pinning, tuple[str, ...]]:
    """Resolve a role's NUMA node and CPUs from the GPUs it was given.

    The GPU/node checks run whatever runtime.pinning says: a contradiction in the config is an
    error even when nothing will be pinned.
    """
    if topology is None:
        return Pinning("off", None, (), config.runtime.numa_policy, UNPLACED), ()
    noted: list[str] = []
    pinning, bus_ids = _resolve_node(key, role, topology, config, noted, where)
    if config.runtime.pinning == "off":
        why = "pinning off (runtime.pinning: off)"
        return Pinning("off", None, (), pinning.policy, why), bus_ids
    warnings += noted
    return pinning, bus_ids


def _resolve_node(
    key: str, role: RoleConfig, topology: Topology, config: Config, warnings: list[str],
    where: str,
) -> tuple[Pinning, tuple[str, ...]]:
    """The role's pinning from its GPUs' NUMA node; TopologyError where the config and the
    host disagree."""
    gpus = _role_gpus(key, role, topology, where)
    bus_ids = tuple(g.pci_bus_id for g in gpus)
    node_ids = {g.numa_node for g in gpus if g.numa_node is not None}
    _check_one_node(key, gpus, node_ids)
    _check_wanted_node(key, role, topology, where)
    if node_ids:
        return _known_node(key, role, topology, config, gpus, warnings, where), bus_ids
    return _unknown_node(key, role, topology, config, gpus, warnings), bus_ids


def _role_gpus(key: str, role: RoleConfig, topology: Topology, where: str) -> list[Gpu]:
    """The host's GPU of each index the role names; TopologyError for one it lacks."""
    gpus = []
    for index in role.gpus:
        gpu = topology.gpu(index)
        if gpu is None:
            have = format_cpulist([g.index for g in topology.gpus]) or "none"
            raise TopologyError(
                f"{key}.gpus: GPU {index} does not exist on {where} (it has GPUs {have})",
                hint=f"pick GPUs from {have} ({topology.source})",
            )
        gpus.append(gpu)
    return gpus


def _check_one_node(key: str, gpus: list[Gpu], node_ids: set[int]) -> None:
    """TopologyError when the role's GPUs lie on more than one NUMA node."""
    if len(node_ids) > 1:
        by_node = sorted(gpus, key=lambda g: (g.numa_node is None, g.numa_node, g.index))
        a = next(g for g in by_node if g.numa_node == max(node_ids))
        b = next(g for g in by_node if g.numa_node == min(node_ids))
        raise TopologyError(
            f"{key}.gpus cross NUMA nodes: GPU {a.index} is on node {a.numa_node}, "
            f"GPU {b.index} on node {b.numa_node}",
            hint="give the role GPUs of one node (see `pdsvc topology`)",
        )


def _check_wanted_node(key: str, role: RoleConfig, topology: Topology, where: str) -> None:
    """TopologyError when the role's configured numa_node is not one of the host's."""
    existing = ", ".join(str(n.id) for n in topology.nodes) or "none"
    wanted = role.numa_node
    if wanted != "auto" and topology.node(wanted) is None:
        raise TopologyError(
            f"{key}.numa_node: node {wanted} does not exist on {where} (it has nodes {existing})",
            hint="set numa_node: auto",
        )


def _known_node(
    key: str, role: RoleConfig, topology: Topology, config: Config, gpus: list[Gpu],
    warnings: list[str], where: str,
) -> Pinning:
    """Pinning to the one NUMA node the role's GPUs report (some may report none)."""
    mode, policy = config.runtime.pinning, config.runtime.numa_policy
    wanted, gpu_list = role.numa_node, format_cpulist(role.gpus)
    (node_id,) = {g.numa_node for g in gpus if g.numa_node is not None}
    if wanted != "auto" and wanted != node_id:
        raise TopologyError(
            f"{key}.numa_node is {wanted} but GPUs {gpu_list} are on node {node_id}",
            hint=f"set numa_node: auto (or {node_id})",
        )
    node = topology.node(node_id)
    if node is None or not node.cpus:
        raise TopologyError(
            f"{key}: GPUs {gpu_list} report NUMA node {node_id}, which has no CPUs on {where}"
        )
    if any(g.numa_node is None for g in gpus):
        warnings.append(
            f"{key}: some GPUs report numa_node -1; using node {node_id} of the others"
        )
    why = f"node {node_id} of GPUs {gpu_list}" if wanted == "auto" else f"numa_node {node_id}"
    return Pinning(mode, node_id, node.cpus, policy, why)


def _unknown_node(
    key: str, role: RoleConfig, topology: Topology, config: Config, gpus: list[Gpu],
    warnings: list[str],
) -> Pinning:
    """Pinning when every GPU says numa_node = -1: the kernel does not know (VMs). Never
    guess silently: the configured node, the host's only node, the GPUs' local CPUs, or
    nothing, each with a warning."""
    mode, policy = config.runtime.pinning, config.runtime.numa_policy
    wanted, gpu_list = role.numa_node, format_cpulist(role.gpus)
    if wanted != "auto":
        node = topology.node(wanted)
        assert node is not None
        warnings.append(
            f"{key}: GPUs {gpu_list} report numa_node -1 (unknown); pinning to node {wanted} "
            f"as configured"
        )
        return Pinning(mode, wanted, node.cpus, policy, f"numa_node {wanted} (configured)")
    if len(topology.nodes) == 1:
        node = topology.nodes[0]
        warnings.append(
            f"{key}: GPUs {gpu_list} report numa_node -1 (unknown, common on VMs); the host has "
            f"one NUMA node ({node.id}), so the role runs on its CPUs {format_cpulist(node.cpus)}"
        )
        why = f"only NUMA node {node.id} (GPU numa_node unknown)"
        return Pinning(mode, node.id, node.cpus, policy, why)
    local = tuple(sorted({c for g in gpus for c in g.local_cpus}))
    if local:
        warnings.append(
            f"{key}: GPUs {gpu_list} report numa_node -1 (unknown) on a host with "
            f"{len(topology.nodes)} nodes; CPUs pinned to their local_cpulist "
            f"{format_cpulist(local)} with no memory policy — set {key}.numa_node to pin memory"
        )
        return Pinning(mode, None, local, policy, "GPU local_cpulist (NUMA unknown)")
    warnings.append(
        f"{key}: GPUs {gpu_list} have no known NUMA node or local CPUs; not pinned — set "
        f"{key}.numa_node"
    )
    return Pinning("off", None, (), policy, "unknown topology: not pinned")
