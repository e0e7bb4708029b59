"""The lease on pdsvc apply's holds (pdsvc/apply/lease.py): every hold carries ``until`` and
is renewed while apply runs, so one left by a killed apply ends by itself; renewal keeps when
the hold began, never brings back a removed hold, and a failed renewal is said, not raised.
`pdsvc status` says how long a hold has left, or that it expired."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from pdsvc.apply.execute import Bounds, Executor
from pdsvc.apply.host import LocalHost
from pdsvc.apply.lease import LEASE_ENV, LEASE_SECS, RENEWALS, Lease, lease_secs
from pdsvc.ship.runtime.hold import Hold, hold_path, write_hold
from pdsvc.status.runstate import hold_words


class FakeHost(LocalHost):
    """This host, but its hold writes recorded (the lease's side of host.Host) and a wall
    clock a test moves."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.files: dict[str, dict] = {}
        self.writes = 0
        self.fail: Exception | bool | None = None  # raise this, or answer False

    def wall(self) -> float:
        return self.t

    def write_hold(self, path: str, out: bool, peers, why: str, until=None,
                   since=None, by="pdsvc apply", profile=None) -> bool:
        if isinstance(self.fail, Exception):
            raise self.fail
        if self.fail is False:
            return False
        self.writes += 1
        self.files[path] = {"out": out, "peers": peers, "why": why, "until": until,
                            "since": since}
        return True

    def clear_hold(self, path: str) -> None:
        self.files.pop(path, None)


def test_the_shipped_lease_is_30_s_renewed_every_5_s_and_the_runtime_honours_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEASE_ENV, raising=False)
    assert (LEASE_SECS, LEASE_SECS / RENEWALS) == (30.0, 5.0)
    ex = Executor({}, LocalHost(), Bounds(), lambda s: None)
    assert (ex.lease.secs, ex.lease.every) == (30.0, 5.0)
    path = hold_path(str(tmp_path), "dsv4-decode-0")
    assert path and ex.lease.hold(path, out=True, peers=None, why="restart")
    doc = json.loads(Path(path).read_text())
    assert 29.0 < doc["until"] - time.time() <= 30.0
    assert Hold(path, wall=lambda: doc["until"] - 1).out()
    assert Hold(path, wall=lambda: doc["until"]).out() is None


def test_the_lease_length_comes_from_the_environment_only_when_it_is_a_positive_number(
        ) -> None:
    assert lease_secs({LEASE_ENV: "3"}) == 3.0
    for bad in ("", "0", "-2", "soon"):
        assert lease_secs({LEASE_ENV: bad}) == LEASE_SECS


def test_a_renewal_moves_until_keeps_since_and_never_brings_back_a_released_hold() -> None:
    host, said = FakeHost(), list[str]()
    lease = Lease(host, said.append, secs=30)
    assert lease.hold("/run/x/p0.hold.json", out=True, peers=["http://d0"], why="step 1")
    assert host.files["/run/x/p0.hold.json"] == {
        "out": True, "peers": ["http://d0"], "why": "step 1", "until": 1030.0, "since": 1000.0}
    host.t = 1005.0
    lease.renew()
    assert host.files["/run/x/p0.hold.json"]["until"] == 1035.0
    assert host.files["/run/x/p0.hold.json"]["since"] == 1000.0
    lease.release("/run/x/p0.hold.json")
    lease.renew()
    assert host.files == {} and not lease.held and said == []


def test_a_failed_renewal_is_said_once_and_never_raises() -> None:
    host, said = FakeHost(), list[str]()
    lease = Lease(host, said.append, secs=30)
    lease.hold("/run/x/p0.hold.json", out=True, peers=None, why="")
    for fail in (OSError("No space left on device"), False, OSError("again")):
        host.fail = fail
        lease.renew()
    assert len(said) == 1 and "could not renew the hold /run/x/p0.hold.json" in said[0]
    assert "No space left on device" in said[0]
    host.fail = None
    lease.renew()
    assert len(said) == 2 and "renewed the hold /run/x/p0.hold.json again" in said[1]
    assert host.files["/run/x/p0.hold.json"]["until"] == 1030.0


def test_the_executors_holds_go_through_the_lease_and_leave_it_when_released() -> None:
    host = FakeHost()
    ex = Executor({}, host, Bounds(), lambda s: None)
    ex.holds["/run/x/p0.hold.json"] = "p0.service"
    ex.lease.hold("/run/x/p0.hold.json", out=True, peers=None, why="")
    assert ex.release_all() == ["p0.service"]
    assert not ex.lease.held and host.files == {}


def test_the_lease_thread_renews_until_stopped(tmp_path: Path) -> None:
    path = str(tmp_path / "p0.hold.json")
    renewed, writes = threading.Event(), []

    class Watching(LocalHost):
        def write_hold(self, *args, **kwargs) -> bool:
            ok = super().write_hold(*args, **kwargs)
            writes.append(ok)
            if len(writes) > 1:  # the hold() call itself came first
                renewed.set()
            return ok

    lease = Lease(Watching(), lambda s: None, secs=0.6)
    lease.hold(path, out=True, peers=None, why="")
    first = json.loads(Path(path).read_text())
    lease.start()
    try:
        assert renewed.wait(30)
    finally:
        lease.stop()
    after = json.loads(Path(path).read_text())
    assert after["until"] > first["until"] and after["since"] == first["since"]
    assert all(writes)
    assert lease._thread is None  # stopped: a killed apply renews nothing either


def test_status_shows_the_lease_left_or_that_the_hold_expired(tmp_path: Path) -> None:
    path = hold_path(str(tmp_path), "dsv4-decode-0")
    assert path
    write_hold(path, out=True, why="restart", until=1030.0)
    words = hold_words(tmp_path, "dsv4-decode-0", now=1006.0)
    assert words.startswith("held by pdsvc apply") and "(lease: 24 s left)" in words
    assert "out of the router" in words
    words = hold_words(tmp_path, "dsv4-decode-0", now=1042.0)
    assert words.startswith("hold by pdsvc apply expired 12 s ago") and path in words
    assert "the runtime ignores it" in words
    write_hold(path, out=True)  # an older apply's: no lease, held until removed
    assert "lease:" not in hold_words(tmp_path, "dsv4-decode-0", now=1e12)
    assert hold_words(tmp_path, "dsv4-prefill-0") == ""
