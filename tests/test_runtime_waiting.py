"""The main thread never waits past a stop (pdsvc/ship/runtime/waiting.py): in every phase
before SERVING a call that may block runs aside and a pause is slept in slices, so a stop is
seen within DUTY_SLICE_S whatever the call waits for. Each test holds the phase inside a call
that does not return (an `nvidia-smi` that hangs, a lock another engine holds, a peer that
does not answer, a router that does not answer) and shows the stop acted on while it still
waits; then, as a process, a stop while the router join hangs."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ports import free_port
from runtime_procs import engine_args, wait_for
from timing import within

from pdsvc.ship.runtime.gpu import GpuHolder, GpuWait, wait_gpus_idle
from pdsvc.ship.runtime.jitlock import JitLock
from pdsvc.ship.runtime.leaving import leave_within
from pdsvc.ship.runtime.membership import Routers, Worker
from pdsvc.ship.runtime.phases import wait_for_urls
from pdsvc.ship.runtime.probe import HttpReply, ProbeResult
from pdsvc.ship.runtime.timings import DUTY_SLICE_S
from pdsvc.ship.runtime.waiting import aside, rest

#: a stop must be acted on within this of being asked, in every phase (issue: the main thread
#: never waits); the idle figure is DUTY_SLICE_S, the bound SLACK × this
STOP_SEEN_S = 0.5


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Lets every hanging call of a test go when it ends (their threads are daemons)."""
    event = threading.Event()
    yield event
    event.set()


def stopped_after(secs: float) -> tuple[Callable[[], bool], Callable[[], float]]:
    """``should_stop`` that turns true ``secs`` from now, and the seconds since it did."""
    at = time.monotonic() + secs
    return (lambda: time.monotonic() >= at), (lambda: time.monotonic() - at)


def test_aside_sees_a_stop_while_the_call_hangs_and_hands_back_its_result(release) -> None:
    should_stop, since = stopped_after(0.1)
    assert aside(lambda: release.wait(30), should_stop, 0.02) is None
    assert not release.is_set()  # the stop came first; the call still hangs
    within(since(), STOP_SEEN_S, "aside's stop")
    assert aside(lambda: "answer", lambda: False, 0.02) == "answer"
    with pytest.raises(ZeroDivisionError):
        aside(lambda: 1 / 0, lambda: False, 0.02)


def test_rest_sleeps_in_slices_and_ends_at_a_stop() -> None:
    slept: list[float] = []
    now = [0.0]

    def sleep(secs: float) -> None:
        slept.append(secs)
        now[0] += secs

    assert rest(1.0, lambda: False, sleep, lambda: now[0], 0.25) is False
    assert slept == [0.25] * 4
    slept.clear()
    assert rest(30.0, lambda: now[0] >= 1.5, sleep, lambda: now[0], 0.25) is True
    assert sum(slept) == pytest.approx(0.5)  # from 1.0 to 1.5: not the 30 s asked


