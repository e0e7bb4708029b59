"""`pdsvc status` under a real systemd (nspawn), against the real sglang-router 0.3.2 and the
stand-in engines, installed by the real install.sh: run inside the container as a user would,
with the serve venv's python (which has pdsvc's dependencies).

The tests share one stack and run in file order; the last one stops decode.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, require
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

STATUS_TIMEOUT = 60  # one status call: python start + 4 x systemctl + 4 probes, on a busy box


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require(nspawn_available())
    s = Stack.up(tmp_path_factory.mktemp("e2e-status"), serve_python.parent.parent)
    try:
        yield s
    finally:
        s.down()


@pytest.fixture(scope="module")
def pdsvc_status(stack: Stack, serve_python: Path):
    """Run `pdsvc status ARGS` inside the container (via `-m pdsvc.cli.status`, the command
    alone); the CompletedProcess, whatever its exit code."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return stack.c.run(
            ["env", f"PYTHONPATH={REPO}", str(serve_python), "-m", "pdsvc.cli.status",
             "-c", "/srv/e2e/config.yaml", "--topology", "/srv/e2e/topology.json", *args],
            check=False, timeout=STATUS_TIMEOUT)

    return run


def verdict(out: str) -> str:
    return out.rstrip("\n").splitlines()[-1]


def test_a_started_stack_is_serving(stack: Stack, pdsvc_status) -> None:
    result = pdsvc_status()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert result.stderr == ""
    assert verdict(out) == "serving"
    assert re.search(r"^e2e-pd.target\s+active\s+\d+", out, re.M), out
    for role, probe in (("prefill", "/health 200"), ("decode", "/health 200"),
                        ("router", "/readiness 200")):
        assert re.search(rf"^e2e-{role}.service\s+active \(running\)\s+\d+s\s+0\s+{probe} \(",
                         out, re.M), out
    assert re.search(r"^\s+prefill\s+http://127.0.0.1:30000\s+healthy$", out, re.M), out
    assert re.search(r"^\s+decode\s+http://127.0.0.1:30001\s+healthy$", out, re.M), out
    # router.host is 0.0.0.0: clients are told this machine's name
    hostname = stack.c.run(["cat", "/proc/sys/kernel/hostname"]).stdout.strip()
    assert f"send requests to: http://{hostname}:8000/v1/chat/completions" in out
    # and that path is where requests go (127.0.0.1: the container has no /etc/hosts)
    code, body = stack.curl("/v1/chat/completions", {
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert code == 200 and "chat.completion" in body, body


def test_json_parses_and_has_the_same_facts(pdsvc_status) -> None:
    result = pdsvc_status("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert (doc["serving"], doc["verdict"], doc["problems"]) == (True, "serving", [])
    assert [(u["unit"], u["state"]) for u in doc["units"]] == [
        ("e2e-pd.target", "active"), ("e2e-prefill.service", "active"),
        ("e2e-decode.service", "active"), ("e2e-router.service", "active")]
    for u in doc["units"][1:]:
        assert u["restarts"] == 0 and u["since_secs"] > 0 and u["probe"]["code"] == 200, u
    assert sorted((w["type"], w["url"], w["healthy"]) for w in doc["workers"]) == [
        ("decode", "http://127.0.0.1:30001", True), ("prefill", "http://127.0.0.1:30000", True)]


def test_a_stopped_decode_is_not_serving_and_named(stack: Stack, pdsvc_status) -> None:
    decode = stack.unit("decode")
    stack.c.systemctl("stop", decode, timeout=120)
    result = pdsvc_status()
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(rf"^{decode}\s+inactive \(dead\)", result.stdout, re.M), result.stdout
    assert verdict(result.stdout).startswith(f"not serving: {decode} is inactive (dead)")

    # the router's health checker (1 s) then takes decode out: readiness 503, worker unhealthy
    def router_noticed() -> dict | None:
        doc = json.loads(pdsvc_status("--json").stdout)
        return doc if not any(w["healthy"] for w in doc["workers"] or []
                              if w["type"] == "decode") else None

    doc = stack.c.wait_for(router_noticed, 60, interval=1, what="the router marks decode down")
    assert doc["serving"] is False
    router = doc["units"][3]
    assert router["state"] == "active" and router["probe"]["code"] == 503
    assert doc["problems"][0] == f"{decode} is inactive (dead)"
    # a stopped engine deregistered itself first: the router does not list it at all
    assert "the router does not list the decode worker http://127.0.0.1:30001" in doc["problems"]
    assert any(p.startswith("router not ready: /readiness 503") for p in doc["problems"])
