"""Reading GPUs and NUMA nodes from /sys-like trees of real host shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdsvc.errors import TopologyError
from pdsvc.topology import format_cpulist, load_topology_file, parse_cpulist, read_sysfs


def test_seed_host_gpus_in_pci_bus_order_and_non_gpus_ignored(sysfs_hosts) -> None:
    topo = read_sysfs(sysfs_hosts["seed"])
    assert [g.pci_bus_id for g in topo.gpus] == [
        "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
    ]  # NVSwitch (0x0680), the GPU's audio function and the Intel NIC are not GPUs
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [n.id for n in topo.nodes] == [0, 1]
    assert format_cpulist(topo.node(1).cpus) == "56-111,168-223"


def test_vm_numa_minus_one_is_unknown_not_node_zero(sysfs_hosts) -> None:
    topo = read_sysfs(sysfs_hosts["h200-vm"])
    assert len(topo.gpus) == 1 and topo.gpus[0].numa_node is None
    assert topo.gpus[0].local_cpus == tuple(range(16))


def test_bus_order_is_numeric_across_domains(tmp_path: Path) -> None:
    from sysfs import Dev, Host, build_sysfs
    host = Host(nodes={0: "0-3"}, devices=(
        Dev("0001:01:00.0", 0, "0-3"), Dev("0000:c1:00.0", 0, "0-3"), Dev("0000:0a:00.0", 0, "0-3"),
    ))
    topo = read_sysfs(build_sysfs(tmp_path, host))
    assert [g.pci_bus_id for g in topo.gpus] == ["0000:0a:00.0", "0000:c1:00.0", "0001:01:00.0"]


def test_empty_root_has_no_gpus(tmp_path: Path) -> None:
    topo = read_sysfs(tmp_path)
    assert topo.gpus == () and topo.nodes == ()


@pytest.mark.parametrize(("text", "cpus"), [
    ("0-3", (0, 1, 2, 3)), ("0-1,8,10-11\n", (0, 1, 8, 10, 11)), ("", ()), ("5", (5,)),
])
def test_cpulist_round_trip(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1-"])
def test_bad_cpulist_is_a_topology_error(bad: str) -> None:
    with pytest.raises(TopologyError):
        parse_cpulist(bad)


def test_topology_file_errors_are_clean(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="not found"):
        load_topology_file(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"gpus": [{"index": 0}]}')
    with pytest.raises(TopologyError, match="not a pdsvc topology file"):
        load_topology_file(tmp_path / "bad.json")


def test_shipped_seed_topology_matches_the_seed_fixture(sysfs_hosts) -> None:
    repo = Path(__file__).resolve().parent.parent
    assert load_topology_file(repo / "etc/seed-host.topology.json") == read_sysfs(
        sysfs_hosts["seed"])
