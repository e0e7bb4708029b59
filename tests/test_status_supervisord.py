"""`pdsvc status` against a supervisord bundle: a stand-in supervisord on a unix socket,
asked over XML-RPC as supervisorctl asks it.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from status_stands import (
    NOT_READY,
    PROGRAMS,
    SUPERVISORD,
    Deployment,
    FakeSupervisord,
    row,
    sv_invoke,
    verdict,
)

from pdsvc.status.managers import (
    Supervisord,
    state_from_process_info,
)


def test_supervisord_all_running_serves_and_shows_the_group(dep: Deployment,
                                                            sv: FakeSupervisord) -> None:
    result = sv_invoke(dep, sv)
    out = result.output
    assert result.exit_code == 0, out
    assert out.startswith("dsv4 PD stack (supervisord)\n")
    # no target under supervisord: the first row is the supervisord running the bundle
    assert re.search(r"^dsv4-supervisord\s+active \(running\)\s+-\s+-\s+-\s+"
                     r"supervisord pid 4000: 3 of 3 programs running$", row(out, SUPERVISORD)), out
    for role, probe in (("prefill", "/health 200"), ("decode", "/health 200"),
                        ("router", "/readiness 200")):
        # supervisord counts no restarts: `-`
        assert re.search(rf"active \(running\)\s+3m12s\s+-\s+{probe} \(\d+ ms\)\s+"
                         r"pid 4242, uptime", row(out, PROGRAMS[role])), out
    assert verdict(out) == "serving"
    assert sorted(sv.calls) == sorted(PROGRAMS.values())
    assert not (dep.tmp / "calls").exists()  # systemctl was not asked


def test_supervisord_fatal_decode_is_not_serving_and_named(dep: Deployment,
                                                           sv: FakeSupervisord) -> None:
    sv.set("decode", "FATAL", age=42)
    dep.decode.close()
    dep.router.routes["/readiness"] = NOT_READY
    result = sv_invoke(dep, sv)
    assert result.exit_code == 1, result.output
    assert re.search(r"failed \(fatal\)\s+42s\s+-\s+/health connection refused\s+"
                     r"Exited too quickly", row(result.output, PROGRAMS["decode"])), result.output
    assert "2 of 3 programs running" in row(result.output, SUPERVISORD)
    assert verdict(result.output).startswith(
        "not serving: dsv4-decode is failed (fatal); router not ready: /readiness 503")


def test_supervisord_starting_prefill_is_activating(dep: Deployment,
                                                    sv: FakeSupervisord) -> None:
    sv.set("prefill", "STARTING", age=5, description="")
    dep.prefill.routes["/health"] = (503, "")
    result = sv_invoke(dep, sv)
    assert result.exit_code == 1, result.output
    assert re.search(r"activating \(starting\)\s+5s\s+-\s+/health 503",
                     row(result.output, PROGRAMS["prefill"])), result.output
    assert verdict(result.output) == "not serving: dsv4-prefill is activating (starting)"


def test_supervisord_json_has_the_same_facts(dep: Deployment, sv: FakeSupervisord) -> None:
    sv.set("router", "BACKOFF", age=3)
    result = sv_invoke(dep, sv, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["backend"] == "supervisord"
    assert [(u["role"], u["unit"], u["state"], u["sub"]) for u in doc["units"]] == [
        ("target", SUPERVISORD, "active", "running"),
        ("prefill", PROGRAMS["prefill"], "active", "running"),
        ("decode", PROGRAMS["decode"], "active", "running"),
        ("router", PROGRAMS["router"], "failed", "backoff")]
    assert all(u["restarts"] is None for u in doc["units"])
    assert doc["units"][1]["since_secs"] == 192.0
    assert doc["problems"] == ["dsv4-router is failed (backoff)"]


def test_supervisord_absent_socket_is_rows_with_the_error_not_a_traceback(
        dep: Deployment, short_dir: Path) -> None:
    missing = short_dir / "nobody.sock"
    result = dep.invoke("--backend", "supervisord", "--socket", str(missing))
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    why = f"supervisord: {missing}: no such socket — is supervisord running?"
    for unit in (SUPERVISORD, *PROGRAMS.values()):
        assert "unknown" in row(result.output, unit) and why in row(result.output, unit)
    assert verdict(result.output).startswith(f"not serving: unit states unknown ({why}")


def test_supervisord_stale_socket_is_connection_refused(dep: Deployment,
                                                        short_dir: Path) -> None:
    stale = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # bound, never listening: what a killed supervisord leaves behind
        result = dep.invoke("--backend", "supervisord", "--socket", str(stale), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert {u["error"] for u in doc["units"]} == {
        f"supervisord: {stale}: connection refused — supervisord is not running"}


def test_supervisord_hung_socket_is_bounded_by_the_timeout(short_dir: Path) -> None:
    hung = short_dir / "hung.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(hung))
        s.listen()  # accepts connections, never answers
        backend = Supervisord(str(hung), {}, timeout=0.3)
        t0 = time.monotonic()
        state = backend.state("dsv4-decode")
        assert time.monotonic() - t0 < 2
    assert state.error == f"supervisord: {hung}: no answer within 0.3s"


def test_supervisord_unknown_program_is_not_installed(dep: Deployment,
                                                      sv: FakeSupervisord) -> None:
    del sv.procs[PROGRAMS["router"]]
    result = sv_invoke(dep, sv)
    assert result.exit_code == 1
    assert "not installed" in row(result.output, PROGRAMS["router"])
    assert verdict(result.output) == "not serving: dsv4-router is not installed"


def test_auto_backend_follows_the_config_format_and_its_run_dir(dep: Deployment,
                                                                short_dir: Path) -> None:
    cfg = yaml.safe_load(dep.config.read_text())
    cfg["format"] = "supervisord"
    cfg.setdefault("supervisord", {})["run_dir"] = str(short_dir)
    dep.config.write_text(yaml.safe_dump(cfg))
    fake = FakeSupervisord(short_dir / "dsv4-supervisord.sock")  # the bundle's socket name
    try:
        fake.all_running()
        result = dep.invoke()  # --backend auto
        assert result.exit_code == 0, result.output
        assert result.output.startswith("dsv4 PD stack (supervisord)")
        assert len(fake.calls) == 3
        # and systemd is still one flag away
        assert dep.invoke("--backend", "systemd").output.startswith("dsv4 PD stack (systemd)")
    finally:
        fake.close()


def test_socket_implies_supervisord_under_auto_and_is_refused_with_systemd(
        dep: Deployment, sv: FakeSupervisord) -> None:
    result = dep.invoke("--socket", str(sv.path))
    assert result.exit_code == 0 and "(supervisord)" in result.output.splitlines()[0]
    refused = dep.invoke("--backend", "systemd", "--socket", str(sv.path))
    assert refused.exit_code == 2
    assert "--socket is supervisord's control socket" in refused.output


@pytest.mark.parametrize(("info", "want"), [
    ({"statename": "RUNNING", "start": 100, "stop": 0, "now": 161, "description": "pid 7"},
     ("active", "running", "", 61.0, "pid 7")),
    ({"statename": "STOPPING", "start": 100, "stop": 50, "now": 110},
     ("deactivating", "stopping", "", 10.0, "")),
    ({"statename": "EXITED", "start": 100, "stop": 150, "now": 160, "exitstatus": 0,
      "description": "Nov 29 10:39 AM"},
     ("inactive", "exited", "success", 10.0, "Nov 29 10:39 AM")),
    ({"statename": "EXITED", "start": 100, "stop": 150, "now": 160, "exitstatus": 3,
      "description": "Nov 29 10:39 AM"},
     ("failed", "exited", "exit-code", 10.0, "Nov 29 10:39 AM (exit status 3)")),
    ({"statename": "FATAL", "start": 100, "stop": 90, "now": 130,
      "description": "can't find command '/nope'"},  # a spawn error: no exit since the start
     ("failed", "fatal", "", 30.0, "can't find command '/nope'")),
    ({"statename": "STOPPED", "start": 0, "stop": 0, "now": 130, "description": "Not started"},
     ("inactive", "stopped", "", None, "Not started")),
    ({"statename": "WHATEVER"}, ("unknown", "whatever", "", None, "")),
])
def test_state_from_process_info(info: dict[str, Any], want: tuple) -> None:
    s = state_from_process_info("g:p", info)
    assert (s.state, s.sub, s.result, s.since_secs, s.status_text) == want
    assert s.restarts is None and s.unit == "g:p" and s.error is None
    assert bool(s.since) == (s.since_secs is not None)


