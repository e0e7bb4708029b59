"""The plan cache returns exactly the plan a full build returns, and only for the same inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import REPO

from pdsvc import plancache
from pdsvc.clikit import load_plan
from pdsvc.config import parse_config
from pdsvc.plan import build_plan, plan_from_dict
from pdsvc.topology import load_topology_file

SEED = REPO / "etc/seed-host.topology.json"


def test_round_trip_is_exact() -> None:
    text = (REPO / "etc/pdsvc.yaml").read_text()
    plan = build_plan(parse_config(text), load_topology_file(SEED), config_source="x",
                      config_text=text)
    assert plan_from_dict(plan.to_dict()) == plan


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
