"""``front``: take one router out of HAProxy's rotation before its unit stops, and put it back
once it serves (router.replicas ≥ 2: HAProxy listens on the clients' port in front of them).

A router unit runs ``front drain`` as its ExecStop= (before systemd signals the router, also
after a crash: systemd.service(5) runs the stop commands of a unit that had started) and
``front ready`` as its ExecStartPost= (after READY=1: the router lists engines and one
generation went through it). Both speak to HAProxy's runtime API on its stats socket
(``level admin``; HAProxy's management guide, "Unix Socket commands"):

* drain: ``set server BACKEND/SERVER state drain``: no new request goes to the router,
  the ones it serves go on; then ``show stat`` until its current sessions (``scur``) are 0,
  at most ``--timeout`` seconds. The state outlives the router's health checks, so a router
  that comes back is not sent traffic before it is ready.
* ready: ``set server BACKEND/SERVER state ready``, then ``show stat`` until HAProxy's own
  health check has it UP (at most ``--timeout`` s): a rolling restart starts the next router
  only once this one takes requests.

Both exit 0 whatever happens (a front that is down or a socket that is missing is said in
one line): a router's stop or start never fails for the front. A request refused by a router
in between is retried by HAProxy on another (``retry-on conn-failure empty-response``).
"""

from __future__ import annotations

import csv
import socket
import time
from collections.abc import Callable

from .timings import FRONT_CALL_TIMEOUT_S, FRONT_POLL_S


def ask(path: str, command: str, timeout: float = FRONT_CALL_TIMEOUT_S) -> str:
    """One command on HAProxy's runtime API (a Unix socket), its whole answer. Raises OSError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def server_row(stat_csv: str, backend: str, server: str) -> dict[str, str] | None:
    """The row of ``show stat`` for BACKEND/SERVER (its header line starts with ``# ``)."""
    lines = stat_csv.splitlines()
    if not lines or not lines[0].startswith("# "):
        return None
    for row in csv.DictReader([lines[0][2:], *lines[1:]]):
        if row.get("pxname") == backend and row.get("svname") == server:
            return row
    return None


class Front:
    """One router (SERVER) of HAProxy's BACKEND, through the socket at ``path``."""

    def __init__(self, path: str, backend: str, server: str, log: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 call: Callable[[str, str], str] = ask) -> None:
        self.path, self.backend, self.server = path, backend, server
        self.log, self.clock, self.sleep, self.call = log, clock, sleep, call

    def row(self) -> dict[str, str] | None:
        return server_row(self.call(self.path, "show stat"), self.backend, self.server)

    def set_state(self, state: str) -> bool:
        """``set server``; False (said) when the front did not take it."""
        answer = self.call(self.path, f"set server {self.backend}/{self.server} state {state}")
        if answer.strip():  # HAProxy answers an accepted `set server` with an empty line
            self.log(f"front: {self.backend}/{self.server} state {state}: {answer.strip()}")
            return False
        return True

    def until(self, done: Callable[[dict[str, str]], bool], timeout: float) -> dict[str, str]:
        """Look at the server's row until ``done`` or ``timeout``; the last row seen."""
        deadline = self.clock() + timeout
        while True:
            row = self.row() or {}
            if done(row) or self.clock() >= deadline:
                return row
            self.sleep(FRONT_POLL_S)

    def drain(self, timeout: float) -> None:
        began = self.clock()
        if not self.set_state("drain"):
            return
        row = self.until(lambda r: r.get("scur", "0") in ("", "0"), timeout)
        took = self.clock() - began
        busy = row.get("scur", "0")
        if busy not in ("", "0"):
            self.log(f"front: {self.server} still serves {busy} request(s) after {took:.1f} s "
                     "of drain: stopping it anyway (the front retries what it can elsewhere)")
        else:
            self.log(f"front: {self.server} drained in {took:.1f} s: no new request reaches "
                     "it until it is ready again")

    def ready(self, timeout: float) -> None:
        began = self.clock()
        if not self.set_state("ready"):
            return
        row = self.until(lambda r: r.get("status", "").startswith("UP"), timeout)
        took = self.clock() - began
        if row.get("status", "").startswith("UP"):
            self.log(f"front: {self.server} is back in rotation ({took:.1f} s)")
        else:
            self.log(f"front: {self.server} set ready but not UP after {took:.1f} s (status "
                     f"{row.get('status') or 'unknown'}, last check "
                     f"{row.get('check_status') or 'none'}): its health check decides")


def run_front(action: str, path: str, backend: str, server: str, timeout: float,
              log: Callable[[str], None]) -> int:
    """`runtime front drain|ready`: always 0 (a router's stop or start never fails for it)."""
    front = Front(path, backend, server, log)
    try:
        front.drain(timeout) if action == "drain" else front.ready(timeout)
    except OSError as exc:
        log(f"front: cannot reach HAProxy's runtime API at {path} ({exc}): {server} not "
            f"{'drained' if action == 'drain' else 'put back'}; its health check decides")
    return 0