def test_wait_gpus_sees_a_stop_while_nvidia_smi_hangs(release, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    entered = threading.Event()

    def hanging(path: str, gpus: object) -> list[GpuHolder]:
        entered.set()
        release.wait(60)  # as nvidia-smi on a wedged driver, up to its own timeout
        return []

    should_stop, since = stopped_after(0.2)
    got = wait_gpus_idle(str(smi), [0], lambda _: None, lambda _: None, timeout=120,
                         progress_every=10, should_stop=should_stop, holders=hanging)
    assert got is GpuWait.STOPPED and entered.is_set() and not release.is_set()
    within(since(), STOP_SEEN_S, "WAIT_GPUS' stop while nvidia-smi hangs")


def test_wait_gpus_sees_a_stop_between_looks_at_a_busy_gpu(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    busy = [GpuHolder(0, "00000000:18:00.0", 4242, "python", "70000 MiB")]
    should_stop, since = stopped_after(0.2)
    got = wait_gpus_idle(str(smi), [0], lambda _: None, lambda _: None, timeout=120,
                         progress_every=10, should_stop=should_stop,
                         holders=lambda path, gpus: busy, poll=30)
    assert got is GpuWait.STOPPED  # not after the 30 s between looks
    within(since(), STOP_SEEN_S, "WAIT_GPUS' stop between looks")


def test_the_jit_lock_sees_a_stop_while_another_engine_compiles(tmp_path: Path) -> None:
    holder = JitLock(str(tmp_path), "k", "dsv4-prefill", lambda _: None, progress_every=10)
    assert holder.acquire()
    waiter = JitLock(str(tmp_path), "k", "dsv4-decode", lambda _: None, progress_every=10,
                     retry_every=30)
    should_stop, since = stopped_after(0.2)
    assert waiter.acquire(should_stop) is False and not waiter.held
    within(since(), STOP_SEEN_S, "JIT_LOCK's stop (not after the 30 s between tries)")


def test_wait_for_sees_a_stop_while_a_peer_does_not_answer(release) -> None:
    asked: list[str] = []

    def probe(url: str) -> ProbeResult:
        asked.append(url)
        release.wait(60)  # a peer's host lost: the probe waits out its timeout
        return ProbeResult(False, "timed out")

    should_stop, since = stopped_after(0.2)
    assert wait_for_urls(["http://p:1/health"], log=lambda _: None, status=lambda _: None,
                         poll_interval=30, progress_every=10, should_stop=should_stop,
                         probe=probe) is False
    assert asked and not release.is_set()
    within(since(), STOP_SEEN_S, "--wait-for's stop while a probe hangs")


class HangingRouter:
    """A control plane that does not answer (its host lost, SIGSTOPped) until released."""

    def __init__(self, release: threading.Event) -> None:
        self.release, self.calls = release, 0

    def __call__(self, url, timeout, body=None, headers=None, method=None, **kw) -> HttpReply:
        self.calls += 1
        self.release.wait(60)
        return HttpReply(200, json.dumps({"workers": []}).encode(), "HTTP 200")


def test_a_stop_leaves_within_its_bound_while_a_router_does_not_answer(release) -> None:
    said: list[str] = []
    routers = Routers(["http://r:8000"], Worker("http://e:1", "decode", None), "k",
                      said.append, call=HangingRouter(release))
    t0 = time.monotonic()
    assert leave_within(routers, said.append, secs=0.3) is False
    within(time.monotonic() - t0, 0.3 + DUTY_SLICE_S, "a stop's leave of a dark router")
    assert any("did not take this engine out within 0.3 s" in s for s in said), said
    release.set()  # the router answers at last: the leave aside completes, and for good
    wait_for(lambda: routers.left, what="the leave aside to finish")
    assert routers.join() is False


def test_a_stop_leaves_at_once_when_the_routers_answer() -> None:
    workers = [{"id": "w1", "url": "http://e:1", "worker_type": "decode"}]

    def router(url, timeout, body=None, headers=None, method=None, **kw) -> HttpReply:
        if method == "DELETE":
            workers.clear()
        return HttpReply(200, json.dumps({"workers": workers}).encode(), "HTTP 200")

    said: list[str] = []
    routers = Routers(["http://r:8000"], Worker("http://e:1", "decode", None), "k",
                      said.append, call=router)
    assert leave_within(routers, said.append) is True
    assert routers.left and not workers and not any("did not take" in s for s in said)


def dark_calls(dark: socket.socket) -> bool:
    """Whether a connection waits on ``dark`` (listening, never accepting)."""
    dark.settimeout(0)
    try:
        conn, _ = dark.accept()
    except BlockingIOError:
        return False
    conn.detach()  # kept open, unanswered: the caller waits out its own timeout
    return True


def test_a_stop_while_the_router_join_hangs_ends_the_runtime_at_once(
        procs, notify_socket, tmp_path: Path) -> None:
    """The engine is healthy and its runtime joins a router that accepts the connection and
    never answers (SIGSTOPped): the manager's stop is acted on during the join, the stop's
    leave gives up after LEAVE_WAIT_S, and the engine drains and exits cleanly."""
    port, events = free_port(), tmp_path / "child.jsonl"
    key = tmp_path / "key"
    key.write_text("k\n")
    with socket.socket() as dark:
        dark.bind(("127.0.0.1", 0))
        dark.listen(16)
        router = f"http://127.0.0.1:{dark.getsockname()[1]}"
        proc = procs.start(
            engine_args(port, "dsv4-decode", "--role", "decode", "--router", router,
                        "--control-plane-key", str(key), "--")
            + procs.child(port, events),
            notify=notify_socket,
        )
        try:
            wait_for(lambda: dark_calls(dark), what="the runtime's first call to the router")
        except AssertionError:
            print(procs.log(proc))
            raise
        assert not notify_socket.times("READY=1"), "joined a router that never answered?"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert procs.wait(proc) == 0
        took = time.monotonic() - t0
    log = procs.log(proc)
    assert "did not take this engine out within 2 s" in log, log
    assert "Traceback" not in log, log
    print(f"stop during a join with a dark router: exited after {took:.1f} s")
    within(took, 2.0 + 1.0, "the stop during a hung join (LEAVE_WAIT_S, then a drain)")
