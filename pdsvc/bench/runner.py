"""One run: bench_serving (in a driver process that imported it once: driver.py), its result
file read back, the gates judged."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .driver import DRIVERS, DriverFailed, Drivers
from .gates import Gate, canary_gate, error_gate, kv_gate, read_counters, token_gate
from .target import BENCH_MODULE, Load, Target, bench_argv, bench_env


@dataclass(frozen=True)
class Slo:
    """A request meets the SLO when its TTFT and its mean inter-token latency are within
    these (vLLM's goodput, vllm PR #9338, with ITL for TPOT); the rate meets it when at
    least ``share`` of all requests do (failed ones never do)."""

    ttft_ms: float
    itl_ms: float
    share: float = 0.99


@dataclass
class RunResult:
    load: Load
    command: list[str]
    total: int = 0
    ok: int = 0
    failed: int = 0
    zero: int = 0
    output_tokens: int = 0
    duration_s: float = 0.0
    metrics: dict[str, float | None] = field(default_factory=dict)
    slo_share: float | None = None  # share of requests meeting the SLO
    gates: list[Gate] = field(default_factory=list)
    error: str = ""  # bench_serving itself failed (no result)

    @property
    def valid(self) -> bool:
        return not self.error and all(g.result != "fail" for g in self.gates)

    def failed_gates(self) -> list[Gate]:
        return [g for g in self.gates if g.result == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.load.rate, "input_len": self.load.input_len,
                "output_len": self.load.output_len, "num_prompts": self.load.num_prompts,
                "command": self.command, "requests": self.total, "succeeded": self.ok,
                "failed": self.failed, "zero_token": self.zero,
                "output_tokens": self.output_tokens, "duration_s": self.duration_s,
                "metrics": self.metrics, "slo_share": self.slo_share, "valid": self.valid,
                "gates": [g.to_dict() for g in self.gates], "error": self.error or None}


METRIC_KEYS = ("request_throughput", "output_throughput", "median_ttft_ms", "p90_ttft_ms",
               "p99_ttft_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms")


def read_result(path: Path) -> dict[str, Any] | None:
    """The last JSON line bench_serving appended (``--output-file``, ``--output-details``)."""
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def judge_requests(res: RunResult, doc: dict[str, Any], slo: Slo | None) -> None:
    """Count from the per-request details, not from the summary: a request that
    "succeeded" with no text (TTFT 0, sglang #9585) is a zero-token request."""
    errors = doc.get("errors") or []
    texts = doc.get("generated_texts") or []
    ttfts = doc.get("ttfts") or []
    itls = doc.get("itls") or []
    lens = doc.get("output_lens") or []
    res.total = len(errors)
    meets = 0
    for i, err in enumerate(errors):
        if err:
            res.failed += 1
            continue
        res.ok += 1
        ttft = ttfts[i] if i < len(ttfts) else 0.0
        if not (texts[i] if i < len(texts) else "") or not ttft:
            res.zero += 1
            continue
        res.output_tokens += int(lens[i]) if i < len(lens) else 0
        gaps = itls[i] if i < len(itls) else []
        itl = statistics.fmean(gaps) if gaps else 0.0
        if slo and ttft * 1000 <= slo.ttft_ms and itl * 1000 <= slo.itl_ms:
            meets += 1
    res.duration_s = float(doc.get("duration") or 0.0)
    res.metrics = {k: doc.get(k) for k in METRIC_KEYS}
    if slo is not None:
        res.slo_share = meets / res.total if res.total else 0.0


def run_once(target: Target, load: Load, out_file: Path, *, env: Mapping[str, str],
             slo: Slo | None, max_error_rate: float,
             pairs: Callable[[], list[Any]], log: Callable[[str], None],
             log_file: Path, drivers: Drivers = DRIVERS) -> RunResult:
    """bench_serving at one load; its output goes to ``log_file`` (progress on stderr)."""
    argv = bench_argv(target, load, str(out_file))
    res = RunResult(load, argv)
    out_file.unlink(missing_ok=True)
    driver = drivers.get(target.python, BENCH_MODULE, bench_env(target, env),
                         log_file.with_name("bench-driver.log"))
    before = read_counters(target.engines)
    started = time.time()
    try:
        assert argv[1:3] == ["-m", BENCH_MODULE]  # the driver runs the module as -m does
        rc = driver.run(argv[3:], log_file)
    except OSError as e:  # runtime.python missing or not executable
        res.error = f"cannot run {argv[0]}: {e.strerror or e} (runtime.python)"
        return res
    except DriverFailed as e:  # it could not import bench_serving, or died
        res.error = f"bench_serving {e}" + (f": {e.tail}" if e.tail else "")
        log(f"  bench_serving failed (log: {e.log})")
        return res
    after = read_counters(target.engines)
    doc = read_result(out_file)
    if rc != 0 or doc is None:
        tail = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        res.error = (f"bench_serving exited {rc}: " + " | ".join(tail)
                     if tail else f"bench_serving exited {rc}")
        log(f"  bench_serving failed (log: {log_file})")
        return res
    judge_requests(res, doc, slo)
    res.gates = [token_gate(res.zero, res.ok), error_gate(res.failed, res.total, max_error_rate),
                 kv_gate(before, after), canary_gate(pairs(), started)]
    return res
