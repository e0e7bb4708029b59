"""The state files' contract (pdsvc/ship/runtime/statefile.py): one kind each, a format in every
file, one reader and one writer; a reader that meets a newer format says so in one line."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
from conftest import REPO

from pdsvc.ship.runtime import statefile
from pdsvc.ship.runtime.canary import Canary, Pair, Round
from pdsvc.ship.runtime.cascade import Cascade, marker_path
from pdsvc.ship.runtime.hold import Hold, write_hold
from pdsvc.ship.runtime.policy import RestartPolicy
from pdsvc.ship.runtime.statefile import (
    FORMAT,
    Kind,
    NewerFormat,
    read_known,
    read_state,
    state_path,
    write_state,
)


def policy(path: str, log=None) -> RestartPolicy:
    return RestartPolicy(path, restart_delay=1, max_delay=8, reset_after=600, attempts=3,
                         log=log)


def test_a_written_state_carries_the_format_and_reads_back(tmp_path: Path) -> None:
    path = state_path(str(tmp_path), "x", Kind.CANARY)
    assert path.endswith("x.canary.json")
    written = write_state(path, {"pairs": [], "format": 99})  # the caller cannot fake it
    assert written == {"format": FORMAT, "pairs": []} == read_state(path)


def test_a_file_from_before_formats_is_read_as_format_1(tmp_path: Path) -> None:
    path = tmp_path / "x.restart.json"
    path.write_text(json.dumps({"phase": "serving"}))
    assert read_state(str(path)) == {"phase": "serving"}


@pytest.mark.parametrize("found", [FORMAT + 1, "2", True, None])
def test_a_newer_or_unknown_format_is_said_in_one_line_not_guessed(tmp_path: Path,
                                                                   found: object) -> None:
    path = tmp_path / "x.restart.json"
    path.write_text(json.dumps({"format": found, "phase": "serving"}))
    with pytest.raises(NewerFormat) as e:
        read_state(str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    said: list[str] = []
    assert read_known(str(path), said.append) is None and said == [str(e.value)]


def test_every_writer_writes_the_format(tmp_path: Path) -> None:
    """Each kind, written by its own writer, carries the format."""
    d = str(tmp_path)
    p = policy(state_path(d, "e", Kind.RESTART))
    p.on_start()
    canary = Canary("http://p", [Pair("http://p", 8998, "http://d")], failures_to_act=3,
                    log=print, path=state_path(d, "e", Kind.CANARY))
    canary.record([Round(Pair("http://p", 8998, "http://d"), True)])
    for name, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")):
        one = policy(state_path(d, name, Kind.RESTART))
        one.record_heal(role)
    cure = Cascade(d, "dep", "d0", "systemctl restart dep-pd.target", print)
    assert cure.after_heal()  # heals of both roles: the cure's marker
    write_hold(state_path(d, "e", Kind.HOLD), out=True)  # (a hold would have stopped the cure)
    files = {Kind.RESTART: state_path(d, "e", Kind.RESTART),
             Kind.CANARY: state_path(d, "e", Kind.CANARY),
             Kind.HOLD: state_path(d, "e", Kind.HOLD),
             Kind.HEAL_ALL: marker_path(d, "dep")}
    for kind, path in files.items():
        assert json.loads(Path(path).read_text())["format"] == FORMAT, kind


def test_the_runtime_meets_a_newer_restart_file_says_so_and_starts_as_a_first(
        tmp_path: Path) -> None:
    path = tmp_path / "e.restart.json"
    path.write_text(json.dumps({"format": FORMAT + 1, "phase": "crashed", "crashes": 9}))
    lines: list[str] = []
    verdict = policy(str(path), lines.append).on_start()
    assert verdict.delay == 0 and len(lines) == 1 and "newer" in lines[0]


def test_a_newer_hold_is_no_hold_and_said(tmp_path: Path) -> None:
    path = tmp_path / "e.hold.json"
    path.write_text(json.dumps({"format": FORMAT + 1, "out": True, "until": time.time() + 60}))
    lines: list[str] = []
    assert Hold(str(path), lines.append).out() is None and "newer" in lines[0]


def test_status_names_a_unit_whose_state_is_of_a_newer_format(tmp_path: Path) -> None:
    from pdsvc.cli.kit import load_plan
    from pdsvc.status import runstate

    plan = load_plan(REPO / "etc" / "pdsvc.yaml", None, REPO / "etc" / "seed-host.topology.json")
    name = plan.engines[0].name
    Path(state_path(str(tmp_path), name, Kind.RESTART)).write_text(
        json.dumps({"format": FORMAT + 1, "phase": "gave-up"}))
    runs = runstate.unit_runs(plan, tmp_path)
    lines = runstate.problems(runs, [])
    assert [line for line in lines if "newer than this pdsvc" in line] and \
        not [line for line in lines if "gave up" in line]  # not guessed from its fields


def test_no_state_file_kind_is_a_string_literal_outside_its_enum() -> None:
    """state_path is always called with a Kind, never with the kind's word."""
    bad = []
    for path in (REPO / "pdsvc").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "state_path" \
                    and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                            for a in node.args[2:]):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad and statefile.state_path.__module__ == "pdsvc.ship.runtime.statefile", bad
