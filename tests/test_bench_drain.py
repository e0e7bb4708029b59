"""A run of `pdsvc bench` (and of each `pdsvc tune` measurement) starts on a drained
deployment: an overloaded run leaves requests queued until the router gives up on them, and
the next run's warmup and first requests would wait behind them. Before each run but the
first, the session waits (bounded) until the engines run no more requests than before the
first run, one per engine of live traffic allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdsvc.bench import session as session_mod
from pdsvc.bench.session import Session
from pdsvc.bench.target import Target


def make(monkeypatch: pytest.MonkeyPatch, counts: list[int | None], tmp_path: Path):
    seen: list[int | None] = []

    def total(engines, timeout: float = 3.0) -> int | None:
        seen.append(counts[0] if counts else None)
        return counts.pop(0) if len(counts) > 1 else counts[0]

    monkeypatch.setattr(session_mod, "running_total", total)
    monkeypatch.setattr(session_mod, "DRAIN_POLL_S", 0.0)
    target = Target("python", "http://r", "/m", "m", (("p", "http://p"), ("d", "http://d")),
                    True)
    said: list[str] = []
    s = Session(target, tmp_path, None, 0.01, None, None, said.append)  # type: ignore[arg-type]
    return s, said, seen


def test_the_next_run_waits_for_what_the_last_left_running(monkeypatch, tmp_path) -> None:
    # 1 live request before the first run; then 40, 12, 3 left running: 3 ≤ 1 + 2 engines
    s, said, seen = make(monkeypatch, [1, 40, 12, 3], tmp_path)
    s.before = session_mod.running_total(())
    s._drained()
    assert seen == [1, 40, 12, 3]
    assert said == ["  waiting for the 40 requests the last run left running (a run starts "
                    "drained)"]


def test_the_wait_is_bounded_and_unreadable_metrics_do_not_wait(monkeypatch, tmp_path) -> None:
    s, said, _ = make(monkeypatch, [0, 50], tmp_path)
    monkeypatch.setattr(session_mod, "DRAIN_BOUND_S", 0.0)
    s.before = session_mod.running_total(())
    s._drained()
    assert said[-1] == "  still 50 requests running after 0 s; running anyway"
    s, said, _ = make(monkeypatch, [0, None], tmp_path)
    s.before = session_mod.running_total(())
    s._drained()
    assert said == []
