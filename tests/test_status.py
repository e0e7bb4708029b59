"""`pdsvc status` against stand-ins: a fake `systemctl` (a script printing `systemctl show`'s
KEY=VALUE lines from files a test writes), a fake supervisord (a stdlib XML-RPC server on a unix
socket answering what supervisorctl asks), and stdlib HTTP servers on free 127.0.0.1 ports
playing the engines' /health and the router's /readiness and /workers.

Each test says the situation and what the user must read: the exit code, the rows, the verdict.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from click.testing import CliRunner
from status_stands import (
    NOT_READY,
    UNITS,
    Deployment,
    row,
    verdict,
    workers_body,
    write_config,
)

import pdsvc.cli.status as status_mod
from pdsvc.cli.status import CLEAR_SCREEN, status, watch
from pdsvc.status.managers import (
    UNIT_PROPERTIES,
)

# --------------------------------------------------------------------------- the command


def test_a_serving_stack_exits_0_and_shows_every_fact(dep: Deployment) -> None:
    dep.unit("dsv4-decode.service", restarts=2)
    result = dep.invoke()
    out = result.output
    assert result.exit_code == 0, out
    assert verdict(out) == "serving"
    assert re.search(r"^dsv4-pd.target\s+active\s+3m1[23]s\s+-\s+-$", row(out, "dsv4-pd.target"))
    for unit, restarts, probe in (("dsv4-prefill.service", 0, "/health 200"),
                                  ("dsv4-decode.service", 2, "/health 200"),
                                  ("dsv4-router.service", 0, "/readiness 200")):
        assert re.search(rf"active \(running\)\s+3m1[23]s\s+{restarts}\s+{probe} \(\d+ ms\)",
                         row(out, unit)), out
    assert re.search(rf"prefill\s+{dep.prefill.url}\s+healthy", out), out
    assert re.search(rf"decode\s+{dep.decode.url}\s+healthy", out), out
    # router.host 0.0.0.0: clients use this machine's name
    url = f"http://{socket.gethostname()}:{dep.router.port}/v1/chat/completions"
    assert f"send requests to: {url}" in out
    # one `systemctl show` per unit, KEY=VALUE properties (no --value: its order is the unit's)
    calls = (dep.tmp / "calls").read_text().splitlines()
    assert sorted(calls) == sorted(
        f"show {u} --no-pager -p {','.join(UNIT_PROPERTIES)}" for u in UNITS)


def test_a_failed_unit_exits_1_and_the_verdict_names_it(dep: Deployment) -> None:
    dep.unit("dsv4-decode.service", "failed", "failed", result="exit-code", restarts=3,
             age=42, text="stopping (dsv4-decode)")
    dep.decode.close()
    dep.router.routes["/readiness"] = NOT_READY
    dep.router.routes["/workers"] = (200, workers_body(
        ("prefill", dep.prefill.url, True), ("decode", dep.decode.url, False)))
    result = dep.invoke()
    assert result.exit_code == 1, result.output
    assert re.search(r"failed \(Result: exit-code\)\s+42s\s+3\s+/health connection refused",
                     row(result.output, "dsv4-decode.service")), result.output
    assert re.search(rf"decode\s+{dep.decode.url}\s+UNHEALTHY", result.output)
    assert re.fullmatch(
        r"not serving: dsv4-decode.service is failed \(Result: exit-code\); "
        r"router not ready: /readiness 503 \(\d+ ms\) — insufficient healthy workers; "
        rf"decode worker {dep.decode.url} unhealthy", verdict(result.output)), result.output


def test_router_not_ready_is_not_serving_although_every_unit_is_active(dep: Deployment) -> None:
    dep.router.routes["/readiness"] = NOT_READY
    result = dep.invoke()
    assert result.exit_code == 1
    assert re.fullmatch(r"not serving: router not ready: /readiness 503 \(\d+ ms\) — "
                        r"insufficient healthy workers", verdict(result.output)), result.output


def test_a_starting_unit_shows_how_far_it_got(dep: Deployment) -> None:
    dep.unit("dsv4-prefill.service", "activating", "start", age=45, restarts=0,
             text="waiting for http://127.0.0.1:30000/health (HTTP 503) — 45 s")
    dep.prefill.routes["/health"] = (503, "")
    result = dep.invoke()
    assert result.exit_code == 1
    assert re.search(r"activating \(start\)\s+45s\s+0\s+/health 503 \(\d+ ms\)\s+waiting for",
                     row(result.output, "dsv4-prefill.service"))
    assert verdict(result.output) == ("not serving: dsv4-prefill.service is activating (start): "
                                      "waiting for http://127.0.0.1:30000/health (HTTP 503) — 45 s")


def test_a_worker_missing_from_the_router_view_is_named(dep: Deployment) -> None:
    dep.router.routes["/workers"] = (200, workers_body(("prefill", dep.prefill.url, True)))
    result = dep.invoke()
    assert result.exit_code == 0  # readiness says 200: serving, but the gap is reported
    assert verdict(result.output) == (
        f"serving, but: the router does not list the decode worker {dep.decode.url}")


def test_a_unit_that_is_not_installed_says_so(dep: Deployment) -> None:
    (dep.tmp / "units" / "dsv4-router.service").unlink()
    result = dep.invoke()
    assert result.exit_code == 1
    assert "not installed" in row(result.output, "dsv4-router.service")
    assert verdict(result.output) == "not serving: dsv4-router.service is not installed"


def test_an_engine_refusing_connections_is_a_row_not_a_traceback(dep: Deployment) -> None:
    # the unit is still active (its watchdog has not fired yet) and the router still ready:
    # serving by definition, but the verdict says what is off
    dep.decode.close()
    result = dep.invoke()
    assert result.exit_code == 0, result.output
    assert "/health connection refused" in row(result.output, "dsv4-decode.service")
    assert verdict(result.output) == "serving, but: decode: /health connection refused"


def test_an_unreachable_router_and_systemd_are_rows_not_tracebacks(dep: Deployment) -> None:
    dep.router.close()
    (dep.tmp / "bus-down").touch()
    result = dep.invoke()
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "systemctl: Failed to connect to bus" in row(result.output, "dsv4-router.service")
    assert "/readiness connection refused" in row(result.output, "dsv4-router.service")
    assert "unknown: connection refused" in result.output  # the workers section
    assert verdict(result.output) == (
        "not serving: unit states unknown (systemctl: Failed to connect to bus: No such file or "
        "directory); router not ready: /readiness connection refused")


def test_a_missing_systemctl_is_a_row_too(dep: Deployment) -> None:
    result = dep.invoke(systemctl=str(dep.tmp / "no-such-systemctl"))
    assert result.exit_code == 1
    assert "no-such-systemctl: not found" in row(result.output, "dsv4-prefill.service")
    assert verdict(result.output).startswith("not serving: unit states unknown (")


def test_json_has_the_same_facts(dep: Deployment) -> None:
    result = dep.invoke("--json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert set(doc) == {"format", "name", "backend", "serving", "verdict", "problems", "url",
                        "units", "workers", "workers_error", "workers_probe", "runs", "pairs",
                        "more_routers", "front", "front_error", "address"}
    assert doc["address"] is None  # no moving address: routers on one host
    assert [(r["unit"], r["phase"]) for r in doc["runs"]] == [  # no runtime state here
        ("dsv4-prefill.service", "unknown"), ("dsv4-decode.service", "unknown"),
        ("dsv4-router.service", "unknown")]
    assert [(p["prefill"], p["decode"], p["state"]) for p in doc["pairs"]] == [
        (dep.prefill.url, dep.decode.url, "unknown")]
    assert (doc["name"], doc["backend"], doc["serving"], doc["verdict"], doc["problems"]) == (
        "dsv4", "systemd", True, "serving", [])
    assert doc["url"].endswith(f":{dep.router.port}/v1/chat/completions")
    assert [(u["role"], u["unit"], u["state"]) for u in doc["units"]] == [
        ("target", "dsv4-pd.target", "active"), ("prefill", "dsv4-prefill.service", "active"),
        ("decode", "dsv4-decode.service", "active"), ("router", "dsv4-router.service", "active")]
    prefill = doc["units"][1]
    assert set(prefill) == {"role", "unit", "state", "sub", "result", "since", "since_secs",
                            "restarts", "status_text", "loaded", "error", "probe"}
    assert prefill["sub"] == "running" and prefill["restarts"] == 0
    assert 191 < prefill["since_secs"] < 200 and prefill["since"].startswith("Sun 2026-11-29")
    assert prefill["probe"]["url"] == f"{dep.prefill.url}/health"
    assert prefill["probe"]["code"] == 200 and prefill["probe"]["error"] is None
    assert isinstance(prefill["probe"]["latency_ms"], float)
    assert doc["units"][0]["probe"] is None
    assert doc["units"][3]["probe"]["url"] == f"{dep.router.url}/readiness"
    assert doc["workers"] == [{"url": dep.prefill.url, "type": "prefill", "healthy": True},
                              {"url": dep.decode.url, "type": "decode", "healthy": True}]
    assert doc["workers_error"] is None and doc["workers_probe"]["code"] == 200


def test_json_when_nothing_answers(dep: Deployment) -> None:
    for e in (dep.prefill, dep.decode, dep.router):
        e.close()
    for unit in UNITS[1:]:
        dep.unit(unit, "inactive", "dead")
    result = dep.invoke("--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["serving"] is False and doc["workers"] is None
    assert doc["workers_error"] == "connection refused"
    assert doc["problems"] == [f"{u} is inactive (dead)" for u in UNITS[1:]]
    assert all(u["probe"]["code"] is None for u in doc["units"][1:])


def test_watch_refreshes_until_ctrl_c(dep: Deployment, monkeypatch) -> None:
    naps: list[float] = []

    def sleep(secs: float) -> None:
        naps.append(secs)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_mod, "sleep", sleep)
    result = dep.invoke("--watch", "0.5")
    assert result.exit_code == 0, result.output  # the last frame's verdict, not 130
    assert naps == [0.5, 0.5]
    assert result.output.count("send requests to:") == 2
    assert CLEAR_SCREEN not in result.output  # not a terminal: frames are appended
    assert re.match(r"\d\d:\d\d:\d\d  every 0.5s, Ctrl-C stops\n", result.output)


def test_watch_json_writes_one_line_per_frame(dep: Deployment, monkeypatch) -> None:
    naps: list[float] = []

    def sleep(secs: float) -> None:
        naps.append(secs)
        dep.router.routes["/readiness"] = NOT_READY  # the second frame sees the router drop
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_mod, "sleep", sleep)
    result = dep.invoke("--json", "--watch")
    assert naps == [2.0, 2.0]  # --watch alone: every 2 s
    frames = [json.loads(line) for line in result.output.splitlines()]
    assert [f["serving"] for f in frames] == [True, False]
    assert result.exit_code == 1


def test_watch_clears_the_screen_between_frames_on_a_terminal(monkeypatch, capsys) -> None:
    frames = iter([("one", 0), ("two", 1)])
    monkeypatch.setattr(status_mod, "sleep", lambda s: None)

    def frame() -> tuple[str, int]:
        try:
            return next(frames)
        except StopIteration:
            raise KeyboardInterrupt from None

    assert watch(1, frame, clear=True) == 1
    assert capsys.readouterr().out == f"{CLEAR_SCREEN}one\n{CLEAR_SCREEN}two\n"


def test_a_bad_config_exits_2(dep: Deployment) -> None:
    dep.config.write_text("name: dsv4\nprefill: {prot: 1}\n")
    result = dep.invoke()
    assert result.exit_code == 2
    assert result.stderr.startswith(f"pdsvc: error: {dep.config}:1: missing required key 'model'")


def test_the_router_api_key_is_sent_to_workers(dep: Deployment) -> None:
    write_config(dep.config, dep.prefill.port, dep.decode.port, dep.router.port,
                 args={"api-key": "sk-test-123"})
    assert dep.invoke().exit_code == 0
    auth = [h.get("Authorization") for h in dep.router.seen]
    assert "Bearer sk-test-123" in auth



# --------------------------------------------------------------------------- several hosts



def test_one_host_of_several_shows_its_units_and_the_remote_routers_view(
    hosts_dep: Deployment
) -> None:
    result = hosts_dep.invoke("--host", "gpu-a")
    out = result.output
    assert result.exit_code == 0, out
    units = [line.split()[0] for line in out.splitlines() if line.startswith("dsv4-")]
    assert units == ["dsv4-pd.target", "dsv4-prefill.service"]  # only what runs here
    assert f"GET http://127.0.0.3:{hosts_dep.router.port}/workers" in out  # where it runs
    assert verdict(out) == "serving"
    hosts_dep.router.routes["/workers"] = (200, workers_body(
        ("prefill", hosts_dep.prefill.url, True)))
    hosts_dep.router.routes["/readiness"] = NOT_READY
    out = hosts_dep.invoke("--host", "gpu-a").output
    assert "router (another host) not ready: /readiness 503" in verdict(out)
    assert f"the router does not list the decode worker {hosts_dep.decode.url}" in verdict(out)


def test_host_must_be_named_when_it_cannot_be_told(hosts_dep: Deployment) -> None:
    result = hosts_dep.invoke()  # every 127.x address is this machine's
    assert result.exit_code == 2
    assert "several hosts' addresses are on this machine (lb, gpu-a, gpu-b); pass --host NAME" \
        in result.output
    result = hosts_dep.invoke("--host", "gpu-z")
    assert result.exit_code == 2 and "--host gpu-z: no such host" in result.output


def test_a_router_only_host_needs_no_gpu_to_show_status(hosts_dep: Deployment,
                                                         tmp_path: Path) -> None:
    """On the router's host /sys has no GPU: the plan of the other hosts' engines must not be
    laid on it (a TopologyError here would make status useless where the router runs)."""
    no_gpus = tmp_path / "sys"
    no_gpus.mkdir()
    result = CliRunner().invoke(status, ["-c", str(hosts_dep.config), "--sysfs-root",
                                         str(no_gpus), "--systemctl", str(hosts_dep.systemctl),
                                         "--host", "lb"])
    # it ran (the stand-in router listens on 127.0.0.3, where the real one would be on every
    # address: its probe at 127.0.0.1 is refused, so "not serving" is this test's answer)
    assert result.exit_code == 1 and "no NVIDIA GPU" not in result.output, result.output
    units = [line.split()[0] for line in result.output.splitlines()
             if line.startswith("dsv4-")]
    assert units == ["dsv4-pd.target", "dsv4-router.service"]
