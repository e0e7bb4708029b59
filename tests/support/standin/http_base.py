"""The stand-in's HTTP plumbing (stdlib http.server): a threaded server per port and a handler
base with body reading, JSON replies and chunked server-sent events."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .engine import Engine
from .util import log


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], handler: type, engine: Engine, kind: str) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.engine = engine
        self.kind = kind
        self._thread: threading.Thread | None = None
        super().__init__(addr, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup; skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.server_address[1]

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True, name=f"fake-sglang-{self.kind}")
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.shutdown()
        self.server_close()


def parse_body(raw: bytes) -> tuple[Any, str | None]:
    if not raw.strip():
        return None, None
    try:
        return json.loads(raw), None
    except ValueError as e:
        return None, str(e)


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    timeout = 120  # idle keep-alive connections do not pin a thread forever
    server: Server

    def parse_request(self) -> bool:
        # The router's gRPC health probes open with the HTTP/2 prior-knowledge preface. The
        # stdlib would answer it HTTP/0.9-style (a bare body); send a proper HTTP/1.1 505 and
        # close the connection instead.
        if self.raw_requestline.startswith(b"PRI * HTTP/2"):
            self.command = None
            self.request_version = "HTTP/1.1"
            self.requestline = "PRI * HTTP/2.0"
            self.close_connection = True
            self.send_error(505, "HTTP/2 is not supported (fake_sglang speaks HTTP/1.1)")
            return False
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.engine.knobs.access_log:
            log(f"INFO:     {self.client_address[0]}:{self.client_address[1]} - {format % args}")

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            try:
                raw = self._read_body()
            except ValueError as e:
                self.close_connection = True
                self._json(400, {"error": {"message": f"bad request body: {e}"}})
                return
            body, parse_error = parse_body(raw)
            self.server.engine.record(
                self.server.kind, self.server.server_port, self.command, self.path,
                dict(self.headers.items()), body if parse_error is None else raw.decode("latin-1"),
            )  # fmt: skip
            self.route(urlsplit(self.path), body, parse_error)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def route(self, url: Any, body: Any, parse_error: str | None) -> None:
        raise NotImplementedError

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size_line = self.rfile.readline(65537)
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError as e:
                    raise ValueError("bad chunk size") from e
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(65537)
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            n = int(length)
        except ValueError as e:
            raise ValueError("bad Content-Length") from e
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    # chunked SSE (fake_latency.py calls these three too)
    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _sse(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        chunk = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    def _sse_end(self) -> None:
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
