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
                      generate_url="", liveness_url="")


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




# --------------------------------------------------------------------------- several routers


class AllActive:
    """A service manager whose every unit is active."""

    name = "systemd"

    def state(self, unit: str) -> ServiceState:
        return ServiceState(unit=unit, state="active", sub="running", result="success",
                            since="", since_secs=1.0, restarts=0)


def test_status_shows_each_routers_list_and_names_a_gap_in_any(tmp_path) -> None:
    """router.replicas: 2: a row per router and the front, each router's own worker list, and
    an engine missing from the second router's list is a problem (serving goes on)."""
    from dataclasses import replace

    from pdsvc.config.load import parse_config
    from pdsvc.plan.build import build_plan
    from pdsvc.status.collect import collect
    from pdsvc.status.format import format_text, report_dict

    eps = [Endpoint() for _ in range(4)]  # prefill, decode, router-0, router-1
    try:
        text = "model: {path: /srv/m}\nrouter: {replicas: 2}\n"
        plan = build_plan(parse_config(text, "c.yaml"), None, config_source="c.yaml",
                          config_text=text)
        engines = tuple(replace(e, url=ep.url, health_url=f"{ep.url}/health")
                        for e, ep in zip(plan.engines, eps, strict=False))
        routers = tuple(replace(r, url=ep.url, readiness_url=f"{ep.url}/readiness")
                        for r, ep in zip(plan.routers, eps[2:], strict=True))
        plan = replace(plan, engines=engines, routers=routers,
                       paths=replace(plan.paths, router_key=str(tmp_path / "none")))
        for ep in eps[:2]:
            ep.routes["/health"] = (200, "")
        both = workers_body(("prefill", eps[0].url, True), ("decode", eps[1].url, True))
        for ep in eps[2:]:
            ep.routes["/readiness"] = (200, '{"status":"ready"}')
        eps[2].routes["/workers"] = (200, both)
        eps[3].routes["/workers"] = (200, workers_body(("prefill", eps[0].url, True)))
        report = collect(plan, AllActive(), hostname="gpu-07")  # type: ignore[arg-type]
        out = format_text(report)
        assert [u.role for u in report.units] == [
            "target", "prefill", "decode", "router", "router", "front"]
        assert f"router workers (GET {eps[3].url}/workers):" in out
        assert report.serving and report.problems[0] == (
            f"the router {eps[3].url} does not list the decode worker {eps[1].url}")
        # no HAProxy here: its view is a problem of its own, the stack still serves
        assert report.problems[1:] == (f"the front: cannot read HAProxy's runtime API at "
                                       f"{plan.front.socket}: No such file or directory",)
        assert "send requests to: http://gpu-07:8000/v1/chat/completions" in out
        more = report_dict(report)["more_routers"]
        assert [len(m["workers"]) for m in more] == [1]
    finally:
        for ep in eps:
            ep.close()
