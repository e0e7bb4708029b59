"""A heal cascade across hosts: the prefills on one host, the decodes on another, both stale-pair
bugs at once (the stand-in's FAKE_SGLANG_STALE_PAIR=both), real systemd in each host's
container, the real router on a third. No host's state directory holds heals of both roles;
the router's worker list does (each registration's labels, runtime/cascade.py): one prefill
restarted starts the cascade, one runtime finds it and cures it, and the cure reaches the other
host through the router: every engine restarts with it once, and the deployment settles."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet
from host_labs import fleet_up

pytestmark = pytest.mark.e2e

ENGINES = {"e2e-prefill-0": "gpu-a", "e2e-prefill-1": "gpu-a",
           "e2e-decode-0": "gpu-b", "e2e-decode-1": "gpu-b"}
QUIET = 20.0  # no heal for this long, everything serving: settled
BOUND = 300.0  # the fault -> settled, at most
RESTART = "restarting to heal its pair"  # every own restart of an engine (a heal, a cure)
CASCADE = "heal cascade"  # ... and a cure's names the cascade


@pytest.fixture(scope="module")
def split(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Fleet]:
    fleet = fleet_up(serve_python, tmp_path_factory.mktemp("e2e-cascade-hosts"),
                     {"lb": ["router"], "gpu-a": ["prefill[0]", "prefill[1]"],
                      "gpu-b": ["decode[0]", "decode[1]"]}, router_package,
                     prefill=[{"gpus": [0]}, {"gpus": [1]}],
                     decode=[{"gpus": [0]}, {"gpus": [1]}],
                     **{"runtime.env.FAKE_SGLANG_STALE_PAIR": "both"})
    yield fleet
    fleet.down()


def lines(f: Fleet, *keys: str, but: str = "\0") -> dict[str, list[str]]:
    """Each engine's journal lines with every one of ``keys`` and without ``but``."""
    out = {}
    for unit, host in ENGINES.items():
        text = f.hosts[host].journal(f"{unit}.service", lines=5000)
        out[unit] = [ln for ln in text.splitlines() if all(k in ln for k in keys)
                     and but not in ln]
    return out


def count(found: dict[str, list[str]]) -> int:
    return sum(len(v) for v in found.values())


def canaries_ok(f: Fleet) -> bool:
    for unit, host in ENGINES.items():
        path = f"/run/e2e/{unit}.canary.json"
        h = f.hosts[host]
        if not h.exists(path):
            return False
        pairs = json.loads(h.read_file(path))["pairs"]
        if not pairs or any(p["state"] != "ok" for p in pairs):
            return False
    return True


def test_a_cascade_over_two_hosts_is_cured_once_on_both(split: Fleet,
                                                        router_package: str) -> None:
    invocation = {u: split.hosts[h].show(f"{u}.service", "InvocationID")["InvocationID"]
                  for u, h in ENGINES.items()}
    heals0, cures0 = lines(split, RESTART, but=CASCADE), lines(split, RESTART, CASCADE)
    t0 = time.monotonic()
    split.hosts["gpu-a"].run(["systemctl", "restart", "e2e-prefill-1.service"])
    last = [count(heals0) + count(cures0), t0]

    def settled() -> bool:
        n = count(lines(split, RESTART))
        if n != last[0]:
            last[:] = [n, time.monotonic()]
            return False
        cured = lines(split, RESTART, CASCADE)
        return (all(len(cured[u]) > len(cures0[u]) for u in ENGINES)
                and time.monotonic() - last[1] >= QUIET and split.generate()[0]
                and canaries_ok(split))

    try:
        split.hosts["lb"].wait_for(settled, BOUND, interval=1.0,
                                   what="every engine on both hosts cured once, settled")
    except AssertionError as e:
        raise AssertionError(f"{e}\nheals: {lines(split, RESTART)}") from None
    seconds = last[1] - t0
    cured = lines(split, RESTART, CASCADE)
    heals = count(lines(split, RESTART, but=CASCADE)) - count(heals0)
    print(f"\nBENCH [{router_package}] heal cascade across hosts: settled {seconds:.0f} s after "
          f"the fault, {heals} heals, {len(ENGINES)} engines on 2 hosts cured")
    assert all(len(cured[u]) - len(cures0[u]) == 1 for u in ENGINES), cured  # once each
    assert all(split.hosts[h].show(f"{u}.service", "InvocationID")["InvocationID"]
               != invocation[u] for u, h in ENGINES.items())
    # the other host learnt the cure through the router
    told = [ln for v in lines(split, "the router lists it").values() for ln in v]
    assert told, "no runtime took the cure from the router's list"
