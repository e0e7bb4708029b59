"""The stand-in engine's latency model, for `pdsvc bench` (test support, stdlib only).

fake_sglang.py hands a decode's streamed ``/generate`` to ``MODEL.serve()`` when a knob below
is set; everything else answers as before. The model is a server with a capacity, and the knee
is that capacity:

* ``FAKE_SGLANG_KNEE_RATE`` (requests/s): the engine's scheduler takes one request at a time,
  first come first served, and each takes it ``1/KNEE`` s (a prefill that serves KNEE requests/s,
  whatever the prompt). A request's first token comes ``FAKE_SGLANG_TTFT_MS`` (50) after the
  scheduler takes it. Below the knee the queue is short and rarely there (its p99 wait is about
  2.3 / (KNEE - rate) s: 2.3 service times per unit of 1 - load); past the knee the arrivals
  outrun it and the queue, so TTFT, grows with every request for as long as the load lasts
  (by 1 - KNEE/rate of a service time per arrival). So the highest rate at which 99 % of
  requests meet a TTFT bound is the knee, to within what the run can resolve: a bound of A
  service times of queueing (A/KNEE s) is met up to about 1 - 2.3/A of the knee, and broken
  above it once a run's N requests queue more than A: N (1 - KNEE/rate) > A (A = 25, N = 480
  resolve it to within 10 %; 80 requests, or a bound of a few service times, cannot);
* then each request streams ``max_new_tokens`` tokens, one chunk per token, one every
  ``FAKE_SGLANG_ITL_MS`` (10), slower by 1 + the scheduler's queued work in seconds (a decode
  step yields to the queued prefills: 1 s of queue doubles the ITL), so ITL grows past the
  knee too and barely moves below it;
* **capacity and latency from the engine's own flags and environment** (for `pdsvc tune`,
  whose candidates change them; ``configure`` reads them from the argv and env the engine was
  started with). This is the stand-in's designed rule, not SGLang's:

  - ``FAKE_SGLANG_SLOT_RATE`` (requests/s per slot): the knee is this × the engine's slots,
    the smallest of ``--max-running-requests``, ``--cuda-graph-max-bs-decode`` and
    ``--cuda-graph-max-bs`` it was given (``FAKE_SGLANG_SLOTS``, 8, when none); it replaces
    ``FAKE_SGLANG_KNEE_RATE``;
  - ``FAKE_SGLANG_ITL_SLOTS=S``: each token's time grows with the slots, × (1 + slots / S):
    more captured batch, more per step, so an ITL bound caps the slots worth having;
  - ``FAKE_SGLANG_ITL_BY_NCCL_PROTO="LL128=0.8,Simple=1.3"``: the ITL × the factor of the
    engine's own ``NCCL_PROTO`` (1 when it is not listed or not set).

  So a space's best config is designed: the most slots whose ITL still meets the SLO, with
  the fastest protocol; the knee there is its goodput;
* a decode's non-streamed ``/generate`` (the pair canary's) waits its turn in the same queue,
  and ``sglang:num_queue_reqs`` says how many requests wait there;
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


def slots(argv: dict[str, int | None]) -> int:
    """The engine's slots: the smallest of the capacity flags it was given, else
    FAKE_SGLANG_SLOTS (8)."""
    given = [v for v in argv.values() if v]
    return min(given) if given else int(_num("FAKE_SGLANG_SLOTS", 8) or 8)


def proto_factor(env_proto: str | None) -> float:
    """FAKE_SGLANG_ITL_BY_NCCL_PROTO's factor for this NCCL_PROTO (1 when unlisted)."""
    table = os.environ.get("FAKE_SGLANG_ITL_BY_NCCL_PROTO", "")
    for item in filter(None, (x.strip() for x in table.split(","))):
        name, _, factor = item.partition("=")
        if env_proto and name.strip() == env_proto:
            return float(factor)
    return 1.0


