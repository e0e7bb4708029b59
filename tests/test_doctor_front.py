"""`pdsvc doctor` with router.replicas ≥ 2: the front's HAProxy is there, new enough, and takes
the config pdsvc renders; else one failed row that says how to install it."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import REPO, require

from pdsvc.cli.kit import load_plan
from pdsvc.doctor.checks import CHECKS
from pdsvc.doctor.facts import Facts
from pdsvc.doctor.front import check_front
from pdsvc.doctor.host import Host
from pdsvc.plan.build import Plan

TOPO = REPO / "etc/seed-host.topology.json"


def plan(text: str, tmp_path: Path) -> Plan:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    return load_plan(cfg, None, TOPO)


def fake_haproxy(tmp_path: Path, version: str, check_rc: int = 0) -> str:
    exe = tmp_path / "haproxy"
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = -v ]; then echo 'HAProxy version {version} "
                   f"2024/01/01'; exit 0; fi\necho '[ALERT] parsing: unknown keyword' >&2\n"
                   f"exit {check_rc}\n")
    exe.chmod(0o755)
    return str(exe)


def with_haproxy(p: Plan, path: str) -> Plan:
    assert p.front is not None
    return replace(p, front=replace(p.front, haproxy=path))


def test_the_check_runs_only_with_a_front(tmp_path: Path) -> None:
    one = plan("model: {path: /srv/m}\n", tmp_path)
    two = plan("model: {path: /srv/m}\nrouter: {replicas: 2}\n", tmp_path)
    front = next(c for c in CHECKS if c.name == "front")
    assert not front.when(Facts(Host(), one)) and front.when(Facts(Host(), two))


def test_debians_haproxy_takes_the_rendered_config(tmp_path: Path) -> None:
    if not shutil.which("haproxy"):
        require("haproxy is not installed (apt install haproxy)")
    (row,) = check_front(plan("model: {path: /srv/m}\nrouter: {replicas: 3}\n", tmp_path))
    assert row.status == "ok" and "3 routers behind http://127.0.0.1:8000" in row.detail


@pytest.mark.parametrize(("version", "rc", "said"), [
    (None, 0, "not found"), ("1.8.30", 0, "older than 2.0"), ("2.6.12", 1, "refuses")])
def test_missing_old_or_refusing_is_one_failed_row_with_the_fix(
        tmp_path: Path, version: str | None, rc: int, said: str) -> None:
    p = plan("model: {path: /srv/m}\nrouter: {replicas: 2}\n", tmp_path)
    exe = fake_haproxy(tmp_path, version, rc) if version else str(tmp_path / "none")
    (row,) = check_front(with_haproxy(p, exe))
    assert row.status == "failed" and said in row.detail, row
    assert row.fix and ("apt install haproxy" in row.fix or "pdsvc bug" in row.fix)
