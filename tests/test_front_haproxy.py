"""The front as users run it: Debian's HAProxy with the config pdsvc renders
(render/front.py), two stand-in routers on loopback, and the runtime's `front drain|ready`
(runtime/front.py) on HAProxy's real runtime API. A router that refuses, resets or closes
without a response costs the client nothing; a drained router gets no new request and its
drain waits for the one it serves; a router put back is UP before `ready` returns."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import require
from ports import free_port

from pdsvc.config.load import parse_config
from pdsvc.plan.build import build_plan
from pdsvc.render.front import front_config
from pdsvc.ship.runtime.front import Front, run_front

HAPROXY = "/usr/sbin/haproxy"


@dataclass
class Router:
    """A stand-in router: answers GET /readiness and POST /generate with its name; ``mode``
    makes it close without a response (``drop``), wait (``slow``) first, or answer 503 to
    both as a router without workers does (``unready``)."""

    name: str
    port: int = field(default_factory=free_port)
    mode: str = "ok"
    served: int = 0
    server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def reply(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def reply_503(self) -> None:  # sglang-router 0.3.2's words
                body = b'{"status":"not ready","reason":"insufficient healthy workers"}'
                self.send_response(503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if router.mode == "unready":
                    return self.reply_503()
                self.reply(b"ok")

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if router.mode == "drop":  # like a router killed mid-request
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if router.mode == "unready":
                    return self.reply_503()
                if router.mode == "slow":
                    time.sleep(1.5)
                router.served += 1
                self.reply(router.name.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *a: None  # type: ignore[method-assign]  # drop mode
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@dataclass
class Lab:
    port: int
    socket: str
    routers: list[Router]
    metrics_port: int = 0

    def post(self, body: bytes = b'{"text": "hi"}') -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def front(self, name: str) -> Front:
        return Front(self.socket, "routers", name, lambda line: None)

    def status(self, name: str) -> str:
        return (self.front(name).row() or {}).get("status", "")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    if not shutil.which(HAPROXY):
        require("haproxy is not installed (apt install haproxy)")
    routers = [Router("r0"), Router("r1")]
    for r in routers:
        r.start()
    port = free_port()
    text = "model: {path: /srv/m}\nformat: systemd\nrouter: {replicas: 2, host: 127.0.0.1, " \
           f"port: {port}}}\n"
    plan = build_plan(parse_config(text, "c.yaml"), None, config_source="c.yaml",
                      config_text=text)
    assert plan.front is not None
    sock = str(tmp_path / "admin.sock")
    front = replace(plan.front, socket=sock, check_interval_ms=200, servers=tuple(
        (r.name, f"127.0.0.1:{r.port}") for r in routers), prometheus_port=free_port())
    cfg = tmp_path / "front.cfg"
    cfg.write_text(front_config(front, ["test"]))
    proc = subprocess.Popen([HAPROXY, "-Ws", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "NOTIFY_SOCKET": ""})
    try:
        lab = Lab(port, sock, routers, front.prometheus_port)
        deadline = time.monotonic() + 10
        while True:
            try:
                if all(lab.status(r.name).startswith("UP") for r in routers):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "haproxy did not come up"
            time.sleep(0.05)
        yield lab
    finally:
        proc.terminate()
        proc.wait(10)
        for r in routers:
            r.stop()


def test_the_rendered_config_is_valid_for_haproxy(lab: Lab) -> None:
    """(the fixture started HAProxy with it, both routers UP) and requests share them"""
    answers = [lab.post() for _ in range(6)]
    assert {a for a in answers} == {(200, "r0"), (200, "r1")}


def test_a_router_gone_or_closing_without_a_response_costs_no_request(lab: Lab) -> None:
    r0, r1 = lab.routers
    r1.stop()  # refused at once: retried on r0, whatever the health check says yet
    assert [lab.post() for _ in range(8)] == [(200, "r0")] * 8
    r1.start()
    r1.mode = "drop"  # accepts, then closes without a byte: an empty response, retried
    assert [lab.post() for _ in range(8)] == [(200, "r0")] * 8


def test_a_router_without_workers_costs_no_request_and_leaves_rotation(lab: Lab) -> None:
    """Its /readiness and every request answer 503 (cut off from the engines): each request
    it gets is sent again to the other router at once, and two checks take it out."""
    r0, r1 = lab.routers
    r1.mode = "unready"
    assert [lab.post() for _ in range(8)] == [(200, "r0")] * 8
    deadline = time.monotonic() + 5
    while not lab.status("r1").startswith("DOWN"):
        assert time.monotonic() < deadline, lab.status("r1")
        time.sleep(0.05)
    r1.mode = "ok"  # ready again: back in rotation by its own check
    deadline = time.monotonic() + 5
    while not lab.status("r1").startswith("UP"):
        assert time.monotonic() < deadline, lab.status("r1")
        time.sleep(0.05)
    assert (200, "r1") in [lab.post() for _ in range(4)]


def test_drain_waits_for_the_request_in_flight_and_sends_none_new(lab: Lab) -> None:
    r0, r1 = lab.routers
    r0.mode = r1.mode = "slow"
    results: list[tuple[int, str]] = []
    flights = [threading.Thread(target=lambda: results.append(lab.post())) for _ in range(2)]
    for t in flights:
        t.start()
    time.sleep(0.3)  # one on each router
    lines: list[str] = []
    began = time.monotonic()
    assert run_front("drain", lab.socket, "routers", "r0", 10, lines.append) == 0
    took = time.monotonic() - began
    # it waited for r0's request, and saw it end before its bound: "drained in", never "still
    # serves … after" (the mechanism, whatever the machine's load stretches the seconds to)
    assert took > 0.5, took
    assert "drained in" in lines[-1] and lab.status("r0").startswith("DRAIN"), lines
    for t in flights:
        t.join()
    assert sorted(results) == [(200, "r0"), (200, "r1")]
    r0.mode = r1.mode = "ok"
    assert [lab.post() for _ in range(4)] == [(200, "r1")] * 4
    # back: UP (its health check passed) before `ready` returns, and it serves again
    assert run_front("ready", lab.socket, "routers", "r0", 10, lines.append) == 0
    assert "back in rotation" in lines[-1] and lab.status("r0").startswith("UP")
    assert (200, "r0") in [lab.post() for _ in range(4)]


def test_a_router_down_stays_drained_until_ready(lab: Lab) -> None:
    """A crash runs the unit's ExecStop= too: a router drained while down is not sent
    requests once its process is back, only once its unit says ready."""
    r0, _ = lab.routers
    r0.stop()
    run_front("drain", lab.socket, "routers", "r0", 5, lambda line: None)
    r0.start()
    time.sleep(0.6)  # health checks see it answer again
    assert [lab.post() for _ in range(4)] == [(200, "r1")] * 4


def test_no_front_is_one_line_and_exit_0(tmp_path: Path) -> None:
    lines: list[str] = []
    assert run_front("drain", str(tmp_path / "none.sock"), "routers", "r0", 1,
                     lines.append) == 0
    assert len(lines) == 1 and "cannot reach HAProxy's runtime API" in lines[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "127.0.0.1", "localhost"])
def test_every_router_host_the_schema_takes_is_a_valid_bind(host: str, tmp_path: Path) -> None:
    if not shutil.which(HAPROXY):
        require("haproxy is not installed (apt install haproxy)")
    text = f"model: {{path: /srv/m}}\nrouter: {{replicas: 2, host: '{host}'}}\n"
    plan = build_plan(parse_config(text, "c.yaml"), None, config_source="c.yaml",
                      config_text=text)
    assert plan.front is not None
    cfg = tmp_path / "front.cfg"
    cfg.write_text(front_config(replace(plan.front, socket=str(tmp_path / "s")), ["t"]))
    r = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_status_reads_each_router_as_the_front_sees_it(lab: Lab) -> None:
    """`pdsvc status`'s view of the front (status/collect.front_view): both routers UP, then
    one drained is a problem naming it; all out is said as such."""
    from pdsvc.status.collect import front_problems, front_view

    text = "model: {path: /srv/m}\nrouter: {replicas: 2}\n"
    plan = build_plan(parse_config(text, "c.yaml"), None, config_source="c.yaml",
                      config_text=text)
    assert plan.front is not None
    plan = replace(plan, front=replace(plan.front, socket=lab.socket,
                                       servers=(("r0", "-"), ("r1", "-"))))
    front, error = front_view(plan)
    assert error is None and [(s.name, s.in_rotation) for s in front or ()] == [
        ("r0", True), ("r1", True)]
    assert front_problems(plan, front, error) == []
    run_front("drain", lab.socket, "routers", "r0", 5, lambda line: None)
    front, error = front_view(plan)
    assert front_problems(plan, front, error) == [
        "the front does not send requests to r0 (DRAIN)"]
    run_front("drain", lab.socket, "routers", "r1", 5, lambda line: None)
    front, error = front_view(plan)
    assert front_problems(plan, front, error)[-1] == (
        "the front has no router in rotation: every request gets its 503")


def test_the_exporter_says_each_routers_state_as_the_alerts_read_it(lab: Lab) -> None:
    """HAProxy's own exporter (the pdsvc-front scrape target): haproxy_server_status with
    proxy, server and state labels, the current state at 1 (monitoring._front_alerts)."""
    def status() -> str:
        conn = http.client.HTTPConnection("127.0.0.1", lab.metrics_port, timeout=5)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    assert 'haproxy_server_status{proxy="routers",server="r0",state="UP"} 1' in status()
    run_front("drain", lab.socket, "routers", "r0", 5, lambda line: None)
    text = status()
    assert 'haproxy_server_status{proxy="routers",server="r0",state="UP"} 0' in text
    assert 'haproxy_server_status{proxy="routers",server="r0",state="DRAIN"} 1' in text
