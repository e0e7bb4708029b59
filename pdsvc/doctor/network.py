"""The network of one host of several: its address is this machine's (the engines bind it and
peers dial it), and each UCX_NET_DEVICES entry is a link that is up (NIXL moves KV over it)."""

from __future__ import annotations

from pathlib import Path

from pdsvc.plan.build import Plan

from .ports import try_bind
from .rows import Row, fail, ok


def check_network(plan: Plan, sysfs_root: Path) -> list[Row]:
    """One host of several: its address is this machine's (the engines bind it and peers dial
    it), and each UCX_NET_DEVICES entry is a link that is up (NIXL moves KV over it)."""
    if not plan.hosts:
        return []
    h = plan.hosts[0]
    rows = []
    if try_bind(h.address, 0) == 0:
        rows.append(ok("network", f"{h.address} (hosts.{h.name}.address) is on this host"))
    else:
        rows.append(fail("network", f"{h.address} (hosts.{h.name}.address) is not an address "
                         "of this host", f"run on {h.name} (or pass --host NAME), or configure "
                         f"{h.address} on its NIC"))
    devices = dict.fromkeys(d for e in plan.engines
                            for d in dict(e.env).get("UCX_NET_DEVICES", "").split(",") if d)
    for dev in devices:
        state, where = link_state(sysfs_root, dev)
        if state is None:
            rows.append(fail("network", f"UCX_NET_DEVICES {dev}: no such device ({where})",
                             f"set hosts.{h.name}.ucx_net_devices to a NIC of this host "
                             "(`ibdev2netdev`, `ip -br link`)"))
        elif state != "up":
            rows.append(fail("network", f"UCX_NET_DEVICES {dev} is {state} ({where})",
                             "bring the link up, or pick another NIC"))
        else:
            rows.append(ok("network", f"UCX_NET_DEVICES {dev} is up"))
    return rows


def link_state(sysfs: Path, device: str) -> tuple[str | None, str]:
    """('up' | the link's state | None when absent, the sysfs path read) of a UCX device:
    an RDMA port `mlx5_0:1`, or a netdev `eth1`."""
    if device == "all":
        return "up", "all devices"
    name, _, port = device.partition(":")
    if port:
        path = sysfs / "class/infiniband" / name / "ports" / port / "state"
        try:
            state = path.read_text().split(":")[-1].strip().lower()  # "4: ACTIVE"
        except OSError:
            return None, str(path)
        return ("up" if state == "active" else state), str(path)
    path = sysfs / "class/net" / name / "operstate"
    try:
        state = path.read_text().strip().lower()
    except OSError:
        return None, str(path)
    return ("up" if state in ("up", "unknown") else state), str(path)
