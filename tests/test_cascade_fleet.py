"""A heal cascade across hosts (pdsvc/ship/runtime/cascade.py): with engines serving from two
hosts or more, each such host's engine runtimes serve its heals and cures on one port,
`lifecycle.cascade_port` at the host's address (--fleet-listen), and read every other engine
host's (--fleet). On one host nothing of it is rendered."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO
from sdsyntax import exec_argv, sections
from svconf import SupervisordConf

from pdsvc.config.load import parse_config
from pdsvc.config.schema import LifecycleConfig
from pdsvc.errors import ConfigError
from pdsvc.plan.build import EnginePlan, Plan, build_plan
from pdsvc.plan.connections import connections
from pdsvc.plan.runtime_argv import member_flags
from pdsvc.render.supervisord import render_supervisord
from pdsvc.render.systemd import render_systemd
from pdsvc.topology import load_topology_file

SEED = load_topology_file(REPO / "etc/seed-host.topology.json")
BASE = "model: {path: /srv/m}\n"

#: 2P1D: the router's host serves prefill[0] too, prefill[1] on gpu-a, the decode on gpu-b,
#: and rank 1 of the decode on gpu-c (a host that serves no engine)
FOUR_HOSTS = BASE + """\
hosts:
  lb: {address: 10.0.0.1, run: [router, "prefill[0]"]}
  gpu-a: {address: 10.0.0.2, run: ["prefill[1]"]}
  gpu-b: {address: 10.0.0.3, run: [decode]}
  gpu-c: {address: 10.0.0.4, run: [decode]}
prefill:
  - {gpus: [0, 1]}
  - {gpus: [2, 3]}
