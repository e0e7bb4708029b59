"""SGLang's own facts that pdsvc's layers share: port spans, the JIT cache variables and the
metric of the requests an engine runs.

A leaf: it imports nothing of pdsvc, so the config layer can check what the plan will use
without importing the plan.
"""

from __future__ import annotations

#: SGLang takes ZMQ/NCCL ports dist_init_port+1 … +5+dp; keep each role's base this far apart.
DIST_INIT_SPAN = 100

#: Every JIT/compile cache the engines use, as (env var, subdirectory of runtime.jit_cache)
#: (sglang/srt/environ.py and each library's own cache variable). SGLANG_DG_CACHE_DIR is
#: mirrored into DG_JIT_CACHE_DIR by SGLang at import, but DeepGEMM may read
#: DG_JIT_CACHE_DIR first, so both are set to the same directory.
JIT_CACHE_ENV: tuple[tuple[str, str], ...] = (
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
    ("DG_JIT_CACHE_DIR", "deep_gemm"),
    ("SGLANG_CACHE_DIR", "sglang"),
    ("SGLANG_JIT_CACHE_DIR", "sglang/jit"),
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),
    ("TILELANG_CACHE_DIR", "tilelang"),
    ("CUDA_CACHE_PATH", "nv-compute-cache"),
)
#: CUDA's PTX JIT cache defaults to 256 MiB on older drivers; 4 GiB is its documented maximum.
CUDA_CACHE_MAXSIZE = "4294967296"

#: What a decode checks of a prefill when it first connects to its bootstrap server, and
#: refuses to pair on when they differ (SGLang 0.5.23 python/sglang/srt/disaggregation/
#: common/conn.py, `CommonKVReceiver.try_ensure_parallel_info`: "Page size mismatch",
#: "KV cache dtype mismatch", "KV layout mismatch ... the same --dsv4-attn-backend and
#: SGLANG_DSV4_KV_LAYOUT"), plus what makes two engines' KV caches different things
#: altogether: the model and the transfer backend (a NIXL agent and a Mooncake engine never
#: talk; nixl/conn.py, mooncake/conn.py). Flag -> the value SGLang takes when it is not given
#: (None: no default pdsvc can name; then only "both absent" is equal).
PAIR_FLAGS: dict[str, str | None] = {
    "--page-size": "1",
    "--kv-cache-dtype": "auto",
    "--dsv4-attn-backend": None,
    "--model-path": None,
    "--disaggregation-transfer-backend": "mooncake",
}
#: The same for environment variables (SGLANG_DSV4_KV_LAYOUT: the KV layout check above;
#: the NIXL plugin: both agents must load the same one, nixl/conn.py).
PAIR_ENV: dict[str, str | None] = {
    "SGLANG_DSV4_KV_LAYOUT": "auto",
    "SGLANG_DISAGGREGATION_NIXL_BACKEND": "UCX",
}

#: The engine's requests in flight (sglang/srt/metrics/collector.py), summed over its gauges.
RUNNING_REQS = "sglang:num_running_reqs"


def running_requests(metrics: str) -> int | None:
    """The sum of `sglang:num_running_reqs` in a Prometheus text page; None when absent."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith(RUNNING_REQS) and not line.startswith(RUNNING_REQS + "_"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return int(total) if seen else None
