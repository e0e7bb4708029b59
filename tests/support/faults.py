"""The faults a PD stack sees in the field, as acts on a `Stack`: one catalogue for the
end-to-end marathon (tests/test_e2e_shipped.py) and the benchmark (benchmarks/pair_faults.py).

Each fault says how to do it, whether a pair heal must follow (the stand-in's NIXL pair state
goes stale in both directions: a replaced decode poisons its prefill), and what the fault
itself must take beyond one engine's start: the watchdog's bound for a hang, one steady canary
interval for a pair broken behind a port that never closed (nothing marks that moment).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from stack import Stack


@dataclass(frozen=True)
class Fault:
    name: str
    act: Callable[[Stack], None]
    heal: bool = False  # a pair heal (one more start of each side) must follow
    extra: Callable[[dict], float] = lambda lifecycle: 0.0  # beyond the engines' starts


def kill(signal: str, role: str) -> Callable[[Stack], None]:
    return lambda s: s.c.run(["kill", f"-{signal}", str(s.engine_pid(role))])


def kill_runtime(role: str) -> Callable[[Stack], None]:
    return lambda s: s.c.run(["kill", "-9", s.prop(s.unit(role), "MainPID")])


def restart(role: str) -> Callable[[Stack], None]:
    return lambda s: s.c.systemctl("restart", s.unit(role))


def _replace_prefill(s: Stack) -> None:
    """sglang #33789: a new prefill instance at the same address; its port never closed."""
    assert s.curl("/_fake/control", {"new_instance": True}, port=30000)[0] == 200


def watchdog(lc: dict) -> float:
    return lc["liveness_interval_secs"] * lc["liveness_failures"] + lc["liveness_timeout_secs"]


MARATHON = (
    Fault("systemctl restart decode", restart("decode"), heal=True),
    Fault("kill -9 decode engine", kill("9", "decode"), heal=True),
    Fault("kill -9 prefill engine", kill("9", "prefill")),
    Fault("kill -9 decode's runtime (MainPID)", kill_runtime("decode"), heal=True),
    Fault("SIGSTOP decode engine", kill("STOP", "decode"), heal=True, extra=watchdog),
    Fault("kill -9 router", kill("9", "router")),
    Fault("systemctl restart prefill", restart("prefill")),
    Fault("kill -9 decode engine, again", kill("9", "decode"), heal=True),
    Fault("prefill replaced behind its address", _replace_prefill, heal=True,
          extra=lambda lc: lc["canary_interval_secs"]),
)


def canaries_ok(stack: Stack, instances: tuple[str, ...] = ("prefill", "decode")) -> bool:
    """Every engine's canary file (in its RuntimeDirectory=) says every pair is ok."""
    for role in instances:
        path = f"/run/e2e/{stack.unit(role).removesuffix('.service')}.canary.json"
        if not stack.c.exists(path):
            return False
        pairs = json.loads(stack.c.read_file(path))["pairs"]
        if not pairs or any(p["state"] != "ok" for p in pairs):
            return False
    return True


def journal(stack: Stack, role: str) -> list[str]:
    return stack.c.journal(stack.unit(role), lines=5000).splitlines()


@dataclass
class Outcome:
    seconds: float  # the fault → the stack serves again
    bound: float
    heals: list[str]  # the journal lines of the heals it took
    backoff: float  # of it, the restart policy's back-off for crashes in a row


def inflict(stack: Stack, fault: Fault, lifecycle: dict, start_s: float,
            rng: random.Random) -> Outcome:
    """Do ``fault`` within seconds of the last recovery and time until the stack serves again.
    The bound: one engine's start ``start_s`` + 10 s, one more start when a heal is needed,
    what the fault itself takes, and the back-off the restart policy chose (logged)."""
    time.sleep(rng.uniform(0.0, 2.0))
    marks = {r: len(journal(stack, r)) for r in ("prefill", "decode")}
    t0 = time.monotonic()
    fault.act(stack)
    time.sleep(0.5)  # let it take hold before "serving" can be judged
    bound = start_s + 10 + (start_s if fault.heal else 0.0) + fault.extra(lifecycle)
    stack.wait_serving(timeout=bound + 60, what=f"the stack serves again after: {fault.name}")
    seconds = time.monotonic() - t0
    since = {r: journal(stack, r)[m:] for r, m in marks.items()}
    backoff = sum(float(x) for lines in since.values()
                  for x in re.findall(r"backing off ([\d.]+) s more", "\n".join(lines)))
    heals = [line for lines in since.values() for line in lines
             if "restarting to heal its pair" in line]
    return Outcome(seconds, bound + backoff, heals, backoff)
