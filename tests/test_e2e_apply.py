"""`pdsvc apply` under a real systemd (nspawn), with the real router and the stand-in engines:
a 2P2D stack takes a pair-compatible change of the decodes (an extra engine arg), run inside
the container as an operator would, while a request loop runs through the router.

Checked: only the changed units restarted, one at a time (the second decode stopped only
after the first was back), and every request of the loop was served. And an apply killed with
SIGKILL mid-step leaves its hold behind: the engine rejoins the router once the hold's lease
has run out (pdsvc/apply/lease.py, here a few seconds long).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import require
from nspawn import nspawn_available
from stack import APPLY_DIR, Stack

from pdsvc.apply.lease import LEASE_ENV

pytestmark = pytest.mark.e2e

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = Stack.up(tmp_path_factory.mktemp("e2e-apply"), serve_python.parent.parent, gpus=4, **{
        "prefill": [{"gpus": [0]}, {"gpus": [1]}],
        "decode": [{"gpus": [2]}, {"gpus": [3]}],
        "router.policy": "round_robin",
        "router.package": router_package,
    })
    yield s
    s.down()


def request_loop(s: Stack, stop: threading.Event, results: list) -> None:
    while not stop.is_set():
        code, body = s.generate(timeout=10)
        results.append((time.monotonic(), code == 200 and "hello from fake engine" in body,
                        code, body[-200:]))


def test_apply_restarts_only_the_changed_decodes_one_at_a_time_while_serving(
        stack: Stack, serve_python: Path) -> None:
    c = stack.c
    cfg = yaml.safe_load((stack.work / "config.yaml").read_text())
    for d in cfg["decode"]:
        d["args"] = {"max-running-requests": 64}
    units = {e: stack.unit(e) for e in ENGINES} | {"router": stack.unit("router")}
    before = {e: stack.invocation(e) for e in units}
    timeouts = ("--drain-timeout", "20", "--step-timeout", "120")

    plan = stack.apply(cfg, *timeouts, "--dry-run", timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "serving: never stops" in plan.stdout, plan.stdout

    stop, results = threading.Event(), []
    loop = threading.Thread(target=request_loop, args=(stack, stop, results), daemon=True)
    loop.start()
    time.sleep(2)
    try:
        r = stack.apply(cfg, *timeouts, timeout=400)
    finally:
        time.sleep(2)
        stop.set()
        loop.join(30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step 1/2: restart e2e-decode-0.service" in r.stderr, r.stderr
    assert "step 2/2: restart e2e-decode-1.service" in r.stderr, r.stderr
    assert "systemctl restart e2e-pd.target" not in r.stderr  # install.sh's hint is not ours

    after = {e: stack.invocation(e) for e in units}
    changed = {e for e in units if after[e] != before[e]}
    assert changed == {"decode-0", "decode-1"}, (before, after)
    # one at a time: decode-1 began to stop only once decode-0 was active again
    back = int(stack.prop(units["decode-0"], "ActiveEnterTimestampMonotonic"))
    went = int(stack.prop(units["decode-1"], "InactiveEnterTimestampMonotonic"))
    assert went > back, (went, back)
    environ = c.run(["cat", f"/proc/{stack.engine_pid('decode-1')}/cmdline"]).stdout
    assert "--max-running-requests\x0064" in environ
    # served throughout
    failed = [x for x in results if not x[1]]
    assert len(results) > 20 and not failed, (len(results), failed[:5])
    assert c.exists(f"{APPLY_DIR}/units/.pdsvc-previous/e2e-decode-0.service")
    # that bundle came from `pdsvc render` of a config now edited: not kept, and said so
    assert not c.exists(f"{APPLY_DIR}/units/.pdsvc-previous/config.yaml")
    assert "the config of the running bundle is not kept" in r.stderr
    assert c.exists(f"{APPLY_DIR}/units/.pdsvc-applied.yaml")  # the next apply keeps this one


def _listed(stack: Stack, url: str) -> bool:
    code, body = stack.workers(timeout=5)
    try:
        workers = json.loads(body)["workers"] if code == 200 else []
    except (ValueError, KeyError):
        return False
    return any(str(w.get("url", "")).rstrip("/") == url and w.get("is_healthy") is not False
               for w in workers)


def test_a_hold_left_by_a_killed_apply_runs_out_and_the_engine_rejoins(stack: Stack) -> None:
    c, lease = stack.c, 4.0
    cfg = yaml.safe_load((stack.work / "config.yaml").read_text())
    for d in cfg["decode"]:
        d["args"] = {"max-running-requests": 48}  # neither the original nor the test above's
    engine = next(e for e in stack.plan["engines"] if e["name"] == "e2e-decode-0")
    url = engine["url"].rstrip("/")
    hold = f"{stack.plan['paths']['run_dir']}/e2e-decode-0.hold.json"
    done: list = []
    run = threading.Thread(target=lambda: done.append(stack.apply(
        cfg, "--drain-timeout", "20", "--step-timeout", "120", timeout=300,
        env={LEASE_ENV: str(lease)})), daemon=True)
    run.start()
    # mid-step: decode-0 held and out of the router (apply drains, restarts, waits for it)
    c.wait_for(lambda: c.exists(hold) and not _listed(stack, url), 120, interval=0.1,
               what="apply holding decode-0 out of the router")
    pid = c.run(["pgrep", "-f", "-o", "pdsvc.cli apply"]).stdout.split()[0]
    c.run(["kill", "-9", pid])
    killed = time.monotonic()
    run.join(60)
    assert done and done[0].returncode in (-9, 137), done and done[0].stderr
    assert "released the hold" not in done[0].stderr  # no finally ran: the hold is left
    assert c.exists(hold), "apply released decode-0 before it was killed"
    doc = json.loads(c.run(["cat", hold]).stdout)
    assert doc["until"] - doc["since"] >= lease - 0.5  # leased (and maybe renewed)
    c.wait_for(lambda: _listed(stack, url), 120, interval=0.25,
               what="decode-0 back in the router after the lease ran out")
    rejoined = time.monotonic() - killed
    print(f"BENCH hold lease: rejoined {rejoined:.1f} s after apply was killed "
          f"(lease {lease:g} s, renewed every {lease / 6:.2f} s)")
    journal = c.journal(stack.unit("decode-0"), lines=400)
    assert f"ignoring an expired hold from pdsvc apply ({hold}" in journal, journal[-3000:]
    stack.wait_serving(120)
    c.run(["rm", "-f", hold])
