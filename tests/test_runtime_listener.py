"""The runtime's supervisord event listener (`runtime eventlistener`, runtime/listener.py):
supervisord's event protocol on stdin/stdout against a fake of its XML-RPC interface. On
PROCESS_STATE_STARTING of a prefill it restarts an older coupled decode (systemd's PartOf=); on
an engine program's PROCESS_STATE_EXITED or BACKOFF it takes the engine out of every router
(the units' ExecStopPost=). Under the real supervisord: tests/test_e2e_supervisord.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import xmlrpc.client
from pathlib import Path

import pytest
from runtime_procs import RUNTIME, RUNTIME_PYTHON

from pdsvc.ship.runtime.cli import parse_args
from pdsvc.ship.runtime.listener import run_eventlistener


class FakeSupervisor:
    """supervisord's XML-RPC `supervisor.*` calls the listener makes, recorded."""

    def __init__(self, infos: dict[str, dict]) -> None:
        self.infos = infos
        self.calls: list[tuple] = []
        self.supervisor = self

    def getProcessInfo(self, name: str) -> dict:  # noqa: N802 - supervisord's API
        return self.infos[name]

    def stopProcess(self, name: str, wait: bool) -> bool:  # noqa: N802
        self.calls.append(("stop", name, wait))
        return True

    def startProcess(self, name: str, wait: bool) -> bool:  # noqa: N802
        self.calls.append(("start", name, wait))
        return True


def _event(name: str, group: str, from_state: str, event: str = "PROCESS_STATE_STARTING"
           ) -> bytes:
    payload = f"processname:{name} groupname:{group} from_state:{from_state} tries:0"
    return (f"ver:3.0 server:supervisor serial:1 pool:l poolserial:1 eventname:{event} "
            f"len:{len(payload)}\n{payload}").encode()


def _listen(infos: dict, *events: bytes) -> tuple[FakeSupervisor, bytes, str]:
    rpc = FakeSupervisor(infos)
    args, _ = parse_args(["eventlistener", "--name", "t-restarts", "--restart-with",
                              "g:decode=g:prefill"])
    out = io.BytesIO()
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        assert run_eventlistener(args, io.BytesIO(b"".join(events)), out, rpc) == 0
    finally:
        sys.stderr = old
    return rpc, out.getvalue(), err.getvalue()


def test_listener_restarts_an_older_decode_when_prefill_restarts():
    infos = {"g:prefill": {"start": 1000, "statename": "STARTING", "pid": 2},
             "g:decode": {"start": 900, "statename": "RUNNING", "pid": 3}}
    rpc, out, err = _listen(infos, _event("prefill", "g", "EXITED"))
    assert rpc.calls == [("stop", "g:decode", True), ("start", "g:decode", False)]
    assert out == b"READY\nRESULT 2\nOKREADY\n"  # the protocol: READY, RESULT, READY again
    assert "g:prefill (re)started (from EXITED): restarting g:decode" in err


def test_listener_names_a_program_alone_in_its_group_by_itself():
    """The bundle's programs are groups of their own: supervisord's event says
    groupname:prefill processname:prefill, and `prefill` is its supervisorctl name."""
    rpc = FakeSupervisor({"prefill": {"start": 1000, "statename": "STARTING", "pid": 2},
                          "decode": {"start": 900, "statename": "RUNNING", "pid": 3}})
    args, _ = parse_args(["eventlistener", "--name", "t", "--restart-with", "decode=prefill"])
    old, sys.stderr = sys.stderr, io.StringIO()
    try:
        event = _event("prefill", "prefill", "EXITED")
        assert run_eventlistener(args, io.BytesIO(event), io.BytesIO(), rpc) == 0
    finally:
        sys.stderr = old
    assert rpc.calls == [("stop", "decode", True), ("start", "decode", False)]


@pytest.mark.parametrize(("decode", "event"), [
    ({"start": 1000, "statename": "STARTING", "pid": 3}, _event("prefill", "g", "STOPPED")),
    ({"start": 1001, "statename": "RUNNING", "pid": 3}, _event("prefill", "g", "STOPPED")),
    ({"start": 900, "statename": "STOPPED", "pid": 0}, _event("prefill", "g", "EXITED")),
    ({"start": 900, "statename": "RUNNING", "pid": 3}, _event("decode", "g", "EXITED")),
    ({"start": 900, "statename": "RUNNING", "pid": 3},
     _event("prefill", "g", "STARTING", "PROCESS_STATE_RUNNING")),
], ids=["started-together-at-boot", "younger", "stopped", "other-program", "other-event"])
def test_listener_leaves_decode_alone(decode: dict, event: bytes):
    infos = {"g:prefill": {"start": 1000, "statename": "STARTING", "pid": 2}, "g:decode": decode}
    rpc, _, _ = _listen(infos, event)
    assert rpc.calls == []


