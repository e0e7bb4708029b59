"""A duty that raises what it did not expect never dies in silence (pdsvc/ship/runtime/
duties.py): each duty's thread is made to raise here, and each shows its outcome: one journal
line with the traceback, the count and last words in NAME.duties.json (which `pdsvc status`
and the textfile read), and its policy: it goes on, or the run ends with exit 71."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import pytest
from pair_fakes import WORKER, FakeRouter
from runtime_procs import wait_for

from pdsvc.ship.runtime import duties as duties_module
from pdsvc.ship.runtime.canary import Canary, Pair, Round
from pdsvc.ship.runtime.child import StderrTap
from pdsvc.ship.runtime.duties import POLICIES, Duties, Policy, quiet
from pdsvc.ship.runtime.endings import Ending, Exit
from pdsvc.ship.runtime.events import DutyFailed, Inbox, Poller, Wake, watch_child
from pdsvc.ship.runtime.fleet import Fleet
from pdsvc.ship.runtime.membership import Routers
from pdsvc.ship.runtime.metrics import Textfile, exposition, unit_samples
from pdsvc.ship.runtime.notify import Notifier
from pdsvc.ship.runtime.options import Options
from pdsvc.ship.runtime.policy import RestartPolicy
from pdsvc.ship.runtime.rounds import CanaryThread
from pdsvc.ship.runtime.serving import Serving
from pdsvc.ship.runtime.statefile import read_state
from pdsvc.ship.runtime.timings import HEAL_STAGGER_S
from pdsvc.ship.runtime.watch import Watch, step
from pdsvc.status.runstate import duty_words

P, D = "http://10.0.0.2:30000", "http://10.0.0.3:30001"


def recorded(tmp_path: Path) -> tuple[Duties, list[str], str]:
    lines: list[str] = []
    path = str(tmp_path / "u.duties.json")
    return Duties(path, lines.append), lines, path


def boom(what: str = "boom") -> None:
    raise RuntimeError(what)


def fail(duties: Duties, duty: str, times: int) -> None:
    """``duty`` raises ``times`` times, each recorded as its guard would."""
    for _ in range(times):
        try:
            boom()
        except RuntimeError as e:
            duties.failed(duty, e)


def test_the_policy_of_each_duty_is_the_one_the_module_writes_down() -> None:
    table = (duties_module.__doc__ or "").split("  duty ", 1)[1]
    rows = {line.split()[0]: line for line in table.splitlines()[1:]
            if line[:2] == "  " and line.strip() and not line.startswith("   ")}
    assert set(rows) == set(POLICIES)
    for duty, policy in POLICIES.items():
        assert ("ENDS the runtime" in rows[duty]) is (policy is Policy.ENDS), duty


def test_a_poller_that_raises_says_it_counts_it_and_goes_on(tmp_path: Path) -> None:
    duties, lines, path = recorded(tmp_path)
    inbox = Inbox(time.monotonic)
    calls = []

    def work() -> Wake | None:
        calls.append(1)
        if len(calls) <= 3:
            raise ValueError("a router answered a list")  # the same each time
        return Wake(len(calls))

    poller = Poller("membership", inbox, work, lambda: 0.01, duties=duties).start()
    try:
        assert isinstance(inbox.get(5.0), Wake)  # it went on, and its next work posted
    finally:
        poller.stop()
    (line,) = [x for x in lines if "duty membership failed" in x]  # said once, not 3x
    assert line.startswith("duty membership failed (1x): ValueError: a router answered a "
                           "list (at test_runtime_duties.py:") and line.endswith("it goes on")
    doc = read_state(path)
    assert doc["duties"]["membership"]["count"] == 3
    assert doc["duties"]["membership"]["policy"] == "goes on"
    assert "duty membership failed 3x (it goes on; last: ValueError" in \
        duty_words(tmp_path, "u")


def test_the_same_failure_is_said_again_every_hundredth_time(tmp_path: Path) -> None:
    duties, lines, _ = recorded(tmp_path)
    fail(duties, "peers", 250)
    assert [x.split(" ", 4)[3] for x in lines] == ["(1x):", "(100x):", "(200x):"]


def test_the_childs_exit_watch_that_raises_ends_the_run_with_71(tmp_path: Path) -> None:
    duties, lines, _ = recorded(tmp_path)
    inbox = Inbox(time.monotonic)
    duties.on_fatal = lambda duty, detail: inbox.post(DutyFailed(duty, detail))

    class Broken:
        def wait(self) -> int:
            raise OSError("ECHILD")

    watch_child(Broken(), inbox, duties)  # type: ignore[arg-type]
    event = inbox.get(5.0)
    assert isinstance(event, DutyFailed) and event.duty == "child-exit"
    done = step(Watch(last_ok=0.0), event)
    assert done.outcome is not None and done.outcome.kind is Ending.DUTY
    assert Ending.DUTY.exit == Exit.DUTY == 71 and Ending.DUTY.own_stop
    assert "duty child-exit failed" in done.outcome.detail
    assert any("it ends the runtime: the process manager restarts the unit" in x for x in lines)


def test_a_canary_pass_that_raises_records_no_round_and_the_next_one_runs(
        tmp_path: Path) -> None:
    duties, lines, _ = recorded(tmp_path)
    pair = Pair(P, 8998, D)
    canary = Canary(D, [pair], failures_to_act=3, log=lambda s: None)
    probes: list[int] = []

    def probe(p: Pair, peer: str, timeout: float) -> Round:
        probes.append(1)
        if len(probes) == 1:
            raise KeyError("bootstrap_room")
        return Round(p, True)

    t = CanaryThread(canary, 30.0, 1.0, probe=probe, retry=0.05, watch=0.05,
                     reachable=lambda url: True, duties=duties)
    t.start()
    try:
        wait_for(lambda: len(probes) >= 2 and t.results, 5.0, "a round after the failed one")
    finally:
        t.stop()
    assert [[r.ok for r in rs] for rs in t.results][:1] == [[True]]  # only the good round
    assert any("duty pair-canary failed (1x): KeyError: 'bootstrap_room'" in x for x in lines)


def test_a_heal_question_that_raises_is_answered_not_now_and_asked_again(
        tmp_path: Path) -> None:
    duties, lines, _ = recorded(tmp_path)
    s = Serving(Options(role="decode"), print, Notifier(print),
                RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1, attempts=3),
                None, None, Canary(D, [Pair(P, 8998, D)], failures_to_act=3, log=print),
                None, None, duties=duties)
    s.decide_heal = lambda why, waited: boom("the router answered nonsense")  # type: ignore
    said = s.heal_question("pair stale", 9.0)
    assert said.wait and said.ask_after == HEAL_STAGGER_S  # the loop's `asking` is reset by it
    assert any("duty heal-question failed" in x for x in lines)


def test_a_stderr_tap_that_raises_copies_the_bytes_as_they_come(tmp_path: Path) -> None:
    read, write = os.pipe()
    pipe = os.fdopen(read, "rb")
    first = [True]
    real = pipe.readline

    class Pipe(io.BufferedReader):
        pass

    def readline() -> bytes:
        if first[0]:
            first[0] = False
            raise UnicodeError("the line parser broke")
        return real()

    pipe.readline = readline  # type: ignore[method-assign]
    sink = io.BytesIO()
    duties, lines, _ = recorded(tmp_path)
    tap = StderrTap(pipe, sink, b"", duties)
    os.write(write, b"engine line 1\nengine line 2\n")
    os.close(write)
    tap.drain(5.0)
    assert sink.getvalue() == b"engine line 1\nengine line 2\n"  # nothing lost, nobody blocked
    assert any("duty stderr-tap failed" in x and "it goes on" in x for x in lines)


def test_the_textfile_and_the_fleet_go_on_after_a_write_or_read_that_raised(
        tmp_path: Path) -> None:
    duties, lines, _ = recorded(tmp_path)
    tf = Textfile("u", str(tmp_path), str(tmp_path / "metrics"), {"unit": "u.service"},
                  duties=duties)
    calls = []
    # its first write (the run's start) comes from the caller; the thread's first one raises
    tf.refresh = lambda **kw: calls.append(1) or (len(calls) == 2 and boom())  # type: ignore
    with tf.running():
        wait_for(lambda: len(calls) >= 4, 10.0, "writes after the failed one")
    fleet = Fleet(["10.0.0.9:8997"], "k", "dep", print, duties=duties)
    reads: list[int] = []
    fleet.refresh = lambda: reads.append(1) or (len(reads) == 1 and boom())  # type: ignore
    fleet.start()
    try:
        wait_for(lambda: len(reads) >= 2, 5.0, "a read after the failed one")
    finally:
        fleet.stop.set()
    said = " ".join(lines)
    assert "duty metrics-textfile failed" in said and "duty fleet-read failed" in said


def test_the_metrics_carry_each_duty_that_failed(tmp_path: Path) -> None:
    duties, _, path = recorded(tmp_path)
    fail(duties, "liveness", 2)
    samples = unit_samples({"unit": "u.service"}, None, None, None, up=True, heal_budget=None,
                           now=1.0, duties=read_state(path))
    text = exposition(samples)
    assert 'pdsvc_unit_duty_failures_total{unit="u.service",duty="liveness"} 2' in text
    assert Duties(path, print).failures == {} and read_state(path)["duties"] == {}  # a new run


def test_membership_under_the_guard_of_a_real_serving_loop(tmp_path: Path) -> None:
    """Serving's own pollers carry the unit's duties: a membership check that raises inside
    the loop is said and counted, and the next check still joins the router."""
    duties, lines, _ = recorded(tmp_path)
    router = FakeRouter(True)
    members = Routers(["http://r"], WORKER, "k", print, call=router)
    original, broke = members.check, threading.Event()

    def check(engine_healthy: bool) -> None:
        if not broke.is_set():
            broke.set()
            raise TypeError("NoneType is not subscriptable")
        original(engine_healthy)

    members.check = check  # type: ignore[method-assign]
    s = Serving(Options(role="prefill", membership_interval=0.05, liveness_interval=60.0),
                print, Notifier(print),
                RestartPolicy(None, restart_delay=1, max_delay=1, reset_after=1, attempts=3),
                members, None, None, None, None, duties=duties)
    pollers = s.pollers(lambda: pytest.fail("no liveness probe here"), None)  # type: ignore
    for p in pollers:
        p.start()
    try:
        wait_for(lambda: router.workers, 5.0, "the worker registered after the failed check")
    finally:
        for p in pollers:
            p.stop()
    assert any("duty membership failed (1x): TypeError" in x for x in lines)
    assert quiet().guard("x", lambda: 5) == 5
