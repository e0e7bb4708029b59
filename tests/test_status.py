"""`pdsvc status` against stand-ins: a fake `systemctl` (a script printing `systemctl show`'s
KEY=VALUE lines from files a test writes), a fake supervisord (a stdlib XML-RPC server on a unix
socket answering what supervisorctl asks), and stdlib HTTP servers on free 127.0.0.1 ports
playing the engines' /health and the router's /readiness and /workers.

Each test says the situation and what the user must read: the exit code, the rows, the verdict.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
import threading
import time
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO
from ports import free_port

import pdsvc.cli.status as status_mod
from pdsvc.cli.status import CLEAR_SCREEN, status, watch
from pdsvc.plan.build import RouterPlan
from pdsvc.status.collect import client_url, http_get, parse_workers
from pdsvc.status.format import human_age
from pdsvc.status.managers import (
    UNIT_PROPERTIES,
    ServiceState,
    SupervisordBackend,
    SystemdBackend,
    state_from_process_info,
    state_from_show,
)

SEED_TOPOLOGY = str(REPO / "etc" / "seed-host.topology.json")
UNITS = ("dsv4-pd.target", "dsv4-prefill.service", "dsv4-decode.service", "dsv4-router.service")


# --------------------------------------------------------------------------- stand-ins


class Endpoint:
    """A stand-in HTTP server on a free 127.0.0.1 port: `routes[path] = (code, body)`;
    `delay` seconds before each answer; the headers of every request are kept in `seen`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.routes: dict[str, tuple[int, str]] = {}
        self.delay = 0.0
        self.seen: list[dict[str, str]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.seen.append(dict(self.headers))
                time.sleep(endpoint.delay)
                code, body = endpoint.routes.get(self.path, (404, "not found"))
                data = body.encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *a: None  # a client that gave up is no news
        self.closed = False
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.shutdown()
        self.server.server_close()


def workers_body(*workers: tuple[str, str, bool]) -> str:
    """The router's GET /workers (sglang-router 0.3.2 and smg), for (type, url, healthy)."""
    items = [{"id": url, "url": url, "model_id": "fake-model", "worker_type": kind,
              "is_healthy": healthy, "load": 0, "connection_mode": "Http",
              **({"bootstrap_port": 8998} if kind == "prefill" else {}),
              "metadata": {}, "disable_health_check": False}
             for kind, url, healthy in workers]
    stats = {f"{k}_count": sum(w[0] == k for w in workers) for k in ("prefill", "decode")}
    return json.dumps({"workers": items, "stats": {**stats, "regular_count": 0}})


READY = (200, '{"status":"ready","healthy_workers":2,"total_workers":2}')
NOT_READY = (503, '{"status":"not ready","reason":"insufficient healthy workers"}')


@dataclass
class Deployment:
    """The seed config on stand-in ports, a fake systemctl, and a runner for `status`."""

    tmp: Path
    config: Path
    prefill: Endpoint
    decode: Endpoint
    router: Endpoint
    systemctl: Path

    def unit(self, unit: str, state: str = "active", sub: str = "running", *, age: float = 192,
             restarts: int | None = 0, result: str = "success", text: str = "") -> None:
        """What the fake systemctl reports for `unit`: in `state` for `age` seconds."""
        mono = int((time.monotonic() - age) * 1e6)
        when = "Sun 2026-11-29 10:39:27 UTC"
        lines = {
            "LoadState": "loaded", "ActiveState": state, "SubState": sub, "Result": result,
            "StatusText": text,
            "ActiveEnterTimestamp": when if state == "active" else "",
            "ActiveEnterTimestampMonotonic": mono if state == "active" else 0,
            "StateChangeTimestamp": when, "StateChangeTimestampMonotonic": mono,
        }
        if restarts is not None:  # targets have no NRestarts
            lines["NRestarts"] = restarts
        (self.tmp / "units" / unit).write_text("".join(f"{k}={v}\n" for k, v in lines.items()))

    def all_serving(self) -> None:
        for unit in UNITS:
            self.unit(unit, "active", "active" if unit.endswith(".target") else "running",
                      restarts=None if unit.endswith(".target") else 0)
        for engine in (self.prefill, self.decode):
            engine.routes["/health"] = (200, "")
        self.router.routes["/readiness"] = READY
        self.router.routes["/workers"] = (200, workers_body(
            ("prefill", self.prefill.url, True), ("decode", self.decode.url, True)))

    def invoke(self, *args: str, systemctl: str | None = None):
        return CliRunner().invoke(status, [
            "-c", str(self.config), "--topology", SEED_TOPOLOGY,
            "--systemctl", systemctl or str(self.systemctl), *args])


FAKE_SYSTEMCTL = """#!/bin/sh
# stand-in for `systemctl show UNIT --no-pager -p …`: prints units/UNIT as systemctl would
dir={dir}
echo "$@" >> "$dir/calls"
if [ -e "$dir/bus-down" ]; then
  echo "Failed to connect to bus: No such file or directory" >&2; exit 1
fi
if [ -f "$dir/units/$2" ]; then cat "$dir/units/$2"; exit 0; fi
printf 'LoadState=not-found\\nActiveState=inactive\\nSubState=dead\\nResult=success\\n'
"""


def write_config(path: Path, prefill: int, decode: int, router: int, **router_extra) -> Path:
    cfg = yaml.safe_load((REPO / "etc" / "pdsvc.yaml").read_text())
    cfg["prefill"]["port"], cfg["decode"]["port"] = prefill, decode
    cfg["router"]["port"] = router
    cfg["router"].update(router_extra)
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def dep(tmp_path: Path) -> Iterator[Deployment]:
    (tmp_path / "units").mkdir()
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(FAKE_SYSTEMCTL.format(dir=tmp_path))
    systemctl.chmod(0o755)
    prefill, decode, router = Endpoint(), Endpoint(), Endpoint()
    config = write_config(tmp_path / "pdsvc.yaml", prefill.port, decode.port, router.port)
    d = Deployment(tmp_path, config, prefill, decode, router, systemctl)
    d.all_serving()
    yield d
    for e in (prefill, decode, router):
        e.close()


def verdict(output: str) -> str:
    return output.rstrip("\n").splitlines()[-1]


def row(output: str, unit: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(unit))


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
                        "units", "workers", "workers_error", "workers_probe", "runs", "pairs"}
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


