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

The time on one pair: from the moment the dead-lock formed (the cure says since when every
engine has been up while the stale sides waited on each other) to the first moment every
engine is listed, every pair good and a generation passes, with no restart after it. The
cure restarts every engine together, so that span holds one engine load; the goal is at most
one load + 30 s (it was some 11 min before the rule).

    sudo python benchmarks/cascade_hosts.py     # needs root, systemd-nspawn, .venv-serve
    sudo python benchmarks/cascade_hosts.py shipped     # only the named profiles
"""

from __future__ import annotations

import re
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
HELD = re.compile(r"for (\d+) s every engine has been up")  # ... and since when it held


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
        good: list[float] = []  # the first moment all served, since the last restart

        def settled() -> bool:
            n = count(lines(fleet, RESTART))
            if n != last[0]:
                last[:] = [n, time.monotonic()]
                good.clear()
                return False
            now = time.monotonic()
            serves = (canaries_ok(fleet) and sum(1 for w in fleet.workers() if w[3])
                      == len(ENGINES) and fleet.generate()[0])
            if serves and not good:
                good.append(now)
            elif not serves:
                good.clear()
            return serves and now - last[1] >= QUIET

        fleet.hosts["lb"].wait_for(settled, BOUND, interval=1.0, what="settled")
        when = found_at(fleet, found0)
        rule = lines(fleet, FOUND, CASCADE, but=TAKEN)[when[0][1]][-1] if when else ""
        heals = count(lines(fleet, RESTART, but=CASCADE)) - count(heals0)
        cure = f"{when[0][0] - wall0:.0f} s ({'dead-lock' if DEADLOCK in rule else 'cascade'})" \
            if when else "none"
        held = HELD.search(rule)
        served = good[0] - t0
        one_pair = (f"; on one pair {served - (when[0][0] - wall0 - int(held[1])):.0f} s "
                    f"(dead-lock formed at {when[0][0] - wall0 - int(held[1]):.0f} s) = load + "
                    f"{served - (when[0][0] - wall0 - int(held[1])) - LOAD:.0f} s"
                    ) if when and held else ""
        return (f"cure after {cure}, last restart after {last[1] - t0:.0f} s, every pair "
                f"serving after {served:.0f} s, {heals} heals before it{one_pair}")
    finally:
        fleet.down()


def main() -> None:
    wanted = sys.argv[1:] or list(PROFILES)
    unknown = [w for w in wanted if w not in PROFILES]
    if unknown:
        sys.exit(f"cascade_hosts.py: no profile {', '.join(unknown)}; the profiles: "
                 f"{', '.join(repr(p) for p in PROFILES)}")
    print(f"stand-in load {LOAD:g} s; one prefill of 2P2D restarted; both stale-pair bugs")
    for package in ("sglang-router", "smg"):  # 0.3.2 and 1.13.0 (tests/conftest.py)
        for name, profile in PROFILES.items():
            if name not in wanted:
                continue
            print(f"{package:14} {name:13} {run(package, profile)}", flush=True)


if __name__ == "__main__":
    main()
