"""Routers on several hosts behind a moving address (router.vip): the config's refusals, the
plan (a router per router host, every engine registering with each), each router host's
bundle (HAProxy's front over every router, keepalived's unit and config), the key made on the
first router host and copied to the others, and the firewall rows (VRRP between router hosts,
each front to every router). keepalived's own reading of the config is in the e2e lab
(tests/test_e2e_vip.py), where it moves the address."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import sdsyntax as sd
import yaml
from conftest import REPO

from pdsvc.apply.rollout import plan_rollout
from pdsvc.cli.commands import main
from pdsvc.cli.kit import load_plan
from pdsvc.config.load import parse_config
from pdsvc.errors import ConfigError
from pdsvc.plan.build import build_plan
from pdsvc.plan.connections import connections
from pdsvc.render.hosts_bundle import per_host
from pdsvc.render.systemd import render_systemd
from pdsvc.topology import load_topology_file

EXAMPLE = REPO / "etc/examples/two-routers.yaml"
SEED = REPO / "etc/seed-host.topology.json"


def plan_of(cfg: dict):
    text = yaml.safe_dump(cfg, sort_keys=False)
    return build_plan(parse_config(text, "c.yaml"), load_topology_file(SEED),
                      config_source="c.yaml", config_text=text)


def example(**router) -> dict:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["router"] = {**cfg["router"], **router}
    return cfg


def test_a_router_on_each_router_host_and_every_engine_registers_with_both() -> None:
    plan = plan_of(example())
    assert [(r.name, r.machine, r.host, r.port) for r in plan.routers] == [
        ("dsv4-router-0", "lb-a", "10.0.0.1", 8100), ("dsv4-router-1", "lb-b", "10.0.0.4", 8100)]
    for e in plan.engines:
        assert e.router_urls == ("http://10.0.0.1:8100", "http://10.0.0.4:8100")
    assert plan.client_url == "http://10.0.0.100:8000"
    assert plan.front.servers == (("dsv4-router-0", "10.0.0.1:8100"),
                                  ("dsv4-router-1", "10.0.0.4:8100"))
    assert plan.vip.members == (("lb-a", "10.0.0.1"), ("lb-b", "10.0.0.4"))
    units = {h.name: h.units for h in plan.hosts}
    assert units["lb-a"] == ("dsv4-router-0.service", "dsv4-front.service", "dsv4-vip.service")
    assert units["lb-b"] == ("dsv4-router-1.service", "dsv4-front.service", "dsv4-vip.service")
    assert units["gpu-a"] == ("dsv4-prefill.service",)


def test_the_key_is_made_on_the_first_router_host_and_copied_to_the_other() -> None:
    plan = plan_of(example())
    a, b, gpu = plan.for_host("lb-a"), plan.for_host("lb-b"), plan.for_host("gpu-a")
    assert (a.key_use, b.key_use, gpu.key_use) == ("make", "copy", "copy")
    assert b.key_origin() == gpu.key_origin() == ("lb-a", "10.0.0.1")
    assert gpu.front is None and gpu.vip is None  # nothing of the front on an engine host


def bundle(plan, host: str) -> dict[str, str]:
    return {f.path: f.content for f in render_systemd(plan.for_host(host), "pdsvc render")}


def test_each_router_host_runs_a_front_over_every_router_and_keepalived() -> None:
    plan = plan_of(example())
    for host, me, peer, priority in (("lb-a", "10.0.0.1", "10.0.0.4", 150),
                                     ("lb-b", "10.0.0.4", "10.0.0.1", 140)):
        files = bundle(plan, host)
        servers = [ln.split()[1:] for ln in files["front.cfg"].splitlines()
                   if ln.strip().startswith("server ")]
        assert servers == [["dsv4-router-0", "10.0.0.1:8100"], ["dsv4-router-1", "10.0.0.4:8100"]]
        assert "    bind 0.0.0.0:8000" in files["front.cfg"].splitlines()
        conf = files["vip.conf"].split()
        after = {w: conf[i + 1] for i, w in enumerate(conf[:-1])}
        assert (after["unicast_src_ip"], after["priority"], after["interface"]) == (
            me, str(priority), "eth0")
        assert after["{"] and peer in conf and "10.0.0.100/32" in conf and "nopreempt" in conf
        assert after["vrrp_version"] == "3" and after["advert_int"] == "0.5"
        unit = sd.sections(files["dsv4-vip.service"])
        assert unit["Unit"]["BindsTo"] == ["dsv4-front.service"]
        assert unit["Service"]["DynamicUser"] == ["yes"]
        assert unit["Service"]["CapabilityBoundingSet"] == ["CAP_NET_ADMIN CAP_NET_RAW"]
        assert sd.sections(files["dsv4-front.service"])["Unit"]["Wants"][-1] == "dsv4-vip.service"
        listing = files["install.list"]
        assert "\nfile\tvip.conf\t/etc/dsv4/vip.conf\t0644\troot\n" in listing
    assert "vip.conf" not in bundle(plan, "gpu-a")


def test_the_firewall_rows_name_vrrp_and_each_front_to_every_router() -> None:
    rows = {(c.source, c.target, c.purpose) for c in connections(plan_of(example()))}
    assert {("lb-a", "10.0.0.4:vrrp", "vrrp"), ("lb-b", "10.0.0.1:vrrp", "vrrp"),
            ("lb-a", "10.0.0.4:8100", "front"), ("lb-b", "10.0.0.1:8100", "front"),
            ("lb-b", "10.0.0.2:30000", "serving"), ("lb-a", "10.0.0.3:30001", "serving"),
            ("gpu-a", "10.0.0.4:8100", "membership")} <= rows


@pytest.mark.parametrize("change, message", [
    ({"vip": {"address": None}}, "router.vip.address: the router is on 2 hosts (lb-a, lb-b)"),
    ({"vip": {"address": "10.0.0.100", "interface": None}},
     "router.vip.interface: the NIC keepalived puts router.vip.address on"),
    ({"host": "10.0.0.1"}, "router.host: 10.0.0.1: with router.vip the front on each router "
     "host listens on every address"),
    ({"vip": {"address": "10.0.0.4", "interface": "eth0"}},
     "router.vip.address: 10.0.0.4 is hosts.lb-b.address"),
    ({"vip": {"address": "127.0.0.1", "interface": "eth0"}},
     "router.vip.address: must be an address the clients reach"),
    ({"vip": {"address": "10.0.0.100", "interface": "eth 0"}}, "router.vip.interface"),
    ({"replicas": 2}, "router.replicas: with hosts, run one router per host"),
    ({"replica_port": 30000}, "router.replica_port: port 30000 is also"),
])
def test_a_moving_address_refuses_what_cannot_work(change: dict, message: str) -> None:
    cfg = example()
    for k, v in change.items():
        cfg["router"][k] = {**cfg["router"].get(k, {}), **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError) as err:
        plan_of(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_moving_address_needs_routers_on_two_hosts() -> None:
    cfg = yaml.safe_load((REPO / "etc/examples/three-hosts.yaml").read_text())
    cfg["router"]["vip"] = {"address": "10.0.0.100", "interface": "eth0"}
    with pytest.raises(ConfigError, match="router.vip.address: a moving address needs routers "
                       "on two or more hosts"):
        plan_of(cfg)


def test_supervisord_refuses_routers_on_several_hosts(runner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["render", "-c", str(EXAMPLE), "--topology", str(SEED),
                                  "--format", "supervisord", "-o", str(tmp_path / "sv")])
    assert result.exit_code != 0
    assert "routers behind a front are rendered for" in result.stderr


@pytest.mark.skipif(shutil.which("keepalived") is None, reason="keepalived not installed")
def test_keepalived_reads_each_router_host_s_config(tmp_path: Path) -> None:
    """keepalived's own config test (exit 0, not a word said) on each host's file, the NIC
    named in it being one this machine has (the check refuses a missing one, and loopback);
    a misspelt keyword fails it, so the check can fail."""
    nics = sorted(n.name for n in Path("/sys/class/net").iterdir() if n.name != "lo")
    if not nics:
        pytest.skip("no network device but lo here")
    plan = plan_of(example(vip={"address": "10.0.0.100", "interface": nics[0]}))
    for host in ("lb-a", "lb-b"):
        text = bundle(plan, host)["vip.conf"]
        for name, conf, clean in ((host, text, True),
                                  ("misspelt", text.replace("nopreempt", "nopreemt"), False)):
            path = tmp_path / f"{name}.conf"
            path.write_text(conf)
            done = subprocess.run(["keepalived", "--config-test", "--use-file", str(path)],
                                  capture_output=True, text=True, timeout=30)
            said = (done.stdout + done.stderr).strip()
            assert (done.returncode == 0 and said == "") is clean, (name, done.returncode, said)


def multi_bundle(tmp_path: Path, cfg: dict, name: str) -> dict[str, str]:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    plan = load_plan(path, None, SEED)
    return {f.path: f.content for f in per_host(plan, "pdsvc render",
                                                lambda p: render_systemd(p, "pdsvc render"))}


def test_apply_of_an_address_change_restarts_keepalived_on_each_router_host(
        tmp_path: Path) -> None:
    """router.vip.advert_ms changed: only the two vip.conf files differ; apply restarts the
    keepalived of each router host, one step each, after everything else, serving on."""
    old = multi_bundle(tmp_path, example(), "old.yaml")
    new = multi_bundle(tmp_path, example(vip={**example()["router"]["vip"], "advert_ms": 300}),
                       "new.yaml")
    assert {p for p in new if new[p] != old.get(p) and "/monitoring/" not in p
            and "install.list" not in p and not p.endswith("manifest")} >= {
        "lb-a/vip.conf", "lb-b/vip.conf"}
    r = plan_rollout(old, new)
    steps = [(str(s.action), s.units, s.serving_stops) for s in r.steps]
    assert steps == [("restart", ("lb-a/dsv4-vip.service",), False),
                     ("restart", ("lb-b/dsv4-vip.service",), False)], steps
    assert all(c.reasons[0].detail == "vip.conf changed" for c in r.changes)


def test_apply_of_a_router_change_across_router_hosts_rolls_one_router_at_a_time(
        tmp_path: Path) -> None:
    old = multi_bundle(tmp_path, example(), "old.yaml")
    new = multi_bundle(tmp_path, example(policy="round_robin"), "new.yaml")
    r = plan_rollout(old, new)
    steps = [(str(s.action), s.units, s.serving_stops) for s in r.steps]
    assert steps == [("restart router", ("lb-a/dsv4-router-0.service",), False),
                     ("restart router", ("lb-b/dsv4-router-1.service",), False)], steps


def test_status_says_whether_this_router_host_has_the_address() -> None:
    """`pdsvc status` on a router host: the address's line and JSON; the check is bind(2)'s
    (an address of this host binds, another does not)."""
    from pdsvc.status.collect import holds
    from pdsvc.status.format import format_text, report_dict
    from pdsvc.status.model import Probe, Report

    assert holds("127.0.0.1") and not holds("192.0.2.7")  # TEST-NET-1: never on a host
    probe = Probe("http://10.0.0.1:8100/workers", 200, 1.0, None)
    for here, said in ((True, "on this host (its front serves the clients)"),
                       (False, "not on this host (another router host has it")):
        r = Report("dsv4", "systemd", (), (), probe, None, "http://10.0.0.100:8000/v1/chat/"
                   "completions", True, (), address=("10.0.0.100", here))
        assert f"the moving address 10.0.0.100: {said}" in format_text(r)
        assert report_dict(r)["address"] == {"address": "10.0.0.100", "here": here}

