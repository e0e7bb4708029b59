"""apply's flow reports typed events (pdsvc/apply/events.py); the command prints each in one
wording, and `pdsvc tune` decides on the events, never on a printed line (tune/live.py)."""

from __future__ import annotations

from pathlib import Path

from pdsvc.apply.events import InstallFailed, StepDone, StepFailed, StepStarted, words
from pdsvc.tune.live import _Frontend


def test_each_event_has_the_words_apply_prints() -> None:
    assert words(StepStarted(1, 2, "restart", ("a.service",), ("b.service",))) == \
        "step 1/2: restart a.service (with b.service)"
    assert words(StepDone(1, 2, 12.345)) == "step 1/2 done in 12.3 s"
    assert words(StepFailed(2, 2, ("b.service",), "b.service: not healthy within 900 s")) == \
        "step 2/2 failed: b.service: not healthy within 900 s"
    assert words(InstallFailed(4)) == "install.sh failed (4); no unit was restarted"


def test_tune_keeps_the_first_failure_as_an_event_not_a_printed_line() -> None:
    said: list[str] = []
    fe = _Frontend(said.append, Path("/nonexistent/install.sh"))
    # a detail line with "failed" in it is passed on, and decides nothing
    fe.say("pdsvc apply:   dsv4-decode.service: the drain failed to finish in 30 s")
    fe.event(StepStarted(1, 2, "restart", ("dsv4-decode.service",)))
    assert fe.failed == "" and fe.failure is None
    first = StepFailed(1, 2, ("dsv4-decode.service",), "dsv4-decode.service: exited 1")
    fe.event(first)
    fe.event(InstallFailed(1))
    assert fe.failure is first and fe.failed == "step 1/2 failed: dsv4-decode.service: exited 1"
    assert said == ["  dsv4-decode.service: the drain failed to finish in 30 s",
                    "step 1/2: restart dsv4-decode.service", words(first),
                    "install.sh failed (1); no unit was restarted"]
