"""SGLang's own facts that pdsvc's layers share: port spans and the JIT cache variables.

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
