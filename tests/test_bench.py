"""`pdsvc bench`: its bench_serving command line through bench_serving's own parser, the gates
and the bisection as units, and whole runs of SGLang's real bench_serving against a stand-in
PD stack on loopback (two fake_sglang engines, the real sglang-router; tests/support/
bench_stack.py): the SLO search finds the stand-in's knee, empty completions and KV transfer
failures fail their gates."""

from __future__ import annotations

import json
import time
from pathlib import Path

import argv_check
import pytest
from bench_stack import BenchStack
from conftest import REPO

from pdsvc.bench import report
from pdsvc.bench.gates import canary_gate, kv_gate, parse_counters, token_gate
from pdsvc.bench.runner import RunResult, Slo
from pdsvc.bench.search import bisect_rate
from pdsvc.bench.target import Load, bench_argv, target_from_plan
from pdsvc.cli.kit import load_plan
from pdsvc.ship.runtime.canary import PairHealth
from pdsvc.status.runstate import PairView

SEED = REPO / "etc/seed-host.topology.json"


def test_the_command_line_is_one_bench_serving_parses_as_meant(serve_python: Path) -> None:
    plan = load_plan(REPO / "etc/pdsvc.yaml", None, SEED)
    argv = bench_argv(target_from_plan(plan), Load(2.5, 1024, 256, 200, seed=3), "/tmp/r.jsonl")
    assert argv[:3] == [plan.python, "-m", "sglang.bench_serving"]
    [result] = argv_check.run_checks(serve_python, [("bench", argv[3:])])
    assert result["ok"], result["error"]
    ns = result["namespace"]
    expected = {
        "backend": "sglang", "base_url": "http://127.0.0.1:8000",
        "model": "/srv/models/DeepSeek-V4-Flash", "served_model_name": "deepseek-v4-flash",
        "tokenizer": "/srv/models/DeepSeek-V4-Flash", "dataset_name": "random-ids",
        "random_input_len": 1024, "random_output_len": 256, "random_range_ratio": 1.0,
        "num_prompts": 200, "request_rate": 2.5, "seed": 3, "pd_separated": True,
        "output_details": True, "output_file": "/tmp/r.jsonl", "disable_tqdm": True,
        "warmup_requests": 1, "ready_check_timeout_sec": 30,
    }
    assert {k: ns[k] for k in expected} == expected
    assert result["abbreviated"] == []  # every flag spelled out, none a prefix


def test_failure_counters_are_summed_over_labels() -> None:
    text = ('# TYPE sglang:num_transfer_failed_reqs_total counter\n'
            'sglang:num_transfer_failed_reqs_total{model_name="m",tp_rank="0"} 2.0\n'
            'sglang:num_transfer_failed_reqs_total{model_name="m",tp_rank="1"} 1.0\n'
            'sglang:num_requests_total{model_name="m"} 9.0\n')
    assert parse_counters(text) == {"sglang:num_transfer_failed_reqs_total": 3.0}


def test_kv_gate_fails_on_a_rise_and_is_unchecked_without_counters() -> None:
    name = "sglang:num_transfer_failed_reqs_total"
    assert kv_gate({"d": {name: 0.0}}, {"d": {name: 2.0}}).result == "fail"
    assert kv_gate({"d": {name: 1.0}}, {"d": {name: 1.0}}).result == "pass"
    gate = kv_gate({"d": "/metrics 404 (1 ms)"}, {"d": "/metrics 404 (1 ms)"})
    assert gate.result == "unchecked" and "404" in gate.detail
    assert kv_gate({}, {}).result == "unchecked"  # --url: nothing watched


