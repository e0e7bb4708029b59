"""`pdsvc tune` on a designed deployment: does it find the designed best, how close is the
goodput it measures to the designed capacity, and what does a candidate cost beyond its
bench runs? Under a real systemd (nspawn), the real router, SGLang's own bench_serving and
the stand-in engines, whose capacity and ITL follow their flags and environment
(tests/support/fake_latency.py):

* capacity: FAKE_SGLANG_SLOT_RATE (1 req/s) × the decode's slots (--cuda-graph-max-bs-decode)
  per decode, two decodes: 8 slots serve 16 req/s, 32 slots 64;
* ITL: 10 ms × (1 + slots / 8) × NCCL_PROTO's factor (LL128 0.7, Simple 1.3): with the SLO's
  ITL bound of 45 ms, 32 slots meet it only with LL128 (35 ms; 50 unset, 65 with Simple).

The pair canaries run at the shipped interval, 30 s: a round is a request in each decode's
queue (a round a second over 4 pairs took a quarter of the baseline's capacity).

So of the 9 candidates (slots 12, 16, 32 × NCCL_PROTO unset, LL128, Simple; the baseline runs
8 slots, NCCL_PROTO unset) the designed best is 32 slots with LL128, 64 req/s. (Candidates
far below the rate range cost most: each overloaded run's queue drains before the next.) A side load
runs through the router all along (its failures are counted).

Printed: pdsvc tune's table, then per candidate its goodput against the designed capacity,
the switch's seconds (apply: each restarted engine's load and its pairs proven) and the rest
(the SLO search's runs), and the side load's failures.

    sudo python benchmarks/tune.py        # needs root, systemd-nspawn, .venv-serve (~30 min)
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

from bench_stack import make_tokenizer  # noqa: E402
from stack import APPLY_DIR, Stack, pdsvc_argv  # noqa: E402

VENV = REPO / ".venv-serve"
BS, PROTO = "decode.args.cuda-graph-max-bs-decode", "decode.env.NCCL_PROTO"
LOAD_SECS = 1.0  # the stand-in engine's load (FAKE_SGLANG_LOAD_SECS in tests/support/stack.py)
SPACE = {
    "slo": {"ttft_ms": 800, "itl_ms": 45, "share": 0.99},
    "workload": {"input_len": 32, "output_len": 8, "num_prompts": 200},
    "rates": {"low": 8, "high": 128, "precision": 0.1},
    "engine_load_secs": LOAD_SECS,
    "search": "grid",
    "levers": {BS: [12, 16, 32], PROTO: [None, "LL128", "Simple"]},
}


def designed(changes: dict) -> float | None:
    """The designed capacity (req/s) of a candidate; None where the ITL bound is broken."""
    slots = changes.get(BS, 8)
    factor = {"LL128": 0.7, "Simple": 1.3}.get(changes.get(PROTO), 1.0)
    if 10 * (1 + slots / 8) * factor > SPACE["slo"]["itl_ms"]:
        return None
    return 2 * slots * 1.0


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="pdsvc-tune-bench-"))
    make_tokenizer(VENV / "bin" / "python", work / "model")
    s = Stack.up(work, VENV, gpus=4, lifetime=4 * 3600, **{
        "prefill": [{"gpus": [0]}, {"gpus": [1]}],
        "decode": [{"gpus": [2], "args": {"cuda-graph-max-bs-decode": 8}},
                   {"gpus": [3], "args": {"cuda-graph-max-bs-decode": 8}}],
        "router.policy": "round_robin",
        # the shipped interval (etc/pdsvc.yaml), not the tests' 1 s: each canary round is a
        # request in a decode's queue, and 4 pairs a second take 4 of the baseline's 16 req/s
        "lifecycle.canary_interval_secs": 30,
        "runtime.env.FAKE_SGLANG_SLOT_RATE": 1,
        "runtime.env.FAKE_SGLANG_ITL_SLOTS": 8,
        "runtime.env.FAKE_SGLANG_ITL_BY_NCCL_PROTO": "LL128=0.7,Simple=1.3",
    })
    stop, side = threading.Event(), []

    def side_load() -> None:
        while not stop.is_set():
            code, body = s.generate(timeout=20)
            side.append(code == 200 and "hello from fake engine" in body)
            time.sleep(0.5)

    try:
        s.c.run(["mkdir", "-p", APPLY_DIR])
        s.c.run(["cp", "-a", "/srv/e2e/units", f"{APPLY_DIR}/units"])
        s.c.run(["cp", "/srv/e2e/config.yaml", f"{APPLY_DIR}/config.yaml"])
        (work / "tune.yaml").write_text(yaml.safe_dump(SPACE))
        argv = pdsvc_argv(work, s.plan["python"], "tune", "-c", f"{APPLY_DIR}/config.yaml",
                          "--topology", "/srv/e2e/topology.json", "-o", f"{APPLY_DIR}/units",
                          "--space", "/srv/e2e/tune.yaml", "--results", "/var/lib/tune",
                          "--drain-timeout", "20", "--step-timeout", "120")
        argv[1] += f":{REPO}/tests/support/bench_site"
        loop = threading.Thread(target=side_load, daemon=True)
        loop.start()
        t0 = time.monotonic()
        r = s.c.run(["bash", "-c", shlex.join(argv) + " 2>/tmp/tune.err"], check=False,
                    timeout=3 * 3600)
        took = time.monotonic() - t0
        stop.set()
        loop.join(30)
        print(r.stdout)
        if r.returncode != 0:
            print(s.c.read_file("/tmp/tune.err")[-5000:])
            raise SystemExit(f"pdsvc tune exited {r.returncode}")
        doc = json.loads(s.c.run(["bash", "-c", "cat /var/lib/tune/*/results.json"]).stdout)
        report(doc, took, side)
    finally:
        stop.set()
        s.down()


def report(doc: dict, took: float, side: list[bool]) -> None:
    print(f"\npdsvc tune took {took / 60:.1f} min; per candidate (first measurement):")
    print(f"  {'name':<9} {'changes':<50} {'goodput':>8} {'designed':>8} {'ratio':>6} "
          f"{'switch s':>8} {'runs s':>7}")
    firsts = [o for o in doc["outcomes"] if o["repeat"] == 0]
    for o in firsts:
        changes = {p: v for p, v in o["changes"]}
        want = designed(changes)
        got = o["rate"]
        ratio = f"{got / want:.2f}" if got and want else "-"
        print(f"  {o['name']:<9} {json.dumps(changes):<50} {got or 0:>8.3g} "
              f"{want or 0:>8.3g} {ratio:>6} {o['apply_seconds']:>8.1f} "
              f"{o['seconds'] - o['apply_seconds']:>7.1f}")
    switched = [o for o in firsts if o["apply_seconds"]]
    if switched:
        worst = max(o["apply_seconds"] for o in switched)
        print(f"  switch (2 decodes restarted one at a time, engine load {LOAD_SECS:g} s): "
              f"mean {sum(o['apply_seconds'] for o in switched) / len(switched):.1f} s, "
              f"max {worst:.1f} s; per restarted engine ≤ {worst / 2:.1f} s "
              f"(goal: engine load + 10 s = {LOAD_SECS + 10:g} s)")
    print(f"  side load: {len(side)} requests, {side.count(False)} failed")


if __name__ == "__main__":
    main()
