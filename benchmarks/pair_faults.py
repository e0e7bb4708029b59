"""Pair healing figures under a real systemd (nspawn), the stand-in engines and both real
routers, with the lifecycle settings etc/pdsvc.yaml ships beside the fast ones the tests use.

For each router generation (sglang-router 0.3.2, smg 1.13.0) and each settings profile, from
one run on one machine:
  registration — last engine READY → router READY, i.e. the first good completion through the
                 router (the router's READY=1 waits for one): goal ≤ 0.3 s;
  the marathon — every fault of tests/support/faults.py, one after another, each within
                 seconds of the stack serving again after the last, with NIXL pair state
                 stale in both directions (HTTP 200 + abort): seconds until the stack serves
                 again, against its bound (one engine's start + 10 s, one more start when a
                 heal is needed, what the fault itself takes, the policy's logged back-off),
                 and the heals it took (goal: at most one).

    sudo python benchmarks/pair_faults.py        # needs root, systemd-nspawn, .venv-serve
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

from faults import MARATHON, Outcome, inflict  # noqa: E402
from stack import Stack, e2e_config  # noqa: E402

LOAD, WARM = 3.0, 0.2  # stand-in engine: weights, warm compile (s)
START = LOAD + WARM + 2.0  # one engine's start: python, load, compile, registration
SHIPPED = yaml.safe_load((REPO / "etc" / "pdsvc.yaml").read_text())
FAST = e2e_config("x", REPO, "/m")
PROFILES = {
    "fast (tests)": {"lifecycle": FAST["lifecycle"],
                     "router.health_check": FAST["router"]["health_check"]},
    "shipped": {"lifecycle": SHIPPED["lifecycle"],
                "router.health_check": SHIPPED["router"]["health_check"]},
}


def ts(stack: Stack, unit: str, prop: str) -> float:
    return int(stack.prop(unit, prop)) / 1e6


def run(package: str, profile: dict, rng: random.Random) -> tuple[float, list[Outcome]]:
    stack = Stack.up(Path(tempfile.mkdtemp(prefix="pdsvc-bench-")), REPO / ".venv-serve",
                     start=False, **{
                         "router.package": package, **profile,
                         "runtime.env.FAKE_SGLANG_LOAD_SECS": LOAD,
                         "runtime.env.FAKE_SGLANG_COMPILE_WARM_SECS": WARM,
                         "runtime.env.FAKE_SGLANG_STALE_PAIR": "both"})
    try:
        registrations = []
        for i in range(3):
            if i:
                stack.stop()
            stack.start(timeout=300)
            last = max(ts(stack, stack.unit(r), "ActiveEnterTimestampMonotonic")
                       for r in ("prefill", "decode"))
            registrations.append(ts(stack, stack.unit("router"),
                                    "ActiveEnterTimestampMonotonic") - last)
        outcomes = [inflict(stack, f, profile["lifecycle"], START, rng) for f in MARATHON]
    finally:
        stack.down()
    return statistics.median(registrations), outcomes


def main() -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"stand-in engine: load {LOAD:g} s + warm compile {WARM:g} s; NIXL pair state stale "
          f"in both directions; real systemd 252 in nspawn; seed {seed}")
    for name, p in PROFILES.items():
        lc = p["lifecycle"]
        print(f"  {name}: canary every {lc['canary_interval_secs']} s, "
              f"{lc['canary_failures']} failures to act, {lc['canary_heal_attempts']} heals; "
              f"liveness {lc['liveness_interval_secs']} s x {lc['liveness_failures']} + "
              f"{lc['liveness_timeout_secs']} s; router health every "
              f"{p['router.health_check']['interval_secs']} s")
    for package in ("sglang-router", "smg"):
        results = {name: run(package, p, rng) for name, p in PROFILES.items()}
        print(f"\n{package}: seconds until the stack serves again (bound; heals)")
        print(f"  {'fault':<40}" + "".join(f"{name:>26}" for name in results))
        print(f"  {'last engine READY → first completion':<40}" + "".join(
            f"{reg:>11.2f} (≤ 0.30)      " for reg, _ in results.values()))
        for i, fault in enumerate(MARATHON):
            cells = []
            for _, outcomes in results.values():
                o = outcomes[i]
                mark = "" if o.seconds <= o.bound and len(o.heals) <= 1 else " OVER"
                cells.append(f"{o.seconds:>7.1f} (≤ {o.bound:>4.0f}; {len(o.heals)}){mark}")
            print(f"  {fault.name:<40}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
