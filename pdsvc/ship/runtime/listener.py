"""supervisord event listener: restart decode whenever prefill (re)starts (PartOf= for
supervisord), take an engine whose runtime died out of every router (ExecStopPost= for
supervisord), and the XML-RPC client over supervisord's unix socket."""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import sys
import xmlrpc.client
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from .endings import Exit
from .leaving import leave_after_end
from .notify import Log
from .probe import HttpReply, http_call


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over supervisord's unix control socket (``unix:///run/x.sock``)."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost")
        self._path = path
        self._sock_timeout = timeout

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._sock_timeout)
        sock.connect(self._path)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__()
        self._path = path
        self._sock_timeout = timeout

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self._path, self._sock_timeout)


def supervisor_rpc(server_url: str, timeout: float | None = None) -> xmlrpc.client.ServerProxy:
    """supervisord's XML-RPC interface at ``SUPERVISOR_SERVER_URL`` (unix:// or http://)."""
    if server_url.startswith("unix://"):
        transport = _UnixTransport(server_url[len("unix://") :], timeout)
        return xmlrpc.client.ServerProxy("http://localhost/RPC2", transport=transport)
    return xmlrpc.client.ServerProxy(server_url.rstrip("/") + "/RPC2")


def _tokens(text: str) -> dict[str, str]:
    """supervisord's ``key:value key:value`` event header/payload (values have no spaces)."""
    return dict(item.split(":", 1) for item in text.split() if ":" in item)


def namespec(group: str, process: str) -> str:
    """supervisorctl's name of a process: ``group:process``, or ``process`` alone when the
    program is its own group."""
    return process if group == process else f"{group}:{process}"


class Restarter:
    """Restart each dependent program when its trigger (re)starts, unless the dependent is
    already younger than the trigger (both just started together, e.g. at boot)."""

    RESTARTABLE = ("STARTING", "RUNNING")

    def __init__(self, couples: Mapping[str, Sequence[str]], rpc: object, log: Log) -> None:
        self.couples = couples  # trigger namespec -> dependent namespecs
        self.rpc = rpc
        self.log = log

    def on_starting(self, payload: Mapping[str, str]) -> None:
        trigger = namespec(payload.get("groupname", ""), payload.get("processname", ""))
        for dependent in self.couples.get(trigger, ()):
            try:
                self._restart_if_older(trigger, dependent, payload.get("from_state", "?"))
            except (OSError, xmlrpc.client.Error) as exc:
                self.log(f"cannot restart {dependent} after {trigger} started: {exc}")

    def _restart_if_older(self, trigger: str, dependent: str, from_state: str) -> None:
        api = self.rpc.supervisor  # type: ignore[attr-defined]
        started = api.getProcessInfo(trigger)["start"]
        info = api.getProcessInfo(dependent)
        if info["statename"] not in self.RESTARTABLE or info["start"] >= started:
            return  # not running, or already an instance started with (or after) the trigger
        self.log(
            f"{trigger} (re)started (from {from_state}): restarting {dependent}, whose "
            f"instance (pid {info['pid']}) is {started - info['start']} s older"
        )
        try:
            api.stopProcess(dependent, True)  # waits; supervisord's stopwaitsecs bounds it
        except xmlrpc.client.Fault as fault:
            if "NOT_RUNNING" not in fault.faultString:
                raise
        try:
            api.startProcess(dependent, False)
        except xmlrpc.client.Fault as fault:
            if "ALREADY_STARTED" not in fault.faultString:
                raise
        self.log(f"{dependent} restarted")


#: A program's process ended without a stop asked for: from RUNNING (EXITED) or while still
#: STARTING, within its startsecs (BACKOFF: supervisord's events.py, supervisor 4.x). An
#: engine can be registered before startsecs (a fast load), so both count.
LEAVE_EVENTS = ("PROCESS_STATE_EXITED", "PROCESS_STATE_BACKOFF")


class Leaver:
    """An engine program that exited without a stop asked for (kill -9 of its runtime, the
    OOM killer: LEAVE_EVENTS) leaves every router now, not when the routers' health checks
    give up on it (leaving.leave_after_end, the systemd units' ExecStopPost=). A runtime
    that stopped cleanly had left already (supervisord reports STOPPED then)."""

    def __init__(self, leaves: Mapping[str, str], routers: Sequence[str], key: str | None,
                 log: Log, call: Callable[..., HttpReply] = http_call) -> None:
        self.leaves = leaves  # program namespec -> the engine's URL as the routers list it
        self.routers = list(routers)
        self.key = key
        self.log = log
        self.call = call  # the HTTP client (tests: a fake router)

    def on_exited(self, payload: Mapping[str, str]) -> None:
        name = namespec(payload.get("groupname", ""), payload.get("processname", ""))
        url = self.leaves.get(name)
        if url is None or not self.routers:
            return
        how = {"SERVICE_RESULT": "exited " + (
                   "while starting" if payload.get("from_state") == "STARTING" else
                   "as expected" if payload.get("expected") == "1" else "unexpectedly"),
               "EXIT_CODE": f"pid {payload.get('pid', '?')}"}
        leave_after_end(self.routers, url, self.key, self.log, env=how, call=self.call)


def run_eventlistener(
    args: argparse.Namespace,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    rpc: object | None = None,
    call: Callable[..., Any] | None = None,
) -> int:
    """Speak supervisord's event listener protocol on stdin/stdout (so logs go to stderr):
    READY, read one event, act on it, RESULT 2 OK, again. Returns when stdin closes."""
    log = Log(args.name)
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout.buffer if stdout is None else stdout
    couples: dict[str, list[str]] = {}
    for dependent, trigger in args.restart_with or ():
        couples.setdefault(trigger, []).append(dependent)
    leaver = Leaver(dict(args.leave or ()), args.router or (), args.control_plane_key, log,
                    call or http_call)
    if rpc is None:
        server_url = args.server_url or os.environ.get("SUPERVISOR_SERVER_URL", "")
        if not server_url:
            log("no --server-url and SUPERVISOR_SERVER_URL is unset: run this as a "
                "supervisord [eventlistener:x] program")
            return Exit.USAGE
        rpc = supervisor_rpc(server_url)
    restarter = Restarter(couples, rpc, log)
    for trigger, dependents in couples.items():
        log(f"will restart {', '.join(dependents)} whenever {trigger} (re)starts")
    if leaver.leaves:
        log(f"will take {', '.join(leaver.leaves)} out of the router(s) whenever one exits "
            "without a stop")
    while True:
        stdout.write(b"READY\n")
        stdout.flush()
        line = stdin.readline()
        if not line:
            return 0
        header = _tokens(line.decode("utf-8", "replace"))
        payload = stdin.read(int(header.get("len", "0"))).decode("utf-8", "replace")
        if header.get("eventname") == "PROCESS_STATE_STARTING":
            restarter.on_starting(_tokens(payload.split("\n", 1)[0]))
        elif header.get("eventname") in LEAVE_EVENTS:
            leaver.on_exited(_tokens(payload.split("\n", 1)[0]))
        stdout.write(b"RESULT 2\nOK")
        stdout.flush()
