"""A profile hold's pause of the routers' health checks (pdsvc/ship/runtime/membership.py
``Membership.pause``) against the real sglang-router 0.3.2 from PyPI (the serve venv) and two
stand-in engines, on loopback: the router was started with ``--disable-circuit-breaker`` and
must stay so through a pause and a resume.

0.3.2 has no PATCH route; its PUT takes ``disable_health_check`` but rebuilds the worker with
the default circuit breaker, whatever the router was started with. With that PUT, the
decode's failures at its thaw opened the breaker on both workers, and every request got 503
for its timeout (benchmarks/profile.py, 1P1D, 112 of 994 requests). The runtime registers the
worker afresh instead: the failures here stay the engine's own (502), never the breaker's 503.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import standin_client
from ports import free_ports
from standin_client import wait_until

from pdsvc.ship.runtime.membership import Routers, Worker

engines, model_dir = standin_client.engines, standin_client.model_dir


def call(base: str, path: str, body: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback only
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def router(serve_python: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """sglang-router 0.3.2 on loopback, its breaker off, one retry: (base URL, metrics URL)."""
    port, metrics = free_ports(2)
    log = tmp_path / "router.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(serve_python), "-m", "sglang_router.launch_router", "--pd-disaggregation",
             "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(metrics), "--disable-circuit-breaker",
             "--retry-max-retries", "1"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _listens(base), 30, "the router up")
        assert proc.poll() is None, log.read_text()
        yield base, f"http://127.0.0.1:{metrics}/metrics"
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _listens(base: str) -> bool:
    try:
        return call(base, "/liveness", timeout=1)[0] == 200
    except OSError:
        return False


def listed(base: str) -> list[tuple[str, bool]]:
    return [(w["worker_type"], w["disable_health_check"])
            for w in json.loads(call(base, "/workers")[1])["workers"]]


def test_a_pause_and_a_resume_keep_the_routers_circuit_breaker_off(engines, router) -> None:
    base, metrics = router
    pre, dec = engines("prefill"), engines("decode")
    pre.wait_healthy(10)
    dec.wait_healthy(10)
    lines: list[str] = []
    members = {
        role: Routers([base], Worker(f"http://127.0.0.1:{eng.port}", role,
                                     eng.bport if role == "prefill" else None), None,
                      lines.append)
        for role, eng in (("prefill", pre), ("decode", dec))}
    for m in members.values():
        wait_until(m.join, 15, "registered")
    wait_until(lambda: len(listed(base)) == 2, 15, "both listed")
    assert call(base, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})[0] \
        == 200
    for m in members.values():  # what a profile hold does, engine by engine
        assert m.pause(True) == {base: ""}, lines
    assert sorted(listed(base)) == [("decode", True), ("prefill", True)]
    for m in members.values():
        assert m.pause(False) == {base: ""}, lines
    assert sorted(listed(base)) == [("decode", False), ("prefill", False)]  # once each
    dec.proc.kill()
    dec.proc.wait(5)
    codes = [call(base, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})[0]
             for _ in range(15)]
    states = [line for line in call(metrics, "")[1].splitlines()
              if line.startswith("smg_worker_cb_state{")]
    # the dead decode's own failures, each of them: no breaker opened to answer 503 instead
    assert 503 not in codes and set(codes) <= {500, 502}, codes
    assert states and all(line.endswith(" 0") for line in states), states
