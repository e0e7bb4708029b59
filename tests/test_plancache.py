"""The plan cache returns exactly the plan a full build returns, and only for the same inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from pdsvc.cli.kit import load_plan
from pdsvc.config.load import parse_config
from pdsvc.plan import cache as plancache
from pdsvc.plan.build import Plan, build_plan, plan_from_dict
from pdsvc.topology import load_topology_file

SEED = REPO / "etc/seed-host.topology.json"


#: Every optional section value set, none left at None: the other side of each Optional.
EVERY_OPTION = """\
model: {path: /m}
runtime: {pinning: off}
transfer: {kv_check_min_gbps: 12.5}
router: {python: /opt/router/bin/python, control_plane_key: /etc/k/router.key}
supervisord: {numactl: null, logs: files, drop_privileges: false}
k8s: {router_image: r:1, node_selector: {gpu: h200}, jit_cache_claim: jit,
      router_service_type: NodePort, host_network: true}
"""


def _plans() -> list[tuple[str, Plan]]:
    """Plans of several configs: one host, xPyD, an inventory of hosts (and each host's view),
    no host at all (k8s), every optional value set."""
    seed = load_topology_file(SEED)
    texts = {name: (REPO / path).read_text() for name, path in (
        ("default", "etc/pdsvc.yaml"), ("2p1d", "etc/examples/2p1d.yaml"),
        ("three-hosts", "etc/examples/three-hosts.yaml"))}
    texts["every-option"] = EVERY_OPTION
    plans = []
    for name, text in texts.items():
        config = parse_config(text)
        plan = build_plan(config, seed, config_source=name, config_text=text)
        plans += [(name, plan), (f"{name} (k8s)", build_plan(
            config, None, config_source=name, config_text=text))]
        plans += [(f"{name}: {h.name}", plan.for_host(h.name)) for h in plan.hosts]
    return plans


def test_round_trip_through_json_is_exact() -> None:
    """plan -> to_dict -> JSON -> plan_from_dict gives the same plan, for every shape of plan:
    the loader follows the field types, so a new field cannot be left out of the cache."""
    plans = _plans()
    assert {"three-hosts: gpu-a", "every-option (k8s)"} <= {name for name, _ in plans}
    for name, plan in plans:
        assert plan_from_dict(json.loads(json.dumps(plan.to_dict()))) == plan, name
    plan = dict(plans)["every-option"]
    assert plan.supervisord.numactl is None and plan.k8s.node_selector == {"gpu": "h200"}
    assert plan.engines[0].pinning.numa_node is None


def test_a_partial_or_mistyped_entry_is_refused() -> None:
    """What the cache reads as a miss (KeyError, TypeError, ValueError), never a wrong plan."""
    good = dict(_plans())["default"].to_dict()
    broken = [
        {k: v for k, v in good.items() if k != "lifecycle"},
        {**good, "lifecycle": {**good["lifecycle"], "start_attempts": "3"}},
        {**good, "format": "launchd"},
        {**good, "supervisord": {**good["supervisord"], "drop_privileges": 1}},
        {**good, "engines": [{**good["engines"][0], "pairs": [["http://p", 8998]]}]},
    ]
    for d in broken:
        with pytest.raises((KeyError, TypeError, ValueError)):
            plan_from_dict(d)


def test_cache_hit_equals_full_build_and_misses_on_change(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = tmp_path / "c.yaml"
    shutil.copy(REPO / "etc/pdsvc.yaml", cfg)
    first = load_plan(cfg, None, SEED)  # miss: built and stored
    assert len(list((tmp_path / "cache/pdsvc/plans").glob("*.json"))) == 1
    assert load_plan(cfg, None, SEED) == first  # hit
    cfg.write_text(cfg.read_text().replace("port: 8000", "port: 8080"))
    changed = load_plan(cfg, None, SEED)  # another key: a full build
    assert changed.router.port == 8080 and len(list((tmp_path / "cache/pdsvc/plans")
                                                     .glob("*.json"))) == 2


def test_corrupt_entry_is_a_miss_and_the_cache_can_be_off(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = REPO / "etc/pdsvc.yaml"
    plan = load_plan(cfg, None, SEED)
    (entry,) = (tmp_path / "cache/pdsvc/plans").glob("*.json")
    entry.write_text("{not json")
    assert load_plan(cfg, None, SEED) == plan
    monkeypatch.setenv("PDSVC_NO_PLAN_CACHE", "1")
    assert plancache.get("anything") is None


def test_round_trip_of_an_xpyd_plan() -> None:
    """N prefill + M decode (list form) round-trips too: names, ports and couplings."""
    text = (REPO / "tests/cases/seed-2p2d-explicit.yaml").read_text()
    plan = build_plan(parse_config(text), load_topology_file(SEED), config_source="x",
                      config_text=text)
    assert [e.name for e in plan.engines] == [
        "dsv4-prefill-0", "dsv4-prefill-1", "dsv4-decode-0", "dsv4-decode-1"]
    assert plan_from_dict(plan.to_dict()) == plan
