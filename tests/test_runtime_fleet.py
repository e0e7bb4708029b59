"""Heals and cures across hosts (pdsvc/ship/runtime/fleet.py): each host's engine runtimes serve
its view on one port, keyed with the deployment's control-plane key, and read the other hosts'.
In-process, on loopback: real listeners, real HTTP, temporary state directories as the hosts'
and a fake wall clock for the cascade's rule."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from runtime_procs import FakeClock

from pdsvc.ship.runtime import timings
from pdsvc.ship.runtime.cascade import Cascade, marker_path
from pdsvc.ship.runtime.fleet import PATH, Fleet, host_view, listen, parse_view, share
from pdsvc.ship.runtime.policy import RestartPolicy
from pdsvc.ship.runtime.statefile import FORMAT, Kind, NewerFormat, state_path

KEY = "k3y-of-the-deployment"


def record_heal(state: Path, name: str, role: str, clock: FakeClock) -> None:
    RestartPolicy(state_path(str(state), name, Kind.RESTART), restart_delay=1.0, max_delay=8.0,
                  reset_after=600.0, attempts=3, clock=clock).record_heal(role)


def get(url: str, key: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Host:
    """One host of the lab: its state directory and its listener."""

    def __init__(self, state: Path, clock: FakeClock) -> None:
        state.mkdir()
        self.state, self.clock = state, clock
        self.address = f"127.0.0.1:{free_port()}"
        self.server = listen(self.address, KEY,
                             lambda: host_view(str(state), "dep", clock.now))

    def runtime(self, name: str, *others: Host, lines: list[str]) -> Cascade:
        c = Cascade(str(self.state), "dep", name, "systemctl restart dep-pd.target",
                    lines.append, clock=self.clock)
        c.remote = Fleet([o.address for o in others], KEY, "dep", lines.append)
        return c


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[Host, Host, FakeClock]]:
    clock = FakeClock(now=1000.0)
    a, b = Host(tmp_path / "a", clock), Host(tmp_path / "b", clock)
    yield a, b, clock
    for h in (a, b):
        h.server.shutdown()
        h.server.server_close()


def refresh(*cs: Cascade) -> None:
    for c in cs:
        assert isinstance(c.remote, Fleet)
        c.remote.refresh()


def test_a_cascade_over_two_hosts_is_found_and_cured_once_on_both(hosts) -> None:
    """Host A runs both prefills, host B the decode: no state directory holds heals of both
    roles; B reads A's and finds the cascade; A reads B's cure and its engines restart with
    it, once, and the cure passed on is never a cure of its own."""
    a, b, clock = hosts
    lines: list[str] = []
    p0, p1 = a.runtime("dep-prefill-0", b, lines=lines), a.runtime("dep-prefill-1", b, lines=lines)
    d0 = b.runtime("dep-decode-0", a, lines=lines)
    began_a = clock.now - 100  # A's engines started before it all
    record_heal(a.state, "dep-prefill-0", "prefill", clock)
    clock.now += 10
    record_heal(a.state, "dep-prefill-1", "prefill", clock)
    refresh(p1)
    assert p1.after_heal() is None  # one role only
    clock.now += 10
    record_heal(b.state, "dep-decode-0", "decode", clock)
    refresh(d0)
    cure = d0.after_heal()  # B sees A's heals: the poison went back
    assert cure and "3 heals of both roles" in cure
    assert f"{a.address}/dep-prefill-0" in cure  # another host's heal, named by its host
    at = json.loads(Path(marker_path(str(b.state), "dep")).read_text())["at"]
    clock.now += 1
    refresh(p0, p1)
    p0.next_look = p1.next_look = 0.0
    assert p0.due(began_a, clock.now) is not None  # A's first look writes A's marker
    assert p1.due(began_a, clock.now) is not None  # and its neighbour acts on it too
    mine = json.loads(Path(marker_path(str(a.state), "dep")).read_text())
    assert mine["at"] == at and mine["by"] == "dep-decode-0"  # no cure of cures
    assert any("cured a heal cascade" in ln and "dep-decode-0" in ln for ln in lines)
    p0.next_look = 0.0
    assert p0.due(clock.now, clock.now + 1) is None  # restarted since: done
    refresh(d0)
    d0.next_look = 0.0
    assert d0.due(clock.now, clock.now + 2) is None  # A's marker is B's own cure: nothing new
    clock.now += timings.CURE_WINDOW_S / 2
    record_heal(a.state, "dep-prefill-0", "prefill", clock)
    refresh(p0)
    assert p0.after_heal() is None  # heals since the cure: not yet a cascade


def test_the_view_is_for_holders_of_the_key_only(hosts) -> None:
    a, _, clock = hosts
    record_heal(a.state, "dep-prefill-0", "prefill", clock)
    url = f"http://{a.address}{PATH}"
    for key in (None, "wrong", KEY + "x", ""):
        status, body = get(url, key)
        assert status == 401 and b"dep-prefill-0" not in body
    assert get(f"http://{a.address}/", KEY)[0] == 404
    status, body = get(url, KEY)
    doc = json.loads(body)
    assert status == 200 and doc["format"] == FORMAT and doc["deployment"] == "dep"
    assert [(h["name"], h["role"]) for h in doc["heals"]] == [("dep-prefill-0", "prefill")]
    assert doc["cure"] is None and KEY not in body.decode()


def test_every_engine_runtime_of_a_host_binds_the_one_port(hosts) -> None:
    """SO_REUSEPORT: a second runtime of the host listens beside the first; once the first is
    gone (its engine heals), the host still answers."""
    a, _, clock = hosts
    second = listen(a.address, KEY, lambda: host_view(str(a.state), "dep", clock.now))
    try:
        a.server.shutdown()
        a.server.server_close()
        assert get(f"http://{a.address}{PATH}", KEY)[0] == 200
    finally:
        second.shutdown()
        second.server_close()
    a.server = listen(a.address, KEY, lambda: {})  # for the fixture's cleanup


def test_a_host_that_stops_answering_keeps_its_last_view_and_is_said_once(hosts) -> None:
    a, b, clock = hosts
    lines: list[str] = []
    record_heal(a.state, "dep-prefill-0", "prefill", clock)
    fleet = Fleet([a.address], KEY, "dep", lines.append)
    fleet.refresh()
    assert [h.role for h in fleet.heals()] == ["prefill"]
    a.server.shutdown()
    a.server.server_close()
    fleet.refresh()
    fleet.refresh()
    assert [h.role for h in fleet.heals()] == ["prefill"]  # kept
    assert sum("not read" in ln for ln in lines) == 1
    a.server = listen(a.address, KEY, lambda: host_view(str(a.state), "dep", clock.now))
    fleet.refresh()
    assert lines[-1] == f"heals of host {a.address} read again"
    wrong = Fleet([a.address], "not-the-key", "dep", lines.append)
    wrong.refresh()
    assert wrong.heals() == [] and "HTTP 401" in lines[-1]


def test_views_of_another_deployment_or_a_newer_format_are_not_read() -> None:
    view = {"format": FORMAT, "deployment": "dep", "cure": {"at": 7.5, "by": "dep-decode-1"},
            "heals": [{"at": 20.5, "name": "x", "role": "decode"},
                      {"at": "bad", "name": "y", "role": "decode"},
                      {"at": 30.0, "name": "z", "role": "router"}, "junk"]}
    found, cure = parse_view(json.dumps(view), "h:1", "dep")
    assert [(h.at, h.name, h.role) for h in found] == [(20.5, "h:1/x", "decode")]
    assert cure == (7.5, "dep-decode-1")
    with pytest.raises(ValueError, match="not a view of deployment 'other'"):
        parse_view(json.dumps(view), "h:1", "other")
    with pytest.raises(NewerFormat, match="upgrade pdsvc"):
        parse_view(json.dumps({**view, "format": FORMAT + 1}), "h:1", "dep")


def test_the_view_holds_the_hosts_heals_within_the_window_and_its_marker(tmp_path) -> None:
    clock = FakeClock(now=1000.0)
    record_heal(tmp_path, "dep-decode-0", "decode", clock)
    clock.now += timings.CASCADE_WINDOW_S + 1
    record_heal(tmp_path, "dep-decode-1", "decode", clock)
    Path(marker_path(str(tmp_path), "dep")).write_text(json.dumps({"at": 1500.0, "by": "p"}))
    doc = host_view(str(tmp_path), "dep", clock.now)
    assert [h["name"] for h in doc["heals"]] == ["dep-decode-1"]  # the older one aged out
    assert doc["cure"] == {"at": 1500.0, "by": "p"}


def test_share_without_a_key_says_so_and_neither_listens_nor_reads(tmp_path) -> None:
    from pdsvc.ship.runtime.cli import parse_args
    port = free_port()
    args, _ = parse_args([
        "engine", "--name", "dep-decode-0", "--health-url", "http://127.0.0.1:1/health",
        "--state-dir", str(tmp_path), "--deployment", "dep", "--role", "decode",
        "--fleet-listen", f"127.0.0.1:{port}", "--fleet", "127.0.0.1:1", "--", "true"])
    lines: list[str] = []
    c = Cascade(str(tmp_path), "dep", "dep-decode-0", "", lines.append)
    assert share(args, None, c, lines.append) is None
    assert c.remote is None and "not shared" in lines[-1]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens
    server = share(args, KEY, c, lines.append)
    assert server is not None
    try:
        assert isinstance(c.remote, Fleet) and c.remote.hosts == ["127.0.0.1:1"]
        c.remote.stop.set()
        assert get(f"http://127.0.0.1:{port}{PATH}", KEY)[0] == 200
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("bad", ["nohost", "h:", ":80", "h:0", "h:70000", "h:http"])
def test_a_bad_address_is_refused_by_the_parser(bad: str, capsys) -> None:
    from pdsvc.ship.runtime.cli import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(["engine", "--name", "x", "--health-url", "http://127.0.0.1:1/health",
                    "--fleet", bad, "--", "true"])
    assert e.value.code == 2 and "expected ADDR:PORT" in capsys.readouterr().err


def test_a_heal_reads_the_other_hosts_at_once_so_one_cascade_is_cured_once(hosts) -> None:
    """B's cure, written a moment ago, is read by A's heal itself (not the reader's last look):
    A's heal comes after the cure and is no second cascade."""
    a, b, clock = hosts
    lines: list[str] = []
    p0 = a.runtime("dep-prefill-0", b, lines=lines)
    d0 = b.runtime("dep-decode-0", a, lines=lines)
    for name, role, state in (("dep-prefill-0", "prefill", a.state),
                              ("dep-decode-0", "decode", b.state),
                              ("dep-decode-1", "decode", b.state)):
        clock.now += 5
        record_heal(state, name, role, clock)
    refresh(p0)  # A's last look: before B's cure
    assert d0.after_heal()  # B completes the cascade and cures it
    clock.now += 0.3
    record_heal(a.state, "dep-prefill-0", "prefill", clock)
    assert p0.after_heal() is None  # A reads B's cure with its heal: one cure
    assert not Path(marker_path(str(a.state), "dep")).exists()
