"""`pdsvc doctor --kv` under a real systemd (nspawn): each half of the NIXL transfer runs as a
transient unit with its engine unit's own settings (User=, CPUAffinity=, Environment=, the
hardening) and the drop-ins installed beside it, the way an operator's `systemctl edit` adds a
UCX_NET_DEVICES=. Host memory (no GPU in CI); the real NIXL 1.5.1 from the serve venv."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, require
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

DOCTOR_TIMEOUT = 240


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require(nspawn_available())
    s = Stack.up(tmp_path_factory.mktemp("e2e-kv"), serve_python.parent.parent, start=False,
                 **{"transfer.kv_check_bytes": 4 << 20, "transfer.kv_check_blocks": 4})
    try:
        yield s
    finally:
        s.down()


def doctor_kv(stack: Stack, serve_python: Path) -> dict:
    """`pdsvc doctor --kv --kv-as systemd --json` inside the container, as root; its kv row."""
    proc = stack.c.run(
        ["env", f"PYTHONPATH={REPO}", str(serve_python), "-m", "pdsvc.cli", "doctor",
         "-c", "/srv/e2e/config.yaml", "--topology", "/srv/e2e/topology.json",
         "--kv", "--kv-as", "systemd", "--json"], check=False, timeout=DOCTOR_TIMEOUT)
    report = json.loads(proc.stdout)
    [row] = [c for c in report["checks"] if c["check"].startswith("kv")]
    return row


def test_the_halves_run_as_the_units_and_move_the_blocks_intact(
        stack: Stack, serve_python: Path) -> None:
    row = doctor_kv(stack, serve_python)
    assert row["check"] == "kv e2e-prefill→e2e-decode", row
    assert row["status"] == "ok", row
    assert "4 MiB in 4 blocks" in row["detail"] and "intact" in row["detail"]
    assert row["detail"].endswith("ran as sglang (systemd)"), row
    assert no_kvcheck_units(stack) == ""  # the transient units are gone (--collect)


def test_a_dropin_with_a_wrong_nic_fails_and_is_named(stack: Stack, serve_python: Path) -> None:
    dropin = "/etc/systemd/system/e2e-prefill.service.d/50-nic.conf"
    stack.c.run(["mkdir", "-p", str(Path(dropin).parent)])
    stack.c.run(["sh", "-c", f"printf '[Service]\\nEnvironment=UCX_NET_DEVICES=bogus0\\n' "
                 f"> {dropin} && systemctl daemon-reload"])
    try:
        row = doctor_kv(stack, serve_python)
    finally:
        stack.c.run(["sh", "-c", f"rm -f {dropin} && systemctl daemon-reload"])
    assert row["status"] == "failed", row
    assert "NIXL_ERR_BACKEND" in row["detail"]
    assert row["fix"].startswith("UCX_NET_DEVICES=bogus0 names no usable device here")
    assert "drop-ins" in row["fix"]
    assert no_kvcheck_units(stack) == ""  # the decode-side half was stopped, not left waiting


def no_kvcheck_units(stack: Stack) -> str:
    return stack.c.run(["systemctl", "list-units", "--all", "--no-legend", "*kvcheck*"],
                       check=False).stdout.strip()


def test_no_kv_without_asking(stack: Stack, serve_python: Path) -> None:
    proc = stack.c.run(
        ["env", f"PYTHONPATH={REPO}", str(serve_python), "-m", "pdsvc.cli", "doctor",
         "-c", "/srv/e2e/config.yaml", "--topology", "/srv/e2e/topology.json", "--json"],
        check=False, timeout=DOCTOR_TIMEOUT)
    assert not [c for c in json.loads(proc.stdout)["checks"] if c["check"].startswith("kv")]
