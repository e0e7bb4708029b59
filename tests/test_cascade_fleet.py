"""A heal cascade across hosts (pdsvc/ship/runtime/cascade.py): with engines serving from two
hosts or more, each such host's engine runtimes serve its heals and cures on one port,
`lifecycle.cascade_port` at the host's address (--fleet-listen), and read every other engine
host's (--fleet). On one host nothing of it is rendered."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from pdsvc.config.load import parse_config
from pdsvc.config.schema import LifecycleConfig
from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan, build_plan
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
