"""The stand-in's command line: the argv ``sglang.launch_server`` gets, then the lifecycle."""

from __future__ import annotations

import argparse
import sys

import fake_latency

from .config import KnobError, Knobs
from .engine import Engine
from .lifecycle import Lifecycle
from .util import emit, log


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fake_sglang",
        description="Test stand-in for python -m sglang.launch_server (not SGLang).",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--tp", "--tp-size", "--tensor-parallel-size", dest="tp_size", type=int,
                   default=1)  # fmt: skip
    p.add_argument("--dp", "--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--admin-api-key", default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    # capacity (fake_latency: FAKE_SGLANG_SLOT_RATE) and a start refused (Knobs)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs-decode", type=int, default=None)
    p.add_argument("--moe-runner-backend", default="auto")
    p.add_argument("--enable-metrics", action="store_true")
    # what a decode checks of a prefill when it first reaches its bootstrap server (bootstrap.py)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--kv-cache-dtype", default="auto")
    return p


def main(argv: list[str] | None = None) -> int:
    args, ignored = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        knobs = Knobs.from_env()
    except KnobError as e:
        emit(f"ValueError: {e}")
        return 2
    if args.moe_runner_backend in knobs.refuse_moe_backends:  # before anything is served
        emit(f"ValueError: --moe-runner-backend {args.moe_runner_backend} cannot run this "
             "model (the stand-in's FAKE_SGLANG_REFUSE_MOE_BACKENDS)")
        return 1
    fake_latency.MODEL.configure({
        "--max-running-requests": args.max_running_requests,
        "--cuda-graph-max-bs-decode": args.cuda_graph_max_bs_decode,
        "--cuda-graph-max-bs": args.cuda_graph_max_bs})
    engine = Engine(args, ignored, knobs)
    fake_latency.MODEL.gate = engine.profiler.wait_unfrozen  # no token while frozen
    try:
        return Lifecycle(engine).run()
    except KeyboardInterrupt:
        log("fake_sglang: KeyboardInterrupt, exiting")
        return 130
