"""The runtime's restart policy (pdsvc/ship/runtime/policy.py), in-process with a fake clock:
back-off, give-up, what a stop counts as, and the heal budget."""

from __future__ import annotations

import json
from pathlib import Path

from runtime_procs import FakeClock

from pdsvc.ship.runtime.policy import RestartPolicy

# --------------------------------------------------------------------------- restart policy


def make_policy(path: Path, clock: FakeClock, attempts: int = 3) -> RestartPolicy:
    return RestartPolicy(str(path), restart_delay=1.0, max_delay=8.0, reset_after=600.0,
                         attempts=attempts, clock=clock)


def test_crashes_in_a_row_back_off_doubling_and_serving_long_forgives(tmp_path: Path) -> None:
    clock, path = FakeClock(1000.0), tmp_path / "u.restart.json"
    delays = []
    for _ in range(6):
        p = make_policy(path, clock)  # every run is a new process reading the file
        delays.append(p.on_start().delay)
        p.on_healthy()
        clock.now += 5  # served 5 s, then crashed
        p.on_crash("engine exited with status 137")
    # RestartSec (1 s) is systemd's; ours on top: 0, 1, 3, 7, then capped at 8
    assert delays == [0.0, 0.0, 1.0, 3.0, 7.0, 8.0]
    p = make_policy(path, clock)
    assert p.on_start().why.startswith("crash #6 in a row")
    p.on_healthy()
    clock.now += 600  # a healthy period resets the count
    p.on_crash("engine exited with status 1")
    assert make_policy(path, clock).on_start().delay == 0.0


def test_failed_starts_give_up_once_and_the_next_operator_start_tries_afresh(
        tmp_path: Path) -> None:
    clock, path = FakeClock(1000.0), tmp_path / "u.restart.json"
    verdicts = []
    for _ in range(3):
        p = make_policy(path, clock)
        p.on_start()
        verdicts.append(p.on_failed_start("OSError: Incorrect path_or_model_id"))
    assert verdicts[:2] == [None, None]
    assert verdicts[2] == ("gave up after 3 starts in a row that never became healthy; last: "
                           "OSError: Incorrect path_or_model_id")
    state = json.loads(path.read_text())
    assert state["phase"] == "gave-up" and state["failed_starts"] == 0
    p = make_policy(path, clock)  # `systemctl start` after the fix
    p.on_start()
    assert p.on_failed_start("still broken") is None  # counts from one again


def test_stops_never_count_and_a_killed_run_is_read_for_what_it_was(tmp_path: Path) -> None:
    clock, path = FakeClock(1000.0), tmp_path / "u.restart.json"
    for _ in range(5):  # operator restarts, PartOf= restarts, heals: all stops
        p = make_policy(path, clock)
        p.on_start()
        p.on_stop("stopped (SIGTERM)")
    p = make_policy(path, clock)
    assert p.on_start().delay == 0.0 and p.state.failed_starts == 0
    # the runtime itself was SIGKILLed while serving: the next run counts a crash
    p.on_healthy()
    p2 = make_policy(path, clock)
    p2.on_start()
    assert p2.state.crashes == 1
    # ... and while starting: a failed start
    p3 = make_policy(path, clock)
    p3.on_start()
    assert p3.state.failed_starts == 1


def test_an_unreadable_state_file_is_a_first_start(tmp_path: Path) -> None:
    path = tmp_path / "u.restart.json"
    path.write_text("{not json")
    p = make_policy(path, FakeClock(1000.0))
    assert p.on_start().delay == 0.0
    assert json.loads(path.read_text())["phase"] == "starting"


def test_heals_that_brought_the_pair_back_are_forgotten(tmp_path: Path) -> None:
    clock, path = FakeClock(1000.0), tmp_path / "u.restart.json"
    p = make_policy(path, clock)
    for _ in range(5):
        assert p.may_heal(2, 3600, 300) == (True, "")
        p.record_heal()
        p.on_pair_good()  # each heal worked
    p.record_heal()
    p.record_heal()
    heal, why = make_policy(path, clock).may_heal(2, 3600, 300)  # two in a row that did not
    assert not heal and "2 heals within 60 min did not bring a pair back" in why
    assert "the next try in 300 s" in why
    clock.now += 3601
    assert make_policy(path, clock).may_heal(2, 3600, 300) == (True, "")


def test_past_the_budget_heals_go_on_slower_never_stuck_for_good(tmp_path: Path) -> None:
    clock, path = FakeClock(1000.0), tmp_path / "u.restart.json"
    p = make_policy(path, clock)
    tries = []
    for second in range(0, 1800, 10):  # a pair that stays broken for half an hour
        clock.now = 1000.0 + second
        p = make_policy(path, clock)  # each heal is a new run of the unit
        if p.may_heal(2, 3600, 300)[0]:
            p.record_heal()
            tries.append(second)
    assert tries[:2] == [0, 10]  # the budget: at once
    assert tries[2:] == [310, 610, 910, 1210, 1510]  # then one every 300 s, never none


def test_an_operators_stop_starts_the_heal_budget_afresh(tmp_path: Path) -> None:
    clock, path = FakeClock(1000.0), tmp_path / "u.restart.json"
    p = make_policy(path, clock)
    p.record_heal()
    p.record_heal()
    p.on_stop("a heal: this runtime's own stop")  # not asked: the count stays
    assert not make_policy(path, clock).may_heal(2, 3600, 300)[0]
    p = make_policy(path, clock)
    p.on_stop("stopped (SIGTERM)", asked=True)  # systemctl restart
    assert make_policy(path, clock).may_heal(2, 3600, 300) == (True, "")


def test_a_budget_of_zero_only_reports(tmp_path: Path) -> None:
    heal, why = make_policy(tmp_path / "u.restart.json", FakeClock(1000.0)).may_heal(0, 3600, 300)
    assert not heal and "only reports" in why
