"""An engine whose runtime died (kill -9 of the unit's main process, as the OOM killer would
do) leaves the router at once: the engine unit's ExecStopPost= (`runtime leave`) deletes its
entry, whatever ended the runtime. Without it, the dead engine stays listed until the router's
health checks give up on it, and requests go to it meanwhile. Both are measured in one run,
on a 2P2D stack under real systemd with the router health check etc/pdsvc.yaml ships (a drop-in
that clears ExecStopPost= stands for the units before): `BENCH` prints the two side by side."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
import zero_loss
from conftest import require
from faults import journal, kill_runtime
from nspawn import nspawn_available
from stack import REPO, Stack

pytestmark = pytest.mark.e2e

SHIPPED = yaml.safe_load((REPO / "etc" / "pdsvc.yaml").read_text())
#: the longest a dead engine may stay listed here: the shipped checks' window, and some
LISTED_AT_MOST_S = 40.0


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = zero_loss.boot(tmp_path_factory.mktemp("runtime-death"), serve_python.parent.parent,
                       router_package,
                       **{"router.health_check": dict(SHIPPED["router"]["health_check"])})
    try:
        yield s
    finally:
        s.down()


def listed_after_kill(s: Stack, instance: str) -> tuple[float, str]:
    """kill -9 of ``instance``'s runtime; the seconds the router listed it healthy while no
    engine served its URL, and how that ended: "left" the router, or "back" (its unit's
    restart served the URL again first)."""
    url = zero_loss.engine_urls(s)[instance]
    port = int(url.rsplit(":", 1)[1])
    t0 = time.monotonic()
    kill_runtime(instance)(s)
    time.sleep(0.05)  # the engine is killed with its runtime (KillMode=mixed)
    while time.monotonic() - t0 < LISTED_AT_MOST_S:
        listed = s.listed()
        if listed is not None and url not in listed:
            return time.monotonic() - t0, "left"
        if s.curl("/health", port=port, timeout=1)[0] == 200:
            return time.monotonic() - t0, "back"
        time.sleep(0.05)
    return time.monotonic() - t0, "neither"


def test_an_engine_whose_runtime_was_killed_leaves_the_router_at_once(
        stack: Stack, router_package: str) -> None:
    with_leave, ended = listed_after_kill(stack, "prefill-0")
    assert ended == "left", (with_leave, ended)
    assert any("ended without taking" in ln and "deregistered it" in ln
               for ln in journal(stack, "prefill-0"))
    stack.c.wait_for(lambda: zero_loss.at_capacity(stack), 60, interval=0.5, what="capacity")
    # the units before: no ExecStopPost= (an empty assignment in a drop-in clears the list)
    drop_in = f"/etc/systemd/system/{stack.unit('prefill-1')}.d"
    stack.c.run(["sh", "-c", f"mkdir -p {drop_in} && printf '[Service]\\nExecStopPost=\\n' "
                             f"> {drop_in}/before.conf"])
    stack.c.daemon_reload()
    mark = len(journal(stack, "prefill-1"))
    try:
        without, ended_without = listed_after_kill(stack, "prefill-1")
    finally:
        stack.c.run(["rm", "-rf", drop_in])
        stack.c.daemon_reload()
    stack.c.wait_for(lambda: zero_loss.at_capacity(stack), 60, interval=0.5, what="capacity")
    hc = SHIPPED["router"]["health_check"]
    print(f"\nBENCH [{router_package}] kill -9 of a prefill's runtime, shipped router health "
          f"check (every {hc['interval_secs']} s, {hc['failure_threshold']} failures): the dead "
          f"engine listed {with_leave:.2f} s with the unit's ExecStopPost= leave, "
          f"{without:.2f} s without it (then {ended_without}: "
          f"{'its restart served again first' if ended_without == 'back' else 'left'})")
    # the mechanism, not two durations of different moments: without the unit's leave,
    # nothing deregistered the dead engine (the router's own checks, or its restart, ended it)
    assert not any("deregistered it" in ln for ln in journal(stack, "prefill-1")[mark:])
