"""No single point of failure in the router: router.replicas: 2 behind Debian's HAProxy, a
2P2D stack under steady load, real systemd, both router generations (tests/support/
zero_loss.py's FRONT_EVENTS, the same figures as benchmarks/zero_loss.py):

  systemctl restart of one router: 0 failed (it drains out of the front first);
  kill -9 of one router: 0 non-streamed failed (the front sends them to the other), streams
    cut no more than were in flight;
  both routers restarted in turn (a package upgrade): 0 failed;
  `pdsvc apply` of a router change (one router at a time): 0 failed.
No request of any event may hang until the client's timeout. The front adds latency: its
p50 and p99 beside the router's own, in one run, are printed (`BENCH`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import zero_loss
from conftest import require
from faults import journal
from loadgen import Load
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fronted(serve_python: Path, router_package: str,
            tmp_path_factory) -> Iterator[tuple[Stack, Load]]:
    require(nspawn_available())
    with zero_loss.loaded(tmp_path_factory.mktemp("front"), serve_python.parent.parent,
                          router_package, front=True) as running:
        yield running


def test_clients_reach_both_routers_through_one_address(fronted: tuple[Stack, Load]) -> None:
    stack, _ = fronted
    assert stack.plan["client_url"] == "http://127.0.0.1:8000"
    assert stack.router_ports == [8100, 8101]
    for port in stack.router_ports:  # every engine registered with each router
        assert stack.listed(port) == set(zero_loss.engine_urls(stack).values())
    # pdsvc status says so, with each router as the front sees it
    r = stack.pdsvc("status", "-c", "/srv/e2e/config.yaml", "--topology",
                    "/srv/e2e/topology.json", "--json", timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["serving"] and doc["problems"] == [], r.stdout + r.stderr
    assert [(f["name"], f["status"]) for f in doc["front"]] == [
        (f"{stack.name}-router-0", "UP"), (f"{stack.name}-router-1", "UP")]
    assert [len(m["workers"]) for m in doc["more_routers"]] == [4]
    # HAProxy's own exporter, the pdsvc-front scrape target, from inside its sandbox
    code, text = stack.curl("/metrics", port=stack.plan["front"]["prometheus_port"])
    assert code == 200 and (f'haproxy_server_status{{proxy="routers",server="{stack.name}'
                            '-router-1",state="UP"} 1') in text


@pytest.mark.parametrize("event", zero_loss.FRONT_EVENTS,
                         ids=[e.name for e in zero_loss.FRONT_EVENTS])
def test_no_request_fails_when_a_router_goes(fronted: tuple[Stack, Load], router_package: str,
                                             event: zero_loss.Event) -> None:
    stack, ld = fronted
    zero_loss.meets_goal(stack, ld, event, "front")
    if event.target and "restart" in event.name:  # drained out of the front, then back
        said = journal(stack, event.target)
        assert any("drained in" in ln for ln in said), said[-20:]
        assert any("back in rotation" in ln for ln in said), said[-20:]


def test_the_latency_the_front_adds_is_printed(fronted: tuple[Stack, Load],
                                               router_package: str) -> None:
    """Figures, not a timed assertion: every request answered both ways, the difference
    printed beside the goal (≤ 1 ms p50, ≤ 2 ms p99)."""
    stack, _ = fronted
    got, line = zero_loss.front_latency(stack)
    print(f"BENCH [{router_package}] {line}")
    assert set(got) == {"front", "router"}
    line = zero_loss.front_memory(stack)
    print(f"BENCH [{router_package}] {line}")
    assert "MiB" in line


def test_a_marathon_of_faults_with_an_apply_in_the_middle_loses_no_request(
        fronted: tuple[Stack, Load], router_package: str) -> None:
    """Engines, runtimes and routers killed and restarted in a row, some while the last one
    still heals, a pdsvc apply in the middle: no non-streamed request fails, and a stream
    fails only by being cut on an engine or router that was killed under it."""
    if zero_loss.apply_missing():
        pytest.skip("no pdsvc apply")
    stack, ld = fronted
    failed, plain, sent, _, line = zero_loss.marathon(stack, ld)
    print(f"BENCH [{router_package}] {line}")
    assert sent > 100
    assert plain == 0 and set(failed) <= {"cut"}, line