def test_canary_gate_reads_the_pair_states() -> None:
    t0 = time.time()
    ok = PairView("p", "d", PairHealth.OK, t0 - 60, "", "p")
    assert canary_gate([ok], t0).result == "pass"
    failing = PairView("p", "d", PairHealth.FAILING, t0 + 1, "HTTP 500", "d")
    assert canary_gate([failing], t0).result == "fail"
    healed = PairView("p", "d", PairHealth.OK, t0 + 5, "", "p")  # ok again, only since mid-run
    gate = canary_gate([healed], t0)
    # said as what happened, not as "ok" (a pair ok at the end that was not ok all along)
    assert gate.result == "fail" and "p -> d: re-proven 5 s into the run" in gate.detail, gate
    assert canary_gate([PairView("p", "d", PairHealth.UNKNOWN, None, "", "")],
                       t0).result == "unchecked"


def test_zero_tokens_fail_the_token_gate() -> None:
    assert token_gate(0, 10).result == "pass"
    assert "3 of 10" in token_gate(3, 10).detail
    assert token_gate(0, 0).result == "fail"


def test_bisection_finds_a_step_within_precision_in_log2_runs() -> None:
    tried: list[float] = []

    def meets(rate: float) -> bool:
        tried.append(rate)
        return rate <= 10.0

    good, bad = bisect_rate(0.5, 64, 0.05, meets)
    assert good is not None and bad is not None
    assert good <= 10.0 < bad and bad / good <= 1.05
    assert len(tried) == 7  # ceil(log2(ln(128) / ln(1.05)))
    assert bisect_rate(2, 4, 0.05, lambda r: False) == (None, 2)  # the lowest rate runs too
    assert bisect_rate(2, 4, 0.05, lambda r: True) == (4, None)