def test_listener_survives_a_failed_call():
    class Broken(FakeSupervisor):
        def stopProcess(self, name, wait):  # noqa: N802
            raise xmlrpc.client.Fault(10, "BAD_NAME")

    infos = {"g:prefill": {"start": 1000, "statename": "STARTING", "pid": 2},
             "g:decode": {"start": 900, "statename": "RUNNING", "pid": 3}}
    rpc = Broken(infos)
    args, _ = parse_args(["eventlistener", "--name", "t", "--restart-with",
                              "g:decode=g:prefill"])
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        event = _event("prefill", "g", "EXITED")
        assert run_eventlistener(args, io.BytesIO(event * 2), io.BytesIO(), rpc) == 0
    finally:
        sys.stderr = old
    assert err.getvalue().count("cannot restart g:decode after g:prefill started") == 2


def test_eventlistener_usage():
    def run(*args):
        return subprocess.run([RUNTIME_PYTHON, str(RUNTIME), *args], capture_output=True,
                              text=True, timeout=10, check=False, env={
                                  k: v for k, v in os.environ.items()
                                  if k != "SUPERVISOR_SERVER_URL"})

    help_ = run("eventlistener", "--help")
    assert help_.returncode == 0 and "--restart-with" in help_.stdout
    assert "Exit status" in help_.stdout
    for argv in (["eventlistener", "--name", "x"],
                 ["eventlistener", "--name", "x", "--restart-with", "nodependent"],
                 ["eventlistener", "--name", "x", "--restart-with", "a=b", "--", "cmd"]):
        result = run(*argv)
        assert result.returncode == 2 and "Traceback" not in result.stderr, argv
    no_server = run("eventlistener", "--name", "x", "--restart-with", "a=b")
    assert no_server.returncode == 2 and "SUPERVISOR_SERVER_URL is unset" in no_server.stderr
    for mode in ("engine", "router"):
        text = run(mode, "--help").stdout
        for name in ("--wait-for", "--watchdog-secs", "--kill-tree", "--stop-timeout"):
            assert name in text, (mode, name)


def test_listener_takes_an_engine_whose_runtime_died_out_of_every_router(tmp_path: Path):
    """supervisord's ExecStopPost=: PROCESS_STATE_EXITED of an engine program deletes its
    entry from each router; another program's exit, and a STOPPED program, delete nothing."""
    from pair_fakes import FakeRouter

    from pdsvc.ship.runtime.membership import Routers, Worker

    routers = {"http://r0:8100": FakeRouter(), "http://r1:8101": FakeRouter()}

    def call(url: str, *a, **kw):  # noqa: ANN002, ANN003, ANN202
        return next(r for base, r in routers.items() if url.startswith(base))(url, *a, **kw)

    for url in ("http://10.0.0.2:30000", "http://10.0.0.3:30001"):
        assert Routers(list(routers), Worker(url, "prefill", 8998), "k", print,
                       call=call).join()
    key = tmp_path / "key"
    key.write_text("k")
    args, _ = parse_args(["eventlistener", "--name", "t-events", "--leave",
                          "p=http://10.0.0.2:30000", "--leave", "q=http://10.0.0.3:30001",
                          "--router", "http://r0:8100", "--router", "http://r1:8101",
                          "--control-plane-key", str(key)])
    # q died within its startsecs (a fast load): supervisord says BACKOFF, not EXITED
    events = [_event("router", "router", "RUNNING", "PROCESS_STATE_EXITED"),
              _event("p", "p", "RUNNING", "PROCESS_STATE_STOPPED"),
              _event("p", "p", "RUNNING", "PROCESS_STATE_EXITED"),
              _event("q", "q", "STARTING", "PROCESS_STATE_BACKOFF")]
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        assert run_eventlistener(args, io.BytesIO(b"".join(events)), io.BytesIO(),
                                 FakeSupervisor({}), call=call) == 0
    finally:
        sys.stderr = old
    for r in routers.values():
        assert r.workers == [] and [m for m, _ in r.calls].count("DELETE") == 2
    said = err.getvalue()
    assert said.count("deregistered it from") == 4 and "exited unexpectedly" in said
    assert "exited while starting" in said
    assert "k\n" not in said
