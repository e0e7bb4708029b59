"""The deployment's other hosts: their heals and cures, for a heal cascade that spans hosts.

Why. A heal cascade is judged on the heals of *both* roles (cascade.py), but each host's state
directory holds only its own engines' heals; when prefills and decodes sit on different hosts,
no host sees a cascade. The router's worker list cannot carry them: an engine whose pairs are
all stale is never admitted to the router (canary.Canary.admits), and in a cascade that is
every engine that just healed.

The channel: every engine runtime of a host serves that host's view (its heals within
CASCADE_WINDOW_S and its cure marker, read from the shared ``--state-dir``) on one port per host
(``--fleet-listen``), and reads the other hosts' views (``--fleet``) every FLEET_LOOK_S in a
thread of its own. All the runtimes of a host bind the port with ``SO_REUSEPORT`` (socket(7)):
the kernel hands each connection to one of them, and each answers the same view, so the host
answers while any of its engine runtimes runs: one heals, the others still answer. No new
service to run.

Trust. The view is read with the deployment's control-plane key (the router's, the one secret
the engines already share): ``Authorization: Bearer KEY``, compared in constant time
(hmac.compare_digest); anything else is 401 and says nothing. A runtime without a key does not
listen. The reply holds times, engine names and roles only, never the key, and the server logs
nothing (the journal is no place for a request line).

A host that does not answer (it reboots, a network blip) keeps its last view: the heals in it
carry their own times and age out of the cascade's window by themselves.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .cascade import ROLES, Cascade, Heal, heals, read_marker
from .duties import Duties, quiet
from .options import Options
from .probe import http_call
from .statefile import FORMAT, NewerFormat, parse_state
from .timings import CASCADE_WINDOW_S, FLEET_LOOK_S, FLEET_TIMEOUT_S

#: the one path the listener answers
PATH = "/pdsvc/v1/cascade"
#: the most of a view a reader takes (a few hundred bytes per heal: ample)
MAX_VIEW = 256 * 1024


def host_view(state_dir: str, deployment: str, now: float) -> dict[str, Any]:
    """What this host tells the others: its engines' heals within the window, its last cure."""
    recent = [h for h in heals(state_dir) if now - h.at < CASCADE_WINDOW_S]
    marker = read_marker(state_dir, deployment)
    cure = {"at": float(marker["at"]), "by": str(marker.get("by") or "?")} if marker else None
    return {"format": FORMAT, "deployment": deployment,
            "heals": [{"at": h.at, "name": h.name, "role": h.role} for h in recent],
            "cure": cure}


def parse_view(text: str, host: str, deployment: str
               ) -> tuple[list[Heal], tuple[float, str] | None]:
    """The view of ``host`` (ADDR:PORT) -> (its heals, its cure (at, by) or None). Raises
    NewerFormat, and ValueError for anything that is not this deployment's view."""
    where = f"http://{host}{PATH}"
    doc = parse_state(text, where)
    if doc is None or doc.get("deployment") != deployment:
        raise ValueError(f"{where}: not a view of deployment {deployment!r}")
    found: list[Heal] = []
    for item in doc.get("heals") or []:
        at = item.get("at") if isinstance(item, dict) else None
        if isinstance(at, (int, float)) and not isinstance(at, bool) \
                and item.get("role") in ROLES:
            found.append(Heal(float(at), f"{host}/{item.get('name')}",
                              str(item["role"])))
    cure = doc.get("cure")
    at = cure.get("at") if isinstance(cure, dict) else None
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return found, (float(at), str(cure.get("by") or "?"))  # type: ignore[union-attr]
    return found, None


