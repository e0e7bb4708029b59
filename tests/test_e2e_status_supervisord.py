"""`pdsvc status` against a stack run by the REAL supervisord of the serve venv (the bundle of
`pdsvc render --format supervisord`, the stand-in engines and the real sglang-router 0.3.2),
asked over supervisord's own control socket. pdsvc runs as a user runs it: `python -m
pdsvc.cli.commands status`, with this (the host's) python.

The stack is test_e2e_supervisord's SupervisordStack on free 127.0.0.1 ports, with `format:
supervisord` in its config (so `--backend auto` picks supervisord). The tests share it and run
in file order: the last ones stop decode, then supervisord itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_e2e_supervisord import NAME, SupervisordStack, wait_for

pytestmark = pytest.mark.e2e

STATUS_TIMEOUT = 60  # one status call: python start + 4 RPCs + 4 probes, on a busy box
SUPERVISORD = f"{NAME}-supervisord"  # the row in place of the target


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[SupervisordStack]:
    s = SupervisordStack(tmp_path_factory.mktemp("sv-status"), serve_python.parent.parent,
                         format="supervisord")
    try:
        s.start()
        s.wait_serving(180, "the stack serves after `supervisord -c`")
        yield s
    finally:
        s.down()


def pdsvc_status(stack: SupervisordStack, *args: str) -> subprocess.CompletedProcess[str]:
    """`pdsvc status ARGS` for the stack's config; the CompletedProcess, whatever its code."""
    return subprocess.run(
        [sys.executable, "-m", "pdsvc.cli", "status", "-c", str(stack.work / "config.yaml"),
         "--topology", str(stack.work / "topology.json"), *args],
        capture_output=True, text=True, timeout=STATUS_TIMEOUT, check=False,
        stdin=subprocess.DEVNULL,
    )


def verdict(out: str) -> str:
    return out.rstrip("\n").splitlines()[-1]


def both_workers_healthy(stack: SupervisordStack) -> dict | None:
    doc = json.loads(pdsvc_status(stack, "--backend", "supervisord", "--json").stdout)
    healthy = sorted(w["type"] for w in doc["workers"] or [] if w["healthy"])
    return doc if healthy == ["decode", "prefill"] else None


def test_a_started_stack_is_serving(stack: SupervisordStack) -> None:
    # the router's health checker (1 s) may still be catching up with the engines
    wait_for(lambda: both_workers_healthy(stack), 30, "the router lists both workers healthy")
    result = pdsvc_status(stack, "--backend", "supervisord")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert result.stderr == ""
    assert out.startswith(f"{NAME} PD stack (supervisord)\n"), out
    assert verdict(out) == "serving"
    # no target under supervisord: the supervisord that runs the bundle
    assert re.search(rf"^{SUPERVISORD}\s+active \(running\)\s+-\s+-\s+-\s+supervisord pid "
                     rf"{stack.proc.pid}: 3 of 3 programs running$", out, re.M), out
    for role, probe in (("prefill", "/health 200"), ("decode", "/health 200"),
                        ("router", "/readiness 200")):
        name = stack.names[role]
        assert re.search(rf"^{name}\s+active \(running\)\s+\d+[sm]\S*\s+-\s+{probe} \(\d+ ms\)"
                         rf"\s+pid {stack.runtime_pid(role)}, uptime ", out, re.M), out
    for role, engine in zip(("prefill", "decode"), stack.plan.engines, strict=True):
        assert re.search(rf"^\s+{role}\s+{re.escape(engine.url)}\s+healthy$", out, re.M), out


def test_auto_takes_supervisord_from_the_config_format(stack: SupervisordStack) -> None:
    result = pdsvc_status(stack, "--json")  # --backend auto, the socket from run_dir
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert (doc["backend"], doc["serving"], doc["problems"]) == ("supervisord", True, [])
    assert [(u["unit"], u["state"], u["sub"]) for u in doc["units"]] == [
        (SUPERVISORD, "active", "running"),
        *((stack.names[r], "active", "running") for r in ("prefill", "decode", "router"))]
    assert all(u["restarts"] is None and u["error"] is None for u in doc["units"])
    assert all(u["since_secs"] >= 0 for u in doc["units"][1:])


def test_a_stopped_decode_is_not_serving_and_named(stack: SupervisordStack) -> None:
    decode = stack.names["decode"]
    stopped = stack.ctl("stop", decode, timeout=stack.plan.lifecycle.stop_timeout_secs + 60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    result = pdsvc_status(stack, "--backend", "supervisord")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert re.search(rf"^{decode}\s+inactive \(stopped\)\s+\d+s\s+-\s+/health connection "
                     "refused", out, re.M), out
    assert "2 of 3 programs running" in out
    assert verdict(out).startswith(f"not serving: {decode} is inactive (stopped)"), out


def test_a_stopped_supervisord_is_rows_with_the_error(stack: SupervisordStack) -> None:
    assert stack.proc is not None
    stack.ctl("shutdown", timeout=90)
    stack.proc.wait(timeout=90)
    result = pdsvc_status(stack, "--backend", "supervisord")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "Traceback" not in out + result.stderr
    assert re.search(rf"^{SUPERVISORD}\s+unknown\s.*supervisord: ", out, re.M), out
    assert verdict(out).startswith("not serving: unit states unknown (supervisord: "), out
