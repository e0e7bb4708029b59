"""`pdsvc doctor` on fixture hosts (tests/support/doctor_box.py): the host's topology and NUMA,
systemd, limits and disks, and one host of several."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from doctor_box import (
    SEED_TOPOLOGY,
    Box,
    by_check,
    make_box,
    rows,
    write_config,
    write_proc,
    write_systemctl,
)
from doctor_box import big_disks as doctor_box_big_disks
from doctor_box import box as doctor_box_box
from sysfs import H200X2_VM, LAPTOP, N0, SEED, Dev

from pdsvc import doctor as dr
from pdsvc.cli.doctor import doctor
from pdsvc.doctor import limits as dr_limits

#: doctor_box's fixtures, made visible here: big disks unless a test says otherwise, one host.
big_disks = pytest.fixture(autouse=True)(doctor_box_big_disks)
box = pytest.fixture(doctor_box_box)


# --------------------------------------------------------------------------------------------
# Topology and NUMA


def test_topology_mismatch_against_a_plan_rendered_elsewhere(runner, tmp_path: Path) -> None:
    """The plan comes from etc/seed-host.topology.json; on this host GPU 4 sits on node 0."""
    moved = dataclasses.replace(SEED, devices=tuple(
        Dev(d.bdf, 0, N0, d.klass, d.vendor) if d.bdf == "0000:9a:00.0" else d
        for d in SEED.devices))
    box = make_box(tmp_path, host=moved)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, topology=True))
    assert result.exit_code == 3
    line = next(x for x in result.output.splitlines() if x.startswith(" ✗ topology"))
    assert "GPU 4 (0000:9a:00.0) is on NUMA node 0 here; the plan pins dsv4-decode to node 1" \
        in line
    assert "fix: re-render on this host" in line
    same = runner.invoke(doctor, make_box(tmp_path / "same").args(config, topology=True))
    assert " ✓ topology " in same.output


ONE_NODE_SEED = dataclasses.replace(SEED, nodes={0: "0-223"}, devices=tuple(
    Dev(d.bdf, 0, "0-223", d.klass, d.vendor) for d in SEED.devices))


def test_one_finding_per_fact_and_a_fix_said_once(runner, tmp_path: Path) -> None:
    """A plan made for the seed host (decode pinned to node 1) on a host
    with one NUMA node. The missing node is one ✗ row, not one more per GPU that is therefore
    on node 0; no ✓ row vouches for the pinning that ✗ refutes; no fix is printed twice."""
    box = make_box(tmp_path, host=ONE_NODE_SEED)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, topology=True))
    assert result.exit_code == 3
    lines = result.output.splitlines()[1:-1]
    (failed,) = [x for x in lines if x.startswith(" ✗ ")]
    assert failed.startswith(" ✗ topology ")
    assert "dsv4-decode is pinned to NUMA node 1, which this host lacks (nodes 0" in failed
    assert not [x for x in lines if x.startswith(" ✓ ") and "node 1" in x], result.output
    assert any(x.startswith(" ✓ numa ") and "dsv4-prefill pinned to node 0" in x
               for x in lines), result.output
    fixes = [x.split("   fix: ", 1)[1] for x in lines if "   fix: " in x]
    assert len(fixes) == len(set(fixes)), result.output

    # a host with neither the plan's GPUs nor its nodes: many findings, each fix said once
    many = make_box(tmp_path / "vm", host=H200X2_VM)
    result = runner.invoke(doctor, many.args(config, topology=True))
    lines = result.output.splitlines()
    fixes = [x.split("   fix: ", 1)[1] for x in lines if "   fix: " in x]
    assert len(fixes) == len(set(fixes)), result.output
    assert any(x.endswith("(fix as above)") for x in lines), result.output
    assert not any(x.startswith(" ✓ gpus idle") for x in lines), result.output
    report = json.loads(runner.invoke(doctor, many.args(config, "--json", topology=True)).output)
    assert all(r["fix"] for r in report["checks"] if r["status"] != "ok")  # JSON keeps each fix


def test_numa_minus_one_is_a_warning_with_what_the_plan_did(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path, host=H200X2_VM)
    config = write_config(
        tmp_path / "pdsvc.yaml", box.python,
        prefill={"gpus": [0], "tp": 1}, decode={"gpus": [1], "tp": 1})
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 0, result.output
    numa = [x for x in result.output.splitlines() if x.startswith(" ! numa")]
    assert len(numa) == 2
    assert "dsv4-prefill: GPUs 0 report numa_node -1 (unknown, common on VMs); the host has one " \
           "NUMA node (0), so the role runs on its CPUs 0-31" in numa[0]
    assert "fix: nothing to do on a one-node VM" in numa[0]
    assert " ✓ topology " in result.output and " ✓ gpus " in result.output


def test_a_plan_that_cannot_fit_still_reports_the_host(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path, host=LAPTOP)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    report = json.loads(result.output)
    assert report["target"] is None
    first = report["checks"][0]
    assert (first["check"], first["status"]) == ("plan", "failed")
    assert "no NVIDIA GPU found" in first["detail"]
    assert {r["check"] for r in report["checks"]} >= {"driver", "memlock", "systemd"}


def test_bad_config_is_exit_2(runner, box: Box) -> None:
    config = box.tmp / "bad.yaml"
    config.write_text("name: dsv4\nmodel:\n  path: /m\nprefill:\n  prot: 1\n")
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 2
    assert "did you mean 'prefill.port'" in result.stderr


# --------------------------------------------------------------------------------------------
# systemd, limits, disks


def test_systemd_too_old(runner, box: Box) -> None:
    box.systemctl = write_systemctl(box.tmp / "old", version=239)
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 3
    line = next(x for x in result.output.splitlines() if x.startswith(" ✗ systemd"))
    assert "systemd 239 is older than 245" in line and "NUMAPolicy= (243)" in line


def test_no_systemd_points_to_supervisord(runner, box: Box) -> None:
    """The H200 VMs: no systemctl, PID 1 is not systemd (shared/fixtures/*/probe.log)."""
    box.systemctl = box.tmp / "nowhere/systemctl"
    box.run_dir = box.tmp / "nowhere/run"
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 0
    (row,) = by_check(result, "systemd")
    assert row["status"] == "warning" and "not PID 1" in row["detail"]
    assert "supervisord" in row["fix"]


@pytest.mark.parametrize(("hard", "cap_eff", "status"), [
    ("unlimited", "0000000000000000", "ok"),
    ("8388608", "000001ffffffffff", "ok"),  # CAP_SYS_RESOURCE: systemd raises it anyway
    ("65536", "00000000a80425fb", "failed"),  # docker's default set: no CAP_SYS_RESOURCE
])
def test_memlock(tmp_path: Path, hard: str, cap_eff: str, status: str) -> None:
    host = dr.Host(proc_root=write_proc(tmp_path, memlock_hard=hard, cap_eff=cap_eff))
    (row,) = dr.check_memlock(host)
    assert row.status == status, row


def test_shm_and_jit_cache_thresholds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pdsvc.cli.kit import load_plan

    plan = load_plan(REPO / "etc/pdsvc.yaml", None, SEED_TOPOLOGY)
    for free_gib, status in ((100, "ok"), (10, "warning"), (2, "failed")):
        monkeypatch.setattr(dr_limits, "fs_space", lambda p, f=free_gib: (f * dr.GIB, f * dr.GIB))
        (row,) = dr.check_jit_cache(plan)
        assert row.status == status, row
        assert row.detail.startswith("/var/cache/dsv4/jit")
    monkeypatch.setattr(dr_limits, "fs_space", lambda p: (64 << 20, 64 << 20))
    (row,) = dr.check_shm(dr.Host(shm_path=tmp_path))
    assert row.status == "warning" and "64.0 MiB" in row.detail and "--shm-size" in row.fix

    def missing(path: Path) -> tuple[int, int]:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(dr_limits, "fs_space", missing)
    (row,) = dr.check_shm(dr.Host(shm_path=tmp_path / "none"))
    assert row.status == "failed"


def test_parsers_of_tool_output(tmp_path: Path) -> None:
    # the h200x2-vm fixture's GPUs, in the columns doctor asks for
    gpus = dr.parse_query_gpu(
        "0, 00000000:00:06.0, 143771 MiB, 0 MiB\n1, 00000000:00:07.0, 143771 MiB, 0 MiB\n")
    assert [(g.index, g.bus_id, g.total_mib, g.used_mib) for g in gpus] == [
        (0, "00000000:00:06.0", 143771, 0), (1, "00000000:00:07.0", 143771, 0)]
    assert dr.parse_query_gpu("0, 00000000:00:06.0, [N/A], [N/A]\n")[0].total_mib is None
    with pytest.raises(dr.GpuQueryError):
        dr.parse_query_gpu("NVIDIA-SMI has failed because it couldn't communicate with the driver")
    assert dr.mem_fraction(["--mem-fraction-static", "0.70"]) == 0.7
    assert dr.mem_fraction(["--mem-fraction-static=0.5"]) == 0.5
    assert dr.mem_fraction(["--port", "1"]) is None
    assert dr.proc_driver_version(write_proc(tmp_path / "proc")) == "580.159.04"
    assert dr.proc_driver_version(tmp_path / "none") is None


# --------------------------------------------------------------------------------------------
# One host of several


def test_each_host_of_several_is_checked_for_what_runs_there(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    cfg = yaml.safe_load(config.read_text())
    cfg["hosts"] = {"lb": {"address": "127.0.0.3", "run": ["router"]},
                    "gpu-a": {"address": "127.0.0.1", "run": ["prefill", "decode"]}}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    lb = runner.invoke(doctor, box.args(config, "--host", "lb"))
    assert lb.exit_code == 0, lb.output
    lines = lb.output.splitlines()
    assert lines[0] == f"pdsvc doctor — dsv4-pd.target on host lb (config {config})"
    assert any(line.startswith(" ✓ gpus") and "none planned here (dsv4-router.service only)"
               in line for line in lines), lb.output
    # a router host needs no driver, GPU or JIT cache; its router's flags are still checked
    assert not any(line.startswith((" ✓ driver", " ✓ jit cache", " ✓ flags prefill"))
                   for line in lines), lb.output
    assert any(line.startswith(" ✓ flags router") for line in lines), lb.output
    assert any(line.startswith(" ✓ network") and "127.0.0.3 (hosts.lb.address) is on this host"
               in line for line in lines), lb.output
    gpu = runner.invoke(doctor, box.args(config, "--host", "gpu-a", "--json"))
    assert gpu.exit_code == 0, gpu.output
    checks = {r["check"] for r in rows(gpu)}
    assert {"driver", "gpus", "flags prefill", "flags decode", "jit cache"} <= checks
    assert "flags router" not in checks


def test_host_option_without_hosts_is_a_usage_error(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--host", "lb"))
    assert result.exit_code == 2 and "has no `hosts`; leave --host out" in result.output


def test_network_of_one_host_of_several(runner, box: Box) -> None:
    """The host's address must be this machine's; each UCX_NET_DEVICES entry a link that is up
    (an RDMA port's state, a netdev's operstate, read from --sysfs-root)."""
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    cfg = yaml.safe_load(config.read_text())
    cfg["hosts"] = {"gpu-a": {"address": "10.255.0.8", "run": ["prefill", "decode"],
                              "ucx_net_devices": "mlx5_0:1,mlx5_1:1,eth1,eth9"},
                    "gpu-b": {"address": "10.255.0.9", "run": ["router"]}}
    cfg["router"]["host"] = "0.0.0.0"  # the engines on gpu-a register with it across hosts
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    ib = box.sysfs / "class/infiniband"
    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        (ib / dev / "ports/1").mkdir(parents=True)
        (ib / dev / "ports/1/state").write_text(state + "\n")
    (box.sysfs / "class/net/eth1").mkdir(parents=True)
    (box.sysfs / "class/net/eth1/operstate").write_text("up\n")
    result = runner.invoke(doctor, box.args(config, "--host", "gpu-a", "--json"))
    net = [(r["status"], r["detail"]) for r in by_check(result, "network")]
    assert net[0][0] == "failed" and net[0][1] == (
        "10.255.0.8 (hosts.gpu-a.address) is not an address of this host")
    assert ("ok", "UCX_NET_DEVICES mlx5_0:1 is up") in net
    assert any(s == "failed" and "UCX_NET_DEVICES mlx5_1:1 is down" in d for s, d in net), net
    assert ("ok", "UCX_NET_DEVICES eth1 is up") in net
    assert any(s == "failed" and "UCX_NET_DEVICES eth9: no such device" in d for s, d in net)
    assert result.exit_code == 3


def test_only_this_hosts_engines_are_laid_on_its_topology(runner, box: Box) -> None:
    """gpu-b runs the decode on GPUs 4-7; doctor on gpu-a (whose /sys is the seed host's, but
    could have 4 GPUs) and on the router host check their own engines only."""
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    cfg = yaml.safe_load(config.read_text())
    cfg["hosts"] = {"lb": {"address": "127.0.0.3", "run": ["router"]},
                    "gpu-a": {"address": "127.0.0.1", "run": ["prefill"]},
                    "gpu-b": {"address": "127.0.0.2", "run": ["decode"]}}
    cfg["decode"]["gpus"] = [8, 9, 10, 11]  # not on this box: gpu-b's own
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for host in ("lb", "gpu-a"):
        result = runner.invoke(doctor, box.args(config, "--host", host, "--json"))
        assert not any(r["check"] == "plan" and r["status"] == "failed"
                       for r in rows(result)), (host, result.output)
    result = runner.invoke(doctor, box.args(config, "--host", "gpu-b", "--json"))
    failed = [r["detail"] for r in by_check(result, "plan") if r["status"] == "failed"]
    assert failed and "decode.gpus: GPU 8 does not exist on host gpu-b" in failed[0]


@pytest.mark.parametrize("package, versions, status, said", [
    ("sglang-router", {"sglang-router": "0.3.2"}, "ok", "sglang-router 0.3.2 (router.package)"),
    ("smg", {"smg": "1.13.0"}, "ok", "smg 1.13.0 (router.package)"),
    ("smg", {"smg": "1.12.0"}, "warning", "smg 1.12.0 installed; pdsvc renders for smg==1.13.0"),
])
def test_doctor_names_the_router_package_and_its_version(package, versions, status,
                                                          said) -> None:
    from pdsvc.config.load import parse_config
    from pdsvc.doctor.venv import Installed, check_router_package, requirements
    from pdsvc.plan.build import build_plan
    from pdsvc.topology import load_topology_file

    repo = Path(__file__).resolve().parent.parent
    cfg = yaml.safe_load((repo / "etc/pdsvc.yaml").read_text())
    cfg["router"]["package"] = package
    text = yaml.safe_dump(cfg)
    plan = build_plan(parse_config(text, "c.yaml"),
                      load_topology_file(repo / "etc/seed-host.topology.json"),
                      config_source="c.yaml", config_text=text)
    assert [r.label for r in requirements(plan)][:2] == ["sglang", package]
    (row,) = check_router_package(plan, Installed("/py", "3.11", versions))
    assert (row.status, row.detail) == (status, said)
