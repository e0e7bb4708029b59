"""`pdsvc apply` on a supervisord bundle under the REAL supervisord (the serve venv's
supervisor 4.3.0), with the real router and the stand-in engines: a 2P2D stack takes a
pair-compatible change of the decodes (an extra engine arg), applied as an operator would
(`python -m pdsvc.cli apply`), while a request loop runs through the router.

Checked: each program is a group of its own, so supervisord re-reads one changed program
without touching the others (supervisor's supervisorctl.py do_update re-creates a whole group;
options.py ProcessGroupConfig.__eq__ decides which groups changed); only the two decodes
restarted, one at a time (the second stopped only after the first ran again), each with the
new argument, and every request of the loop was served.

The stack is test_e2e_supervisord's SupervisordStack on free 127.0.0.1 ports, in the list
form (engines=2).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import xmlrpc.client
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_e2e_supervisord import NAME, SupervisordStack

from pdsvc.ship.runtime.listener import supervisor_rpc

pytestmark = pytest.mark.e2e

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[SupervisordStack]:
    s = SupervisordStack(tmp_path_factory.mktemp("sv-apply"), serve_python.parent.parent,
                         engines=2, format="supervisord", **{
                             "router.policy": "round_robin",
                             "router.package": router_package})
    try:
        s.start()
        s.wait_serving(180, "the 2P2D stack serves after `supervisord -c`")
        yield s
    finally:
        s.down()


def apply(stack: SupervisordStack, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pdsvc.cli", "apply", "-c", str(stack.work / "config.yaml"),
         "--topology", str(stack.work / "topology.json"), "-o", str(stack.bundle), *args],
        capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def request_loop(s: SupervisordStack, stop: threading.Event, results: list) -> None:
    while not stop.is_set():
        code, body = s.generate(timeout=10)
        results.append((time.monotonic(), code == 200 and "hello from fake engine" in body,
                        code, body[-200:]))


def watch_decodes(s: SupervisordStack, stop: threading.Event, seen: list) -> None:
    """Which decodes supervisord runs, every 0.2 s (gone between removeProcessGroup and
    addProcessGroup: BAD_NAME, counted as down)."""
    rpc = supervisor_rpc(f"unix://{s.run_dir}/{NAME}-supervisord.sock", timeout=10)
    while not stop.is_set():
        down = []
        for d in ("decode-0", "decode-1"):
            try:
                running = rpc.supervisor.getProcessInfo(s.names[d])["statename"] == "RUNNING"
            except xmlrpc.client.Fault:
                running = False
            if not running:
                down.append(d)
        seen.append(tuple(down))
        time.sleep(0.2)


def test_apply_restarts_only_the_changed_decodes_one_at_a_time_while_serving(
        stack: SupervisordStack) -> None:
    status = stack.ctl("status").stdout
    assert "-pd:" not in status, status  # no shared group: each program by its own name
    cfg = yaml.safe_load((stack.work / "config.yaml").read_text())
    for d in cfg["decode"]:
        d["args"] = {"max-running-requests": 64}
    (stack.work / "config.yaml").write_text(yaml.safe_dump(cfg))
    roles = (*ENGINES, "router")
    before = {r: (stack.info(r)["pid"], stack.info(r)["start"]) for r in roles}
    timeouts = ("--drain-timeout", "20", "--step-timeout", "120")

    plan = apply(stack, *timeouts, "--dry-run", timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "serving: never stops" in plan.stdout, plan.stdout
    assert "update group" not in plan.stdout, plan.stdout

    stop, results, seen = threading.Event(), [], []
    threads = [threading.Thread(target=request_loop, args=(stack, stop, results), daemon=True),
               threading.Thread(target=watch_decodes, args=(stack, stop, seen), daemon=True)]
    for t in threads:
        t.start()
    time.sleep(2)
    try:
        r = apply(stack, *timeouts, timeout=400)
    finally:
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join(30)
    assert r.returncode == 0, r.stdout + r.stderr
    d0, d1 = stack.names["decode-0"], stack.names["decode-1"]
    assert f"step 1/2: restart {d0}" in r.stderr, r.stderr
    assert f"step 2/2: restart {d1}" in r.stderr, r.stderr

    after = {r_: (stack.info(r_)["pid"], stack.info(r_)["start"]) for r_ in roles}
    changed = {r_ for r_ in roles if after[r_] != before[r_]}
    assert changed == {"decode-0", "decode-1"}, (before, after)
    # one at a time: each decode was down, never both at once, decode-0 first
    assert ("decode-0",) in seen and ("decode-1",) in seen, seen
    assert ("decode-0", "decode-1") not in seen, seen
    assert seen.index(("decode-0",)) < seen.index(("decode-1",))
    err = r.stderr
    assert err.index(f"{d0}: serving again") < err.index(f"step 2/2: restart {d1}"), err
    log1 = stack.log("decode-1")
    assert log1.count("started engine pid") == 2, log1[-2000:]
    for d in ("decode-0", "decode-1"):
        assert "--max-running-requests 64" in stack.cmdline(stack.engine_pid(d))
    for p in ("prefill-0", "prefill-1"):
        assert "--max-running-requests" not in stack.cmdline(stack.engine_pid(p))
    # served throughout
    failed = [x for x in results if not x[1]]
    # zero, on both routers: a step waits until the router lists another engine of its role
    # before one leaves (smg once answered "No decode workers available" here: the rollout
    # began while decode-1 had not yet joined, so taking decode-0 out left none)
    assert not failed, (len(results), failed[:5])
    assert len(results) > 20, len(results)
    assert (stack.bundle / ".pdsvc-previous" / "supervisord.conf").is_file()
