"""One stand-in engine's state: what its HTTP handlers read and the control endpoint changes.

The process lifecycle (loading, SIGTERM, exit) is lifecycle.py's; the HTTP API is api.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from . import metrics, pair
from .config import Knobs
from .profiler import Profiler
from .util import log

if TYPE_CHECKING:
    from .http_base import Server

VERSION = "0.5.23+fake"

#: keys POST /_fake/control accepts
CONTROL_KEYS = frozenset({"hang", "hang_bootstrap", "health", "gen_delay", "crash", "stale_pair",
                          "pair_failure", "new_instance", "paced"})


class Engine:
    def __init__(self, args: argparse.Namespace, ignored: list[str], knobs: Knobs) -> None:
        self.args = args
        self.ignored = ignored
        self.knobs = knobs
        self.role = args.disaggregation_mode
        self.pd = self.role in ("prefill", "decode")
        self.served_name = args.served_model_name or args.model_path
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.state = "starting"  # -> "ready"
        self.ready_at: float | None = None
        self.graceful_exit = False
        self.term_requested = False
        self.hang = False
        self.hang_bootstrap = knobs.hang_bootstrap
        self.health_override = "ok"
        self.gen_delay = knobs.gen_delay
        self.paced = knobs.paced
        self.pair = pair.PairState(self.role, knobs.stale_pair, knobs.pair_failure,
                                   log=lambda msg: log(msg, "TP0"))
        #: decode: the parallel info of each prefill met, by bootstrap address (SGLang's
        #: prefill_info_table; bootstrap.ensure_parallel_info)
        self.prefill_info: dict[str, dict] = {}
        #: how a prefill knows this decode: its own address (SGLang registers it likewise)
        self.pair_key = f"{args.host}:{args.port}"
        self._lock = threading.Lock()
        self.inflight = 0
        self.counters = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.metrics = metrics.EngineMetrics()
        self.http: Server | None = None
        self.bootstrap: Server | None = None
        self.profiler = Profiler(self)

    # ---- request-side state -----------------------------------------------------------------

    @contextlib.contextmanager
    def in_flight(self, counted: bool):
        if counted:
            with self._lock:
                self.inflight += 1
        try:
            yield
        finally:
            if counted:
                with self._lock:
                    self.inflight -= 1

    def healthy(self) -> bool:
        return self.state == "ready" and not self.graceful_exit and self.health_override == "ok"

    def wait_while_hung(self, kind: str) -> None:
        while self.hang and (kind == "http" or self.hang_bootstrap):
            time.sleep(0.05)

    def count(self, items: list[dict]) -> None:
        with self._lock:
            self.counters["requests"] += len(items)
            self.counters["prompt_tokens"] += sum(m["prompt_tokens"] for m in items)
            self.counters["generation_tokens"] += sum(m["completion_tokens"] for m in items)

    def record(
        self, kind: str, port: int, method: str, path: str, headers: dict, body: Any
    ) -> None:
        path_out = self.knobs.request_log
        if not path_out:
            return
        line = json.dumps({"t": time.time(), "role": self.role, "port": port, "server": kind,
                           "pid": os.getpid(), "method": method, "path": path,
                           "headers": headers, "body": body})  # fmt: skip
        try:
            fd = os.open(path_out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as e:
            log(f"fake_sglang: cannot write request log {path_out}: {e}")

    # ---- the control endpoint ---------------------------------------------------------------

    def apply_control(self, body: Any) -> tuple[int, dict]:
        """POST /_fake/control: (status, reply). Validates everything before changing anything."""
        if not isinstance(body, dict):
            return 400, {"error": {"message": "control body must be a JSON object"}}
        unknown = set(body) - CONTROL_KEYS
        if unknown:
            return 400, {"error": {"message": f"unknown control keys: {sorted(unknown)}"}}
        if "health" in body and body["health"] not in ("ok", "fail"):
            return 400, {"error": {"message": "health must be 'ok' or 'fail'"}}
        try:
            stale_mode = pair.parse_stale_mode(body["stale_pair"]) if "stale_pair" in body else None
            failure_mode = (pair.parse_failure_mode(body["pair_failure"])
                            if "pair_failure" in body else None)  # fmt: skip
        except (ValueError, AttributeError) as e:
            return 400, {"error": {"message": str(e)}}
        if stale_mode is not None:
            self.pair.stale_mode = stale_mode
        if failure_mode is not None:
            self.pair.failure_mode = failure_mode
        if body.get("new_instance"):
            self.pair.new_instance()
        if "hang" in body:
            self.hang = bool(body["hang"])
        if "hang_bootstrap" in body:
            self.hang_bootstrap = bool(body["hang_bootstrap"])
        if "health" in body:
            self.health_override = body["health"]
        if "gen_delay" in body:
            self.gen_delay = float(body["gen_delay"] or 0.0)
        if "paced" in body:
            self.paced = bool(body["paced"])
        log(f"fake_sglang: control {json.dumps(body)}")
        return 200, self.control_state()

    def control_state(self) -> dict:
        return {
            "role": self.role,
            "pid": os.getpid(),
            "state": self.state,
            "graceful_exit": self.graceful_exit,
            "hang": self.hang,
            "hang_bootstrap": self.hang_bootstrap,
            "health": self.health_override,
            "gen_delay": self.gen_delay,
            "paced": self.paced,
            "inflight": self.inflight,
            "profile": {"state": self.profiler.state, "steps": self.profiler.steps,
                        "last": self.profiler.last},
            **self.pair.snapshot(),
        }

    # ---- what SGLang reports about itself ---------------------------------------------------

    def server_info(self) -> dict:
        a = self.args
        return {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "served_model_name": self.served_name,
            "host": a.host,
            "port": a.port,
            "tp_size": a.tp_size,
            "dp_size": a.dp_size,
            "dist_init_addr": a.dist_init_addr,
            "disaggregation_mode": self.role,
            "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
            "disaggregation_transfer_backend": a.disaggregation_transfer_backend,
            "load_balance_method": (
                "follow_bootstrap_room" if self.role == "prefill" else "round_robin"
            ),
            "max_running_requests": a.max_running_requests or 256,
            "speculative_algorithm": a.speculative_algorithm,
            "enable_metrics": a.enable_metrics,
            "version": VERSION,
            "status": self.state,
            "internal_states": [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}],
            "fake_sglang": True,
            "fake_instance_id": self.pair.instance_id,
        }

    def model_info(self) -> dict:
        a = self.args
        model_type, archs = "fake", ["FakeForCausalLM"]
        try:
            with open(os.path.join(a.model_path, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            model_type = cfg.get("model_type", model_type)
            archs = cfg.get("architectures", archs)
        except (OSError, ValueError, AttributeError):
            pass
        return {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": model_type,
            "architectures": archs,
        }
