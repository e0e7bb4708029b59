"""`pdsvc profile` under a real systemd (nspawn), with the real router (each generation), SGLang's
own bench_serving and the stand-in engines, whose profiler writes real traces through a
scheduler freeze (tests/support/standin/profiler.py): a 1P1D stack of two TP2 engines, under a
steady side load judged by content, profiled prefill then decode.

The freeze (FREEZE s per capture) is many times the units' watchdog (liveness every 1 s, 2
failures: WatchdogSec 3 s) and the router's health checks (every 1 s, 1 failure): without the
profile hold the decode is killed mid-write and the router answers 503 (no decode left).
Checked: exit 0; every rank's trace whole and the breakdown from it; no request of the side
load failed; no unit restarted and no pair healed; each runtime's journal says when its hold
began and ended; afterwards the router health-checks both engines again and the stack serves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_stack import make_tokenizer
from conftest import REPO, require
from loadgen import Load, failures
from nspawn import nspawn_available
from stack import Stack, pdsvc_argv

pytestmark = pytest.mark.e2e

FREEZE = 12  # s: each capture's write (the stand-in's FAKE_SGLANG_PROFILE_WRITE_SECS)


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    work = tmp_path_factory.mktemp("e2e-profile")
    make_tokenizer(serve_python, work / "model")
    s = Stack.up(work, serve_python.parent.parent, gpus=4, **{
        "prefill": {"gpus": [0, 1], "tp": 2},
        "decode": {"gpus": [2, 3], "tp": 2},
        "router.package": router_package,
        # requests wait through the freeze: the router must not give up on them first
        "router.args": {"request-timeout-secs": 120},
        "runtime.env.FAKE_SGLANG_PROFILE_WRITE_SECS": FREEZE,
        "runtime.env.FAKE_SGLANG_PACED": 1,
    })
    yield s
    s.down()


def profile_argv(s: Stack, *args: str) -> list[str]:
    """`pdsvc profile` inside the container, bench_serving's stand-ins for triton on its path."""
    argv = pdsvc_argv(s.work, s.plan["python"], "profile", "-c", "/srv/e2e/config.yaml",
                      "--topology", "/srv/e2e/topology.json", *args)
    argv[1] += f":{REPO}/tests/support/bench_site"
    return argv


def test_profiling_both_roles_under_load_fails_no_request_and_heals_nothing(
        stack: Stack) -> None:
    c = stack.c
    before = {r: (stack.invocation(r), stack.restarts(r)) for r in ("prefill", "decode")}
    load = Load(f"{stack.plan['client_url']}/generate", rate=4, tokens=8, timeout=90,
                netns=stack.netns, stream_share=0.5,
                max_in_flight=400)  # every request sent: they pile up while frozen
    load.start()
    time.sleep(2)
    t0 = time.monotonic()
    try:
        run = c.run(profile_argv(stack, "--role", "both", "--steps", "20", "--input-len", "16",
                                 "--output-len", "64", "--concurrency", "4",
                                 "--write-timeout", "90", "--json"),
                    check=False, timeout=400)
        took = time.monotonic() - t0
    finally:
        load.stop(wait=100)
    t1 = time.monotonic()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    doc = json.loads(run.stdout)
    assert doc["format"] == "pdsvc-profile/1"
    assert [r["role"] for r in doc["roles"]] == ["prefill", "decode"]
    decode = doc["roles"][1]
    assert decode["kernels"][0]["name"] == "_tiled_sparse_decode_kernel"
    assert decode["outliers"] == []  # TP2: the fixture's ranks 0 and 1, alike
    for role in doc["roles"]:
        (engine,) = role["engines"]
        assert len(engine["traces"]) == 2  # one per TP rank
        assert engine["tok_s"] and engine["tok_s"] > 0
        for path in engine["traces"]:
            assert c.exists(path)
    sent = load.between(t0, t1)
    failed = failures(sent)
    beyond = took - doc["warmup_s"] - 2 * FREEZE
    print(f"\n{stack.plan['routers'][0]['package']}: pdsvc profile --role both took "
          f"{took:.0f} s: warm-up {doc['warmup_s']:.0f} s, 2 x {FREEZE} s frozen, "
          f"{beyond:.0f} s beyond; side load: {sum(failed.values())} of {len(sent)} failed")
    assert not failed and not load.skipped, (failed, load.skipped)
    after = {r: (stack.invocation(r), stack.restarts(r)) for r in ("prefill", "decode")}
    assert after == before  # no restart
    for role in ("prefill", "decode"):
        journal = c.journal(stack.unit(role))
        assert "by pdsvc profile: until" in journal
        assert "(released by pdsvc profile): liveness is judged again" in journal
        assert "health checks resumed" in journal
        state = json.loads(c.read_file(f"/run/{stack.name}/{stack.name}-{role}.restart.json"))
        assert not state.get("heal_log"), state  # no pair healed
        assert not c.exists(f"/run/{stack.name}/{stack.name}-{role}.hold.json")
    assert stack.generate()[0] == 200  # (paced: its text is 4 tokens of the usual one)
    listed = stack.listed()
    assert listed is not None and len(listed) == 2  # both back, judged by the router again
    code, body = stack.workers()
    for w in json.loads(body)["workers"]:
        assert w.get("disable_health_check") in (None, False), w


def test_a_lost_terminal_mid_write_leaves_no_engine_profiling_and_no_hold(
        stack: Stack) -> None:
    """SIGHUP (the terminal of the operator's session gone) while the decode writes: pdsvc
    profile waits for the write with the hold kept, releases it, exits 130."""
    c = stack.c
    before = (stack.invocation("decode"), stack.restarts("decode"))
    load = Load(f"{stack.plan['client_url']}/generate", rate=4, tokens=8, timeout=90,
                netns=stack.netns, stream_share=0.5, max_in_flight=400)
    load.start()
    t0 = time.monotonic()
    try:
        argv = " ".join(f"'{a}'" for a in profile_argv(
            stack, "--input-len", "16", "--output-len", "64", "--concurrency", "4"))
        script = (f"rm -rf /var/lib/{stack.name}/profiles/2*; "  # the runs of earlier tests
                  f"{argv} >/tmp/hup.out 2>/tmp/hup.err & pid=$!; "
                  f"until ls /var/lib/{stack.name}/profiles/*/{stack.name}-decode/*.gz "
                  ">/dev/null 2>&1; do sleep 0.2; kill -0 $pid || exit 9; done; "
                  "kill -HUP $pid; wait $pid; echo rc=$?")
        out = c.run(["bash", "-c", script], check=False, timeout=300)
    finally:
        load.stop(wait=100)
    err = c.read_file("/tmp/hup.err")
    assert "rc=130" in out.stdout, out.stdout + out.stderr + err
    assert "ending the capture on e2e-decode and waiting up to" in err, err
    assert "pdsvc: interrupted" in err
    run = sorted(c.run(["ls", f"/var/lib/{stack.name}/profiles"]).stdout.split())[-1]
    traces = c.run(["bash", "-c", f"ls /var/lib/{stack.name}/profiles/{run}/"
                                  f"{stack.name}-decode/*.gz"]).stdout.split()
    assert len(traces) == 2  # written whole before the hold went
    assert not c.exists(f"/run/{stack.name}/{stack.name}-decode.hold.json")
    assert (stack.invocation("decode"), stack.restarts("decode")) == before
    journal = c.journal(stack.unit("decode"))
    assert journal.rfind("(released by pdsvc profile)") > journal.rfind("Profiling done")
    failed = failures(load.between(t0, time.monotonic()))
    assert not failed and not load.skipped, (failed, load.skipped)
