"""xPyD on one host, under a real systemd (nspawn) with the real sglang-router 0.3.2 and the
stand-in engines: two prefills (each with its own bootstrap port, sglang #20952) and one decode,
rendered from the list form of `prefill:` and installed by the real install.sh.

The tests share one stack and run in file order; each leaves it serving.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

#: prefill-0 loads slowly (as a big prefill does), so that after its kill the restarted decode
#: is back well before it: the window in which only prefill-1 can serve.
SLOW_LOAD_SECS = 12
PREFILLS = ("prefill-0", "prefill-1")
ENGINES = (*PREFILLS, "decode")
INSTANCES = (*ENGINES, "router")
BOOTSTRAP = {"prefill-0": 8998, "prefill-1": 8999}  # allocated: 8998 + index


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = Stack.up(tmp_path_factory.mktemp("e2e-xpyd"), serve_python.parent.parent, gpus=3, **{
        "prefill": [{"gpus": [0], "env": {"FAKE_SGLANG_LOAD_SECS": SLOW_LOAD_SECS}},
                    {"gpus": [1]}],
        "decode": {"gpus": [2]},
        "router.policy": "round_robin",  # both prefills take turns: both ports are used
        "router.package": router_package,
    })
    yield s
    s.down()


# ---------------------------------------------------------------------- instance helpers
# Stack's own helpers take a role and name the unit NAME-ROLE, so they work for an instance
# name (prefill-0); only those that list the units assume one prefill: these replace them.


def units(s: Stack) -> list[str]:
    return [s.unit(i) for i in INSTANCES]


def generate(s: Stack, text: str = "hello", timeout: float = 5) -> tuple[bool, str]:
    code, body = s.curl("/generate", {"text": text, "sampling_params": {"max_new_tokens": 4}},
                        timeout=timeout)
    return code == 200 and "hello from fake engine" in body, body


def serves(s: Stack) -> bool:
    if any(s.prop(u, "ActiveState") != "active" for u in units(s)):
        return False
    return generate(s)[0]


def wait_serving(s: Stack, timeout: float = 90) -> None:
    try:
        s.c.wait_for(lambda: serves(s), timeout, interval=0.25, what="the xPyD stack serves")
    except AssertionError as e:
        states = {u: s.c.show(u, "ActiveState", "SubState", "NRestarts") for u in units(s)}
        raise AssertionError(f"{e}\nunits: {states}\nworkers: {s.workers()}") from None


def workers(s: Stack) -> list[tuple[str, str, int | None, bool]]:
    code, body = s.workers(timeout=5)
    assert code == 200, body
    return sorted((w["worker_type"], w["url"], w.get("bootstrap_port"), w["is_healthy"])
                  for w in json.loads(body)["workers"])


def mono(s: Stack, inst: str, prop: str) -> int:
    return int(s.prop(s.unit(inst), prop))


# ---------------------------------------------------------------------- tests


def test_2p1d_starts_and_serves_through_both_prefills(stack: Stack) -> None:
    # `systemctl start` has returned: it serves now
    for inst in INSTANCES:
        assert stack.prop(stack.unit(inst), "ActiveState") == "active", inst
    assert stack.prop(stack.target, "ActiveState") == "active"
    # each engine posted itself before its READY=1; smg queues an add and lists the worker
    # once its own health check passed (sglang-router 0.3.2 at once)
    want = [
        ("decode", "http://127.0.0.1:30001", None, True),
        ("prefill", "http://127.0.0.1:30000", 8998, True),
        ("prefill", "http://127.0.0.1:30002", 8999, True),
    ]
    stack.c.wait_for(lambda: workers(stack) == want, 10, interval=0.2,
                     what=f"the router lists {want}")
    seen = set()
    for i in range(6):
        ok, body = generate(stack, f"hello {i}")
        assert ok and "[decode@30001]" in body, body
        seen |= {p for p in BOOTSTRAP.values() if f'"bootstrap_port_seen": {p}' in body}
    # decode reached each prefill's own bootstrap server, with the port the router sent
    assert seen == set(BOOTSTRAP.values()), seen


def test_router_is_ready_after_every_engine_and_cold_compiles_were_serialised(
        stack: Stack) -> None:
    # the router starts at once and is ready with the first pair that registered itself; the
    # target, ordered after every unit, only once every engine is
    router_ready = mono(stack, "router", "ActiveEnterTimestampMonotonic")
    assert router_ready >= mono(stack, "decode", "ActiveEnterTimestampMonotonic")
    assert router_ready >= min(mono(stack, p, "ActiveEnterTimestampMonotonic")
                               for p in ENGINES if p.startswith("prefill"))
    target = int(stack.prop(stack.target, "ActiveEnterTimestampMonotonic"))
    for inst in ENGINES:
        assert target >= mono(stack, inst, "ActiveEnterTimestampMonotonic"), inst
    logs = {i: stack.c.journal(stack.unit(i)) for i in ENGINES}
    assert not any("JIT cache race" in log for log in logs.values()), logs
    # one JIT cache, one compile at a time: the two that came later waited for a holder
    assert sum("waiting for e2e-" in log for log in logs.values()) >= 1, logs
    assert all(stack.restarts(i) == 0 for i in ENGINES)


def test_kill_9_of_one_prefill_serves_through_the_other_and_keeps_the_decode(
        stack: Stack) -> None:
    before = {i: stack.invocation(i) for i in INSTANCES}
    stack.c.run(["kill", "-9", str(stack.engine_pid("prefill-0"))])
    t0 = time.monotonic()
    # two prefills: the decode is PartOf= neither, so it keeps serving prefill-1
    # Until the router drops prefill-0 (its runtime deregisters it; the health check, 1 s),
    # requests may fail; then a streak goes through prefill-1 while prefill-0 is still loading.
    streak, results = 0, []
    while streak < 5:
        assert time.monotonic() - t0 < SLOW_LOAD_SECS + 5, (
            f"no streak of 5 successes while prefill-0 was down: {results[-30:]}")
        ok, body = generate(stack, timeout=3)
        results.append((round(time.monotonic() - t0, 1), ok))
        if ok:
            assert f'"bootstrap_port_seen": {BOOTSTRAP["prefill-1"]}' in body, body
        streak = streak + 1 if ok else 0
    state = stack.c.show(stack.unit("prefill-0"), "ActiveState", "SubState")
    assert state["ActiveState"] != "active", (state, results)  # served without it
    assert stack.invocation("prefill-1") == before["prefill-1"]  # the other one never stopped
    assert stack.invocation("decode") == before["decode"]  # nor did the decode
    # prefill-0 comes back on its own, the router takes it back, no manual action
    wait_serving(stack, 60)
    stack.c.wait_for(lambda: all(w[3] for w in workers(stack)) and len(workers(stack)) == 3,
                     20, interval=0.5, what="the router lists 3 healthy workers again")
    assert stack.restarts("prefill-0") == 1 and stack.restarts("prefill-1") == 0
    assert stack.prop(stack.unit("router"), "NRestarts") == "0"
    assert stack.invocation("router") == before["router"]
