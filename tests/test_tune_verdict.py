"""What `pdsvc tune`'s numbers say (pdsvc/tune/verdict.py, report.py): a repeat starts where
the first measurement ended, so repeats that found the same interval are said to confirm it,
never as a spread; a range is said only where one moved; a lower bound is said as one in the
verdict, the table, the JSON and the plot; and results written by an older pdsvc are read."""

from __future__ import annotations

import json
from pathlib import Path

from pdsvc.tune import report
from pdsvc.tune.search import Answer
from pdsvc.tune.space import Candidate, parse_space
from pdsvc.tune.store import Measurement, Result, Store
from pdsvc.tune.verdict import goodputs, judge, span

BEST = Candidate("c1", (("decode.args.cuda-graph-max-bs-decode", 32),))
BASE = Candidate("baseline")
SPACE = parse_space("slo: {ttft_ms: 100, itl_ms: 10}\nrepeats: 3\nlevers:\n"
                    "  decode.args.cuda-graph-max-bs-decode: [32]\n", "tune.yaml")


def m(repeat: int, rate: float | None, above: float | None = None,
      status: Result = Result.MEASURED, name: str = "c1") -> Measurement:
    return Measurement("k", name, [], repeat, status, rate=rate, above=above)


def test_repeats_that_found_the_first_interval_again_confirm_it() -> None:
    outs = [m(0, 69.8, 75.3), m(1, 69.8, 75.3), m(2, 69.8, 75.3)]
    assert span(outs) == "69.8 req/s, confirmed by 2 repeats"
    assert span(outs[:2]) == "69.8 req/s, confirmed by 1 repeat"
    assert span(outs[:1]) == "69.8 req/s"
    # one that moved (it was searched on from there): the range, nothing claimed confirmed
    moved = [m(0, 69.8, 75.3), m(1, 64.0, 69.8), m(2, 69.8, 75.3)]
    assert span(moved) == "64..69.8 req/s"
    # a repeat that met the same rate but no longer missed the next is not a confirmation
    assert span([m(0, 69.8, 75.3), m(1, 69.8, None)]) == "69.8 req/s"


def test_the_win_says_the_repeats_confirmed_and_not_that_each_beat_each() -> None:
    base = [m(r, 8.0, 9.0, name="baseline") for r in range(3)]
    outs = [m(r, 16.0, 17.6) for r in range(3)]
    wins, verdict = judge(BEST, outs, base)
    assert wins
    assert "meets the SLO at 16 req/s, confirmed by 2 repeats, the current config at 8 req/s, " \
           "confirmed by 2 repeats" in verdict, verdict
    assert "each of its" not in verdict and "beats each" not in verdict


def test_a_lower_bound_is_one_in_the_verdict_the_table_the_json_and_the_plot(
        tmp_path: Path) -> None:
    base = [m(r, 8.0, 9.0, name="baseline") for r in range(3)]
    outs = [m(r, 64.0, None, Result.LOWER_BOUND) for r in range(3)]
    wins, verdict = judge(BEST, outs, base)
    assert wins and "at ≥ 64 req/s, confirmed by 2 repeats" in verdict, verdict
    answer = Answer(base, BEST, outs, wins, verdict, "grid",
                    rows=[(BASE, base[0], ""), (BEST, outs[0], "")], running=BEST)
    measured = {"baseline": base, "c1": outs}
    row = next(x for x in report.table(answer, measured) if x.startswith("c1 *"))
    assert "≥ 64, confirmed by 2 repeats" in row
    assert "lower bound: the SLO held at the range's top (raise rates.high)" in row, row
    assert "valid" not in row
    doc = report.document(SPACE, answer, measured, results=tmp_path, best_config=None,
                          plot_path=None)
    assert [g["bound"] for g in doc["best"]["goodput"]] == ["at-least"] * 3
    assert doc["best"]["said"] == "≥ 64 req/s, confirmed by 2 repeats"
    assert [g["bound"] for g in doc["baseline"]["goodput"]] == ["exact"] * 3
    assert [g["confirms_first"] for g in doc["baseline"]["goodput"]] == [False, True, True]
    json.dumps(doc)  # a document a machine reads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = report.figure(plt, SPACE, answer, measured)
    try:
        bars = fig.axes[0].patches
        assert [b.get_hatch() for b in bars] == [None, "//"]  # the baseline, the best
        assert "≥" in [t.get_text() for t in fig.axes[0].texts]
        assert "lower bound" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_a_race_lost_is_an_upper_bound_for_machines_too() -> None:
    lost = m(1, None, 17.6, Result.BELOW)
    assert goodputs([m(0, 16.0, 17.6), lost])[1] == {
        "repeat": 1, "rate": None, "bound": "below", "missed_at": 17.6,
        "confirms_first": False}


def test_results_of_the_first_format_are_read_and_written_as_the_second(
        tmp_path: Path) -> None:
    """pdsvc-tune-results/1 named a failed start ``failed`` and the first of two tries'
    reason ``again``: read as today's; the next measurement writes the whole file in the
    current format."""
    old = {"format": "pdsvc-tune-results/1", "host": "gpu-1", "outcomes": [
        {"key": "[]", "name": "baseline", "changes": [], "repeat": 0, "status": "measured",
         "rate": 8.0, "above": 9.0, "again": "run at 8 req/s: gate kv-transfer failed"},
        {"key": "k", "name": "c2", "changes": [["decode.args.x", 1]], "repeat": 0,
         "status": "failed", "why": "decode exited with status 1"}]}
    (tmp_path / "results.json").write_text(json.dumps(old))
    store = Store(tmp_path, {"host": "gpu-1"})
    assert [o.status for o in store.outcomes] == [Result.MEASURED, Result.FAILED_START]
    assert store.outcomes[1].changes == [("decode.args.x", 1)]
    assert store.outcomes[0].first_invalid == "run at 8 req/s: gate kv-transfer failed"
    store.add(m(1, 8.0, 9.0, name="baseline"))
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["format"] == "pdsvc-tune-results/2"
    assert [o["status"] for o in doc["outcomes"]] == ["measured", "failed-start", "measured"]
    assert "again" not in doc["outcomes"][0] and doc["outcomes"][0]["first_invalid"]
    assert [o.status for o in Store(tmp_path, {}).outcomes] == \
        [Result.MEASURED, Result.FAILED_START, Result.MEASURED]
