"""`pdsvc apply`'s rollout plan (pdsvc/apply/rollout.py, pure: two rendered bundles in,
steps out): the order of the steps, what each takes down and whether serving stops. The
command and the executor are test_apply.py's; the e2e under systemd test_e2e_apply.py and
test_e2e_apply_layout.py."""

from __future__ import annotations

import json

from apply_bundles import ONE_ONE, TOPO, bundle, rollout, two_two

from pdsvc.apply.rollout import VERBS, Step, StepKind, format_rollout, plan_rollout


def test_a_decode_arg_rolls_one_decode_at_a_time_and_serving_never_stops(tmp_path) -> None:
    r = rollout(tmp_path, two_two(), two_two(d=", args: {max-running-requests: 64}"))
    assert [(c.unit, c.action) for c in r.changes] == [
        ("dsv4-decode-0.service", "restart"), ("dsv4-decode-1.service", "restart")]
    assert r.changes[0].reasons[0].kind == "argv"
    assert r.changes[0].reasons[0].detail == "--max-running-requests: unset -> 64"
    assert [(s.action, s.units, s.takes) for s in r.steps] == [
        ("restart", ("dsv4-decode-0.service",), ()), ("restart", ("dsv4-decode-1.service",), ())]
    for s in r.steps:  # each decode is in 2 of the 4 pairs; the other 2 serve
        assert (len(s.pairs_down), s.pairs_left, s.serving_stops) == (2, 2, False)
    assert r.outage == ()


def test_an_env_change_is_classified_as_env_and_prefills_go_first(tmp_path) -> None:
    r = rollout(tmp_path, two_two(), two_two(p=", env: {SGLANG_LOG_LEVEL: debug}",
                                             d=", env: {SGLANG_LOG_LEVEL: debug}"))
    assert [s.units[0] for s in r.steps] == [
        "dsv4-prefill-0.service", "dsv4-prefill-1.service",
        "dsv4-decode-0.service", "dsv4-decode-1.service"]
    assert {x.kind for c in r.changes for x in c.reasons} == {"env"}
    assert not r.outage


def test_pair_incompatible_change_on_2p2d_rolls_as_two_halves_and_serving_never_stops(
        tmp_path) -> None:
    r = rollout(tmp_path, two_two(), two_two(p=", args: {page-size: 64}",
                                             d=", args: {page-size: 64}"))
    assert all(c.pair_breaking == ("--page-size: 1 -> 64",) for c in r.changes)
    a = ("dsv4-prefill-0.service", "dsv4-decode-0.service")
    b = ("dsv4-prefill-1.service", "dsv4-decode-1.service")
    assert [(s.action, s.units) for s in r.steps] == [
        ("restart half", a), ("switch halves", b), ("restart half", b)]
    assert all(s.halves == (a, b) for s in r.steps)
    assert [(len(s.pairs_down), s.pairs_left, s.serving_stops) for s in r.steps] == [
        (3, 1, False), (3, 1, False), (3, 1, False)]
    assert not r.outage and "cannot pair (--page-size: 1 -> 64)" in r.steps[0].why
    text = format_rollout(r)
    assert "serving: never stops" in text and "no mixed pair ever routed" in text


def test_pair_incompatible_change_with_one_engine_of_a_role_is_one_step(tmp_path) -> None:
    new = ONE_ONE.replace("[0, 1, 2, 3]}", "[0, 1, 2, 3], args: {page-size: 64}}")
    r = rollout(tmp_path, ONE_ONE % "", new % ", args: {page-size: 64}")
    [step] = r.steps
    assert step.action == "restart together" and step.serving_stops
    assert "cannot pair (--page-size: 1 -> 64)" in step.why


def test_a_prefill_restart_takes_its_partof_decodes_along_and_says_serving_stops(
        tmp_path) -> None:
    """NIXL with two prefills: no decode is PartOf= a prefill, so each prefill restarts alone
    and serving never stops; a decode set to restart with every prefill (sglang #33789) is
    taken along by each, and the plan says serving stops instead of promising capacity:
    both prefills then restart in one step, one outage instead of two."""
    change = ", args: {chunked-prefill-size: 4096}"
    (tmp_path / "auto").mkdir()
    (tmp_path / "coupled").mkdir()
    alone = rollout(tmp_path / "auto", two_two(backend="nixl"), two_two(p=change, backend="nixl"))
    assert [(s.units, s.takes) for s in alone.steps] == [
        (("dsv4-prefill-0.service",), ()), (("dsv4-prefill-1.service",), ())]
    assert not any(s.serving_stops for s in alone.steps)
    coupled = ", restart_with_prefill: true"
    r = rollout(tmp_path / "coupled", two_two(d=coupled, backend="nixl"),
                two_two(p=change, d=coupled, backend="nixl"))
    assert [(s.action, s.units, s.takes) for s in r.steps] == [
        (StepKind.RESTART_TOGETHER, ("dsv4-prefill-0.service", "dsv4-prefill-1.service"),
         ("dsv4-decode-0.service", "dsv4-decode-1.service"))]
    assert r.steps[0].serving_stops and "one engine load instead of 2" in r.steps[0].why


