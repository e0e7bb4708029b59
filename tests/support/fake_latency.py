"""The stand-in engine's latency model, for `pdsvc bench` (test support, stdlib only).

fake_sglang.py hands a decode's streamed ``/generate`` to ``MODEL.serve()`` when a knob below
is set; everything else answers as before. The model is a decode batch with a capacity:

* a request, once its first token is out, wants one token every ``FAKE_SGLANG_ITL_MS`` (10)
  for its ``max_new_tokens``; it streams them one chunk per token, as SGLang streams;
* the decode serves ``FAKE_SGLANG_KNEE_RATE`` requests/s (the knee): with n requests decoding,
  each of length L, the demand is Σ 1/(L·itl) requests/s; past the knee every token and every
  first token is slower by demand/knee (processor sharing), so TTFT (``FAKE_SGLANG_TTFT_MS``,
  50, at light load) and ITL grow with the rate past the knee, and without bound once the
  arrivals outrun it;
* ``FAKE_SGLANG_EMPTY_EVERY=N``: every Nth generation comes back HTTP 200 with no token
  (srt-slurm #429, sglang #9585);
* ``FAKE_SGLANG_TRANSFER_FAIL_EVERY=N``: every Nth generation's KV transfer "fails": it is
  aborted with no token and ``sglang:num_transfer_failed_reqs_total`` rises (sglang PR #7317's
  counter), as SGLang's decode does.

The counters are added to ``/metrics`` unless the engine already writes them.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from typing import Any

TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
BOOTSTRAP_FAILED = "sglang:num_bootstrap_failed_reqs_total"


def _num(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


class LatencyModel:
    def __init__(self) -> None:
        self.knee = _num("FAKE_SGLANG_KNEE_RATE", None)
        self.ttft = (_num("FAKE_SGLANG_TTFT_MS", 50.0) or 0.0) / 1000
        self.itl = (_num("FAKE_SGLANG_ITL_MS", 10.0) or 0.0) / 1000
        self.empty_every = int(_num("FAKE_SGLANG_EMPTY_EVERY", 0) or 0)
        self.fail_every = int(_num("FAKE_SGLANG_TRANSFER_FAIL_EVERY", 0) or 0)
        self.counters = {TRANSFER_FAILED: 0, BOOTSTRAP_FAILED: 0}
        self._lock = threading.Lock()
        self._decoding: dict[int, float] = {}  # request -> its demand (requests/s)
        self._ids = itertools.count(1)

    @property
    def enabled(self) -> bool:
        return bool(self.knee or self.empty_every or self.fail_every)

    def slowdown(self) -> float:
        if not self.knee:
            return 1.0
        with self._lock:
            demand = sum(self._decoding.values())
        return max(1.0, demand / self.knee)

    def serve(self, handler: Any, kind: str, body: dict, role: str) -> bool:
        """Answer a decode's streamed /generate; False: not for this model (fake_sglang
        answers as before)."""
        if not (self.enabled and role == "decode" and kind == "generate" and body.get("stream")):
            return False
        params = body.get("sampling_params") or {}
        length = max(1, int(params.get("max_new_tokens") or 16))
        rid = next(self._ids)
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "prompt_tokens": 0, "cached_tokens": 0}
        time.sleep(self.ttft * self.slowdown())
        handler._sse_start()
        if self.fail_every and rid % self.fail_every == 0:
            with self._lock:
                self.counters[TRANSFER_FAILED] += 1
            metrics = getattr(handler.server.engine, "metrics", None)
            if metrics is not None:  # the engine's own /metrics (fake_metrics) counts it too
                metrics.transfer_failure()
            why = {"type": "abort", "message": "KV transfer failed (fake_latency knob)"}
            handler._sse({"text": "", "output_ids": [],
                          "meta_info": {**meta, "completion_tokens": 0, "finish_reason": why}})
            handler._sse_end()
            return True
        if self.empty_every and rid % self.empty_every == 0:
            length = 0
        with self._lock:
            self._decoding[rid] = 1.0 / (max(length, 1) * self.itl) if self.itl else 0.0
        try:
            for k in range(1, length + 1):
                if k > 1:
                    time.sleep(self.itl * self.slowdown())
                handler._sse({"text": " ".join(["tok"] * k), "output_ids": list(range(k)),
                              "meta_info": {**meta, "completion_tokens": k,
                                            "finish_reason": None}})
        finally:
            with self._lock:
                self._decoding.pop(rid, None)
        done = {"type": "length", "length": length}
        handler._sse({"text": " ".join(["tok"] * length), "output_ids": list(range(length)),
                      "meta_info": {**meta, "completion_tokens": length, "finish_reason": done}})
        handler._sse_end()
        return True

    def metric_text(self, label: str, text: str) -> str:
        """Prometheus lines for the failure counters the engine's /metrics lacks."""
        lines = []
        for name, value in self.counters.items():
            if name not in text:
                lines += [f"# TYPE {name} counter", f"{name}{label} {float(value)}"]
        return "\n".join(lines) + "\n" if lines else ""


MODEL = LatencyModel()
