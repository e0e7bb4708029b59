"""`pdsvc tune`'s search space and its candidates, checked before anything restarts (issue
33): the space file's errors name the key; the candidates (grid, one lever
at a time, auto); a config the schema or the pairing check refuses is skipped with the reason;
a switch that stops serving (1P1D) is named, one that does not (2P2D) is measured; the
estimate; the CLI's table, JSON and bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pdsvc.cli.commands import main
from pdsvc.errors import ConfigError
from pdsvc.render.hosts_bundle import render_for
from pdsvc.topology import load_topology_file
from pdsvc.tune.check import (
    CONFIRM_RUNS,
    RACE_RUNS,
    RUN_OVERHEAD_S,
    bisect_runs,
    check,
    leaders,
    one_run_seconds,
    run_seconds,
    total_seconds,
)
from pdsvc.tune.space import apply_changes, candidates, current, parse_space

TOPO = REPO / "etc/seed-host.topology.json"
SEED = yaml.safe_load((REPO / "etc/pdsvc.yaml").read_text())
SPACE = """\
slo: {ttft_ms: 2000, itl_ms: 50}
levers:
  decode.args.cuda-graph-max-bs-decode: [16, 32, 64]
  decode.env.NCCL_PROTO: [null, LL128]
"""


def space(text: str = SPACE, **top) -> object:
    doc = yaml.safe_load(text)
    doc.update(top)
    return parse_space(yaml.safe_dump(doc), "tune.yaml")


@pytest.mark.parametrize("text, message", [
    ("levers: {decode.args.x: [1]}\n", "tune.yaml: slo.ttft_ms: is required"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\n", "tune.yaml: levers: must map config paths"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\nlevers: {gpu.x: [1]}\n",
     "levers.gpu.x: not a config path; start with one of prefill, decode"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\nlevers: {decode.args.x: 3}\n",
     "levers.decode.args.x: must be a list of the values to try"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\nlevers: {decode.args.x: [1, 1]}\n", "lists a value twice"),
    ("slo: {ttft_ms: 1, itl_ms: 1, share: 2}\nlevers: {decode.args.x: [1]}\n",
     "slo.share: a share of requests, ≤ 1"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\nrates: {low: 4, high: 2}\nlevers: {decode.args.x: [1]}\n",
     "rates.high: must be above rates.low (4)"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\nsearch: random\nlevers: {decode.args.x: [1]}\n",
     "search: one of auto, grid, one-at-a-time"),
    ("slo: {ttft_ms: 1, itl_ms: 1}\nlever: {}\n", "lever: unknown key"),
    ("slo: [1\n", "tune.yaml:2: not YAML"),
])
def test_a_bad_space_is_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_space(text, "tune.yaml")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_one_lever_at_a_time_from_the_baseline_skips_the_baseline_value() -> None:
    s = space(search="one-at-a-time")
    found = candidates(s, SEED)
    assert [c.describe() for c in found] == [
        "the current config", "decode.args.cuda-graph-max-bs-decode=16",
        "decode.args.cuda-graph-max-bs-decode=64", "decode.env.NCCL_PROTO=LL128"]


def test_auto_is_the_grid_when_it_is_small_else_one_at_a_time() -> None:
    assert space().strategy == "grid" and space().grid_size == 6
    found = candidates(space(), SEED)
    assert len(found) == 6  # 3 x 2 combinations, one of them the baseline itself
    assert found[0].changes == () and len({c.changes for c in found}) == 6
    small = space(max_grid=5)
    assert small.strategy == "one-at-a-time" and "(> max_grid 5)" in small.strategy_why


def test_a_change_reaches_every_item_of_a_list_role_or_the_one_named() -> None:
    cfg = {"decode": [{"gpus": [4], "env": {"A": "1"}}, {"gpus": [5]}]}
    s = parse_space("slo: {ttft_ms: 1, itl_ms: 1}\nlevers:\n  decode.env.A: [null, '2']\n"
                    "  decode[1].args.cuda-graph-max-bs-decode: [8]\n", "t.yaml")
    every, one = s.levers
    assert current(cfg, every) == "1" and current(cfg, one) is None
    out = apply_changes(cfg, (("decode.env.A", "2"), (one.path, 8)), s.levers)
    assert [d.get("env") for d in out["decode"]] == [{"A": "2"}, {"A": "2"}]
    assert [d.get("args") for d in out["decode"]] == [None, {"cuda-graph-max-bs-decode": 8}]
    gone = apply_changes(cfg, (("decode.env.A", None),), s.levers)
    assert gone["decode"][0]["env"] == {} and cfg["decode"][0]["env"] == {"A": "1"}


def checked_for(config: dict, text: str):
    s = parse_space(text, "t.yaml")
    cfg_text = yaml.safe_dump(config, sort_keys=False)
    return s, check(s, candidates(s, config), cfg_text, "c.yaml", load_topology_file(TOPO),
                    lambda p: {f.path: f.content for f in render_for(p, "pdsvc tune")})


def test_a_refused_config_is_skipped_with_the_schema_s_words() -> None:
    """A flag pdsvc owns, and a pair setting only one role changes (the pairing check)."""
    _, out = checked_for(SEED, "slo: {ttft_ms: 1, itl_ms: 1}\nsearch: one-at-a-time\n"
                         "levers:\n  decode.args.port: [31000]\n  decode.args.page-size: [64]\n")
    verdicts = [(c.verdict, c.why) for c in out[1:]]
    assert [v for v, _ in verdicts] == ["refused", "refused"], verdicts
    assert verdicts[0][1].startswith("decode.args: --port is set by pdsvc from <role>.port")
    assert verdicts[1][1].startswith("decode.args.page-size: is '64' but prefill.args.page-size")
    assert all("\n" not in why for _, why in verdicts)


def test_1p1d_switches_stop_serving_and_2p2d_ones_do_not() -> None:
    text = "slo: {ttft_ms: 1, itl_ms: 1}\nlevers: {decode.args.cuda-graph-max-bs-decode: [64]}\n"
    _, one = checked_for(SEED, text)
    assert one[1].verdict == "outage"
    assert one[1].why.startswith("serving stops while dsv4-decode.service restarts (no pair left)")
    two = yaml.safe_load((REPO / "tests/cases/seed-2p2d-explicit.yaml").read_text())
    s, both = checked_for(two, text)
    assert both[1].verdict == "measure" and len(both[1].restarts) == 2  # both decodes, in turn
    # its race: RACE_RUNS runs, not a whole search (a loser costs one)
    assert both[1].seconds == pytest.approx(2 * (s.engine_load_secs + 10)
                                            + RACE_RUNS * one_run_seconds(s))


def test_the_estimate_counts_the_runs_a_bisection_makes() -> None:
    s = parse_space("slo: {ttft_ms: 1000, itl_ms: 20}\n"
                    "rates: {low: 1, high: 16, precision: 0.1}\n"
                    "workload: {num_prompts: 40, output_len: 100}\n"
                    "levers: {decode.args.x: [1]}\n", "t.yaml")
    # log(16) / log(1.1) = 29.1 spans of 10 %: 5 halvings, and the two ends
    assert bisect_runs(s) == 7
    # each: 40 requests at 4 req/s (the range's geometric middle), a warm-up request within
    # the SLO (1 s to the first token, 99 more at 20 ms), the tokenizer and the gates
    assert run_seconds(s) == pytest.approx(7 * (40 / 4 + (1 + 99 * 0.02) + RUN_OVERHEAD_S))
    assert total_seconds(s, []) == 0


def test_the_estimate_counts_a_whole_search_only_for_the_leaders_expected() -> None:
    """Racing: of n candidates one after another, 1 + 1/2 + … + 1/n take the lead, expected
    (the records of a random order); only they are searched above the rate to beat."""
    assert leaders(1) == 1 and leaders(4) == pytest.approx(25 / 12)
    two = yaml.safe_load((REPO / "tests/cases/seed-2p2d-explicit.yaml").read_text())
    text = ("slo: {ttft_ms: 1, itl_ms: 1}\nrepeats: 1\n"
            "levers: {decode.args.cuda-graph-max-bs-decode: [8, 16, 64, 128]}\n")
    s, out = checked_for(two, text)
    switch = 2 * (s.engine_load_secs + 10)
    races = sum(c.seconds for c in out[1:])
    assert races == pytest.approx(4 * (switch + RACE_RUNS * one_run_seconds(s)))
    # the baseline once more after the search: a repeat, started where its first ended
    drift = switch + CONFIRM_RUNS * one_run_seconds(s)
    assert total_seconds(s, out) == pytest.approx(out[0].seconds + races + leaders(4)
                                                  * run_seconds(s) + drift + switch)


def test_the_estimate_counts_a_repeat_as_the_two_runs_that_confirm_the_first() -> None:
    """A repeat starts where the config's first measurement ended (confirm_rate): 2 runs,
    not a whole search, for the baseline's repeats and the best's."""
    two = yaml.safe_load((REPO / "tests/cases/seed-2p2d-explicit.yaml").read_text())
    text = ("slo: {ttft_ms: 1, itl_ms: 1}\nrepeats: 3\n"
            "levers: {decode.args.cuda-graph-max-bs-decode: [64]}\n")
    s, out = checked_for(two, text)
    repeat = CONFIRM_RUNS * one_run_seconds(s)
    assert repeat < run_seconds(s)
    assert out[0].seconds == pytest.approx(run_seconds(s) + 2 * repeat)
    switch = 2 * (s.engine_load_secs + 10)
    assert total_seconds(s, out) == pytest.approx(
        out[0].seconds + out[1].seconds + leaders(1) * run_seconds(s) + 2 * repeat
        + switch + repeat + switch)


def run_cli(runner, *args: str, space_text: str = SPACE, tmp_path: Path):
    path = tmp_path / "tune.yaml"
    path.write_text(space_text)
    return runner.invoke(main, ["tune", "--topology", str(TOPO), "--space", str(path), *args])


def test_the_dry_run_lists_every_candidate_and_the_estimate(runner, tmp_path: Path) -> None:
    r = run_cli(runner, "--dry-run", "-c", str(REPO / "tests/cases/seed-2p2d-explicit.yaml"),
                tmp_path=tmp_path)
    assert r.exit_code == 0, r.output + r.stderr
    assert r.output.startswith("search: grid (search: auto, and the grid has 6 candidates")
    assert "decode.args.cuda-graph-max-bs-decode=64, decode.env.NCCL_PROTO=LL128" in r.output
    assert "6 of 6 candidates to measure (0 refused, 0 stop serving); estimated" in r.output


def test_the_estimate_uses_the_load_the_engines_took_at_their_last_start(
        runner, tmp_path: Path) -> None:
    """Where the deployment's runtimes left their restart state (the last start that served:
    its seconds loading), the estimate uses the slowest engine's, not the space file's
    guess, and says whose it is; a start still loading (no served start) is not one."""
    from pdsvc.ship.runtime.statefile import Kind, state_path, write_state

    cfg = str(REPO / "tests/cases/seed-2p2d-explicit.yaml")
    state = tmp_path / "state"
    guessed = run_cli(runner, "--dry-run", "--json", "-c", cfg, "--state-dir", str(state),
                      tmp_path=tmp_path)
    plain = run_cli(runner, "--dry-run", "-c", cfg, "--state-dir", str(state),
                    tmp_path=tmp_path)
    assert "(600 s each, from the space file: no engine of this config has served" \
        in plain.output, plain.output
    # the loads one after another: each measured candidate restarts its decodes in turn,
    # then the way back for the drift check and the way to the answer
    doc = json.loads(guessed.output)
    restarts = [len(c["restarts"]) for c in doc["candidates"] if c["measured"]]
    assert doc["engine_loads"] == sum(restarts) + 2 * max(restarts)
    loads = doc["engine_loads"]
    assert f"of it {loads} engine loads one after another" in plain.output, plain.output
    for name, took in (("dsv4-decode-0", 95.5), ("dsv4-decode-1", 120.0),
                       ("dsv4-prefill-0", 80.0)):
        write_state(state_path(str(state), name, Kind.RESTART),
                    {"phase": "serving", "start_phases": {"wait_gpus": 0.1, "starting": took}})
    write_state(state_path(str(state), "dsv4-prefill-1", Kind.RESTART),
                {"phase": "starting", "start_phases": {}})
    r = run_cli(runner, "--dry-run", "-c", cfg, "--state-dir", str(state), tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    assert "(120 s each, measured: dsv4-decode-1.service's last start, the slowest)" \
        in r.output, r.output
    measured = json.loads(run_cli(runner, "--dry-run", "--json", "-c", cfg, "--state-dir",
                                  str(state), tmp_path=tmp_path).output)
    one = [c for c in measured["candidates"] if c["verdict"] == "measure"][0]
    was = next(c for c in json.loads(guessed.output)["candidates"] if c["name"] == one["name"])
    # each of its restarts costs 120 + 10 s instead of 600 + 10 s
    assert was["seconds"] - one["seconds"] == pytest.approx(len(one["restarts"]) * 480)


def test_json_and_the_bounds(runner, tmp_path: Path) -> None:
    cfg = str(REPO / "tests/cases/seed-2p2d-explicit.yaml")
    r = run_cli(runner, "--dry-run", "--json", "-c", cfg, "--max-candidates", "2",
                tmp_path=tmp_path)
    doc = json.loads(r.output)
    assert doc["schema"] == "pdsvc-tune-plan/1" and doc["search"] == "grid"
    # the baseline and two: the seed-2p2d case sets no cuda-graph-max-bs-decode, so all six
    # combinations differ from it
    assert [c["measured"] for c in doc["candidates"]] == [True] * 3 + [False] * 4
    whole = json.loads(run_cli(runner, "--dry-run", "--json", "-c", cfg,
                               tmp_path=tmp_path).output)
    assert doc["estimated_seconds"] < whole["estimated_seconds"]
    tight = json.loads(run_cli(runner, "--dry-run", "--json", "-c", cfg, "--max-time", "1",
                               tmp_path=tmp_path).output)
    assert [c["measured"] for c in tight["candidates"]] == [True] + [False] * 6


def test_without_a_running_deployment_it_measures_nothing_and_exits_3(
        runner, tmp_path: Path) -> None:
    """The seed 2P2D case's router (port 8080 of this machine) is not running: nothing is
    switched, nothing is written."""
    r = run_cli(runner, "-c", str(REPO / "tests/cases/seed-2p2d-explicit.yaml"), "--results",
                str(tmp_path / "results"), tmp_path=tmp_path)
    assert r.exit_code == 3, r.output + r.stderr
    assert "not tuning: http://127.0.0.1:8080/v1/models" in r.stderr
    assert "running? (systemctl start dsv4-pd.target)" in r.stderr
    assert not (tmp_path / "results").exists()


def test_the_seed_space_file_parses_and_its_candidates_are_all_checked() -> None:
    s = parse_space((REPO / "etc/tune.yaml").read_text(), "etc/tune.yaml")
    found = candidates(s, SEED)
    assert s.strategy == "one-at-a-time" and len(found) == 1 + sum(
        len([v for v in lv.values if v != current(SEED, lv)]) for lv in s.levers)


def test_a_dry_run_of_outages_says_what_allow_outage_would_cost(runner, tmp_path: Path) -> None:
    """1P1D: every candidate stops serving; the dry run says what --allow-outage measures, the
    estimate then, and the outage each costs, and that estimate is the one --allow-outage
    prints itself."""
    cfg = str(REPO / "etc" / "pdsvc.yaml")
    r = run_cli(runner, "--dry-run", "-c", cfg, tmp_path=tmp_path)
    assert r.exit_code == 0, r.output + r.stderr
    assert "0 of 5 candidates to measure (0 refused, 5 stop serving)" in r.output
    said = next(x for x in r.output.splitlines() if x.startswith("with --allow-outage: "))
    assert said.startswith("with --allow-outage: 5 to measure, estimated ")
    assert "each of the 5 that stop serving is an outage of about one engine load" in said
    allowed = run_cli(runner, "--dry-run", "--allow-outage", "-c", cfg, tmp_path=tmp_path)
    estimate = said.split("estimated ", 1)[1].split(";")[0]
    assert "5 of 5 candidates to measure" in allowed.output
    assert f"; estimated {estimate}, " in allowed.output
    assert "with --allow-outage" not in allowed.output


def test_the_estimate_counts_a_load_per_engine_step_and_none_for_the_router() -> None:
    """A layout (two TP2 prefills instead of one TP4) on 1P1D: the new prefills start and the
    decode restarts in one step (serving stops anyway: one load, apply/rollout.py
    _one_outage), then the router restarts (no engine load)."""
    text = ("slo: {ttft_ms: 1, itl_ms: 1}\nlevers:\n  prefill:\n"
            "    - [{gpus: [0, 1], tp: 2}, {gpus: [2, 3], tp: 2}]\n")
    s, out = checked_for(SEED, text)
    layout = out[1]
    assert layout.verdict == "outage" and len(layout.restarts) == 4, layout
    assert layout.loads == 1
    assert layout.seconds == pytest.approx(1 * s.engine_load_secs + 2 * 10
                                           + RACE_RUNS * one_run_seconds(s))


def test_durations_read_in_the_unit_that_fits() -> None:
    from pdsvc.cli.tune import _duration

    assert [_duration(s) for s in (0, 22, 59.4, 59.6, 754, 3599, 3600, 18540)] == [
        "0 s", "22 s", "59 s", "1 min", "13 min", "1 h 00 min", "1 h 00 min", "5 h 09 min"]
