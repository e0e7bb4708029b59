"""`pdsvc profile` with what a user gets: every setting of `lifecycle:` and `router:`'s health
checks, retries and circuit breaker as etc/pdsvc.yaml ships them (WatchdogSec 60 s, the router
checking every 5 s, unhealthy after 2 failures), under a real systemd and the router package
the file ships, and a decode that freezes FREEZE s while it writes its traces, as sglang PR
#35115 measured one (108 s): nearly twice the watchdog, twenty router health checks.

Checked, seconds after the stack first serves: exit 0 with the breakdown; every rank's trace
whole; no request of a steady side load failed; the decode neither restarted nor healed;
the seconds beyond the load's warm-up and the freeze printed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bench_stack import make_tokenizer
from conftest import require
from loadgen import Load, failures
from nspawn import nspawn_available
from stack import REPO, Stack
from test_e2e_profile import profile_argv

pytestmark = pytest.mark.e2e

SHIPPED = yaml.safe_load((REPO / "etc" / "pdsvc.yaml").read_text())
FREEZE = 110  # s: the stand-in's write of the decode's traces


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    work = tmp_path_factory.mktemp("profile-shipped")
    make_tokenizer(serve_python, work / "model")
    router = SHIPPED["router"]
    s = Stack.up(work, serve_python.parent.parent, gpus=4, start=False, **{
        "prefill": {"gpus": [0, 1], "tp": 2},
        "decode": {"gpus": [2, 3], "tp": 2},
        "lifecycle": dict(SHIPPED["lifecycle"]),
        "router.health_check": dict(router["health_check"]),
        "router.retry": dict(router["retry"]),
        "router.circuit_breaker": router["circuit_breaker"],
        "router.args": {},  # the shipped file sets none: request-timeout-secs is 1800
        "runtime.env.FAKE_SGLANG_PROFILE_WRITE_SECS": FREEZE,
        "runtime.env.FAKE_SGLANG_PACED": 1,
    })
    s.start(timeout=240)
    yield s
    s.down()


def test_a_110_s_freeze_with_the_shipped_settings_fails_no_request(stack: Stack) -> None:
    before = (stack.invocation("decode"), stack.restarts("decode"))
    load = Load(f"{stack.plan['client_url']}/generate", rate=4, tokens=8, timeout=FREEZE + 60,
                netns=stack.netns, stream_share=0.5,
                max_in_flight=1000)  # every request sent: they pile up while frozen
    load.start()
    t0 = time.monotonic()
    try:
        run = stack.c.run(profile_argv(stack, "--input-len", "16", "--output-len", "64",
                                       "--concurrency", "4", "--json"),
                          check=False, timeout=FREEZE + 200)
        took = time.monotonic() - t0
    finally:
        load.stop(wait=FREEZE + 60)
    sent = load.between(t0, time.monotonic())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    doc = json.loads(run.stdout)
    (role,) = doc["roles"]
    assert role["kernels"][0]["name"] == "_tiled_sparse_decode_kernel"
    assert len(role["engines"][0]["traces"]) == 2
    failed = failures(sent)
    print(f"\nshipped defaults: pdsvc profile (decode) took {took:.0f} s: warm-up "
          f"{doc['warmup_s']:.0f} s, {FREEZE} s frozen, {took - doc['warmup_s'] - FREEZE:.0f} s "
          f"beyond; side load: {sum(failed.values())} of {len(sent)} failed")
    assert not failed and not load.skipped, (failed, load.skipped)
    assert (stack.invocation("decode"), stack.restarts("decode")) == before
    state = json.loads(stack.c.read_file(f"/run/{stack.name}/{stack.name}-decode.restart.json"))
    assert not state.get("heal_log")
    journal = stack.c.journal(stack.unit("decode"))
    assert "not judged: profile hold" in journal  # the watchdog would have struck
