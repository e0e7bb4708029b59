"""Every rendered unit passes `systemd-analyze verify` silently and scores ≤ 4.0 in
`systemd-analyze security --offline=yes` — for the default bundle and every fixture case."""

from __future__ import annotations

from pathlib import Path

import pytest
from analyze import missing, scratch_root, security, verify
from conftest import REPO, require

from pdsvc.cli.kit import load_plan
from pdsvc.render.bundle import write_bundle
from pdsvc.render.systemd import render_systemd

OK_CASES = [  # the systemd cases that render (no `## format:`)
    p for p in sorted((REPO / "tests" / "cases").glob("*.yaml"))
    if "assert-error" not in p.read_text() and "## format:" not in p.read_text()
]


def _render(config: Path, tmp_path: Path, **topo) -> tuple:
    plan = load_plan(config, topo.get("sysfs"), topo.get("topology"))
    bundle = tmp_path / "bundle"
    write_bundle(render_systemd(plan, "pdsvc render (test)"), bundle)
    return plan, scratch_root(tmp_path / "root", plan, bundle)


@pytest.mark.parametrize("case", OK_CASES, ids=[p.stem for p in OK_CASES])
def test_cases_verify_clean(case: Path, sysfs_hosts, tmp_path: Path) -> None:
    require(missing())
    host = next(line.split()[-1] for line in case.read_text().splitlines()
                if line.startswith("## host:"))
    plan, _ = _render(case, tmp_path, sysfs=sysfs_hosts[host])
    assert verify(tmp_path / "root", plan) == ""


def test_default_bundle_verify_and_security(tmp_path: Path) -> None:
    require(missing())
    plan, _ = _render(REPO / "etc/pdsvc.yaml", tmp_path,
                      topology=REPO / "etc/seed-host.topology.json")
    assert verify(tmp_path / "root", plan) == ""
    scores = {unit: security(tmp_path / "root", unit) for unit in (plan.gate, *plan.units)}
    assert all(score <= 4.0 for score in scores.values()), scores


def test_two_routers_and_their_front_verify_and_score(tmp_path: Path) -> None:
    """router.replicas: 2: the routers' ExecStop=/ExecStartPost= and HAProxy's unit too."""
    require(missing())
    plan, _ = _render(REPO / "tests/cases/router-replicas.yaml", tmp_path,
                      topology=REPO / "etc/seed-host.topology.json")
    assert plan.front is not None
    assert verify(tmp_path / "root", plan) == ""
    scores = {unit: security(tmp_path / "root", unit) for unit in plan.units}
    assert all(score <= 4.0 for score in scores.values()), scores


def test_a_router_host_of_a_moving_address_verifies_and_scores(tmp_path: Path) -> None:
    """Routers on two hosts (router.vip): a router host's bundle, keepalived's unit with its
    two capabilities among them."""
    require(missing())
    whole = load_plan(REPO / "etc/examples/two-routers.yaml", None,
                      REPO / "etc/seed-host.topology.json")
    plan = whole.for_host("lb-b")
    assert plan.vip is not None
    bundle = tmp_path / "bundle"
    write_bundle(render_systemd(plan, "pdsvc render (test)"), bundle)
    scratch_root(tmp_path / "root", plan, bundle)
    assert verify(tmp_path / "root", plan) == ""
    scores = {unit: security(tmp_path / "root", unit) for unit in plan.units}
    print(scores)
    assert all(score <= 4.0 for score in scores.values()), scores


def test_verify_catches_a_missing_binary(tmp_path: Path) -> None:
    """The check can fail: without the configured python in the root, verify complains."""
    require(missing())
    plan, _ = _render(REPO / "etc/pdsvc.yaml", tmp_path,
                      topology=REPO / "etc/seed-host.topology.json")
    (tmp_path / "root" / plan.python.lstrip("/")).unlink()
    assert "is not executable" in verify(tmp_path / "root", plan)
