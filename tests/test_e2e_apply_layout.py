"""`pdsvc apply` of a layout change (engines per role: the levers `pdsvc tune` pulls on the seed
host's 1P1D) under a real systemd (nspawn), with the real router and the stand-in engines.

Before rollout.py started new engines first, 1P1D -> 2P1D restarted the decode before its new
prefills ran: its pair canary could never prove the pairs with them, and the step failed at
its bound ("pair canary not good yet"), so every layout candidate of a tune ended as a failed
start. Checked here: 1P1D -> 2P1D and 2P1D -> 2P2D are one step for every engine (serving
stops for them anyway: one load, not one per engine); 2P2D -> 3P2D starts the new prefill
first, while the others serve, then restarts the others one at a time; the stack serves in
the new layout after each.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import require
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

TIMEOUTS = ("--drain-timeout", "10", "--step-timeout", "120")


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = Stack.up(tmp_path_factory.mktemp("e2e-layout"), serve_python.parent.parent, gpus=5,
                 **{"router.package": router_package})
    yield s
    s.down()


def steps(stderr: str) -> list[str]:
    """The steps apply ran, as it printed them: 'restart together A, B', 'start C' ..."""
    return re.findall(r"^pdsvc apply: step \d+/\d+: (.+)$", stderr, re.MULTILINE)


def listed(stack: Stack) -> set[str]:
    """The engines the router lists healthy (none while it does not answer)."""
    code, body = stack.workers(timeout=5)
    if code != 200:
        return set()
    return {str(w.get("url", "")).rstrip("/") for w in json.loads(body)["workers"]
            if w.get("is_healthy") is not False}


def applied(stack: Stack, cfg: dict) -> None:
    """The stack's plan is the applied config's from now on (its units, for wait_serving)."""
    path = stack.work / "applied.yaml"
    path.write_text(yaml.safe_dump(cfg))
    stack.plan = json.loads(subprocess.run(
        [sys.executable, "-m", "pdsvc.cli", "plan", "-c", str(path), "--topology",
         str(stack.work / "topology.json"), "--json"],
        capture_output=True, text=True, timeout=60, check=True).stdout)


def layout(stack: Stack, first: bool = False) -> dict:
    """The config last applied (the stack's own before the first apply)."""
    return yaml.safe_load(stack.c.read_file("/var/lib/pdsvc-apply/config.yaml") if not first
                          else (stack.work / "config.yaml").read_text())


def apply_layout(stack: Stack, cfg: dict, ran: list[str], engines: int) -> str:
    """Apply ``cfg`` (--yes: the router's restart stops serving), check the steps it ran and
    that the router lists ``engines`` engines and the stack serves; its plan (stdout)."""
    r = stack.apply(cfg, "--yes", *TIMEOUTS, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert steps(r.stderr) == [*ran, "restart router e2e-router.service"], r.stderr
    # the router's restart is the last step: the engines register themselves again once it
    # serves (their runtimes' membership), each when it next looks; so wait for that
    stack.c.wait_for(lambda: len(listed(stack)) == engines, 90, interval=0.5,
                     what=f"the router lists all {engines} engines")
    applied(stack, cfg)
    stack.wait_serving(60)
    return r.stdout


def test_1p1d_to_2p1d_restarts_the_decode_with_its_new_prefills_in_one_step(
        stack: Stack) -> None:
    """The seed's 2P1D lever: the decode cannot prove its pairs before its prefills run."""
    cfg = layout(stack, first=True)
    cfg["prefill"] = [{"gpus": [0]}, {"gpus": [2]}]
    plan = apply_layout(stack, cfg, [
        "restart together e2e-prefill-0.service, e2e-prefill-1.service, e2e-decode.service"], 3)
    assert "one engine load instead of 2" in plan, plan


def test_2p1d_to_2p2d_starts_the_new_decodes_with_the_prefills_in_one_step(
        stack: Stack) -> None:
    cfg = layout(stack)
    assert len(cfg["prefill"]) == 2, "runs after the 1P1D -> 2P1D test"
    cfg["decode"] = [{"gpus": [1]}, {"gpus": [3]}]
    apply_layout(stack, cfg, ["restart together e2e-prefill-0.service, e2e-prefill-1.service, "
                              "e2e-decode-0.service, e2e-decode-1.service"], 4)


def test_a_new_prefill_starts_first_then_the_others_restart_one_at_a_time(
        stack: Stack) -> None:
    cfg = layout(stack)
    assert len(cfg["decode"]) == 2, "runs after the 2P1D -> 2P2D test"
    cfg["prefill"].append({"gpus": [4]})
    plan = stack.apply(cfg, "--dry-run", *TIMEOUTS, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    first = plan.stdout.split("\n  2. ")[0]
    assert "1. start e2e-prefill-2.service" in first and "STOPS" not in first, plan.stdout
    apply_layout(stack, cfg, ["start e2e-prefill-2.service", *(
        f"restart e2e-{e}.service" for e in ("prefill-0", "prefill-1", "decode-0", "decode-1"))],
        5)