# ---------------------------------------------------------------- the listener
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    key: str
    view: Callable[[], dict[str, Any]]

    def server_bind(self) -> None:
        # every engine runtime of this host binds the same port (module docstring)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a reader gone mid-reply: no traceback in the journal; it reads again in 1 s


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = FLEET_TIMEOUT_S * 5  # a client that sends nothing does not keep a thread
    server_version = "pdsvc-runtime"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        given = self.headers.get("Authorization") or ""
        if not hmac.compare_digest(given.encode(), f"Bearer {self.server.key}".encode()):
            return self._reply(401, {"error": "the deployment's control-plane key is needed"})
        if self.path != PATH:
            return self._reply(404, {"error": f"only {PATH}"})
        return self._reply(200, self.server.view())

    def _reply(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # nothing of a request goes to the journal


def listen(address: str, key: str, view: Callable[[], dict[str, Any]]) -> ThreadingHTTPServer:
    """Serve ``view()`` on ``address`` (ADDR:PORT) in a daemon thread, for holders of ``key``.
    Raises OSError when the port cannot be bound."""
    host, _, port = address.rpartition(":")  # options.host_port checked it
    server = _Server((host, int(port)), _Handler)
    server.key, server.view = key, view
    threading.Thread(target=server.serve_forever, name="fleet-listen", daemon=True).start()
    return server


# ---------------------------------------------------------------- the reader
class Fleet:
    """The other hosts' views, as last read; ``refresh`` reads them all once."""

    def __init__(self, hosts: list[str], key: str, deployment: str,
                 log: Callable[[str], None],
                 call: Callable[..., Any] = http_call, duties: Duties | None = None) -> None:
        self.hosts, self.deployment, self.log, self.call = list(hosts), deployment, log, call
        self.duties = duties or quiet()  # a read that raises: said, counted, then the next
        self.headers = {"Authorization": f"Bearer {key}"}
        self.views: dict[str, tuple[list[Heal], tuple[float, str] | None]] = {}
        self.said: dict[str, str] = {}  # per host: the last problem logged (news only)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def refresh(self) -> None:
        for host in self.hosts:
            url = f"http://{host}{PATH}"
            reply = self.call(url, FLEET_TIMEOUT_S, headers=self.headers, max_body=MAX_VIEW)
            try:
                if reply.status != 200:
                    raise ValueError(f"{url}: {reply.detail}")
                view = parse_view(reply.body.decode("utf-8", "replace"), host, self.deployment)
            except (ValueError, NewerFormat) as e:
                self._say(host, f"heals of host {host} not read (its last view is kept): {e}")
                continue
            self._say(host, "")
            with self.lock:
                self.views[host] = view

    def _say(self, host: str, text: str) -> None:
        if text != self.said.get(host, ""):
            self.said[host] = text
            self.log(text or f"heals of host {host} read again")

    def heals(self) -> list[Heal]:
        with self.lock:
            return [h for found, _ in self.views.values() for h in found]

    def cure(self) -> tuple[float, str] | None:
        with self.lock:
            cures = [c for _, c in self.views.values() if c is not None]
        return max(cures) if cures else None

    def start(self) -> Fleet:
        """Read every FLEET_LOOK_S in a daemon thread until ``stop`` is set."""
        def run() -> None:
            while not self.stop.is_set():
                began = time.monotonic()
                self.duties.guard("fleet-read", self.refresh)
                self.stop.wait(max(0.0, FLEET_LOOK_S - (time.monotonic() - began)))

        threading.Thread(target=run, name="fleet-read", daemon=True).start()
        return self


def share(a: Options, key: str | None, cascade: Cascade, log: Callable[[str], None],
          duties: Duties | None = None) -> ThreadingHTTPServer | None:
    """An engine runtime's part across hosts (--fleet-listen, --fleet): serve this host's
    view (the server is returned) and read the others' into ``cascade``. Never raises: without
    it, a cascade across hosts goes unseen, and each heal still happens on its own."""
    server = None
    if not (a.fleet_listen or a.fleet) or not a.state_dir:
        return None
    if not key:
        log("no --control-plane-key: this host's heals are not shared with the other hosts "
            "and theirs are not read (a heal cascade across hosts goes unseen)")
        return None
    if a.fleet_listen:
        state_dir, deployment = a.state_dir, a.deployment
        try:
            server = listen(a.fleet_listen, key,
                            lambda: host_view(state_dir, deployment, time.time()))
        except OSError as e:
            log(f"cannot serve this host's heals on {a.fleet_listen}: {e}; the other hosts "
                "read them from this host's other engine runtimes, if any")
    if a.fleet:
        cascade.remote = Fleet(a.fleet, key, a.deployment, log, duties=duties).start()
    return server
