"""The host labs (tests/support/fleet.py) that more than one test module runs against, as
session fixtures: booting one costs containers and minutes, so the modules share it, once per
router generation (`lab_router`). The 2P1D lab over four hosts serves tests/test_e2e_hosts.py
(a prefill host's engine killed) and tests/test_e2e_apply_hosts.py (`pdsvc apply` across the
hosts); each test leaves it serving, with every worker healthy, and none relies on coming
first: what holds right after the start is kept in `Fleet.started`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROUTER_PACKAGES, require
from fleet import Fleet
from netlab import netlab_available
from nspawn import nspawn_available


def fleet_up(serve_python: Path, tmp: Path, run: dict[str, list[str]], package: str,
             **kw) -> Fleet:
    """A lab of these hosts, installed and started as docs/hosts.md says (Fleet.up, start)."""
    require(nspawn_available())
    require(netlab_available())
    fleet = Fleet.up(tmp, serve_python.parent.parent, run, **{"router.package": package, **kw})
    try:
        fleet.start()
    except BaseException:
        fleet.down()
        raise
    return fleet


@pytest.fixture(scope="session", params=ROUTER_PACKAGES)
def lab_router(request: pytest.FixtureRequest) -> str:
    """router_package for the shared labs: sglang-router 0.3.2, then smg 1.13.0."""
    return request.param


@pytest.fixture(scope="session")
def four_hosts(serve_python: Path, lab_router: str, tmp_path_factory) -> Iterator[Fleet]:
    """lb: the router; gpu-a: prefill[0] (10 s to load); gpu-b: prefill[1]; gpu-c: decode."""
    fleet = fleet_up(serve_python, tmp_path_factory.mktemp("e2e-4hosts"),
                     {"lb": ["router"], "gpu-a": ["prefill[0]"], "gpu-b": ["prefill[1]"],
                      "gpu-c": ["decode"]}, lab_router,
                     prefill=[{"gpus": [0], "env": {"FAKE_SGLANG_LOAD_SECS": 10}},
                              {"gpus": [0]}],
                     **{"router.policy": "random"})
    yield fleet
    fleet.down()
