"""Zero failed requests on a 2P2D stack under steady load, under a real
systemd, on both router generations: one event at a time, every request judged by content
(tests/support/zero_loss.py, the same events and figures as benchmarks/zero_loss.py).

One stack per router, the events in sequence, each after a steady window at full capacity:
  systemctl restart of one prefill, of one decode: 0 failed;
  kill -9 of one prefill's engine, of one decode's, and of each one's runtime (the unit's
    main process): 0 non-streamed failed, no stream failed
    otherwise than cut, and no more cut than were in flight on that engine;
  systemctl restart of the router: measured (`BENCH` line); no request hangs;
  `pdsvc apply` of a pair-compatible and of a pair-incompatible change: 0 failed (smg: at
    most the requests of the halves' switch, each its own 503; see zero_loss.Outcome.misses).
No request of any event may hang until the client's timeout.
"""

from __future__ import annotations

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
def loaded(serve_python: Path, router_package: str,
           tmp_path_factory) -> Iterator[tuple[Stack, Load]]:
    require(nspawn_available())
    with zero_loss.loaded(tmp_path_factory.mktemp("zero-loss"), serve_python.parent.parent,
                          router_package) as running:
        yield running


@pytest.mark.parametrize("event", zero_loss.EVENTS, ids=[e.name for e in zero_loss.EVENTS])
def test_no_request_fails_beyond_the_goal(loaded: tuple[Stack, Load], router_package: str,
                                          event: zero_loss.Event) -> None:
    stack, ld = loaded
    zero_loss.meets_goal(stack, ld, event, "zero-loss")
    if event.name.endswith("'s runtime"):  # its ExecStopPost= took the engine out at once
        assert any("ended without taking" in ln and "deregistered it" in ln
                   for ln in journal(stack, event.target)), event.name
