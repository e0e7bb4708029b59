"""`pdsvc status`'s facts, piece by piece: systemctl's answer read with an injected clock,
ages, the URL clients reach, the router's /workers, and the HTTP client's bounds.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from ports import free_port
from status_stands import (
    Deployment,
    Endpoint,
    workers_body,
)

from pdsvc.plan.build import RouterPlan
from pdsvc.status.collect import client_url, http_get, parse_workers
from pdsvc.status.format import human_age
from pdsvc.status.managers import (
    ServiceState,
    Systemd,
    state_from_show,
)

# --------------------------------------------------------------------------- the query layer


def test_systemd_backend_reads_show_output_with_an_injected_clock(dep: Deployment) -> None:
    dep.unit("dsv4-decode.service", "active", "running", restarts=4)
    mono = int((dep.tmp / "units" / "dsv4-decode.service").read_text()
               .split("ActiveEnterTimestampMonotonic=")[1].split()[0])
    backend = Systemd(systemctl=str(dep.systemctl), clock=lambda: mono / 1e6 + 61.5)
    assert backend.state("dsv4-decode.service") == ServiceState(
        unit="dsv4-decode.service", state="active", sub="running", result="success",
        since="Sun 2026-11-29 10:39:27 UTC", since_secs=pytest.approx(61.5), restarts=4)


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
    assert client_url(_router(host).host, _router(host).port, "gpu-07") == url


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


