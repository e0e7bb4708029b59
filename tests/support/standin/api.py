"""The engine's HTTP API (SGLang: FastAPI under uvicorn, python/sglang/srt/entrypoints/
http_server.py): health, info, load, metrics, the generation endpoints and the stand-in's
``/_fake/control``."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import fake_latency

from . import bootstrap, generate
from .http_base import BaseHandler
from .util import log

_GET = frozenset({"GET"})
_POST = frozenset({"POST"})

#: path -> (allowed methods, handler name)
ROUTES: dict[str, tuple[frozenset[str], str]] = {
    "/health": (_GET, "h_health"),
    "/health_generate": (_GET, "h_health"),
    "/ready": (_GET, "h_health"),  # is_ready(): healthy and not paused (never paused here)
    "/server_info": (_GET, "h_server_info"),
    "/get_server_info": (_GET, "h_server_info"),
    "/model_info": (_GET, "h_model_info"),
    "/get_model_info": (_GET, "h_model_info"),
    "/v1/models": (_GET, "h_models"),
    "/get_load": (_GET, "h_get_load"),
    "/metrics": (_GET, "h_metrics"),
    "/flush_cache": (frozenset({"GET", "POST"}), "h_flush_cache"),
    "/generate": (frozenset({"POST", "PUT"}), "h_generate"),
    "/start_profile": (frozenset({"GET", "POST"}), "h_start_profile"),
    "/stop_profile": (frozenset({"GET", "POST"}), "h_stop_profile"),
    "/v1/completions": (_POST, "h_generate"),
    "/v1/chat/completions": (_POST, "h_generate"),
}


class EngineHandler(BaseHandler):
    def route(self, url: Any, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        path = url.path
        if path == "/_fake/control":  # never needs the API key, never hangs
            self.h_control(body, parse_error)
            return
        entry = ROUTES.get(path)
        generation = entry is not None and entry[1] == "h_generate" and self.command in entry[0]
        # A generation counts as in flight from arrival, hung or not, so a SIGTERM drains it
        # (without bound, like SGLang) while /health already answers 503.
        with eng.in_flight(generation):
            eng.wait_while_hung("http")
            self._route(path, entry, body, parse_error)

    def _route(self, path: str, entry: tuple | None, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        profiling = entry is not None and entry[1] in ("h_start_profile", "h_stop_profile")
        # srt/utils/auth.py decide_request_auth: the profiler's routes are ADMIN_OPTIONAL (the
        # admin key when one is set, else the API key), the rest need the API key
        key = (eng.args.admin_api_key or eng.args.api_key) if profiling else eng.args.api_key
        if (
            key
            # srt/utils/auth.py: /health*, /ready* and /metrics* never need the key
            and not path.startswith(("/health", "/ready", "/metrics"))
            and self.headers.get("Authorization") != f"Bearer {key}"
        ):
            self._json(401, {"error": "Unauthorized"})
            return
        if entry is None or (path == "/metrics" and not eng.args.enable_metrics) or \
                (profiling and eng.knobs.no_profile):
            self._json(404, {"detail": "Not Found"})
            return
        methods, name = entry
        if self.command not in methods:
            self._json(405, {"detail": "Method Not Allowed"})
            return
        getattr(self, name)(path, body, parse_error)

    # ---- simple endpoints -------------------------------------------------------------------

    def h_health(self, path: str, body: Any, parse_error: str | None) -> None:
        """SGLang's /health runs a generation and answers 200 once the scheduler answers,
        503 after SGLANG_HEALTH_CHECK_TIMEOUT without (http_server.py health_generate)."""
        eng = self.server.engine
        answered = eng.profiler.wait_unfrozen(eng.knobs.health_check_timeout)
        ok = answered and eng.healthy()
        self._send(200 if ok else 503, b"", "text/plain; charset=utf-8")

    def h_server_info(self, path: str, body: Any, parse_error: str | None) -> None:
        self.server.engine.profiler.wait_unfrozen()  # internal state: from the scheduler
        self._json(200, self.server.engine.server_info())

    def h_start_profile(self, path: str, body: Any, parse_error: str | None) -> None:
        if parse_error is not None:
            self._json(400, generate.err(f"invalid JSON: {parse_error}", 400))
            return
        status, text = self.server.engine.profiler.start(body)
        if status == 400:
            self._json(400, generate.err(text, 400))
            return
        self._text(status, text)

    def h_stop_profile(self, path: str, body: Any, parse_error: str | None) -> None:
        status, text = self.server.engine.profiler.stop()
        self._text(status, text)

    def h_model_info(self, path: str, body: Any, parse_error: str | None) -> None:
        self._json(200, self.server.engine.model_info())

    def h_models(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        self._json(200, {"object": "list", "data": [
            {"id": eng.served_name, "object": "model", "created": int(eng.started_wall),
             "owned_by": "sglang", "root": eng.served_name, "max_model_len": 4096}]})

    def h_get_load(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        eng.profiler.wait_unfrozen()  # the scheduler's load
        self._json(200, [{"dp_rank": r, "num_reqs": eng.inflight if r == 0 else 0,
                          "num_waiting_reqs": 0, "num_tokens": 0}
                         for r in range(max(1, eng.args.dp_size))])  # fmt: skip

    def h_metrics(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        kind = eng.role if eng.role in ("prefill", "decode") else "unified"
        queued = fake_latency.MODEL.queued() if eng.role == "decode" else 0
        text = eng.metrics.text(eng.served_name, kind, eng.inflight, queued)
        # pdsvc bench's knobs (fake_latency) count into the same counters; it adds only what
        # the text lacks
        text += fake_latency.MODEL.metric_text(f'{{model_name="{eng.served_name}"}}', text)
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def h_flush_cache(self, path: str, body: Any, parse_error: str | None) -> None:
        self._text(200, "Cache flushed.\nPlease check backend logs for more details. (When there "
                        "are running or waiting requests, the operation will not be performed.)\n")

    def h_control(self, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        if self.command == "GET":
            self._json(200, eng.control_state())
            return
        if self.command != "POST":
            self._json(405, {"detail": "Method Not Allowed"})
            return
        status, reply = eng.apply_control(body if parse_error is None else None)
        self._json(status, reply)
        if status == 200 and body.get("crash"):

            def crash() -> None:
                log("Scheduler hit an exception: RuntimeError: fake crash (control); exiting 1")
                os._exit(1)

            threading.Timer(0.1, crash).start()

    # ---- generation -------------------------------------------------------------------------

    def h_generate(self, path: str, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        t0 = time.monotonic()  # arrival, for the TTFT metrics.py observes
        if parse_error is not None or not isinstance(body, dict):
            why = parse_error or f"got {type(body).__name__}"
            self._json(400, generate.err(f"request body must be a JSON object ({why})", 400))
            return
        eng.profiler.wait_unfrozen()  # the scheduler takes no request while it writes a trace
        if eng.state != "ready":
            self._json(503, generate.err(
                "The server is still starting (loading weights / warming up).", 503,
                "ServiceUnavailable"))  # fmt: skip
            return
        # No check of graceful_exit: SGLang 0.5.23 serves new requests during its SIGTERM drain
        # (http_server.py generate_request -> tokenizer_manager.generate_request checks
        # nothing; sigterm_watchdog waits for rid_to_state, which they join).
        kind = generate.KINDS[path]
        prompts = generate.prompts_of(kind, body)
        n = len(prompts)
        boot: dict[str, list] = {}
        if eng.pd:
            boot, problem = generate.bootstrap_fields(body, n)
            if problem is not None:
                field, msg = problem
                self._json(400, generate.err(f"PD disaggregation ({eng.role}) {msg}", 400,
                                             param=field))  # fmt: skip
                return
            if len(boot["bootstrap_room"]) != n:  # one prompt per bootstrap entry
                n = len(boot["bootstrap_room"])
                prompts = [prompts[min(i, len(prompts) - 1)] for i in range(n)]
        failures: dict[int, str] = {}  # item index -> why its KV transfer failed (pair state)
        if eng.role == "decode":
            failure, failures = bootstrap.reach_prefill(eng, boot)
            if failure is not None:
                eng.metrics.bootstrap_failure()
                self._json(500, generate.err(failure, 500, "InternalServerError"))
                return
        elif eng.role == "prefill":
            failures = bootstrap.pair_failures(eng, boot)
        if failures and eng.pair.failure_mode == "error500":
            self._json(500, generate.err(next(iter(failures.values())), 500,
                                         "InternalServerError"))  # fmt: skip
            return
        if eng.gen_delay > 0:
            time.sleep(eng.gen_delay)
        if not failures and fake_latency.MODEL.serve(self, kind, body, eng.role):
            return  # the latency model answered (tests/support/fake_latency.py)
        fake_latency.MODEL.wait_turn(kind, body, eng.role)
        generate.answer(self, kind, body, prompts, boot, failures, t0)
