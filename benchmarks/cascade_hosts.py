"""A stale-side dead-lock across hosts, with the lifecycle etc/pdsvc.yaml ships beside the fast
one the tests use: how long from the fault until every pair serves again.

The lab of tests/test_e2e_cascade_hosts.py (2P2D, both prefills on gpu-a, both decodes on
gpu-b, the router on lb; each host its own real systemd in its own network namespace; stand-in
engines with both stale-pair bugs). One prefill is restarted; the decodes go stale toward it,
one heals, and the other role goes stale toward that one: the engines the router lists are
then the stale sides of pairs with engines it leaves out, and each waits for a sibling to be
listed. Printed per profile and router, from one run on one machine: the seconds from the fault
to the cure (and which rule found it: a stale-side dead-lock, or a cascade of heals), to
settled (every engine listed, every pair good, a generation through the router, no restart
for 20 s; the 20 s are not counted), the heals before the cure, and the stand-ins' load.

    sudo python benchmarks/cascade_hosts.py     # needs root, systemd-nspawn, .venv-serve
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "tests"))

import conftest  # noqa: E402, F401  (first: it and host_labs import each other)
from fleet import Fleet  # noqa: E402
from stack import e2e_config  # noqa: E402
from test_e2e_cascade_hosts import (  # noqa: E402
    CASCADE,
    ENGINES,
    FOUND,
    QUIET,
    RESTART,
    TAKEN,
    canaries_ok,
    count,
    found_at,
    lines,
)

LOAD = 3.0  # the stand-ins' load (s)
BOUND = 1200.0  # the fault -> settled, at most (the last resort took ~11 min before)
SHIPPED = yaml.safe_load((REPO / "etc" / "pdsvc.yaml").read_text())
FAST = e2e_config("x", REPO, "/m")
PROFILES = {
    "fast (tests)": {"lifecycle": FAST["lifecycle"]},
    "shipped": {"lifecycle": SHIPPED["lifecycle"],
                "router.health_check": SHIPPED["router"]["health_check"]},
}
DEADLOCK = "stale-side dead-lock"  # in the cure's words: the rule that found it


def run(package: str, profile: dict) -> str:
    fleet = Fleet.up(Path(tempfile.mkdtemp(prefix="pdsvc-bench-")), REPO / ".venv-serve",
                     {"lb": ["router"], "gpu-a": ["prefill[0]", "prefill[1]"],
                      "gpu-b": ["decode[0]", "decode[1]"]},
                     **{"router.package": package, **profile,
                        "prefill": [{"gpus": [0]}, {"gpus": [1]}],
                        "decode": [{"gpus": [0]}, {"gpus": [1]}],
                        "runtime.env.FAKE_SGLANG_STALE_PAIR": "both",
                        "runtime.env.FAKE_SGLANG_LOAD_SECS": LOAD})
    try:
        fleet.start()
        fleet.hosts["lb"].wait_for(
            lambda: sum(1 for w in fleet.workers() if w[3]) == len(ENGINES)
            and canaries_ok(fleet), 300, interval=0.5, what="every engine listed, pairs good")
        heals0 = lines(fleet, RESTART, but=CASCADE)
        found0 = lines(fleet, FOUND, CASCADE, but=TAKEN)
        t0, wall0 = time.monotonic(), time.time()
        fleet.hosts["gpu-a"].run(["systemctl", "restart", "e2e-prefill-1.service"])
        last = [count(lines(fleet, RESTART)), t0]

        def settled() -> bool:
            n = count(lines(fleet, RESTART))
            if n != last[0]:
                last[:] = [n, time.monotonic()]
                return False
            return (time.monotonic() - last[1] >= QUIET and canaries_ok(fleet)
                    and sum(1 for w in fleet.workers() if w[3]) == len(ENGINES)
                    and fleet.generate()[0])

        fleet.hosts["lb"].wait_for(settled, BOUND, interval=1.0, what="settled")
        when = found_at(fleet, found0)
        rule = lines(fleet, FOUND, CASCADE, but=TAKEN)[when[0][1]][-1] if when else ""
        heals = count(lines(fleet, RESTART, but=CASCADE)) - count(heals0)
        cure = f"{when[0][0] - wall0:.0f} s ({'dead-lock' if DEADLOCK in rule else 'cascade'})" \
            if when else "none"
        return (f"cure after {cure}, settled after {last[1] - t0:.0f} s, {heals} heals "
                f"before it")
    finally:
        fleet.down()


def main() -> None:
    print(f"stand-in load {LOAD:g} s; one prefill of 2P2D restarted; both stale-pair bugs")
    for package in ("sglang-router", "smg"):  # 0.3.2 and 1.13.0 (tests/conftest.py)
        for name, profile in PROFILES.items():
            print(f"{package:14} {name:13} {run(package, profile)}", flush=True)


if __name__ == "__main__":
    main()