# --------------------------------------------------------------------------- the query layer


def test_systemd_backend_reads_show_output_with_an_injected_clock(dep: Deployment) -> None:
    dep.unit("dsv4-decode.service", "active", "running", restarts=4)
    mono = int((dep.tmp / "units" / "dsv4-decode.service").read_text()
               .split("ActiveEnterTimestampMonotonic=")[1].split()[0])
    backend = SystemdBackend(str(dep.systemctl), clock=lambda: mono / 1e6 + 61.5)
    assert backend.state("dsv4-decode.service") == ServiceState(
        unit="dsv4-decode.service", state="active", sub="running", result="success",
        since="Sun 2026-11-29 10:39:27 UTC", since_secs=61.5, restarts=4)


def test_state_uses_the_last_state_change_when_not_active() -> None:
    props = {"ActiveState": "failed", "SubState": "failed", "Result": "watchdog",
             "ActiveEnterTimestampMonotonic": "1000000", "StateChangeTimestampMonotonic": "9000000",
             "StateChangeTimestamp": "then", "NRestarts": "", "LoadState": "loaded"}
    s = state_from_show("x.service", props, now_monotonic=10.0)
    assert (s.since_secs, s.since, s.restarts) == (1.0, "then", None)
    assert s.describe() == "failed (Result: watchdog)"
    never = state_from_show("x.service", {"ActiveState": "inactive",
                                          "StateChangeTimestampMonotonic": "0"}, now_monotonic=5)
    assert (never.since_secs, never.since) == (None, "")


@pytest.mark.parametrize(("secs", "text"), [
    (None, "-"), (0, "0s"), (59.9, "59s"), (192, "3m12s"), (3600, "1h00m"), (7500, "2h05m"),
    (273600, "3d04h"),
])
def test_human_age(secs: float | None, text: str) -> None:
    assert human_age(secs) == text


def _router(host: str, port: int = 8000) -> RouterPlan:
    return RouterPlan(name="r", python="/usr/bin/python3", host=host, port=port,
                      prometheus_host="127.0.0.1",
                      prometheus_port=29000, env=(), argv=(), url="", readiness_url="",
                      generate_url="", liveness_url="", after=())


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://gpu-07:8000/v1/chat/completions"),
    ("::", "http://gpu-07:8000/v1/chat/completions"),
    ("10.1.2.3", "http://10.1.2.3:8000/v1/chat/completions"),
    ("fd00::7", "http://[fd00::7]:8000/v1/chat/completions"),
])
def test_client_url_uses_the_host_clients_reach(host: str, url: str) -> None:
    assert client_url(_router(host), "gpu-07") == url


