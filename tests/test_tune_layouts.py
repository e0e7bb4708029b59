"""Layouts as levers in `pdsvc tune`'s space (pdsvc/tune/space.py): a mapping merged in, a list
put in place, a role's engines laid out anew (GPUs, TP, engines per role, EP / DP-attention
flags that only work together); each candidate's plan checked before anything restarts, a
refused one skipped with the schema's words."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO
from test_tune_space import SEED, checked_for

from pdsvc.errors import ConfigError
from pdsvc.tune.space import apply_changes, candidates, parse_space
from pdsvc.tune.store import changes_key

HEAD = "slo: {ttft_ms: 1, itl_ms: 1}\nsearch: one-at-a-time\nlevers:\n"


def levers(text: str):
    return parse_space(HEAD + text, "t.yaml")


def test_a_mapping_is_merged_and_a_list_is_put_in_place() -> None:
    s = levers("  decode.args: [{enable-dp-attention: true, dp-size: 4}]\n"
               "  decode.gpus: [[4, 5]]\n")
    out = apply_changes(SEED, (("decode.args", {"enable-dp-attention": True, "dp-size": 4}),
                               ("decode.gpus", [4, 5])), s.levers)
    args = out["decode"]["args"]
    assert args["enable-dp-attention"] is True and args["dp-size"] == 4
    assert args["cuda-graph-max-bs-decode"] == SEED["decode"]["args"]["cuda-graph-max-bs-decode"]
    assert out["decode"]["gpus"] == [4, 5] and SEED["decode"]["gpus"] == [4, 5, 6, 7]


def test_a_list_at_a_role_s_path_lays_its_engines_out_anew() -> None:
    """Each engine is the role's as it is (tp, args, env) less its GPUs, NUMA node and ports
    (left out: from the index), the item's keys over it."""
    s = levers("  prefill: [[{gpus: [0, 1], tp: 2}, {gpus: [2, 3], tp: 2}]]\n")
    two = [{"gpus": [0, 1], "tp": 2}, {"gpus": [2, 3], "tp": 2}]
    out = apply_changes(SEED, (("prefill", two),), s.levers)["prefill"]
    assert [(e["gpus"], e["tp"]) for e in out] == [([0, 1], 2), ([2, 3], 2)]
    assert all(e["args"] == SEED["prefill"]["args"] for e in out)
    assert not any({"port", "bootstrap_port", "dist_init_port", "numa_node"} & set(e)
                   for e in out)


def test_the_seed_2p1d_and_1p2d_layouts_are_checked_before_anything_restarts() -> None:
    s, out = checked_for(SEED, HEAD + (
        "  prefill: [[{gpus: [0, 1], tp: 2}, {gpus: [2, 3], tp: 2}]]\n"
        "  decode: [{gpus: [4, 5, 6, 7, 3], tp: 4}]\n"))
    two_prefills, bad_tp = out[1:]
    # 1P1D -> 2P1D: new units, and the decode restarts (its pairs change): no pair meanwhile
    assert two_prefills.verdict == "outage", two_prefills
    assert {"dsv4-prefill-0.service", "dsv4-prefill-1.service"} <= set(two_prefills.restarts)
    assert bad_tp.verdict == "refused"
    assert bad_tp.why.startswith("decode.tp: tp is 4 but 5 GPUs are listed"), bad_tp.why


def test_a_layout_equal_to_the_config_s_own_is_the_baseline() -> None:
    s = levers("  decode: [{gpus: [4, 5, 6, 7], tp: 4}, {tp: 2, gpus: [4, 5]}]\n")
    found = candidates(s, SEED)
    assert [c.describe() for c in found] == ["the current config",
                                             "decode={tp: 2, gpus: [4, 5]}"]


def test_a_candidate_s_identity_does_not_depend_on_key_order() -> None:
    a = (("decode", {"gpus": [4, 5], "tp": 2}),)
    b = (("decode", {"tp": 2, "gpus": [4, 5]}),)
    assert changes_key(a) == changes_key(b)


@pytest.mark.parametrize("text, message", [
    ("  prefill: [4]\n", "levers.prefill: 4: a value at a role's path is a mapping merged"),
    ("  decode: [{gpus: [4]}, {gpus: [4]}]\n", "lists a value twice"),
    ("  decode: [{tp: 2, gpus: [4, 5]}, {gpus: [4, 5], tp: 2}]\n", "lists a value twice"),
    ("  decode.args: [{when: 2026-12-06}]\n", "a value is a string, number, boolean, null, or"),
    ("  router: [{policy: random}]\n", "levers.router: not a config path"),
    ("  prefill: [2026-12-06]\n", "datetime.date(2026, 12, 6)\": a value at a role's path"),
])
def test_a_bad_layout_is_one_line_naming_the_lever(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        levers(text)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_seed_space_has_the_layouts_its_operator_tries() -> None:
    s = parse_space((REPO / "etc/tune.yaml").read_text(), "etc/tune.yaml")
    assert {"prefill", "decode", "decode.args"} <= {lv.path for lv in s.levers}
    _, out = checked_for(SEED, (REPO / "etc/tune.yaml").read_text())
    layouts = [c for c in out if c.candidate.changes
               and isinstance(c.candidate.changes[0][1], (list, dict))]
    assert layouts and all(c.verdict in ("outage", "measure") for c in layouts), [
        (c.candidate.describe(), c.verdict, c.why) for c in layouts]
    assert yaml.safe_load((REPO / "etc/tune.yaml").read_text())["levers"]["prefill"]


def test_a_layout_is_switched_to_measured_and_wins_like_any_value(tmp_path) -> None:
    """The search's fake deployment (test_tune_search.Fake): a mapping whose backend refuses
    to start is recorded failed-start; the other wins; both survive the results file."""
    from test_tune_search import Fake, tuner

    from pdsvc.tune.store import Store

    space = ("slo: {ttft_ms: 1, itl_ms: 1}\nrepeats: 2\nsearch: grid\nlevers:\n  decode.args:\n"
             "    - {cuda-graph-max-bs-decode: 32, moe-runner-backend: flashinfer_trtllm}\n"
             "    - {cuda-graph-max-bs-decode: 32}\n")
    t, first = tuner(tmp_path, Fake(), space_text=space)
    answer = t.run(first)
    assert answer.wins and answer.best.describe() == "decode.args={cuda-graph-max-bs-decode: 32}"
    statuses = {c.name: o.status for c, o, _ in answer.rows if o is not None}
    assert statuses == {"baseline": "measured", "c1": "failed-start", "c2": "measured"}
    again = Store(tmp_path / "results", {})
    assert [list(map(list, o.changes)) for o in again.outcomes if o.name == "c2"][0] == [
        ["decode.args", {"cuda-graph-max-bs-decode": 32}]]
