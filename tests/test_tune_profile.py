"""`pdsvc tune --profile` (pdsvc/tune/profiled.py, the hooks in pdsvc/tune/search.py): the
baseline's decode is captured while the deployment runs the baseline, the best's once the
deployment ends on it; --keep-current says why the best has none; a capture that fails is
said and the search goes on; the breakdowns side by side (real traces: tests/fixtures/traces)
say whether the bottleneck moved. The real capture under supervisord is
tests/test_e2e_tune_supervisord.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from test_profile_breakdown import traces
from test_tune_search import BS, Fake, tuner

from pdsvc.profile.breakdown import breakdown
from pdsvc.profile.options import ProfileError
from pdsvc.profile.result import EngineCapture, ProfileRun, RoleResult
from pdsvc.tune import profiled
from pdsvc.tune.profiled import Profiled
from pdsvc.tune.search import Interrupted, Limits, Progress, Tuner

WINS = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {BS}: [32]\n"  # 32 slots: twice the base
LOSES = f"slo: {{ttft_ms: 1, itl_ms: 1}}\nlevers:\n  {BS}: [8]\n"


def run_of(kind: str, tok_s: float, run_id: str = "r1") -> ProfileRun:
    """A decode capture whose traces are the committed ``kind`` traces (4 ranks)."""
    engine = EngineCapture("dsv4-decode", "http://127.0.0.1:30001", f"/p/{run_id}", (),
                           "full", tok_s)
    role = RoleResult("decode", 20, "output tokens/s", (engine,),
                      breakdown("decode", traces(kind)))
    return ProfileRun(run_id, f"/var/lib/dsv4/profiles/{run_id}", "bench_serving", (role,),
                      10.0, 3.0)


class Recorder:
    """A profiler that records which config ran at each capture (the fake's ``running``)."""

    def __init__(self, fake: Fake, fail: str | None = None, interrupt: str | None = None,
                 full: str | None = None) -> None:
        self.fake, self.fail, self.interrupt, self.full = fake, fail, interrupt, full
        self.calls: list[tuple[str, str]] = []

    def __call__(self, name: str, config: Path, say: Progress) -> ProfileRun:
        self.calls.append((name, self.fake.running))
        if name == self.interrupt:
            raise KeyboardInterrupt
        if name == self.fail:
            raise ProfileError("dsv4-decode-0: a trace not whole within 300 s")
        if name == self.full:
            raise OSError(28, "No space left on device")
        say("held dsv4-decode-0")
        return run_of("decode", 100.0 if name == "baseline" else 200.0, name)


def profiled_run(tmp_path: Path, space: str, limits: Limits | None = None, **rec: str
                 ) -> tuple[Fake, Recorder, list, Tuner]:
    """A tune of ``space`` with a recording profiler: (the fake, the recorder, the first
    candidates, the tuner)."""
    fake = Fake()
    t, first = tuner(tmp_path, fake, space_text=space, limits=limits)
    recorder = Recorder(fake, **rec)
    t.profiler = recorder
    return fake, recorder, first, t


def test_the_baseline_and_the_best_are_captured_each_while_it_runs(tmp_path: Path) -> None:
    _, rec, first, t = profiled_run(tmp_path, WINS)
    answer = t.run(first)
    assert answer.wins
    best = answer.best.name
    assert rec.calls == [("baseline", "baseline.yaml"), (best, f"{best}.yaml")]
    assert [p.name for p in answer.profiles] == ["baseline", best] and not answer.unprofiled
    lines = profiled.table(answer.profiles)
    assert lines[-1].startswith("profile: the bottleneck did not move: "
                                "_tiled_sparse_decode_kernel")
    tok = next(line for line in lines if line.lstrip().startswith("tok/s"))
    assert "100" in tok and "200" in tok


def test_keep_current_says_why_the_best_has_no_capture(tmp_path: Path) -> None:
    _, rec, first, t = profiled_run(tmp_path, WINS, Limits(keep_current=True))
    answer = t.run(first)
    assert answer.wins and rec.calls == [("baseline", "baseline.yaml")]
    assert "--keep-current" in answer.unprofiled
    lines = profiled.table(answer.profiles, answer.unprofiled)
    assert lines[-1] == f"profile: no comparison: {answer.unprofiled}"  # not "the baseline"
    assert profiled.document(answer.profiles, answer.unprofiled)["verdict"] == \
        f"no comparison: {answer.unprofiled}"


def test_no_win_captures_the_baseline_only_and_says_it_is_the_answers(tmp_path: Path) -> None:
    _, rec, first, t = profiled_run(tmp_path, LOSES)
    answer = t.run(first)
    assert not answer.wins and [n for n, _ in rec.calls] == ["baseline"]
    assert profiled.verdict(answer.profiles).startswith("the answer is the baseline")


def test_a_failed_capture_is_said_and_the_search_goes_on(tmp_path: Path) -> None:
    _, rec, first, t = profiled_run(tmp_path, WINS, fail="baseline")
    answer = t.run(first)
    assert answer.wins and len(rec.calls) == 2  # the best is still captured
    failed = answer.profiles[0]
    assert failed.run is None and "not whole" in failed.why
    doc = profiled.document(answer.profiles)
    assert doc["captures"][0] == {"name": "baseline", "error": failed.why}
    assert doc["verdict"].startswith("no comparison: baseline ")


def test_a_full_disk_at_the_bests_capture_is_said_and_the_answer_still_comes(
        tmp_path: Path) -> None:
    _, rec, first, t = profiled_run(tmp_path, WINS, full="c1")
    answer = t.run(first)
    assert answer.wins and [p.name for p in answer.profiles] == ["baseline", "c1"]
    assert answer.profiles[1].run is None and "No space left" in answer.profiles[1].why


def test_an_interrupt_in_a_capture_ends_tune_as_any_on_the_last_good_config(
        tmp_path: Path) -> None:
    fake, _, first, t = profiled_run(tmp_path, WINS, interrupt="c1")
    best = first[1].candidate.name
    assert best == "c1"
    with pytest.raises(Interrupted):
        t.run(first)
    assert fake.running == f"{best}.yaml"  # the best is the last good config: it stays


def test_a_moved_bottleneck_names_both_kernels_and_the_json_keeps_each_capture() -> None:
    a = Profiled("baseline", run_of("decode", 100.0, "a"))
    b = Profiled("c1", run_of("prefill", 150.0, "b"))
    said = profiled.verdict([a, b])
    assert said.startswith("the bottleneck moved: the top decode kernel was "
                           "_tiled_sparse_decode_kernel")
    assert "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT" in said
    doc = profiled.document([a, b])
    assert [c["top_kernel"]["name"] for c in doc["captures"]] == [
        "_tiled_sparse_decode_kernel", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]
    assert doc["captures"][1]["profile_json"] == "/var/lib/dsv4/profiles/b/profile.json"
    top = a.decode.breakdown.kernels[0] if a.decode else None
    assert top is not None and doc["captures"][0]["top_kernel"]["share"] == top.share


def test_profile_not_as_root_is_refused_before_anything_runs(monkeypatch, tmp_path: Path
                                                             ) -> None:
    from click.testing import CliRunner

    from pdsvc.cli import tune as cli

    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cli.sys, "argv", ["pdsvc", "tune", "--profile"])
    result = CliRunner().invoke(cli.tune, [
        "-c", str(REPO / "etc/pdsvc.yaml"), "--topology",
        str(REPO / "etc/seed-host.topology.json"), "--results", str(tmp_path / "r"),
        "--profile"])
    assert result.exit_code == 3, result.output
    assert result.stderr.strip() == (
        "pdsvc: error: --profile writes profile holds and reads the engines' traces: run "
        "pdsvc tune as root; sudo pdsvc tune --profile")
    assert not (tmp_path / "r").exists()  # nothing measured, nothing written


def test_a_lost_terminal_does_not_end_tunes_wind_down(monkeypatch) -> None:
    """tune's progress lines go to stderr; once it is gone (SIGHUP: EIO), a line must not raise
    in the middle of a capture's wind-down (the hold would be released mid-write) or of the
    way back."""
    import click

    from pdsvc.cli import tune as cli

    def gone(*a: object, **k: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(click, "echo", gone)
    cli._say("pdsvc profile: ending the capture on dsv4-decode-0")  # no OSError
