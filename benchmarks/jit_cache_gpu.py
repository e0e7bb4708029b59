"""Shared JIT cache on a real GPU: does decode reuse the kernels prefill compiled?

Each step runs in a fresh Python process whose environment is parsed from the RENDERED unit
files (dsv4-prefill.service, dsv4-decode.service of --units: by default the seed bundle
tests/golden/seed/, or a bundle of your own `pdsvc render`), not retyped:

  1. cold   — the prefill unit's env, empty cache: compile a set of Triton kernels
  2. warm   — the decode unit's env: the same kernels, which must come from prefill's cache
  3. control— the decode env with TRITON_CACHE_DIR pointed elsewhere: cold again, so (2) was
              the shared cache and not something else warm on the machine

Goal: warm / cold ≤ 0.15. Needs a GPU with torch + triton (CI skips it). Only
CUDA_VISIBLE_DEVICES is overridden (to the one GPU the box has): the units name GPUs 0-3 / 4-7.

    python benchmarks/jit_cache_gpu.py [--units tests/golden/seed] [--kernels 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs in the child: compile N distinct Triton kernels (distinct constexprs = distinct binaries)
CHILD = r"""
import json, os, sys, time
import torch, triton, triton.language as tl

@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, VARIANT: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    acc = x * alpha + y
    for _ in tl.static_range(VARIANT):
        acc = tl.sin(acc) * 0.5 + acc
    tl.store(out_ptr + offs, acc, mask=mask)

n = 1 << 20
x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda"); out = torch.empty_like(x)
torch.cuda.synchronize()
t0 = time.perf_counter()
for v in range(int(sys.argv[1])):
    scale_add[(triton.cdiv(n, 1024),)](x, y, out, n, 2.0, BLOCK=1024, VARIANT=v + 1)
torch.cuda.synchronize()
took = time.perf_counter() - t0
cache = os.environ["TRITON_CACHE_DIR"]
files = sum(len(f) for _, _, f in os.walk(cache)) if os.path.isdir(cache) else 0
print(json.dumps({"seconds": took, "cache": cache, "cache_files": files}))
"""


def unit_env(path: Path) -> dict[str, str]:
    """Environment= lines of a rendered unit, as systemd reads them (quotes, %% escapes)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line.removeprefix("Environment=")):
                key, _, value = word.partition("=")
                env[key] = value.replace("%%", "%")
    return env


def run(env_from_unit: dict[str, str], kernels: int, **override: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON", "CUDA_VISIBLE"))}
    env.update(env_from_unit)
    env.update(override)
    for var in ("TRITON_CACHE_DIR", "HOME"):
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # @triton.jit needs its source in a file
        script = Path(tmp) / "kernels.py"
        script.write_text(CHILD)
        out = subprocess.run([sys.executable, str(script), str(kernels)], env=env,
                             capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"kernel process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--units", type=Path, default=REPO / "tests" / "golden" / "seed")
    ap.add_argument("--kernels", type=int, default=6)
    args = ap.parse_args()
    prefill = unit_env(args.units / "dsv4-prefill.service")
    decode = unit_env(args.units / "dsv4-decode.service")
    assert prefill["TRITON_CACHE_DIR"] == decode["TRITON_CACHE_DIR"], "units do not share a cache"
    shared = Path(prefill["TRITON_CACHE_DIR"])
    shutil.rmtree(shared, ignore_errors=True)
    one_gpu = {"CUDA_VISIBLE_DEVICES": "0"}
    cold = run(prefill, args.kernels, **one_gpu)
    warm = run(decode, args.kernels, **one_gpu)
    elsewhere = tempfile.mkdtemp(prefix="triton-control-")
    control = run(decode, args.kernels, **one_gpu, TRITON_CACHE_DIR=elsewhere)
    shutil.rmtree(elsewhere, ignore_errors=True)
    ratio = warm["seconds"] / cold["seconds"]
    print(f"shared TRITON_CACHE_DIR from the units: {shared}")
    print(f"cold  (prefill unit env, empty cache):   {cold['seconds']:.3f} s  "
          f"({cold['cache_files']} cache files after)")
    print(f"warm  (decode unit env, same cache):     {warm['seconds']:.3f} s")
    print(f"control (decode env, another cache):     {control['seconds']:.3f} s")
    print(f"warm / cold = {ratio:.3f}   goal ≤ 0.15: {'met' if ratio <= 0.15 else 'NOT met'}")


if __name__ == "__main__":
    main()