def test_parse_workers_takes_the_router_view_and_refuses_anything_else() -> None:
    body = workers_body(("prefill", "http://a:1", True), ("decode", "http://b:2", False))
    assert [(w.type, w.url, w.healthy) for w in parse_workers(body)] == [
        ("prefill", "http://a:1", True), ("decode", "http://b:2", False)]
    enum = json.dumps({"workers": [{"url": "http://a:1", "worker_type": {"Prefill": {}},
                                    "is_healthy": True}]})
    assert parse_workers(enum)[0].type == "prefill"
    for bad in ("<html>", "[]", '{"workers": {}}', '{"workers": [1]}'):
        with pytest.raises(ValueError):
            parse_workers(bad)


def test_http_get_bounds_a_hung_endpoint_by_its_timeout() -> None:
    slow = Endpoint()
    slow.delay = 1.5
    slow.routes["/health"] = (200, "")
    try:
        t0 = time.monotonic()
        probe = http_get(f"{slow.url}/health", timeout=0.3)
        assert time.monotonic() - t0 < 1.2
        assert (probe.code, probe.error) == (None, "no answer within 0.3s")
    finally:
        slow.close()


def test_http_get_survives_a_port_that_does_not_speak_http() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def garbage() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        t = threading.Thread(target=garbage, daemon=True)
        t.start()
        probe = http_get(f"http://127.0.0.1:{srv.getsockname()[1]}/health", timeout=2)
        t.join(5)
    assert probe.code is None and probe.error
    refused = http_get(f"http://127.0.0.1:{free_port()}/health")
    assert refused.error == "connection refused"


def test_http_get_ignores_proxy_settings(dep: Deployment, monkeypatch) -> None:
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert http_get(f"{dep.prefill.url}/health").code == 200


# --------------------------------------------------------------------------- supervisord


GROUP = "dsv4-pd"
PROGRAMS = {"prefill": f"{GROUP}:dsv4-prefill", "decode": f"{GROUP}:dsv4-decode",
            "router": f"{GROUP}:dsv4-router"}


class _UnixHandler(SimpleXMLRPCRequestHandler):
    disable_nagle_algorithm = False  # TCP_NODELAY: not on a unix socket


class _UnixXMLRPCServer(ThreadingMixIn, SimpleXMLRPCServer):
    address_family = socket.AF_UNIX
    allow_reuse_address = False
    daemon_threads = True


