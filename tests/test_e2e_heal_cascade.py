"""2P2D under real systemd with both stale-pair bugs at once (the stand-in's
FAKE_SGLANG_STALE_PAIR=both: a decode stale toward a replaced prefill, sglang #33789, and a
prefill stale toward a replaced decode, smg-project/smg #2382): one prefill restarted starts a
heal cascade, every heal making the other role stale again. The runtimes find it in their
shared state directory and restart every engine together once (runtime/cascade.py); the
deployment settles: every engine serving and in the router, every pair good, and no heal for
``QUIET`` seconds. The seconds, heals and engines restarted together are printed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zero_loss
from conftest import require
from faults import canaries_ok, journal
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")
#: no heal for this long, everything serving: settled
QUIET = 20.0
#: the fault -> settled, at most (a cascade of a few heals, the cure, a reload of every engine)
BOUND = 300.0
#: every own restart of an engine says this (a heal, and a restart of the cure alike)
RESTART = "restarting to heal its pair"
#: ... and a restart of the cure names the cascade
CASCADE = "heal cascade"
#: the line of the runtime that found it and wrote the marker
FOUND = ": wrote /run/e2e/e2e.heal-all.json"


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = zero_loss.boot(tmp_path_factory.mktemp("cascade-2p2d"), serve_python.parent.parent,
                       router_package, **{"runtime.env.FAKE_SGLANG_STALE_PAIR": "both"})
    try:
        yield s
    finally:
        s.down()


def lines(s: Stack, *keys: str, but: str = "\0") -> dict[str, list[str]]:
    """Each engine's journal lines with every one of ``keys`` and without ``but``."""
    return {e: [ln for ln in journal(s, e) if all(k in ln for k in keys) and but not in ln]
            for e in ENGINES}


def heals(s: Stack) -> dict[str, list[str]]:
    return lines(s, RESTART, but=CASCADE)


def cures(s: Stack) -> dict[str, list[str]]:
    return lines(s, RESTART, CASCADE)


def count(found: dict[str, list[str]]) -> int:
    return sum(len(v) for v in found.values())


#: the journal lines a failure's timeline shows: starts, heals, cures, canary verdicts ...
TOLD = ("serving on", "restarting", "heal cascade", "NIXL agent name", "Started", "Stopped")
#: ... but not each failed transfer or canary round
UNTOLD = ("bootstrap_room=", "pair canary http")


def timeline(s: Stack) -> str:
    """The engines' lines of ``TOLD``, in order, with their monotonic stamps (for a failure)."""
    units = {s.unit(e) for e in ENGINES}
    return "\n".join(f"{t:9.2f} {ln[:300]}" for t, ln in zero_loss.journal(s)
                     if any(u.removesuffix(".service") in ln for u in units)
                     and any(k in ln for k in TOLD) and not any(k in ln for k in UNTOLD))


def test_a_heal_cascade_is_cured_by_one_restart_of_every_engine_and_settles(
        stack: Stack, router_package: str) -> None:
    heals0, cures0 = heals(stack), cures(stack)
    found0 = count(lines(stack, FOUND))
    before = {e: stack.invocation(e) for e in ENGINES}
    t0 = time.monotonic()
    stack.c.systemctl("restart", stack.unit("prefill-1"))
    last = [count(heals0) + count(cures0), t0]

    def settled() -> bool:
        n = count(heals(stack)) + count(cures(stack))
        if n != last[0]:
            last[:] = [n, time.monotonic()]
            return False
        return (count(cures(stack)) > count(cures0) and time.monotonic() - last[1] >= QUIET
                and zero_loss.at_capacity(stack) and stack.serves()
                and canaries_ok(stack, ENGINES))

    try:
        stack.c.wait_for(settled, BOUND, interval=1.0, what="the deployment settled after "
                         "one cure of its heal cascade")
    except AssertionError as e:
        said = {k: v[-3:] for k, v in lines(stack, "pair canary").items()}
        raise AssertionError(f"{e}\nheals: {heals(stack)}\ncanary: {said}\n"
                             f"timeline:\n{timeline(stack)}") from None
    seconds = last[1] - t0  # the last heal or cure; QUIET passed since without one
    found = lines(stack, FOUND)
    # the heal that completed the cascade became the cure: its line names the cascade
    healed = count(heals(stack)) - count(heals0) + count(found) - found0
    cured = cures(stack)
    together = [e for e in ENGINES if len(cured[e]) > len(cures0[e])]
    print(f"\nBENCH [{router_package}] heal cascade: settled {seconds:.0f} s after the fault, "
          f"{healed} heals, {len(together)} engines restarted together")
    try:
        assert count(found) - found0 == 1, found  # one marker, by one runtime
        assert together == list(ENGINES), cured  # every engine restarted with the cure, once
        assert all(len(cured[e]) - len(cures0[e]) == 1 for e in ENGINES), cured
        assert all(stack.invocation(e) != before[e] for e in ENGINES)
        said = next(ln for v in found.values() for ln in v)
        assert "sglang #33789" in said and "smg-project/smg #2382" in said
        assert f"systemctl restart {stack.target}" in said
    except AssertionError as e:
        raise AssertionError(f"{e}\ntimeline:\n{timeline(stack)}") from None