TWO_ONE = """\
name: dsv4
model: {path: /srv/models/x}
prefill:
  - {gpus: [0, 1], tp: 2}
  - {gpus: [2, 3], tp: 2}
decode: {gpus: [4, 5, 6, 7]}
"""


def test_a_layout_on_1p1d_starts_the_new_engines_with_the_restart_in_one_step(
        tmp_path) -> None:
    """1P1D -> 2P1D (the seed's layout lever): the decode's pairs are with the new prefills,
    so restarting it before they run could never prove them (its step failed at its bound,
    test_e2e_apply_layout.py); and serving stops anyway: one step, one load."""
    r = rollout(tmp_path, ONE_ONE % "", TWO_ONE)
    assert [(s.action, s.units) for s in r.steps] == [
        (StepKind.RESTART_TOGETHER, ("dsv4-prefill-0.service", "dsv4-prefill-1.service",
                                     "dsv4-decode.service")),
        (StepKind.RESTART_ROUTER, ("dsv4-router.service",))]
    assert r.steps[0].serving_stops and r.steps[0].pairs_left == 0
    assert "one engine load instead of 2" in r.steps[0].why


def test_new_engines_start_first_together_while_the_others_serve(tmp_path) -> None:
    """A third prefill on 2P2D: it starts first (nothing is taken out for it),
    then the engines whose pairs now include it restart one at a time, each while the others
    serve."""
    three = two_two().replace("decode:", "  - {gpus: [8, 9]}\ndecode:")
    topo = json.loads(TOPO.read_text())
    more = [dict(g, index=g["index"] + 8, pci_bus_id=g["pci_bus_id"][:-4] + "1.0")
            for g in topo["gpus"][:2]]
    topo["gpus"] += more
    (tmp_path / "topo.json").write_text(json.dumps(topo))
    old = bundle(tmp_path, two_two(), "old.yaml", tmp_path / "topo.json")
    new = bundle(tmp_path, three, "new.yaml", tmp_path / "topo.json")
    r = plan_rollout(old, new)
    first, *rest = r.steps
    assert (first.action, first.units) == (StepKind.START, ("dsv4-prefill-2.service",))
    assert not first.serving_stops and first.pairs_left == 4
    assert [s.action for s in rest][:-1] == [StepKind.RESTART] * (len(rest) - 1)
    assert not any(s.serving_stops for s in rest[:-1])


def test_a_layout_that_renames_every_engine_says_serving_stops(tmp_path) -> None:
    """Every engine new (1P1D -> 2P2D): the installer removes the old ones, so no pair serves
    until the new ones do. The plan said "serving never stops" while it counted only pairs
    among engines that ran before."""
    r = rollout(tmp_path, ONE_ONE % "", two_two())
    assert [(s.action, len(s.units)) for s in r.steps] == [(StepKind.START, 4),
                                                           (StepKind.RESTART_ROUTER, 1)]
    assert r.steps[0].serving_stops and r.steps[0].pairs_left == 0


def test_one_prefill_one_decode_warns_of_the_outage(tmp_path) -> None:
    r = rollout(tmp_path, ONE_ONE % "", ONE_ONE % ", args: {max-running-requests: 64}")
    [step] = r.steps
    assert step.serving_stops and step.pairs_left == 0 and r.outage == (step,)


def test_the_router_changes_last(tmp_path) -> None:
    r = rollout(tmp_path, two_two(), two_two(d=", args: {max-running-requests: 64}",
                                             policy="round_robin"))
    assert [s.action for s in r.steps] == ["restart", "restart", "restart router"]
    assert r.steps[-1].units == ("dsv4-router.service",) and r.steps[-1].serving_stops
    assert "--policy: cache_aware -> round_robin" in r.steps[-1].why


def test_a_comment_only_change_restarts_nothing(tmp_path) -> None:
    r = rollout(tmp_path, two_two(), "# a comment\n" + two_two())
    assert r.nothing_to_do and r.steps == ()


def test_new_runtime_code_restarts_every_engine_and_the_router(tmp_path) -> None:
    old = bundle(tmp_path, two_two())
    new = dict(old)
    new["runtime/canary.py"] += "\n# changed\n"
    r = plan_rollout(old, new)
    assert {c.unit for c in r.changes if c.action == "restart"} == {
        "dsv4-prefill-0.service", "dsv4-prefill-1.service", "dsv4-decode-0.service",
        "dsv4-decode-1.service", "dsv4-router.service"}
    assert all(c.reasons == (c.reasons[0],) and c.reasons[0].kind == "runtime"
               for c in r.changes)
    assert r.steps[-1].action == "restart router"


def test_a_step_reads_as_a_clause_with_its_verb_agreeing() -> None:
    def step(kind: StepKind, *units: str) -> Step:
        return Step(kind, units, (), (), 0, True, "")

    assert step(StepKind.RESTART, "a.service").clause() == "a.service restarts"
    assert (step(StepKind.RESTART_TOGETHER, "a.service", "b.service").clause()
            == "a.service, b.service restart together")
    assert step(StepKind.SWITCH_HALVES, "r.service").clause() == "r.service switches halves"
    assert set(VERBS) == set(StepKind)  # every kind of step has its verbs
