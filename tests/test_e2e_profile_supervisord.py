"""`pdsvc profile` on a supervisord bundle under the REAL supervisord (the serve venv's), the
real router (each generation) and the stand-in engines on free 127.0.0.1 ports: a 1P1D stack
profiled under a side load while its decode freezes FREEZE s to write its traces, many times its
runtime's own watchdog (--watchdog-secs: supervisord has none) and the router's health checks.

Checked: exit 0 and the breakdown; no request of the side load failed; the decode's program
was not restarted (same pid) and healed nothing; its log says when the hold began and ended;
no hold is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_stack import make_tokenizer
from conftest import REPO
from loadgen import Load, failures
from test_e2e_supervisord import NAME, SupervisordStack

pytestmark = pytest.mark.e2e

FREEZE = 10


#: both routers, one after the other in one worker (not conftest's router_package, whose two
#: stacks run at once): every supervisord stack of the suite is named NAME, and this one's
#: traces and its profile lock live under the plan's /var/lib/NAME
@pytest.fixture(scope="module", params=["sglang-router", "smg"])
def stack(request: pytest.FixtureRequest, serve_python: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SupervisordStack]:
    s = SupervisordStack(tmp_path_factory.mktemp("sv-profile"), serve_python.parent.parent,
                         format="supervisord", **{"router.package": request.param,
        "router.args": {"request-timeout-secs": 120},
        "runtime.env.FAKE_SGLANG_PROFILE_WRITE_SECS": FREEZE})
    make_tokenizer(serve_python, s.work / "model")
    state = Path(s.plan.paths.state_dir)  # what the bundle's prepare command makes
    made = not state.exists()
    state.mkdir(mode=0o750, exist_ok=True)
    try:
        s.start()
        s.wait_serving(120, "the 1P1D stack serves after `supervisord -c`")
        for e in s.plan.engines:  # requests take time from now on: steps run while they do
            request = urllib.request.Request(f"{e.url}/_fake/control", method="POST",
                                             data=json.dumps({"paced": True}).encode())
            with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 loopback
                assert reply.status == 200
        yield s
    finally:
        s.down()
        if made:
            shutil.rmtree(state, ignore_errors=True)


def test_profiling_the_decode_under_supervisord_fails_no_request(
        stack: SupervisordStack) -> None:
    pid = stack.runtime_pid("decode")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO}/tests/support/bench_site"}
    load = Load(f"http://127.0.0.1:{stack.router_port}/generate", rate=4, tokens=8,
                timeout=90, stream_share=0.5,
                max_in_flight=400)  # every request sent: they pile up while frozen
    load.start()
    time.sleep(2)
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pdsvc.cli", "profile", "-c", str(stack.work / "config.yaml"),
             "--topology", str(stack.work / "topology.json"), "--input-len", "16",
             "--output-len", "64", "--concurrency", "4", "--write-timeout", "60", "--json"],
            capture_output=True, text=True, timeout=300, check=False, env=env,
            stdin=subprocess.DEVNULL)
        took = time.monotonic() - t0
    finally:
        load.stop(wait=100)
    sent = load.between(t0, time.monotonic())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    doc = json.loads(r.stdout)
    try:
        (role,) = doc["roles"]
        assert role["kernels"][0]["name"] == "_tiled_sparse_decode_kernel"
        assert all(Path(t).is_file() for t in role["engines"][0]["traces"])
        failed = failures(sent)
        print(f"\nsupervisord, {stack.plan.router.package}: pdsvc profile took {took:.0f} s "
              f"(warm-up {doc['warmup_s']:.0f} s, {FREEZE} s frozen); side load: "
              f"{sum(failed.values())} of {len(sent)} failed")
        assert not failed and not load.skipped, (failed, load.skipped)
        assert stack.runtime_pid("decode") == pid  # not restarted
        log = (stack.work / "logs" / f"{stack.names['decode']}.log").read_text()
        assert "by pdsvc profile: until" in log and "(released by pdsvc profile)" in log
        state = stack.plan.supervisord.state_dir
        assert not list(Path(state).glob("*.hold.json"))
        restart = json.loads((Path(state) / f"{NAME}-decode.restart.json").read_text())
        assert not restart.get("heal_log")
    finally:
        shutil.rmtree(doc["trace_root"], ignore_errors=True)
