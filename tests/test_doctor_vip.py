"""`pdsvc doctor` on a router host of routers on several hosts (router.vip): keepalived is
there and takes the config pdsvc renders for this host; else one failed row that says how to
install it, or that the NIC named is not this host's."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pdsvc.cli.kit import load_plan
from pdsvc.doctor.checks import CHECKS
from pdsvc.doctor.facts import Facts
from pdsvc.doctor.host import Host
from pdsvc.doctor.vip import check_vip
from pdsvc.plan.build import Plan

TOPO = REPO / "etc/seed-host.topology.json"
EXAMPLE = REPO / "etc/examples/two-routers.yaml"


def host_plan(tmp_path: Path, host: str, interface: str = "eth0") -> Plan:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["router"]["vip"]["interface"] = interface
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_plan(path, None, TOPO).for_host(host)


def with_keepalived(p: Plan, path: str) -> Plan:
    assert p.vip is not None
    return replace(p, vip=replace(p.vip, keepalived=path))


def test_the_check_runs_on_router_hosts_only(tmp_path: Path) -> None:
    check = next(c for c in CHECKS if c.name == "address")
    assert check.when(Facts(Host(), host_plan(tmp_path, "lb-b")))
    assert not check.when(Facts(Host(), host_plan(tmp_path, "gpu-a")))


@pytest.mark.skipif(shutil.which("keepalived") is None, reason="keepalived not installed")
def test_debians_keepalived_takes_the_config_or_names_the_nic(tmp_path: Path) -> None:
    nics = sorted(n.name for n in Path("/sys/class/net").iterdir() if n.name != "lo")
    if not nics:
        pytest.skip("no network device but lo here")
    (row,) = check_vip(host_plan(tmp_path, "lb-b", nics[0]))
    assert row.status == "ok", row
    assert f"10.0.0.100 on {nics[0]}, VRRP 51 with lb-a" in row.detail
    (row,) = check_vip(host_plan(tmp_path, "lb-b", "nosuchnic0"))
    assert row.status == "failed" and "router.vip.interface nosuchnic0" in row.detail
    assert "ip -br link" in row.fix


def test_missing_keepalived_is_one_failed_row_with_the_install(tmp_path: Path) -> None:
    p = with_keepalived(host_plan(tmp_path, "lb-a"), str(tmp_path / "nope"))
    (row,) = check_vip(p)
    assert row.status == "failed" and "not found" in row.detail
    assert row.fix.startswith("install Debian's package: apt install keepalived")
