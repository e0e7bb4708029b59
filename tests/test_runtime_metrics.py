"""The runtime's textfile (pdsvc/ship/runtime/metrics.py): derived from the state files the restart
policy and the canary write, counters that survive the runtime's restarts, atomic 0644 files
that Prometheus' own parser accepts (`promtool check metrics`)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

from pdsvc.ship.runtime.metrics import Textfile, write_textfile
from pdsvc.ship.runtime.statefile import write_state
from pdsvc.ship.runtime.timings import PROFILE_HOLD_MAX_S

U = 'deployment="dsv4",role="prefill",unit="dsv4-prefill.service"'
LABELS = {"deployment": "dsv4", "role": "prefill", "unit": "dsv4-prefill.service"}
PAIR = "http://127.0.0.1:30000 -> http://127.0.0.1:30001"


def _text(tmp_path) -> str:
    return (tmp_path / "metrics" / "dsv4-prefill.prom").read_text()


def test_starts_by_cause_heals_and_pairs(tmp_path) -> None:
    state, mdir = str(tmp_path), str(tmp_path / "metrics")
    with Textfile("dsv4-prefill", state, mdir, dict(LABELS), heal_budget=2).running():
        write_state(f"{state}/dsv4-prefill.restart.json",
                   {"phase": "serving", "crashes": 0, "heals": [100.0]})
        write_state(f"{state}/dsv4-prefill.canary.json", {"pairs": [
            {"pair": PAIR, "state": "failing", "failures": 4, "failing_since": 50.0}]})
    text = _text(tmp_path)
    assert f'pdsvc_unit_starts_total{{{U},cause="first"}} 1' in text
    assert f'pdsvc_unit_up{{{U}}} 0' in text
    assert f'pdsvc_pair_state{{{U},pair="{PAIR}",state="failing"}} 1' in text
    assert f'pdsvc_unit_heals_total{{{U}}} 1' in text
    assert stat.S_IMODE((tmp_path / "metrics" / "dsv4-prefill.prom").stat().st_mode) == 0o644
    # the next run: the last one ended crashed; the heal already counted is not counted again
    write_state(f"{state}/dsv4-prefill.restart.json",
               {"phase": "crashed", "crashes": 1, "heals": [100.0]})
    with Textfile("dsv4-prefill", state, mdir, dict(LABELS), heal_budget=2).running():
        assert f'pdsvc_unit_up{{{U}}} 1' \
            in _text(tmp_path)
        write_state(f"{state}/dsv4-prefill.restart.json", {"phase": "gave-up"})
    text = _text(tmp_path)
    assert 'cause="crash"} 1' in text and 'cause="first"} 1' in text
    assert f'pdsvc_unit_heals_total{{{U}}} 1' in text
    assert f'pdsvc_unit_gave_up{{{U}}} 1' in text
    assert not [p for p in (tmp_path / "metrics").iterdir() if p.name.startswith(".")]
    promtool = shutil.which("promtool")
    if promtool:
        done = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_textfile_directory_is_0755_under_the_units_umask(tmp_path) -> None:
    """The units run with UMask=0027, which turns mkdir's 0755 into 0750: node_exporter's user
    (neither the service user nor in its group) could not list the directory. Found by
    tests/test_e2e_alerts.py ("open /run/e2e/metrics: permission denied")."""
    old = os.umask(0o027)
    try:
        write_textfile(str(tmp_path / "made" / "a.prom"), "x 1\n")
        stale = tmp_path / "stale"  # made 0750 by an earlier runtime, kept across restarts
        stale.mkdir(mode=0o750)
        write_textfile(str(stale / "a.prom"), "x 1\n")
    finally:
        os.umask(old)
    for d in ("made", "stale"):
        assert stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o755, d
        assert stat.S_IMODE((tmp_path / d / "a.prom").stat().st_mode) == 0o644, d


def test_status_metrics_are_the_runtimes_series_for_every_unit(tmp_path) -> None:
    """`pdsvc status --metrics` prints the same families from the same files, for every unit
    of the plan, with up from the service manager."""
    from pathlib import Path

    from pdsvc.cli.kit import load_plan
    from pdsvc.status.runstate import metrics_text

    repo = Path(__file__).resolve().parent.parent
    plan = load_plan(repo / "etc/pdsvc.yaml", None, repo / "etc/seed-host.topology.json")
    write_state(f"{tmp_path}/dsv4-decode.restart.json", {"phase": "gave-up"})
    write_state(f"{tmp_path}/dsv4-prefill.canary.json", {"pairs": [
        {"pair": PAIR, "state": "ok", "failures": 0, "last_ok": 12.5}]})
    text = metrics_text(plan, tmp_path, {"dsv4-prefill.service": True}, 99.0)
    assert f'pdsvc_unit_up{{{U}}} 1' in text
    assert 'pdsvc_unit_gave_up{deployment="dsv4",role="decode",unit="dsv4-decode.service"} 1' \
        in text
    assert f'pdsvc_pair_last_good_timestamp_seconds{{{U},pair="{PAIR}"}} 12.5' in text
    assert 'unit="dsv4-router.service"' in text
    assert text.count("# TYPE pdsvc_unit_gave_up gauge") == 1
    promtool = shutil.which("promtool")
    if promtool:
        done = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                              capture_output=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_start_that_served_reports_the_seconds_of_each_phase(tmp_path) -> None:
    """The runtime records each state it entered; SERVING writes the durations before it."""
    from pdsvc.ship.runtime.cli import parse_args
    from pdsvc.ship.runtime.lifecycle import Unit
    from pdsvc.ship.runtime.metrics import unit_samples
    from pdsvc.ship.runtime.states import State

    args, command = parse_args(["engine", "--name", "dsv4-prefill", "--health-url",
                                "http://127.0.0.1:9/health", "--state-dir", str(tmp_path),
                                "--", "true"])
    unit = Unit(args, command)
    unit.entered = [(State.WAIT_GPUS, 10.0), (State.JIT_LOCK, 12.5), (State.STARTING, 20.0),
                    (State.SERVING, 95.25)]
    unit.policy.on_healthy(unit.start_phases())
    run = json.loads((tmp_path / "dsv4-prefill.restart.json").read_text())
    assert run["start_phases"] == {"wait_gpus": 2.5, "jit_lock": 7.5, "starting": 75.25}
    samples = unit_samples(dict(LABELS), run, None, None, up=True, heal_budget=None, now=1.0)
    got = {dict(s.labels)["phase"]: s.value for s in samples
           if s.family == "pdsvc_unit_start_phase_seconds"}
    assert got == {"wait_gpus": 2.5, "jit_lock": 7.5, "starting": 75.25}


def test_a_profile_hold_in_force_is_1_until_it_ends_or_passes_its_bound(tmp_path) -> None:
    """pdsvc_unit_profile_held reads the runtime's answer to a hold (NAME.profile.json, written
    by profiled.py): 1 once taken, 0 once ended or past the hold's bound; routers have none."""
    state, mdir = str(tmp_path), str(tmp_path / "metrics")
    now = [1000.0]
    held = f'pdsvc_unit_profile_held{{{U}}} '
    path = f"{state}/dsv4-prefill.profile.json"
    t = Textfile("dsv4-prefill", state, mdir, dict(LABELS), clock=lambda: now[0])
    t.refresh(up=True)
    assert held + "0" in _text(tmp_path)  # never held
    # as the runtime writes it when it takes the hold: until is the lease's end, 30 s on;
    # the lease is renewed without a write (profiled.py), so until is no bound
    write_state(path, {"run": "r1", "since": 990.0, "until": 1020.0, "routers": {}})
    t.refresh(up=True)
    assert held + "1" in _text(tmp_path)
    now[0] = 990.0 + PROFILE_HOLD_MAX_S - 1  # long past until, the write still running
    t.refresh(up=True)
    assert held + "1" in _text(tmp_path)
    now[0] = 990.0 + PROFILE_HOLD_MAX_S  # past its bound: the runtime no longer honours it
    t.refresh(up=True)
    assert held + "0" in _text(tmp_path)
    now[0] = 1010.0
    write_state(path, {"run": "r1", "since": 990.0, "until": 1300.0, "routers": {},
                       "ended_at": 1005.0, "ended": "removed by pdsvc profile"})
    t.refresh(up=True)
    assert held + "0" in _text(tmp_path)
    router = {**LABELS, "role": "router", "unit": "dsv4-router.service"}
    Textfile("dsv4-router", state, mdir, router).refresh(up=True)
    assert "pdsvc_unit_profile_held" not in (tmp_path / "metrics" / "dsv4-router.prom").read_text()


def test_status_metrics_show_a_failed_duty_and_a_profile_hold_as_the_textfile_does(
        tmp_path) -> None:
    from pathlib import Path

    from pdsvc.cli.kit import load_plan
    from pdsvc.status.runstate import metrics_text

    repo = Path(__file__).resolve().parent.parent
    plan = load_plan(repo / "etc/pdsvc.yaml", None, repo / "etc/seed-host.topology.json")
    write_state(f"{tmp_path}/dsv4-decode.duties.json",
                {"duties": {"liveness": {"count": 2, "last": "ValueError: x"}}})
    write_state(f"{tmp_path}/dsv4-decode.profile.json", {"run": "r1", "since": 90.0,
                                                          "until": 120.0})
    text = metrics_text(plan, tmp_path, {"dsv4-decode.service": True}, 99.0)
    d = 'deployment="dsv4",role="decode",unit="dsv4-decode.service"'
    assert f'pdsvc_unit_duty_failures_total{{{d},duty="liveness"}} 2' in text
    assert f'pdsvc_unit_profile_held{{{d}}} 1' in text
    assert f'pdsvc_unit_profile_held{{{U}}} 0' in text