class LatencyModel:
    def __init__(self) -> None:
        self.knee = _num("FAKE_SGLANG_KNEE_RATE", None)
        self.ttft = (_num("FAKE_SGLANG_TTFT_MS", 50.0) or 0.0) / 1000
        self.itl = (_num("FAKE_SGLANG_ITL_MS", 10.0) or 0.0) / 1000
        self.slots = 0  # set by configure (0: the flags play no part)
        self.empty_every = int(_num("FAKE_SGLANG_EMPTY_EVERY", 0) or 0)
        self.fail_every = int(_num("FAKE_SGLANG_TRANSFER_FAIL_EVERY", 0) or 0)
        self.counters = {TRANSFER_FAILED: 0, BOOTSTRAP_FAILED: 0}
        self._lock = threading.Lock()
        self._free_at = 0.0  # monotonic time the scheduler is done with every queued request
        self._turns: list[float] = []  # when the scheduler takes each request not yet taken
        self._ids = itertools.count(1)
        #: blocks while the engine's scheduler is frozen (standin/profiler.py: a trace's write)
        self.gate: Any = lambda: True

    def configure(self, capacity_flags: dict[str, int | None]) -> None:
        """The engine's own flags (``--max-running-requests`` …: their values or None) and
        environment set its knee and ITL (module docstring), when FAKE_SGLANG_SLOT_RATE is set."""
        rate = _num("FAKE_SGLANG_SLOT_RATE", None)
        if not rate:
            return
        self.slots = slots(capacity_flags)
        self.knee = rate * self.slots
        per = _num("FAKE_SGLANG_ITL_SLOTS", None)
        self.itl *= (1 + self.slots / per if per else 1.0) * proto_factor(
            os.environ.get("NCCL_PROTO"))

    @property
    def enabled(self) -> bool:
        return bool(self.knee or self.empty_every or self.fail_every)

    def admit(self) -> float:
        """Queue for the scheduler (FIFO, 1/knee s a request): the seconds to wait until it
        takes this request."""
        if not self.knee:
            return 0.0
        with self._lock:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = start + 1.0 / self.knee
            self._turns = [t for t in self._turns if t > now] + [start]
        return start - now

    def queued(self) -> int:
        """Requests in the queue: admitted, not yet taken by the scheduler (SGLang's
        sglang:num_queue_reqs, its waiting queue)."""
        with self._lock:
            now = time.monotonic()
            return sum(1 for t in self._turns if t > now)

    def wait_turn(self, kind: str, body: dict, role: str) -> None:
        """A decode's non-streamed /generate (the pair canary's, a plain client's) queues for
        the scheduler like any other request: SGLang's scheduler does not tell them apart."""
        if self.knee and role == "decode" and kind == "generate" and not body.get("stream"):
            time.sleep(self.admit())

    def backlog(self) -> float:
        """The scheduler's queued work, in seconds."""
        with self._lock:
            return max(0.0, self._free_at - time.monotonic()) if self.knee else 0.0

    def slowdown(self) -> float:
        """The factor on a token's time: 1, doubled by each second of queued work."""
        return 1.0 + self.backlog()

    def serve(self, handler: Any, kind: str, body: dict, role: str) -> bool:
        """Answer a decode's streamed /generate; False: not for this model (fake_sglang
        answers as before)."""
        if not (self.enabled and role == "decode" and kind == "generate" and body.get("stream")):
            return False
        params = body.get("sampling_params") or {}
        length = max(1, int(params.get("max_new_tokens") or 16))
        rid = next(self._ids)
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "prompt_tokens": 0, "cached_tokens": 0}
        time.sleep(self.admit() + self.ttft)
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
        for k in range(1, length + 1):
            if k > 1:
                time.sleep(self.itl * self.slowdown())
            self.gate()
            handler._sse({"text": " ".join(["tok"] * k), "output_ids": list(range(k)),
                          "meta_info": {**meta, "completion_tokens": k, "finish_reason": None}})
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
