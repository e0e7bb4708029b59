"""Stand-ins for `pdsvc status` tests: a fake `systemctl` (a script printing `systemctl
show`'s KEY=VALUE lines from files a test writes), a fake supervisord (a stdlib XML-RPC server on
a unix socket answering what supervisorctl asks), and stdlib HTTP servers on free 127.0.0.1
ports playing the engines' /health and the router's /readiness and /workers. The fixtures
(dep, hosts_dep, sv, short_dir) are registered in tests/conftest.py.
"""

from __future__ import annotations

import functools
import json
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

from pdsvc.cli.status import status
from pdsvc.status import managers

REPO = Path(__file__).resolve().parents[2]
SEED_TOPOLOGY = str(REPO / "etc" / "seed-host.topology.json")
# The stand-ins' CLOCK_MONOTONIC: this machine's, as if it had booted a day earlier, so that a
# unit `age` seconds old has a timestamp after boot even on a machine up for less than `age`
# (systemd never reports a monotonic timestamp before boot). status's systemd backend reads
# the same clock (the dep fixture).
BOOTED_EARLIER_S = 86400.0


def monotonic() -> float:
    return time.monotonic() + BOOTED_EARLIER_S


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
        mono = int((monotonic() - age) * 1e6)
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
def dep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    monkeypatch.setattr("pdsvc.status.managers.Systemd",
                        functools.partial(managers.Systemd, clock=monotonic))
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



# --------------------------------------------------------------------------- supervisord


#: The row in place of the target: the supervisord that runs the bundle.
SUPERVISORD = "dsv4-supervisord"
#: Each program is a group of its own, named as it (supervisorctl's name is the program's).
PROGRAMS = {"prefill": "dsv4-prefill", "decode": "dsv4-decode", "router": "dsv4-router"}


class _UnixHandler(SimpleXMLRPCRequestHandler):
    disable_nagle_algorithm = False  # TCP_NODELAY: not on a unix socket


class _UnixXMLRPCServer(ThreadingMixIn, SimpleXMLRPCServer):
    address_family = socket.AF_UNIX
    allow_reuse_address = False
    daemon_threads = True


class FakeSupervisord:
    """supervisord's XML-RPC interface (the part status asks) on a unix socket: `procs[name]`
    is what getProcessInfo(name) answers; an unknown name is supervisord's BAD_NAME."""

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
        group = name = PROGRAMS[role]
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


