"""Fixture hosts: build /sys-like trees (PCI functions + NUMA nodes) that pdsvc's reader reads.

Each host is a compact description; `build_sysfs(root, host)` lays it out as the kernel does
(`bus/pci/devices/<bdf>/{vendor,class,numa_node,local_cpulist}`,
`devices/system/node/node<N>/cpulist`). Shapes come from real machines: the seed HGX host,
the H200 VMs in ../shared/fixtures (numa_node = -1), a 4-node (NPS4-like) host and a VM that
shows two nodes but hides the GPUs' node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

GPU_3D = "0x030200"
NVSWITCH = "0x068000"
AUDIO = "0x040300"


@dataclass(frozen=True)
class Dev:
    bdf: str
    node: int
    local_cpus: str
    klass: str = GPU_3D
    vendor: str = "0x10de"


@dataclass(frozen=True)
class Host:
    nodes: dict[int, str]
    devices: tuple[Dev, ...]
    notes: str = ""
    extra_node_entries: tuple[str, ...] = field(default=("has_cpu", "online", "possible"))


N0, N1 = "0-55,112-167", "56-111,168-223"
SEED = Host(
    nodes={0: N0, 1: N1},
    devices=(
        # listed out of bus order on purpose: the reader must sort by PCI bus id
        Dev("0000:9a:00.0", 1, N1), Dev("0000:18:00.0", 0, N0), Dev("0000:2a:00.0", 0, N0),
        Dev("0000:3a:00.0", 0, N0), Dev("0000:5d:00.0", 0, N0), Dev("0000:ab:00.0", 1, N1),
        Dev("0000:ba:00.0", 1, N1), Dev("0000:db:00.0", 1, N1),
        # not GPUs: NVSwitch bridges, an NVIDIA audio function, an Intel NIC
        Dev("0000:05:00.0", 0, N0, NVSWITCH), Dev("0000:06:00.0", 0, N0, NVSWITCH),
        Dev("0000:18:00.1", 0, N0, AUDIO), Dev("0000:17:00.0", 0, N0, "0x020000", "0x8086"),
    ),
    notes="8x H200 HGX, 2 sockets x 56 cores with SMT; GPUs 0-3 on node 0, 4-7 on node 1",
)
H200_VM = Host(
    nodes={0: "0-15"},
    devices=(Dev("0000:00:06.0", -1, "0-15"), Dev("0000:00:01.0", -1, "0-15", "0x010000",
                                                  "0x1af4")),
    notes="../shared/fixtures/h200-vm: one H200, numa_node -1, one node",
)
H200X2_VM = Host(
    nodes={0: "0-31"},
    devices=(Dev("0000:00:06.0", -1, "0-31"), Dev("0000:00:07.0", -1, "0-31")),
    notes="../shared/fixtures/h200x2-vm: two H200, numa_node -1, one node",
)
NPS4 = Host(
    nodes={0: "0-23,96-119", 1: "24-47,120-143", 2: "48-71,144-167", 3: "72-95,168-191"},
    devices=tuple(
        Dev(f"0000:{bus}:00.0", i // 2, cpus)
        for i, (bus, cpus) in enumerate(
            [("01", "0-23,96-119"), ("21", "0-23,96-119"), ("41", "24-47,120-143"),
             ("61", "24-47,120-143"), ("81", "48-71,144-167"), ("a1", "48-71,144-167"),
             ("c1", "72-95,168-191"), ("e1", "72-95,168-191")]
        )
    ),
    notes="8 GPUs on a 1-socket EPYC in NPS4 mode: 4 NUMA nodes, 2 GPUs each",
)
TWO_NODE_VM = Host(
    nodes={0: "0-15", 1: "16-31"},
    devices=(Dev("0000:00:06.0", -1, "0-15"), Dev("0000:00:07.0", -1, "0-15"),
             Dev("0000:00:08.0", -1, "16-31"), Dev("0000:00:09.0", -1, "16-31")),
    notes="a VM that shows two NUMA nodes but reports numa_node -1 for its 4 GPUs",
)
LAPTOP = Host(nodes={0: "0-7"}, devices=(Dev("0000:00:02.0", 0, "0-7", "0x030000", "0x8086"),),
              notes="no NVIDIA GPU")

HOSTS: dict[str, Host] = {
    "seed": SEED, "h200-vm": H200_VM, "h200x2-vm": H200X2_VM, "nps4": NPS4,
    "two-node-vm": TWO_NODE_VM, "laptop": LAPTOP,
}


def build_sysfs(root: Path, host: Host) -> Path:
    """Lay out `host` under `root` (created) and return `root`."""
    node_dir = root / "devices" / "system" / "node"
    node_dir.mkdir(parents=True, exist_ok=True)
    for entry in host.extra_node_entries:
        (node_dir / entry).write_text(",".join(map(str, host.nodes)) + "\n")
    for node, cpus in host.nodes.items():
        (node_dir / f"node{node}").mkdir(exist_ok=True)
        (node_dir / f"node{node}" / "cpulist").write_text(cpus + "\n")
    pci = root / "bus" / "pci" / "devices"
    pci.mkdir(parents=True, exist_ok=True)
    for dev in host.devices:
        d = pci / dev.bdf
        d.mkdir(exist_ok=True)
        (d / "vendor").write_text(dev.vendor + "\n")
        (d / "class").write_text(dev.klass + "\n")
        (d / "numa_node").write_text(f"{dev.node}\n")
        (d / "local_cpulist").write_text(dev.local_cpus + "\n")
    return root
