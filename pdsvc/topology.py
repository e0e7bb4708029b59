"""What the host really has: NVIDIA GPUs (in CUDA PCI_BUS_ID order), their NUMA node and CPUs.

`read_sysfs(root)` is the only code in pdsvc that touches /sys; tests point it at fixture trees.
`Topology.to_json()` / `load_topology_file()` let a user render on a laptop for the GPU host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pdsvc.errors import TopologyError

NVIDIA_VENDOR = "0x10de"
#: PCI base class 0x03 (display): 0x0300 VGA controller, 0x0302 3D controller (datacenter GPUs).
GPU_CLASSES = ("0x0300", "0x0302")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist ("0-3,8,10-11") into a sorted tuple of CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            start, end = int(lo), int(hi if dash else lo)
        except ValueError:
            raise TopologyError(f"cannot parse CPU list {text.strip()!r}") from None
        if end < start:
            raise TopologyError(f"cannot parse CPU list {text.strip()!r}")
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """The inverse of parse_cpulist: compact ranges, e.g. (0,1,2,3,8) -> "0-3,8"."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU. `index` is its CUDA index under CUDA_DEVICE_ORDER=PCI_BUS_ID."""

    index: int
    pci_bus_id: str
    numa_node: int | None  # None: the kernel reports -1 (common on VMs)
    local_cpus: tuple[int, ...]


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...]
    nodes: tuple[NumaNode, ...]
    source: str = field(default="", compare=False)

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def node(self, node_id: int) -> NumaNode | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": "pdsvc-topology/1",
                "source": self.source,
                "gpus": [
                    {
                        "index": g.index,
                        "pci_bus_id": g.pci_bus_id,
                        "numa_node": -1 if g.numa_node is None else g.numa_node,
                        "local_cpulist": format_cpulist(g.local_cpus),
                    }
                    for g in self.gpus
                ],
                "numa_nodes": [{"id": n.id, "cpulist": format_cpulist(n.cpus)} for n in self.nodes],
            },
            indent=2,
        ) + "\n"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _bus_key(bus_id: str) -> tuple[int, ...]:
    """Sort key for "DDDD:BB:DD.F" as CUDA orders devices with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    domain, bus, devfn = bus_id.split(":")
    dev, fn = devfn.split(".")
    return (int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16))


def read_sysfs(root: Path = Path("/sys")) -> Topology:
    """Read GPUs and NUMA nodes from a /sys-like tree (pure function of the tree's contents)."""
    nodes: list[NumaNode] = []
    node_dir = root / "devices" / "system" / "node"
    if node_dir.is_dir():
        for entry in sorted(node_dir.iterdir()):
            name = entry.name
            if name.startswith("node") and name[4:].isdigit():
                cpulist = _read(entry / "cpulist")
                nodes.append(NumaNode(int(name[4:]), parse_cpulist(cpulist or "")))
    nodes.sort(key=lambda n: n.id)

    found: list[tuple[str, int | None, tuple[int, ...]]] = []
    pci_dir = root / "bus" / "pci" / "devices"
    if pci_dir.is_dir():
        for dev in pci_dir.iterdir():
            if _read(dev / "vendor") != NVIDIA_VENDOR:
                continue
            klass = _read(dev / "class") or ""
            if not klass.startswith(GPU_CLASSES):
                continue  # NVSwitch bridges (0x0680), HDMI audio (0x0403), …
            raw_node = _read(dev / "numa_node")
            node = int(raw_node) if raw_node and raw_node.lstrip("-").isdigit() else -1
            cpus = parse_cpulist(_read(dev / "local_cpulist") or "")
            found.append((dev.name, None if node < 0 else node, cpus))
    found.sort(key=lambda f: _bus_key(f[0]))
    gpus = tuple(Gpu(i, bus, node, cpus) for i, (bus, node, cpus) in enumerate(found))
    return Topology(gpus=gpus, nodes=tuple(nodes), source=f"sysfs:{root}")


def load_topology_file(path: Path) -> Topology:
    """Read the JSON that `pdsvc topology --json` writes."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TopologyError(f"{path}: topology file not found") from None
    except (OSError, ValueError) as e:
        raise TopologyError(f"{path}: not a pdsvc topology file ({e})") from None
    try:
        gpus = tuple(
            Gpu(
                index=int(g["index"]),
                pci_bus_id=str(g["pci_bus_id"]),
                numa_node=None if int(g["numa_node"]) < 0 else int(g["numa_node"]),
                local_cpus=parse_cpulist(str(g.get("local_cpulist", ""))),
            )
            for g in data["gpus"]
        )
        nodes = tuple(
            NumaNode(int(n["id"]), parse_cpulist(str(n["cpulist"]))) for n in data["numa_nodes"]
        )
    except (KeyError, TypeError, ValueError) as e:
        raise TopologyError(
            f"{path}: not a pdsvc topology file (missing or bad field {e})",
            hint="write one with `pdsvc topology --json` on the GPU host",
        ) from None
    return Topology(gpus=gpus, nodes=nodes, source=f"file:{path}")
