"""The precision of `pdsvc bench --slo` against a designed capacity: the stand-in's FIFO
scheduler serves KNEE requests/s (tests/support/fake_latency.py), and the SLO search should
find it within 10 % with 480 requests a run. Prints, for each repeat, the rate found and its
ratio to the knee, then their spread, from one machine in one run (so the figures compare).

    sudo python benchmarks/bench_slo.py [REPEATS]          # needs .venv-serve
    sudo tests/support/busy.sh 2 python benchmarks/bench_slo.py   # beside 2 CPU hogs

tests/test_bench.py checks the search's mechanism (a bisection that brackets the capacity);
the precision is this script's: a busy machine bends both the client's send rate and the
stand-in's queueing, so it is a figure to print, not a test's verdict.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

from bench_stack import BenchStack  # noqa: E402

KNEE = 32.0
ENGINE = {"FAKE_SGLANG_KNEE_RATE": str(KNEE), "FAKE_SGLANG_TTFT_MS": "50",
          "FAKE_SGLANG_ITL_MS": "20"}
SEARCH = ["--slo", "ttft=900,itl=40", "--rate-range", "15:60", "--precision", "0.05",
          "--num-prompts", "480", "--input-len", "8", "--output-len", "4", "--json"]


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print(f"pdsvc bench {' '.join(SEARCH)}\nstand-in knee {KNEE:g} req/s; {repeats} repeat(s)")
    ratios = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="pdsvc-bench-slo-") as tmp:
            stack = BenchStack.up(Path(tmp), REPO / ".venv-serve" / "bin" / "python", ENGINE)
            try:
                run = stack.bench(*SEARCH, timeout=1200)
            finally:
                stack.down()
        if run.returncode != 0:
            print(f"repeat {i + 1}: exit {run.returncode}: {run.stderr.strip()[-500:]}")
            return 1
        doc = json.loads(run.stdout)
        found = doc["slo"]["rate"]
        ratios.append(found / KNEE)
        runs = [(round(r["rate"], 1), f"{r['slo_share']:.0%}") for r in doc["runs"]]
        print(f"repeat {i + 1}: found {found:.2f} req/s, found/knee {found / KNEE:.3f}, "
              f"{len(runs)} runs (rate, SLO met): {runs}")
    spread = f"{min(ratios):.3f}..{max(ratios):.3f}" if len(ratios) > 1 else f"{ratios[0]:.3f}"
    ok = all(abs(r - 1) <= 0.10 for r in ratios)
    print(f"found/knee {spread} (goal within 0.90..1.10): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
