"""Wall time of `pdsvc render`, whole process, median of N runs: the default config (the
target), and beside it in the same run the three-host example (three bundles) and the default
config as Kubernetes manifests.

Target: ≤ 0.3 s for the default render. Printed beside the bare interpreter start-up on the
same machine in the same run, so the figure can be read on a noisy or slower box (the ratio is
what travels).

    python benchmarks/render_time.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


#: As installed: pip writes .pyc files, so a render does not recompile pdsvc's modules (a
#: PYTHONDONTWRITEBYTECODE=1 in the caller's environment would make every run do so).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=ENV)
        out.append(time.perf_counter() - t0)
    return out


#: (label, extra render arguments); the first is the one the target is for.
RENDERS = (
    ("default config, systemd", []),
    ("three-hosts example, 3 bundles", ["-c", "etc/examples/three-hosts.yaml"]),
    ("default config, --format k8s", ["--format", "k8s"]),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    outdir = Path(tempfile.mkdtemp(prefix="pdsvc-bench-"))
    results = []
    try:
        base = timed([sys.executable, "-c", "pass"], args.runs)
        for i, (label, extra) in enumerate(RENDERS):
            render = [sys.executable, "-m", "pdsvc.cli", "render", "--topology",
                      "etc/seed-host.topology.json", "--output", str(outdir / f"u{i}"), *extra]
            timed(render, 2)  # warm the page cache, .pyc files and the plan cache
            results.append((label, timed(render, args.runs)))
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    b = statistics.median(base)
    print(f"python -c pass (interpreter start-up): median {b * 1000:.0f} ms")
    for label, full in results:
        med = statistics.median(full)
        print(f"pdsvc render ({label}, whole process): median {med * 1000:.0f} ms over "
              f"{args.runs} runs (min {min(full) * 1000:.0f}, max {max(full) * 1000:.0f}), "
              f"{med / b:.1f}x start-up")
    med = statistics.median(results[0][1])
    print(f"target ≤ 300 ms for the default render: {'met' if med <= 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
