"""pdsvc apply's hold on one engine (pdsvc/ship/runtime/hold.py): the runtime's membership stays
out of the router and does not re-add the engine apply took out; the pair canary probes only
the peers the hold names and never heals while a hold exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pair_fakes import WORKER, FakeRouter, rounds
from runtime_procs import FakeClock

from pdsvc.ship.runtime import rounds as canary_rounds
from pdsvc.ship.runtime.canary import Canary, Pair, Round
from pdsvc.ship.runtime.hold import Hold, clear_hold, hold_path, write_hold
from pdsvc.ship.runtime.membership import Membership
from pdsvc.ship.runtime.statefile import Kind, state_path

P0, P1 = "http://10.0.0.2:30000", "http://10.0.0.3:30000"
D0, D1 = "http://10.0.0.4:30000", "http://10.0.0.5:30000"


def test_the_hold_file_is_the_units_state_file_and_readable_by_the_runtime(tmp_path) -> None:
    path = hold_path(str(tmp_path), "dsv4-prefill-0")
    assert path == state_path(str(tmp_path), "dsv4-prefill-0", Kind.HOLD)
    hold = Hold(path)
    assert not hold.active() and hold.out() is None and hold.allows(D0)
    write_hold(path, out=True, peers=[D0 + "/"], why="step 1")
    assert os.stat(path).st_mode & 0o777 == 0o644  # root writes it, the unit's user reads it
    assert hold.active() and "held out of the router" in (hold.out() or "")
    assert hold.allows(D0) and not hold.allows(D1)
    write_hold(path, out=False, peers=[D0])  # fenced: stays in the router, probes D0 only
    assert hold.out() is None and hold.active() and not hold.allows(D1)
    clear_hold(path)
    clear_hold(path)  # twice: nothing left, no error
    assert not hold.active() and Hold(None).out() is None


def test_a_held_engine_neither_joins_nor_is_re_added_after_apply_took_it_out(
        tmp_path: Path) -> None:
    for smg in (False, True):
        router, lines, clock = FakeRouter(smg), [], FakeClock(1000.0)
        hold = Hold(str(tmp_path / f"h{smg}.hold.json"))
        m = Membership("http://r", WORKER, "k", lines.append, call=router, clock=clock,
                       held=hold.out)
        assert m.join() and len(router.workers) == 1
        write_hold(hold.path, out=True)
        router.workers = []  # apply's DELETE (smg's draining entry is gone at once here)
        before = len(router.calls)
        for _ in range(5):
            m.check(True)
        assert router.workers == [] and not m.joined
        assert router.calls[before:] == []  # not even a look: the file says it all
        assert sum("not joining the router: held" in line for line in lines) == 1
        assert not m.join()  # a fresh start while held: not either
        clear_hold(hold.path)
        m.check(True)  # released: joins at the next check
        assert m.joined and [w["url"] for w in router.workers] == [WORKER.url]
        assert any("hold released" in line for line in lines)


def test_the_canary_only_reports_while_held_and_probes_only_the_named_peers(
        tmp_path: Path) -> None:
    hold = Hold(str(tmp_path / "p0.hold.json"))
    mine, theirs = Pair(P0, 8998, D0), Pair(P0, 8998, D1)
    c = Canary(P0, [mine, theirs], failures_to_act=2, log=lambda s: None, hold=hold)
    c.record([*rounds(mine, True), *rounds(theirs, True)])  # served both
    write_hold(hold.path, out=True, peers=[D0])
    probed: list[str] = []

    def probe(pair: Pair, peer: str, timeout: float) -> Round:
        probed.append(peer)
        return Round(pair, pair is mine)

    t = canary_rounds.CanaryThread(c, 30.0, 5.0, probe=probe)
    assert [p.decode for p in t.probed()] == [D0]
    for _ in range(6):
        c.record(t.round())
    assert probed == [D0] * 6  # D1 runs the other config: never probed
    for _ in range(6):
        c.record(rounds(theirs, False))
    assert c.verdict() is None  # held: a failing pair it served is reported, not healed
    clear_hold(hold.path)
    assert c.verdict() is not None and [p.decode for p in t.probed()] == [D0, D1]


# ---------------------------------------------------------------------- the lease (until)


def test_a_hold_whose_lease_ran_out_is_no_hold_and_is_logged_once_per_lease(
        tmp_path: Path) -> None:
    now, lines = [1000.0], []
    hold = Hold(str(tmp_path / "d0.hold.json"), lines.append, wall=lambda: now[0])
    write_hold(hold.path, out=True, peers=[D0], why="step 1", until=1030.0)
    assert hold.active() and hold.out() and not hold.allows(D1)
    now[0] = 1029.9
    assert hold.active() and lines == []
    now[0] = 1030.0  # the lease ran out: as if the file were gone
    for _ in range(3):
        assert not hold.active() and hold.out() is None and hold.allows(D1)
    assert len(lines) == 1 and "expired hold from pdsvc apply" in lines[0]
    assert hold.path in lines[0]
    write_hold(hold.path, out=True, until=1060.0)  # a renewal (or a new apply): held again
    assert hold.active() and len(lines) == 1
    now[0] = 1061.0
    assert not hold.active() and len(lines) == 2  # a new lease ran out: said again


def test_a_hold_without_until_from_an_older_apply_lasts_until_removed(tmp_path: Path) -> None:
    hold = Hold(str(tmp_path / "d0.hold.json"), wall=lambda: 1e12)
    write_hold(hold.path, out=True)
    assert "until" not in json.loads(Path(hold.path).read_text())
    assert hold.active() and hold.out()


def test_an_expired_hold_lets_the_engine_rejoin_and_its_canary_heal(tmp_path: Path) -> None:
    now, lines = [1000.0], []
    router, clock = FakeRouter(False), FakeClock(1000.0)
    hold = Hold(str(tmp_path / "p0.hold.json"), lines.append, wall=lambda: now[0])
    m = Membership("http://r", WORKER, "k", lines.append, call=router, clock=clock,
                   held=hold.out)
    write_hold(hold.path, out=True, until=1030.0)  # apply took it out, then was killed
    m.check(True)
    assert router.workers == [] and not m.joined
    now[0] = 1031.0
    m.check(True)  # the next membership check after the lease: joins
    assert m.joined and [w["url"] for w in router.workers] == [WORKER.url]
    mine = Pair(P0, 8998, D0)
    c = Canary(P0, [mine], failures_to_act=2, log=lambda s: None, hold=hold)
    c.record(rounds(mine, True))
    for _ in range(6):
        c.record(rounds(mine, False))
    assert c.verdict() is not None  # no hold in force: it heals as usual
