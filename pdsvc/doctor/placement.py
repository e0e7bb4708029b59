"""Topology and NUMA checks: the GPUs are where the plan put them (bus ids, NUMA nodes, CPUs),
re-read from sysfs, and what the plan did where the kernel reports ``numa_node = -1``.

One finding per fact: a node the host lacks is one row (not one more per GPU that is therefore
elsewhere), and the numa row never vouches for an engine the topology row refutes."""

from __future__ import annotations

from collections.abc import Iterable

from pdsvc.errors import TopologyError
from pdsvc.plan.build import EnginePlan, Plan
from pdsvc.topology import Topology, format_cpulist

from .rows import Row, fail, ok, warn

RERENDER = "re-render on this host (`pdsvc render` reads /sys) and reinstall"


def _gpus(indices: Iterable[int], what: str = "") -> str:
    """"GPU 4 (0000:9a:00.0)" or "GPUs 4-7"."""
    indices = sorted(indices)
    if len(indices) == 1:
        return f"GPU {indices[0]}{f' ({what})' if what else ''}"
    return f"GPUs {format_cpulist(indices)}"


def placement_findings(e: EnginePlan, topo: Topology) -> list[tuple[str, str]]:
    """(finding, fix) for each way ``topo`` (this host) contradicts the plan's placement of
    engine ``e``."""
    findings = []
    absent: list[str] = []
    moved: list[str] = []
    nodes_here: dict[int, list[tuple[int, str]]] = {}
    for index, bus in zip(e.gpus, e.pci_bus_ids, strict=True):
        g = topo.gpu(index)
        if g is None:
            absent.append(f"GPU {index} ({bus})")
        elif g.pci_bus_id.lower() != bus.lower():
            moved.append(f"GPU {index} is {g.pci_bus_id} here, {bus} in the plan")
        elif g.numa_node is not None:
            nodes_here.setdefault(g.numa_node, []).append((index, bus))
    if absent:
        findings.append((f"{', '.join(absent)} of {e.name} "
                         f"{'is' if len(absent) == 1 else 'are'} not in {topo.source}", RERENDER))
    if moved:
        findings.append((f"{e.name}: {'; '.join(moved)}", RERENDER))
    pinned = e.pinning.numa_node
    if pinned is not None and topo.node(pinned) is None:
        have = ", ".join(str(n.id) for n in topo.nodes) or "none"
        where = "; ".join(f"its {_gpus(i for i, _ in gs)} {'is' if len(gs) == 1 else 'are'} on "
                          f"node {node}" for node, gs in sorted(nodes_here.items()))
        findings.append((f"{e.name} is pinned to NUMA node {pinned}, which this host lacks "
                         f"(nodes {have}{'; ' + where if where else ''})",
                         f"{RERENDER} (or set {e.role}.numa_node to a node of this host)"))
        return findings
    if pinned is not None:
        for node, gs in sorted(nodes_here.items()):
            if node != pinned:
                what = gs[0][1] if len(gs) == 1 else ""
                findings.append((f"{_gpus((i for i, _ in gs), what)} "
                                 f"{'is' if len(gs) == 1 else 'are'} on NUMA node {node} here; "
                                 f"the plan pins {e.name} to node {pinned}",
                                 f"{RERENDER}, or give the role GPUs of one node (see "
                                 "`pdsvc topology`)"))
    host_cpus = {c for n in topo.nodes for c in n.cpus}
    if host_cpus and set(e.pinning.cpus) - host_cpus:
        extra = format_cpulist(sorted(set(e.pinning.cpus) - host_cpus))
        findings.append((f"{e.name}'s CPUAffinity= lists CPUs {extra}, which this host does "
                         "not have", RERENDER))
    return findings


def check_topology(plan: Plan, topo: Topology | TopologyError, sysfs: object) -> list[Row]:
    """Each engine's GPUs have the plan's bus ids and NUMA node here; its CPUs exist here."""
    if isinstance(topo, TopologyError):
        return [fail("topology", f"cannot read {sysfs}: {topo}",
                     "pass --sysfs-root or run on the GPU host")]
    rows = [fail("topology", finding, fix)
            for e in plan.engines for finding, fix in placement_findings(e, topo)]
    if not rows:
        parts = []
        for e in plan.engines:
            where = f"node {e.pinning.numa_node}" if e.pinning.numa_node is not None else "no node"
            parts.append(f"{e.name} GPUs {format_cpulist(e.gpus)} ({where})")
        rows.append(ok("topology", "; ".join(parts) + f" as planned ({topo.source})"))
    return rows


def check_numa(plan: Plan, topo: Topology | TopologyError) -> list[Row]:
    """`!` for every engine whose GPUs report numa_node -1 here, with what the plan did; ✓ for
    the pinning of the others. Engines the topology check refutes are its to report."""
    if isinstance(topo, TopologyError):
        return []  # the topology row says why
    misplaced = {e.name for e in plan.engines if placement_findings(e, topo)}
    rows = []
    used_warnings = set()
    placed = []
    for e in plan.engines:
        said = next((w for w in plan.warnings if w.startswith(f"{e.role}:")), None)
        if e.name in misplaced:
            used_warnings.add(said)  # a warning about a placement that does not hold here
            continue
        unknown = [i for i in e.gpus if (g := topo.gpu(i)) is not None and g.numa_node is None]
        if not unknown:
            placed.append(e)
            continue
        if said:
            used_warnings.add(said)
            did = said.split(":", 1)[1].strip()
        elif e.pinning.numa_node is not None:
            did = (f"GPUs {format_cpulist(unknown)} report numa_node -1 (unknown) here; the plan "
                   f"({plan.topology_source}) pins to node {e.pinning.numa_node}, which this "
                   "host cannot confirm")
        else:
            did = f"GPUs {format_cpulist(unknown)} report numa_node -1 (unknown); not pinned"
        rows.append(warn(
            "numa", f"{e.name}: {did}",
            f"nothing to do on a one-node VM; on a multi-node host set {e.role}.numa_node to "
            "the GPUs' node (nvidia-smi topo -m shows it)",
        ))
    for w in plan.warnings:
        if w not in used_warnings:
            rows.append(warn("plan", w, "see the warning; `pdsvc plan` shows the pinning"))
    if placed and not rows:
        rows.append(ok("numa", "; ".join(f"{e.name} pinned to {e.pinning.why}" for e in placed)))
    return rows