def test_the_plot_is_a_png_of_ttft_and_itl_against_the_rate(tmp_path: Path) -> None:
    """With the plot extra (matplotlib; in the test extra, so CI draws it)."""
    pytest.importorskip("matplotlib")
    runs = []
    for rate in (8.0, 2.0, 4.0):  # drawn in rate order
        r = RunResult(Load(rate, 8, 4, 10), [])
        r.metrics = {f"{q}_{w}_ms": rate * (10 if w == "ttft" else 1) * (1 + i)
                     for i, q in enumerate(("median", "p90", "p99")) for w in ("ttft", "itl")}
        runs.append(r)
    path = report.plot(runs, tmp_path / "plot" / "latency-vs-rate.png")
    assert path == str(tmp_path / "plot" / "latency-vs-rate.png")
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_draws_the_slo_bounds_and_the_rate_found() -> None:
    """`pdsvc bench --slo`: each axis has its bound (TTFT on the first, ITL on the second) as a
    horizontal line, both the rate found as a vertical one; without an SLO, neither."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for rate in (2.0, 4.0, 8.0):
        r = RunResult(Load(rate, 8, 4, 10), [])
        r.metrics = {f"{q}_{w}_ms": rate for q in ("median", "p90", "p99") for w in ("ttft", "itl")}
        runs.append(r)

    def flat(ax, axis: str) -> list[float]:  # the y (or x) of each straight line drawn
        out = []
        for line in ax.get_lines():
            xs, ys = list(line.get_xdata()), list(line.get_ydata())
            same = ys if axis == "y" else xs
            if len(same) == 2 and same[0] == same[1]:
                out.append(float(same[0]))
        return out

    fig = report.figure(plt, runs, Slo(2000.0, 50.0), 5.25)
    ttft, itl = fig.axes
    assert flat(ttft, "y") == [2000.0] and flat(itl, "y") == [50.0]
    assert flat(ttft, "x") == flat(itl, "x") == [5.25]
    assert "SLO: TTFT ≤ 2000 ms (99%)" in [t.get_text() for t in ttft.get_legend().get_texts()]
    plt.close(fig)
    fig = report.figure(plt, runs, None, None)
    assert flat(fig.axes[0], "y") == flat(fig.axes[0], "x") == []
    plt.close(fig)


# ------------------------------------------------------------------ the real bench_serving

KNEE = 32.0  # requests/s the stand-in's scheduler serves (tests/support/fake_latency.py)
ENGINE = {"FAKE_SGLANG_KNEE_RATE": str(KNEE), "FAKE_SGLANG_TTFT_MS": "50",
          "FAKE_SGLANG_ITL_MS": "20"}
LOAD = ["--input-len", "8", "--output-len", "4"]


@pytest.fixture
def stack(serve_python: Path, tmp_path: Path, request: pytest.FixtureRequest):
    s = BenchStack.up(tmp_path, serve_python, {**ENGINE, **getattr(request, "param", {})})
    yield s
    s.down()


def test_slo_search_brackets_the_capacity_in_few_valid_runs(stack: BenchStack) -> None:
    """The stand-in serves KNEE requests/s (a FIFO scheduler, 1/KNEE s a request): below it
    TTFT's queueing stays short, past it the queue grows with every request. The search is a
    bisection: few runs, each valid, the answer the highest rate that met the SLO, and a rate
    just above it (within the precision) that missed it. 160 requests a run find about 1.27
    of the knee on an idle machine (a 900 ms TTFT bound lets a queue build past the knee for
    the run's 4 s); a busy one bends both the client's send rate and the stand-in's queueing,
    so the answer is only checked to be of the knee's order (0.5..2): the precision (within
    10 % at 480 requests a run, with a 40 ms ITL bound) is
    benchmarks/bench_slo.py's figure, not a verdict here. The search range is not centred on
    the knee (no midpoint lands on it by construction). The ITL bound is 5× the stand-in's
    20 ms, so that TTFT's queue decides: at 2× (40 ms), a busy machine's scheduling alone
    broke it for 5 % of requests at 15.66 req/s, half the knee (p99 TTFT 225 ms)."""
    run = stack.bench("--slo", "ttft=900,itl=100", "--rate-range", "15:60", "--precision", "0.05",
                      "--num-prompts", "160", *LOAD, "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    found = doc["slo"]["rate"]
    runs = [(round(r["rate"], 2), r["slo_share"], r["metrics"]["p99_ttft_ms"]) for r in doc["runs"]]
    print(f"\npdsvc bench --slo on the stand-in: {found:.2f} req/s found, knee {KNEE:g} "
          f"(found/knee {found / KNEE:.3f}); runs (rate, SLO share, p99 TTFT ms): {runs}")
    assert 0.5 <= found / KNEE <= 2.0, runs
    assert len(doc["runs"]) <= 5  # log2(ln 4 / ln 1.05): a bisection, not a sweep
    assert all(r["valid"] for r in doc["runs"])
    met = [r for r in doc["runs"] if r["slo_share"] >= 0.99]
    assert met and max(r["rate"] for r in met) == found  # the highest rate that met it
    assert any(r["slo_share"] < 0.99 and r["rate"] / found <= 1.05 for r in doc["runs"])
    kv = {g["name"]: g["result"] for g in doc["runs"][0]["gates"]}
    assert kv == {"tokens": "pass", "errors": "pass", "kv-transfer": "pass",
                  "canary": "unchecked"}


@pytest.mark.parametrize("stack,gate", [
    ({"FAKE_SGLANG_EMPTY_EVERY": "7"}, "tokens"),
    ({"FAKE_SGLANG_TRANSFER_FAIL_EVERY": "9"}, "kv-transfer"),
], indirect=["stack"], ids=["empty-completions", "transfer-failures"])
def test_invalid_runs_fail_their_gate(stack: BenchStack, gate: str) -> None:
    run = stack.bench("--rate", "4", "--num-prompts", "20", *LOAD)
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("FAILED: run at 4 req/s is not valid: "), run.stdout
    assert f"gate {gate} failed" in last, last  # an aborted transfer has no token either


def test_a_failing_canary_fails_the_run(stack: BenchStack) -> None:
    state = stack.work / "state"
    state.mkdir()
    (state / "bench-decode.canary.json").write_text(json.dumps({"pairs": [{
        "pair": f"{stack.prefill_url} -> {stack.decode_url}", "state": "failing",
        "failing_since": time.time(), "last_error": "HTTP 500 KV transfer failed"}]}))
    run = stack.bench("--rate", "4", "--num-prompts", "10", *LOAD)
    assert run.returncode == 1 and "gate canary failed" in run.stdout, run.stdout
