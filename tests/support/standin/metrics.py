"""The stand-in engine's ``/metrics`` (test support; served by api.py).

SGLang 0.5.23's own names and labels (python/sglang/srt/observability/metrics_collector.py),
with values that move: every generation adds to the request and token counters and observes
its time to first token (arrival to answer: the bootstrap, the pair check and any
``gen_delay`` included, so load and faults show); a decode that cannot reach the prefill's
bootstrap server counts ``sglang:num_bootstrap_failed_reqs_total``, an item whose KV transfer
failed (a stale pair) ``sglang:num_transfer_failed_reqs_total`` — as disaggregation/decode.py
and prefill.py count them (sglang PR #7317). Labels: ``model_name`` and ``engine_type``
(prefill | decode | unified, DisaggregationMode.to_engine_type); the TTFT histogram adds
``is_streaming``, with SGLang's default buckets' upper part.
"""

from __future__ import annotations

import threading

#: a subset of SGLang's default TTFT buckets (seconds)
TTFT_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class EngineMetrics:
    """The counters and the TTFT histogram of one stand-in engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = self.prompt_tokens = self.generation_tokens = 0
        self.bootstrap_failed = self.transfer_failed = 0
        self.ttft_counts = [0] * len(TTFT_BUCKETS)
        self.ttft_sum, self.ttft_count = 0.0, 0

    def bootstrap_failure(self) -> None:
        with self._lock:
            self.bootstrap_failed += 1

    def transfer_failure(self) -> None:
        with self._lock:
            self.transfer_failed += 1

    def served(self, items: list[dict], failed: int, ttft: float) -> None:
        """One answered generation: its items (meta_info), how many of them failed their KV
        transfer, and its time to first token in seconds."""
        with self._lock:
            self.requests += len(items)
            self.prompt_tokens += sum(m["prompt_tokens"] for m in items)
            self.generation_tokens += sum(m["completion_tokens"] for m in items)
            self.transfer_failed += failed
            for i, le in enumerate(TTFT_BUCKETS):
                if ttft <= le:
                    self.ttft_counts[i] += 1
            self.ttft_sum += ttft
            self.ttft_count += 1

    def text(self, model: str, engine_type: str, running: int, queued: int = 0) -> str:
        base = f'model_name="{_esc(model)}",engine_type="{engine_type}"'
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]):
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{{{labels}}} {float(v)}" for labels, v in samples)

        with self._lock:
            family("sglang:num_running_reqs", "gauge", "The number of running requests.",
                   [(base, running)])
            family("sglang:num_queue_reqs", "gauge",
                   "The number of requests in the waiting queue.", [(base, queued)])
            family("sglang:token_usage", "gauge", "The token usage.", [(base, 0.0)])
            family("sglang:num_requests_total", "counter", "Number of requests processed.",
                   [(base, self.requests)])
            family("sglang:prompt_tokens_total", "counter",
                   "Number of prefill tokens processed.", [(base, self.prompt_tokens)])
            family("sglang:generation_tokens_total", "counter",
                   "Number of generation tokens processed.", [(base, self.generation_tokens)])
            family("sglang:num_bootstrap_failed_reqs_total", "counter",
                   "The number of bootstrap failed requests.", [(base, self.bootstrap_failed)])
            family("sglang:num_transfer_failed_reqs_total", "counter",
                   "The number of transfer failed requests.", [(base, self.transfer_failed)])
            ttft = f'{base},is_streaming="false"'
            family("sglang:time_to_first_token_seconds", "histogram",
                   "Histogram of time to first token in seconds.",
                   [*((f'{ttft},le="{le}"', c) for le, c in zip(TTFT_BUCKETS, self.ttft_counts,
                                                                  strict=True)),
                    (f'{ttft},le="+Inf"', self.ttft_count)])
            lines.append(f"sglang:time_to_first_token_seconds_sum{{{ttft}}} {self.ttft_sum}")
            lines.append(f"sglang:time_to_first_token_seconds_count{{{ttft}}} "
                         f"{float(self.ttft_count)}")
        # the histogram's buckets are written as _bucket samples
        return "\n".join(line.replace("sglang:time_to_first_token_seconds{",
                                      "sglang:time_to_first_token_seconds_bucket{")
                         for line in lines) + "\n"