decode: {gpus: [4, 5, 6, 7]}
"""


def plan_of(text: str) -> Plan:
    return build_plan(parse_config(text, "c.yaml"), SEED, config_source="c.yaml",
                      config_text=text)


def by_name(plan: Plan) -> dict[tuple[str, int], EnginePlan]:
    return {(e.name, e.node_rank): e for e in plan.engines}


def flags(argv: list[str], flag: str) -> list[str]:
    """The value after each occurrence of ``flag`` in a command line."""
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


# --------------------------------------------------------------- config


def test_the_port_is_8997_by_default_and_a_yaml_port() -> None:
    assert LifecycleConfig().cascade_port == 8997
    assert plan_of(BASE).lifecycle.cascade_port == 8997  # the plan reads the config's
    assert plan_of(BASE + "lifecycle: {cascade_port: 9100}\n").lifecycle.cascade_port == 9100
    for bad, why in (("0", "greater than or equal to 1"), ("65536", "less than or equal"),
                     ("true", "valid integer"), ("'8997'", "valid integer")):
        with pytest.raises(ConfigError, match=why) as err:
            plan_of(BASE + f"lifecycle: {{cascade_port: {bad}}}\n")
        assert "lifecycle.cascade_port" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("change", "message"), [
    ({"lifecycle": {"cascade_port": 30001}},
     "lifecycle.cascade_port: port 30001 is also decode.port (decode.port is its default); "
     "each service needs its own"),
    ({"lifecycle": {"cascade_port": 8000}}, "lifecycle.cascade_port: port 8000 is also "
     "router.port"),
    ({"prefill": [{"gpus": [0, 1], "bootstrap_port": 8997}, {"gpus": [2, 3]}]},
     "prefill[0].bootstrap_port: port 8997 is also lifecycle.cascade_port "
     "(lifecycle.cascade_port is its default); each service needs its own"),
    ({"lifecycle": {"cascade_port": 30340}},
     "is kept for SGLang's ZMQ/NCCL ports but lifecycle.cascade_port is 30340"),
])
def test_across_hosts_a_clash_with_the_port_is_refused_in_one_line(change: dict,
                                                                  message: str) -> None:
    cfg = yaml.safe_load(FOUR_HOSTS)
    cfg.update(change)
    with pytest.raises(ConfigError) as err:
        plan_of(yaml.safe_dump(cfg, sort_keys=False))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_on_one_host_the_port_is_not_bound_so_nothing_clashes_with_it() -> None:
    plan_of(BASE + "prefill: {bootstrap_port: 8997}\n")
    one_machine = yaml.safe_load(FOUR_HOSTS)  # an inventory whose engines serve from one host
    one_machine["hosts"]["lb"]["run"] = ["router", "prefill", "decode"]
    for h in ("gpu-a", "gpu-b", "gpu-c"):
        del one_machine["hosts"][h]
    one_machine["lifecycle"] = {"cascade_port": 30001}
    plan_of(yaml.safe_dump(one_machine, sort_keys=False))


# --------------------------------------------------------------- plan


@pytest.mark.parametrize("config", ["etc/pdsvc.yaml", "etc/examples/2p1d.yaml"])
def test_on_one_host_the_fields_stay_empty(config: str) -> None:
    plan = plan_of((REPO / config).read_text())
    assert [(e.fleet_listen, e.fleet) for e in plan.engines] == [("", ())] * len(plan.engines)


def test_an_inventory_whose_engines_serve_from_one_host_has_no_cascade_channel() -> None:
    cfg = yaml.safe_load(FOUR_HOSTS)
    cfg["hosts"] = {"lb": {"address": "10.0.0.1", "run": ["router"]},
                    "gpu-a": {"address": "10.0.0.2", "run": ["prefill", "decode"]},
                    "gpu-b": {"address": "10.0.0.3", "run": ["decode"]}}  # rank 1 only
    cfg["prefill"] = [{"gpus": [0, 1]}, {"gpus": [2, 3]}]
    plan = plan_of(yaml.safe_dump(cfg, sort_keys=False))
    assert {e.machine for e in plan.engines} == {"gpu-a", "gpu-b"}
    assert all(not e.fleet_listen and not e.fleet for e in plan.engines)
    assert all(c.purpose != "cascade" for c in connections(plan))


def test_across_hosts_each_serving_engine_listens_on_its_host_and_reads_the_others() -> None:
    plan = plan_of(FOUR_HOSTS + "lifecycle: {cascade_port: 9001}\n")
    got = {k: (e.fleet_listen, e.fleet) for k, e in by_name(plan).items()}
    assert got == {
        ("dsv4-prefill-0", 0): ("10.0.0.1:9001", ("10.0.0.2:9001", "10.0.0.3:9001")),
        ("dsv4-prefill-1", 0): ("10.0.0.2:9001", ("10.0.0.1:9001", "10.0.0.3:9001")),
        ("dsv4-decode", 0): ("10.0.0.3:9001", ("10.0.0.1:9001", "10.0.0.2:9001")),
        ("dsv4-decode", 1): ("", ()),  # rank 1 serves no HTTP: it heals nothing (gpu-c)
    }


def test_engines_of_one_host_share_its_port_and_list_each_other_host_once() -> None:
    cfg = yaml.safe_load(FOUR_HOSTS)
    cfg["hosts"]["gpu-a"]["run"] = ["prefill[1]", "decode[0]"]
    cfg["decode"] = [{"gpus": [4, 5]}, {"gpus": [6, 7]}]  # decode[1] spans gpu-b and gpu-c
    cfg["hosts"]["gpu-b"]["run"] = ["decode[1]"]
    cfg["hosts"]["gpu-c"]["run"] = ["decode[1]"]
    engines = by_name(plan_of(yaml.safe_dump(cfg, sort_keys=False)))
    on_a = [engines[("dsv4-prefill-1", 0)], engines[("dsv4-decode-0", 0)]]
    assert {(e.fleet_listen, e.fleet) for e in on_a} == {
        ("10.0.0.2:8997", ("10.0.0.1:8997", "10.0.0.3:8997"))}


# --------------------------------------------------------------- the runtime's command line


def test_member_flags_end_with_the_listen_address_then_each_other_host() -> None:
    plan = plan_of(FOUR_HOSTS)
    engines = by_name(plan)
    got = member_flags(plan, engines[("dsv4-decode", 0)], "systemd")
    assert got[-6:] == ["--fleet-listen", "10.0.0.3:8997", "--fleet", "10.0.0.1:8997",
                        "--fleet", "10.0.0.2:8997"]
    assert got[-7].startswith("systemctl restart")  # right after --restart-all's command
    assert "--fleet-listen" not in member_flags(plan, engines[("dsv4-decode", 1)], "systemd")
    seed = plan_of((REPO / "etc/pdsvc.yaml").read_text())
    for e in seed.engines:
        assert not {"--fleet-listen", "--fleet"} & set(member_flags(seed, e, "systemd"))


def _engine_commands(plan: Plan, fmt: str) -> dict[str, list[str]]:
    """Each engine's runtime command line (mode, options, --, command) in one host's bundle."""
    if fmt == "systemd":
        files = {f.path: f.content for f in render_systemd(plan, "t")}
        return {e.name: exec_argv(sections(files[e.unit])["Service"]["ExecStart"][0])[2:]
                for e in plan.engines}
    conf = SupervisordConf(render_supervisord(plan, "t")[0].content, "/b")
    out = {}
    for e in plan.engines:
        argv = conf.command(f"program:{e.name}")
        out[e.name] = argv[argv.index("engine"):]
    return out


@pytest.mark.parametrize("fmt", ["systemd", "supervisord"])
def test_both_bundles_hand_every_serving_engine_runtime_the_flags(fmt: str) -> None:
    plan = plan_of(FOUR_HOSTS)
    for host in ("lb", "gpu-a", "gpu-b", "gpu-c"):
        for e in plan.for_host(host).engines:
            argv = _engine_commands(plan.for_host(host), fmt)[e.name]
            options = argv[:argv.index("--")]  # the runtime's, not SGLang's
            assert flags(options, "--fleet-listen") == ([e.fleet_listen] if e.fleet_listen
                                                        else [])
            assert flags(options, "--fleet") == list(e.fleet)
    seed = plan_of((REPO / "etc/pdsvc.yaml").read_text())
    for argv in _engine_commands(seed, fmt).values():
        assert "--fleet-listen" not in argv and "--fleet" not in argv


# --------------------------------------------------------------- the firewall list


def test_one_cascade_row_per_ordered_pair_of_engine_hosts() -> None:
    rows = [(c.source, c.target) for c in connections(plan_of(FOUR_HOSTS))
            if c.purpose == "cascade"]
    assert rows == [  # by destination, then source, in the order of `hosts`
        ("gpu-a", "10.0.0.1:8997"), ("gpu-b", "10.0.0.1:8997"),
        ("lb", "10.0.0.2:8997"), ("gpu-b", "10.0.0.2:8997"),
        ("lb", "10.0.0.3:8997"), ("gpu-a", "10.0.0.3:8997"),
    ]
    whys = {(c.source, c.target): c.why for c in connections(plan_of(FOUR_HOSTS))}
    assert whys[("gpu-b", "10.0.0.1:8997")] == (
        "gpu-b's engine runtimes read lb's heals and cures of a heal cascade (--fleet, keyed)")


def test_doctor_checks_the_port_once_on_each_engine_host() -> None:
    from pdsvc.doctor.ports import planned_ports
    plan = plan_of(FOUR_HOSTS)
    for host, address in (("lb", "10.0.0.1"), ("gpu-a", "10.0.0.2"), ("gpu-b", "10.0.0.3")):
        mine = [p for p in planned_ports(plan.for_host(host)) if "cascade_port" in p.what]
        assert [(p.host, p.port) for p in mine] == [(address, 8997)], host
    assert not [p for p in planned_ports(plan.for_host("gpu-c")) if "cascade_port" in p.what]
    assert not [p for p in planned_ports(plan_of(BASE)) if "cascade_port" in p.what]
