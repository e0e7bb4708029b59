"""Pair healing figures under a real systemd (nspawn), the stand-in engines and both real routers.

For each router generation (sglang-router 0.3.2, smg 1.13.0), from one run on one machine:
  registration — last engine READY → router READY, i.e. the first good completion through the
                 router (the router's READY=1 waits for one): goal ≤ 0.3 s;
  kill -9      — of each engine → first good completion: goal ≤ engine load time + 5 s;
  stale pair   — a prefill replaced behind its address (the decode keeps its old NIXL state and
                 fails every transfer as HTTP 200 + abort) → healed:
                 goal ≤ canary interval × failures + load time + 5 s.
Times come from systemd's own monotonic timestamps where it has them.

    sudo python benchmarks/pair_faults.py        # needs root, systemd-nspawn, .venv-serve
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

from stack import Stack  # noqa: E402

LOAD, WARM = 3.0, 0.2  # stand-in engine: weights, warm compile (s)
INTERVAL, FAILURES = 1, 3  # the canary


def ts(stack: Stack, unit: str, prop: str) -> float:
    return int(stack.prop(unit, prop)) / 1e6


def good(stack: Stack) -> bool:
    code, body = stack.generate(timeout=5)
    return code == 200 and "hello from fake engine" in body


def until_good(stack: Stack, t0: float) -> float:
    stack.c.wait_for(lambda: not good(stack), 10, interval=0.05, what="the fault to bite")
    stack.c.wait_for(lambda: good(stack), 120, interval=0.05, what="a good completion")
    return time.monotonic() - t0


def run(package: str) -> list[tuple[str, float, float]]:
    rows = []
    stack = Stack.up(Path(tempfile.mkdtemp(prefix="pdsvc-bench-")), REPO / ".venv-serve",
                     start=False, **{
                         "router.package": package,
                         "runtime.env.FAKE_SGLANG_LOAD_SECS": LOAD,
                         "runtime.env.FAKE_SGLANG_COMPILE_WARM_SECS": WARM,
                         "runtime.env.FAKE_SGLANG_STALE_PAIR": "decode",
                         "lifecycle.canary_interval_secs": INTERVAL,
                         "lifecycle.canary_failures": FAILURES})
    try:
        stack.start()
        registrations = []
        for i in range(3):
            if i:
                stack.stop()
                stack.start()
            last = max(ts(stack, stack.unit(r), "ActiveEnterTimestampMonotonic")
                       for r in ("prefill", "decode"))
            registrations.append(ts(stack, stack.unit("router"),
                                    "ActiveEnterTimestampMonotonic") - last)
        rows.append(("last engine READY → first good completion (median of 3)",
                     statistics.median(registrations), 0.3))
        load = LOAD + WARM
        for role in ("prefill", "decode"):
            seconds = []
            for _ in range(3):
                time.sleep(2 * INTERVAL)  # the canaries have seen the pair work
                t0 = time.monotonic()
                stack.c.run(["kill", "-9", str(stack.engine_pid(role))])
                seconds.append(until_good(stack, t0))
            rows.append((f"kill -9 {role} engine → serving (median of 3)",
                         statistics.median(seconds), load + 5))
        seconds = []
        for _ in range(3):
            time.sleep(2 * INTERVAL)
            t0 = time.monotonic()
            stack.curl("/_fake/control", {"new_instance": True}, port=30000)
            seconds.append(until_good(stack, t0))
        rows.append(("stale pair (prefill replaced) → healed (median of 3)",
                     statistics.median(seconds), INTERVAL * FAILURES + load + 5))
    finally:
        stack.down()
    return rows


def main() -> None:
    print(f"stand-in engine: load {LOAD:g} s + warm compile {WARM:g} s; canary every "
          f"{INTERVAL} s, {FAILURES} failures to act; real systemd 252 in nspawn")
    for package in ("sglang-router", "smg"):
        print(f"\n{package}")
        for name, value, goal in run(package):
            verdict = "ok" if value <= goal else "OVER"
            print(f"  {name:<58} {value:6.2f} s   goal ≤ {goal:5.2f} s   {verdict}")


if __name__ == "__main__":
    main()
