"""Wall time of `pdsvc render` on the default config, whole process, median of N runs.

Target: ≤ 0.3 s. Printed beside the bare interpreter start-up on the same machine in the same
run, so the figure can be read on a noisy or slower box (the ratio is what travels).

    python benchmarks/render_time.py [--runs 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    outdir = Path(tempfile.mkdtemp(prefix="pdsvc-bench-"))
    try:
        render = [sys.executable, "-m", "pdsvc.cli", "render", "--topology",
                  "etc/seed-host.topology.json", "--output", str(outdir / "units")]
        timed(render, 2)  # warm the page cache and .pyc files
        base = timed([sys.executable, "-c", "pass"], args.runs)
        full = timed(render, args.runs)
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    med, b = statistics.median(full), statistics.median(base)
    print(f"pdsvc render (default config, whole process): median {med * 1000:.0f} ms "
          f"over {args.runs} runs (min {min(full) * 1000:.0f}, max {max(full) * 1000:.0f})")
    print(f"python -c pass (interpreter start-up):        median {b * 1000:.0f} ms")
    print(f"render / bare start-up: {med / b:.1f}x   target ≤ 300 ms: "
          f"{'met' if med <= 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
