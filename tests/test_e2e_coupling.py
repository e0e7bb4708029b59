"""2P2D on one host under a real systemd (nspawn), the real router and the stand-in engines:
one engine's restart or kill -9 reloads that engine only, and the router's retries
(router.retry, rendered for both generations) move a non-streaming request that hit a dead
engine to another pair, so that none fails.

The tests share one stack and run in file order; each leaves it serving.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")
INSTANCES = (*ENGINES, "router")
#: each generation takes this long in the stand-in: requests are in flight when an engine dies
GEN_DELAY = 0.3


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = Stack.up(tmp_path_factory.mktemp("e2e-2p2d"), serve_python.parent.parent, gpus=4, **{
        "prefill": [{"gpus": [0]}, {"gpus": [1]}],
        "decode": [{"gpus": [2]}, {"gpus": [3]}],
        "runtime.env.FAKE_SGLANG_GEN_DELAY": GEN_DELAY,
        "router.policy": "round_robin",
        "router.package": router_package,
    })
    yield s
    s.down()


def units(s: Stack) -> list[str]:
    return [s.unit(i) for i in INSTANCES]


def serves(s: Stack) -> bool:
    if any(s.prop(u, "ActiveState") != "active" for u in units(s)):
        return False
    code, body = s.curl("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}},
                        timeout=5)
    return code == 200 and "hello from fake engine" in body


def four_healthy(s: Stack) -> bool:
    code, body = s.workers(timeout=5)
    return code == 200 and sum(w.get("is_healthy") is not False
                               for w in json.loads(body)["workers"]) == 4


def wait_full(s: Stack, timeout: float = 90) -> float:
    t0 = time.monotonic()
    s.c.wait_for(lambda: serves(s) and four_healthy(s), timeout, interval=0.25,
                 what="all four engines active and in the router")
    return time.monotonic() - t0


class Load:
    """Non-streaming requests through the router from `threads` clients until stopped; each
    judged by content."""

    def __init__(self, s: Stack, threads: int = 4) -> None:
        self.s, self.results = s, []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]

    def run(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            t0 = time.monotonic()
            code, body = self.s.curl("/generate", {"text": f"load {i} {n}",
                                                   "sampling_params": {"max_new_tokens": 4}},
                                     timeout=30)
            ok = code == 200 and "hello from fake engine" in body
            self.results.append((round(t0, 2), ok, code, "" if ok else body[:200]))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        time.sleep(2)  # steady before the event
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    @property
    def failed(self) -> list:
        return [r for r in self.results if not r[1]]


def test_2p2d_serves_with_all_four(stack: Stack) -> None:
    wait_full(stack, 30)
    for inst in ENGINES:
        assert stack.restarts(inst) == 0, inst


def test_a_prefill_restart_keeps_the_decodes_up_and_fails_no_request(stack: Stack) -> None:
    before = {i: stack.invocation(i) for i in INSTANCES}
    with Load(stack) as load:
        t0 = time.monotonic()
        stack.c.run(["systemctl", "restart", stack.unit("prefill-1")])
        back = wait_full(stack) + (time.monotonic() - t0)
        time.sleep(2)
    print(f"restart prefill-1: {len(load.failed)} of {len(load.results)} failed; "
          f"full capacity after {back:.1f} s")
    for d in ("decode-0", "decode-1", "prefill-0", "router"):
        assert stack.invocation(d) == before[d], f"{d} restarted with prefill-1"
    assert stack.invocation("prefill-1") != before["prefill-1"]
    assert len(load.results) > 20 and not load.failed, load.failed[:10]


@pytest.mark.parametrize("victim", ["prefill-0", "decode-0"])
def test_kill_9_of_an_engine_under_load_loses_no_non_streaming_request(
        stack: Stack, victim: str) -> None:
    wait_full(stack)
    before = {i: stack.invocation(i) for i in INSTANCES}
    with Load(stack) as load:
        t0 = time.monotonic()
        stack.c.run(["kill", "-9", str(stack.engine_pid(victim))])
        back = wait_full(stack) + (time.monotonic() - t0)
        time.sleep(2)
    print(f"kill -9 {victim}: {len(load.failed)} of {len(load.results)} failed; "
          f"full capacity after {back:.1f} s")
    for other in (i for i in INSTANCES if i != victim):
        assert stack.invocation(other) == before[other], f"{other} restarted with {victim}"
    assert len(load.results) > 20 and not load.failed, load.failed[:10]
