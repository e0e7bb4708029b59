"""The one HTTP client (pdsvc/ship/runtime/probe.py) as the runtime's probes use it.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ports import free_port

from pdsvc.ship.runtime.probe import (
    NoAnswerKind,
    ProbeResult,
    http_probe,
    liveness_url_for,
)


def test_http_probe_reports_status_and_refusal():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/ok" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert http_probe(f"{base}/ok", 2) == ProbeResult(True, "HTTP 200")
        assert http_probe(f"{base}/health", 2) == ProbeResult(False, "HTTP 503")
    finally:
        server.shutdown()
        server.server_close()
    refused = http_probe(f"http://127.0.0.1:{free_port()}/health", 2)
    assert refused == ProbeResult(False, "connection refused", NoAnswerKind.REFUSED)


def test_a_listener_that_never_answers_is_no_answer_of_kind_timeout() -> None:
    """A SIGSTOPped engine: the kernel accepts the connection, nothing answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        got = http_probe(f"http://127.0.0.1:{sock.getsockname()[1]}/health", 0.3)
    assert not got.ok and got.no_answer is NoAnswerKind.TIMEOUT, got


def test_router_liveness_url_default():
    assert (
        liveness_url_for("http://127.0.0.1:8000/readiness?x=1")
        == "http://127.0.0.1:8000/liveness"
    )