class FakeSupervisord:
    """supervisord's XML-RPC interface (the part status asks) on a unix socket: `procs[name]`
    is what getProcessInfo('group:name') answers; an unknown name is supervisord's BAD_NAME."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = 1_790_000_000
        self.procs: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.server = _UnixXMLRPCServer(str(path), _UnixHandler, logRequests=False,
                                        allow_none=True)
        for name in ("getProcessInfo", "getState", "getPID", "getAllProcessInfo"):
            self.server.register_function(getattr(self, name), f"supervisor.{name}")
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def set(self, role: str, statename: str, *, age: int = 192, description: str | None = None,
            exitstatus: int = 0, started: bool = True) -> None:
        group, name = PROGRAMS[role].split(":")
        start = self.now - age if started else 0
        running = statename in ("RUNNING", "STARTING", "STOPPING")
        if description is None:
            description = {"RUNNING": f"pid 4242, uptime 0:0{age // 60}:{age % 60:02d}",
                           "FATAL": "Exited too quickly (process log may have details)",
                           "BACKOFF": "Exited too quickly (process log may have details)",
                           }.get(statename, "Nov 29 10:39 AM" if started else "Not started")
        self.procs[PROGRAMS[role]] = {
            "name": name, "group": group, "statename": statename, "description": description,
            "start": start - 600 if not running and started else start,
            "stop": start if not running and started else 0,
            "now": self.now, "exitstatus": exitstatus, "pid": 4242 if running else 0,
            "spawnerr": "",
        }

    def all_running(self) -> None:
        for role in PROGRAMS:
            self.set(role, "RUNNING")

    # the RPC methods
    def getProcessInfo(self, name: str) -> dict[str, Any]:  # noqa: N802 — supervisord's name
        self.calls.append(name)
        if name not in self.procs:
            raise xmlrpc.client.Fault(10, f"BAD_NAME: {name}")
        return self.procs[name]

    def getState(self) -> dict[str, Any]:  # noqa: N802
        return {"statecode": 1, "statename": "RUNNING"}

    def getPID(self) -> int:  # noqa: N802
        return 4000

    def getAllProcessInfo(self) -> list[dict[str, Any]]:  # noqa: N802
        return list(self.procs.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose socket paths stay below sun_path's 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="pdsvc-st-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sv(dep: Deployment, short_dir: Path) -> Iterator[FakeSupervisord]:
    fake = FakeSupervisord(short_dir / "sv.sock")
    fake.all_running()
    yield fake
    fake.close()


def sv_invoke(dep: Deployment, sv: FakeSupervisord, *args: str):
    return dep.invoke("--backend", "supervisord", "--socket", str(sv.path), *args)


def test_supervisord_all_running_serves_and_shows_the_group(dep: Deployment,
                                                            sv: FakeSupervisord) -> None:
    result = sv_invoke(dep, sv)
    out = result.output
    assert result.exit_code == 0, out
    assert out.startswith("dsv4 PD stack (supervisord)\n")
    # no target under supervisord: the first row is the group and the supervisord running it
    assert re.search(r"^dsv4-pd\s+active \(running\)\s+-\s+-\s+-\s+"
                     r"supervisord pid 4000: 3 of 3 programs running$", row(out, "dsv4-pd ")), out
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
    assert "2 of 3 programs running" in row(result.output, "dsv4-pd ")
    assert verdict(result.output).startswith(
        "not serving: dsv4-pd:dsv4-decode is failed (fatal); router not ready: /readiness 503")


def test_supervisord_starting_prefill_is_activating(dep: Deployment,
                                                    sv: FakeSupervisord) -> None:
    sv.set("prefill", "STARTING", age=5, description="")
    dep.prefill.routes["/health"] = (503, "")
    result = sv_invoke(dep, sv)
    assert result.exit_code == 1, result.output
    assert re.search(r"activating \(starting\)\s+5s\s+-\s+/health 503",
                     row(result.output, PROGRAMS["prefill"])), result.output
    assert verdict(result.output) == "not serving: dsv4-pd:dsv4-prefill is activating (starting)"


def test_supervisord_json_has_the_same_facts(dep: Deployment, sv: FakeSupervisord) -> None:
    sv.set("router", "BACKOFF", age=3)
    result = sv_invoke(dep, sv, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["backend"] == "supervisord"
    assert [(u["role"], u["unit"], u["state"], u["sub"]) for u in doc["units"]] == [
        ("target", "dsv4-pd", "active", "running"),
        ("prefill", PROGRAMS["prefill"], "active", "running"),
        ("decode", PROGRAMS["decode"], "active", "running"),
        ("router", PROGRAMS["router"], "failed", "backoff")]
    assert all(u["restarts"] is None for u in doc["units"])
    assert doc["units"][1]["since_secs"] == 192.0
    assert doc["problems"] == ["dsv4-pd:dsv4-router is failed (backoff)"]


def test_supervisord_absent_socket_is_rows_with_the_error_not_a_traceback(
        dep: Deployment, short_dir: Path) -> None:
    missing = short_dir / "nobody.sock"
    result = dep.invoke("--backend", "supervisord", "--socket", str(missing))
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    why = f"supervisord: {missing}: no such socket — is supervisord running?"
    for unit in ("dsv4-pd ", *PROGRAMS.values()):
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
        backend = SupervisordBackend(str(hung), {}, timeout=0.3)
        t0 = time.monotonic()
        state = backend.state("dsv4-pd:dsv4-decode")
        assert time.monotonic() - t0 < 2
    assert state.error == f"supervisord: {hung}: no answer within 0.3s"


def test_supervisord_unknown_program_is_not_installed(dep: Deployment,
                                                      sv: FakeSupervisord) -> None:
    del sv.procs[PROGRAMS["router"]]
    result = sv_invoke(dep, sv)
    assert result.exit_code == 1
    assert "not installed" in row(result.output, PROGRAMS["router"])
    assert verdict(result.output) == "not serving: dsv4-pd:dsv4-router is not installed"


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


# --------------------------------------------------------------------------- several hosts


@pytest.fixture
def hosts_dep(dep: Deployment) -> Iterator[Deployment]:
    """The same deployment over three hosts (loopback addresses stand in for them): the
    router on 127.0.0.3, prefill on 127.0.0.1, decode on 127.0.0.2."""
    decode, router = Endpoint("127.0.0.2"), Endpoint("127.0.0.3")
    cfg = yaml.safe_load(dep.config.read_text())
    cfg["decode"]["port"], cfg["router"]["port"] = decode.port, router.port
    cfg["decode"]["gpus"] = [0, 1, 2, 3]
    cfg["hosts"] = {"lb": {"address": "127.0.0.3", "run": ["router"]},
                    "gpu-a": {"address": "127.0.0.1", "run": ["prefill"]},
                    "gpu-b": {"address": "127.0.0.2", "run": ["decode"]}}
    dep.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    old = dep.decode, dep.router
    dep.decode, dep.router = decode, router
    dep.all_serving()
    yield dep
    decode.close()
    router.close()
    dep.decode, dep.router = old


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
