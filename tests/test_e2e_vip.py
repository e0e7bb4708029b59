"""A router host lost: a router on each of two hosts (lb-a, lb-b) behind its HAProxy front,
and the address clients use held by keepalived (router.vip, VRRP between the two), the
prefill on gpu-a, the decode on gpu-b: real systemd in each host's container, real HAProxy and
keepalived from Debian, the real router. A steady load from gpu-a's namespace goes to the
moving address; lb-a is cut off the network (its port on the lab's switch down: a host lost
by power or a switch, which itself goes on as master). The address moves to lb-b, whose router
sends to the same engines. Then lb-a comes back: one host holds the address, and the stack
serves. The seconds until it serves again and the failed requests are printed (BENCH); the
goal (issue 35): serving again within 3 s, nothing failed after that."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet
from host_labs import fleet_up
from loadgen import Load, failures
from stack import curl

pytestmark = pytest.mark.e2e

RUN = {"lb-a": ["router"], "lb-b": ["router"], "gpu-a": ["prefill"], "gpu-b": ["decode"]}
CALM = 1.0  # requests sent this long after the address moved are past the move


@pytest.fixture(scope="module")
def two_routers(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Fleet]:
    fleet = fleet_up(serve_python, tmp_path_factory.mktemp("e2e-vip"), RUN, router_package,
                     **{"router.vip": {}, "router.policy": "round_robin"})
    yield fleet
    fleet.down()


def holders(f: Fleet) -> list[str]:
    """The router hosts whose device holds the moving address now."""
    vip = f.plan["vip"]["address"]
    return [h for h in ("lb-a", "lb-b")
            if f"inet {vip}/32" in f.hosts[h].run(["ip", "-4", "-o", "addr", "show", "dev",
                                                    f.lab.device]).stdout]


def wait(what: str, ok, bound: float, step: float = 0.05) -> float:
    t0 = time.monotonic()
    while not ok():
        assert time.monotonic() - t0 < bound, f"not within {bound} s: {what}"
        time.sleep(step)
    return time.monotonic()


def listed(f: Fleet, host: str) -> int:
    """How many healthy workers the router on ``host`` lists (its own URL, from its host)."""
    r = next(r for r in f.plan["routers"] if r["machine"] == host)
    code, body = curl(f.hosts[host], f"{r['url']}/workers", timeout=5,
                      key_file=f"/etc/{f.name}/router.key")
    if code != 200:
        return 0
    return sum(1 for w in json.loads(body)["workers"] if w["is_healthy"])


def test_a_router_host_lost_moves_the_address_and_the_stack_serves_on(
        two_routers: Fleet, router_package: str) -> None:
    f = two_routers
    assert f.plan["client_url"] == f"http://{f.plan['vip']['address']}:8000"
    wait("lb-a holds the address (the first router host)", lambda: holders(f) == ["lb-a"], 30)
    wait("both routers list both engines", lambda: min(listed(f, "lb-a"),
                                                        listed(f, "lb-b")) == 2, 60, 0.5)
    load = Load(f"{f.plan['client_url']}/generate", rate=8, stream_share=0.0, timeout=8,
                netns=f.lab.netns("gpu-a"), seed=35)
    with load:
        time.sleep(3)
        t_cut = time.monotonic()
        assert not failures(load.within(0, t_cut)), failures(load.within(0, t_cut))
        f.lab.cut("lb-a")
        moved = wait("lb-b holds the address", lambda: "lb-b" in holders(f), 15)
        time.sleep(1)
        # lb-b's own status says it has the address, and sends clients there
        said = json.loads(f.pdsvc("lb-b", "status", "--json", timeout=60).stdout)
        assert said["address"] == {"address": f.plan["vip"]["address"], "here": True}, said
        assert said["url"] == f"{f.plan['client_url']}/v1/chat/completions"
        time.sleep(7)
        t_back = time.monotonic()
        f.lab.cut("lb-a", up=True)
        # lb-a, master all along on its own, meets lb-b again: one of them keeps the address
        settled = wait("one router host holds the address", lambda: len(holders(f)) == 1, 15)
        time.sleep(6)
        t_end = time.monotonic()
    load.settle(t_end)
    after_cut = sorted((r for r in load.results if r.start >= t_cut and r.start < t_back),
                       key=lambda r: r.start)
    first_ok = next(r.start for r in after_cut if r.ok)
    lost = [r for r in load.results if r.start < first_ok and r.end > t_cut]  # in the gap
    since = [r for r in after_cut if r.start >= first_ok]
    calm = [r for r in after_cut if r.start >= moved + CALM]
    back = [r for r in load.results if r.start >= t_back]
    tail = [r for r in back if r.start >= settled + CALM]
    # a request sent into the gap is not lost: its connection's SYN is sent again (TCP's
    # 1 s, then 2 s) and reaches the new holder; it is late, by this much at most
    answered = min(r.end for r in after_cut if r.ok) - t_cut
    late = max((r.latency for r in after_cut if r.ok and r.start < moved), default=0.0)
    print(f"\nBENCH [{router_package}] router host lost: the address moved in "
          f"{moved - t_cut:.1f} s; the first answer {answered:.1f} s after the cut (requests "
          f"sent in the gap {late:.1f} s late at most); "
          f"failed: {len([r for r in lost if not r.ok])} at the cut "
          f"({dict(failures(lost))}), {len([r for r in since if not r.ok])} of {len(since)} "
          f"after serving again; lb-a back: {len([r for r in back if not r.ok])} of "
          f"{len(back)} failed ({dict(failures(back))}), address on {holders(f)}")
    # the state it ends in: one holder, every request past the moves served, both routers
    # listing both engines again
    assert not failures(calm), failures(calm)
    assert not failures(tail), failures(tail)
    assert len(holders(f)) == 1
    wait("both routers list both engines again",
         lambda: min(listed(f, "lb-a"), listed(f, "lb-b")) == 2, 60, 0.5)
