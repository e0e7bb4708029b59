"""A heal cascade (pdsvc/ship/runtime/cascade.py), in-process with fake clocks and a temporary
state directory shared by four engines' restart policies, as on one host: the rule both ways,
one marker, every engine restarting on a newer marker and none on an older one, no second
cure within the hour, and a hold suppressing it all."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from runtime_procs import FakeClock

from pdsvc.ship.runtime import timings
from pdsvc.ship.runtime.cascade import Cascade, Heal, is_cascade, marker_path
from pdsvc.ship.runtime.endings import Ending
from pdsvc.ship.runtime.events import CureDue
from pdsvc.ship.runtime.hold import hold_path, write_hold
from pdsvc.ship.runtime.policy import RestartPolicy
from pdsvc.ship.runtime.statefile import Kind, state_path
from pdsvc.ship.runtime.watch import Watch, step

ENGINES = {"dep-prefill-0": "prefill", "dep-prefill-1": "prefill",
           "dep-decode-0": "decode", "dep-decode-1": "decode"}
RESTART_ALL = "systemctl restart dep-pd.target"


def policy(state: Path, name: str, clock: FakeClock) -> RestartPolicy:
    return RestartPolicy(state_path(str(state), name, Kind.RESTART), restart_delay=1.0,
                         max_delay=8.0, reset_after=600.0, attempts=3, clock=clock)


def serving(state: Path, clock: FakeClock) -> dict[str, RestartPolicy]:
    """Every engine started and healthy now."""
    out = {}
    for name in ENGINES:
        p = out[name] = policy(state, name, clock)
        p.on_start()
        p.on_healthy()
    return out


def heal(state: Path, name: str, clock: FakeClock, lines: list[str]) -> str | None:
    """What the runtime of ``name`` does on a heal: log it, then judge the deployment."""
    policy(state, name, clock).record_heal(ENGINES[name])
    return runtime(state, name, clock, lines).after_heal()


def runtime(state: Path, name: str, clock: FakeClock, lines: list[str]) -> Cascade:
    return Cascade(str(state), "dep", name, RESTART_ALL, lines.append, clock=clock)


def h(at: float, role: str, name: str = "e") -> Heal:
    return Heal(at, name, role)


@pytest.mark.parametrize("heals, cascade_", [
    ([h(0, "decode"), h(10, "decode"), h(20, "decode")], False),  # sglang #33789 alone
    ([h(0, "prefill"), h(10, "prefill"), h(20, "prefill")], False),  # smg #2382 alone
    ([h(0, "decode"), h(10, "prefill")], False),  # two faults at once, not yet a cascade
    ([h(0, "decode"), h(10, "decode"), h(20, "prefill")], True),  # the poison went back
    ([h(0, "prefill"), h(10, "decode"), h(20, "prefill")], True),
])
def test_a_cascade_is_three_heals_of_both_roles(heals: list[Heal], cascade_: bool) -> None:
    assert (is_cascade(heals, now=30.0) is not None) is cascade_


def test_heals_outside_the_window_or_before_the_last_cure_do_not_count() -> None:
    heals = [h(0, "decode"), h(10, "decode"), h(20, "prefill")]
    assert is_cascade(heals, now=20 + timings.CASCADE_WINDOW_S - 1) is None  # the first aged
    assert is_cascade(heals, now=30.0, since=5.0) is None  # the first came before the cure
    assert is_cascade(heals, now=30.0, since=-1.0)


def test_the_heal_log_survives_a_good_pair_and_an_operator_restart_clears_it(
        tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    p = policy(tmp_path, "dep-decode-0", clock)
    p.record_heal("decode")
    p.on_pair_good()  # the budget forgets a heal that worked ...
    doc = json.loads(Path(p.path).read_text())
    assert doc["heals"] == [] and doc["heal_log"] == [1000.0] and doc["role"] == "decode"
    p.on_stop("stopped (SIGTERM)", asked=True)  # ... the cascade's count only a stop
    assert json.loads(Path(p.path).read_text())["heal_log"] == []


def test_heals_of_one_role_only_write_no_marker(tmp_path: Path) -> None:
    clock, lines = FakeClock(1000.0), []
    serving(tmp_path, clock)
    for name in ("dep-decode-0", "dep-decode-1", "dep-decode-0", "dep-decode-1"):
        clock.wait(20)
        assert heal(tmp_path, name, clock, lines) is None
    assert not Path(marker_path(str(tmp_path), "dep")).exists() and not lines


def test_the_heal_that_completes_a_cascade_writes_one_marker_and_every_engine_restarts(
        tmp_path: Path) -> None:
    clock, lines = FakeClock(1000.0), []
    serving(tmp_path, clock)
    started = clock.now
    clock.wait(30)
    assert heal(tmp_path, "dep-decode-0", clock, lines) is None
    clock.wait(20)
    assert heal(tmp_path, "dep-decode-1", clock, lines) is None
    clock.wait(20)
    cure = heal(tmp_path, "dep-prefill-0", clock, lines)
    assert cure and "sglang #33789" in cure and "smg-project/smg #2382" in cure
    assert RESTART_ALL in cure and "every engine together" in cure
    marker = json.loads(Path(marker_path(str(tmp_path), "dep")).read_text())
    assert marker["at"] == clock.now and marker["by"] == "dep-prefill-0"
    assert len(lines) == 1 and "wrote" in lines[0]
    # every engine that served since before the marker restarts, within MARKER_LOOK_S
    clock.wait(0.5)
    for name in ENGINES:
        why = runtime(tmp_path, name, clock, lines).due(started, monotonic=1.0)
        assert why and "dep-prefill-0 found a heal cascade" in why, name
    # and once restarted (serving after the marker), none restarts again
    for name in ENGINES:
        assert runtime(tmp_path, name, clock, lines).due(clock.now, monotonic=1.0) is None
    # the heal of a second runtime a moment later writes no second marker
    clock.wait(1)
    assert heal(tmp_path, "dep-prefill-1", clock, lines) is None
    assert json.loads(Path(marker_path(str(tmp_path), "dep")).read_text()) == marker


def cure_once(state: Path, clock: FakeClock, lines: list[str]) -> float:
    serving(state, clock)
    for name in ("dep-decode-0", "dep-prefill-0", "dep-decode-1"):
        clock.wait(20)
        cure = heal(state, name, clock, lines)
    assert cure
    return clock.now


def test_a_cascade_again_within_the_hour_is_reported_once_with_the_command(
        tmp_path: Path) -> None:
    clock, lines = FakeClock(1000.0), []
    cured = cure_once(tmp_path, clock, lines)
    clock.wait(120)
    serving(tmp_path, clock)  # every engine back, after the marker
    said = len(lines)
    r = runtime(tmp_path, "dep-prefill-1", clock, lines)
    for name in ("dep-decode-0", "dep-prefill-0", "dep-decode-1", "dep-prefill-1"):
        clock.wait(20)
        policy(tmp_path, name, clock).record_heal(ENGINES[name])
        assert r.after_heal() is None
    report = lines[said:]
    assert len(report) == 1, report  # news only
    assert "heal cascade again" in report[0] and f"`{RESTART_ALL}`" in report[0]
    assert json.loads(Path(marker_path(str(tmp_path), "dep")).read_text())["at"] == cured
    # an hour later the next cascade is cured again
    clock.wait(timings.CURE_WINDOW_S)
    for name in ("dep-decode-0", "dep-prefill-0", "dep-decode-1"):
        clock.wait(20)
        cure = heal(tmp_path, name, clock, lines)
    assert cure and json.loads(Path(marker_path(str(tmp_path), "dep")).read_text())["at"] > cured


def test_an_old_marker_restarts_nothing(tmp_path: Path) -> None:
    clock, lines = FakeClock(1000.0), []
    cure_once(tmp_path, clock, lines)
    clock.wait(timings.MARKER_ACT_S)  # an engine that was down, held, or stopped meanwhile
    assert runtime(tmp_path, "dep-decode-0", clock, lines).due(900.0, monotonic=1.0) is None


def test_a_hold_suppresses_the_marker_and_acting_on_one(tmp_path: Path) -> None:
    clock, lines = FakeClock(1000.0), []
    serving(tmp_path, clock)
    hold = hold_path(str(tmp_path), "dep-decode-1")
    assert hold
    write_hold(hold, out=True, why="rolling a change")
    for name in ("dep-decode-0", "dep-prefill-0", "dep-decode-1", "dep-prefill-1"):
        clock.wait(20)
        assert heal(tmp_path, name, clock, lines) is None
    assert not Path(marker_path(str(tmp_path), "dep")).exists()
    Path(hold).unlink()
    clock.wait(1)
    assert heal(tmp_path, "dep-decode-0", clock, lines)  # the cascade is cured once released
    write_hold(hold, out=True, why="rolling a change")
    assert runtime(tmp_path, "dep-decode-0", clock, lines).due(900.0, monotonic=1.0) is None


def test_the_engine_runtime_restarts_its_engine_on_a_newer_marker(tmp_path: Path) -> None:
    """The wiring: SERVING's cure poller posts CureDue on the marker, which ends SERVING
    with Ending.HEAL (a heal's path)."""
    from pdsvc.ship.runtime.cli import parse_args
    from pdsvc.ship.runtime.lifecycle import Unit
    args, command = parse_args([
        "engine", "--name", "dep-decode-0", "--health-url", "http://127.0.0.1:1/health",
        "--state-dir", str(tmp_path), "--deployment", "dep", "--role", "decode",
        "--restart-all", RESTART_ALL, "--", "true"])
    unit = Unit(args, command)
    assert unit.cascade is None  # no pairs: nothing to cure
    unit.began = time.time()  # its engine process started
    unit.cascade = Cascade(str(tmp_path), "dep", "dep-decode-0", RESTART_ALL, print)
    cure = unit.serving().cure  # the cure poller's call
    assert cure() is None  # no marker
    Path(marker_path(str(tmp_path), "dep")).write_text(json.dumps(
        {"at": unit.began - 0.1, "by": "dep-prefill-0", "why": "x"}))
    unit.cascade.next_look = 0.0
    assert cure() is None  # a marker older than this engine's process: done already
    Path(marker_path(str(tmp_path), "dep")).write_text(json.dumps(
        {"at": unit.began + 0.1, "by": "dep-prefill-0", "why": "x"}))
    unit.cascade.next_look = 0.0
    out = cure()
    assert isinstance(out, CureDue) and "restarts together" in out.detail
    assert step(Watch(0.0), out).outcome.kind is Ending.HEAL  # SERVING ends in a heal
