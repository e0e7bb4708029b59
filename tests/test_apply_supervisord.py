"""`pdsvc apply` on a supervisord bundle: its programs read back as units, the rollout that
supervisord allows (a program whose definition changes rolls alone only in a group of its
own: supervisor 4.3.0 re-reads a definition only by re-creating the group; pdsvc renders
each program alone), the step that moves a bundle of the older one-group layout to it, and
the supervisord manager's calls against a fake XML-RPC interface."""

from __future__ import annotations

import re
from pathlib import Path

from pdsvc.apply.order import plan
from pdsvc.apply.programs import CONF, group_members, program_units
from pdsvc.cli.kit import load_plan
from pdsvc.render.supervisord import render_supervisord
from pdsvc.status.managers import Supervisord

REPO = Path(__file__).resolve().parent.parent
TOPO = REPO / "etc" / "seed-host.topology.json"

TWO_TWO = """\
name: dsv4
format: supervisord
model: {path: /srv/models/x}
transfer: {backend: mooncake}
prefill:
  - {gpus: [0, 1]}
  - {gpus: [2, 3]}
decode:
  - {gpus: [4, 5]%s}
  - {gpus: [6, 7]%s}
"""


def bundle(tmp_path: Path, d: str = "", name: str = "c.yaml") -> dict[str, str]:
    cfg = tmp_path / name
    cfg.write_text(TWO_TWO % (d, d))
    return {f.path: f.content for f in render_supervisord(load_plan(cfg, None, TOPO), "r")}


def shared_group(b: dict[str, str]) -> dict[str, str]:
    """The same bundle with every program in one [group:dsv4-pd], as pdsvc rendered it before
    (and as a hand-made conf.d override may still do)."""
    programs = ",".join(re.findall(r"(?m)^\[program:([^\]]+)\]", b[CONF]))
    group = f"[group:dsv4-pd]\nprograms={programs}\n\n"
    conf = re.sub(r"--restart-with (\S+)=(\S+)", r"--restart-with dsv4-pd:\1=dsv4-pd:\2", b[CONF])
    return {**b, CONF: re.sub(r"(?m)^\[program:", lambda m: group + m[0], conf, count=1)}


def test_programs_read_back_as_units_with_their_argv_env_and_router(tmp_path) -> None:
    conf = bundle(tmp_path)[CONF]
    units = program_units(conf)
    d0 = units["dsv4-decode-0"]
    assert d0.kind == "engine" and d0.role == "decode"
    assert d0.url == "http://127.0.0.1:30001" and len(d0.pairs) == 2
    assert d0.option("--router") == "http://127.0.0.1:8000"
    assert d0.key_file == "/etc/dsv4/router.key"
    assert d0.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert "--disaggregation-mode" in d0.engine_argv
    assert units["dsv4-router"].kind == "router"
    assert group_members(conf, "dsv4-decode-0") == ("dsv4-decode-0",)
    assert group_members(shared_group(bundle(tmp_path))[CONF], "dsv4-pd:dsv4-decode-0") == (
        "dsv4-prefill-0", "dsv4-prefill-1", "dsv4-decode-0", "dsv4-decode-1", "dsv4-router")


def test_a_shared_group_makes_one_step_and_says_serving_stops(tmp_path) -> None:
    r = plan(shared_group(bundle(tmp_path, name="a.yaml")),
             shared_group(bundle(tmp_path, ", args: {max-running-requests: 64}", "b.yaml")))
    [step] = r.steps
    assert step.action == "update group" and step.serving_stops
    assert len(step.units) == 5 and "supervisorctl update dsv4-pd" in step.why
    assert any("group of its own" in n for n in r.notes)


def test_the_rendered_programs_roll_one_at_a_time(tmp_path) -> None:
    r = plan(bundle(tmp_path, name="a.yaml"),
             bundle(tmp_path, ", args: {max-running-requests: 64}", "b.yaml"))
    assert [(s.action, s.units) for s in r.steps] == [
        ("restart", ("dsv4-decode-0",)), ("restart", ("dsv4-decode-1",))]
    assert not r.outage


def test_a_runtime_only_change_rolls_one_program_at_a_time_even_in_a_shared_group(
        tmp_path) -> None:
    old = shared_group(bundle(tmp_path))
    new = {**old, "runtime/policy.py": old.get("runtime/policy.py", "") + "\n# changed\n"}
    r = plan(old, new)
    assert [s.units for s in r.steps][:2] == [("dsv4-pd:dsv4-prefill-0",),
                                              ("dsv4-pd:dsv4-prefill-1",)]
    assert r.steps[-1].action == "restart router"


def test_a_bundle_of_the_one_group_layout_is_regrouped_in_one_step(tmp_path) -> None:
    old = shared_group(bundle(tmp_path, name="a.yaml"))
    r = plan(old, bundle(tmp_path, ", args: {max-running-requests: 64}", "b.yaml"))
    [step] = r.steps
    assert step.action == "regroup" and step.serving_stops
    # the event listener (it takes a dead runtime's engine out of the router) starts anew too
    assert step.units == ("dsv4-events", "dsv4-prefill-0", "dsv4-prefill-1", "dsv4-decode-0",
                          "dsv4-decode-1", "dsv4-router")
    assert "supervisorctl update" in step.why
    # after it, the same change rolls
    assert not plan(bundle(tmp_path, name="a.yaml"),
                    bundle(tmp_path, ", args: {max-running-requests: 64}", "b.yaml")).outage


class FakeSupervisor:
    """supervisor's XML-RPC namespace: a log of the calls."""

    def __init__(self, programs: dict[str, str], changed: list[str],
                 added: tuple[str, ...] = (), removed: tuple[str, ...] = ()) -> None:
        self.programs = programs  # name -> group
        self.changed = changed
        self.added, self.removed = list(added), list(removed)
        self.log: list[str] = []

    def reloadConfig(self):  # noqa: N802
        self.log.append("reloadConfig")
        return [[self.added, self.changed, self.removed]]

    def getAllProcessInfo(self):  # noqa: N802
        return [{"name": n, "group": g} for n, g in self.programs.items()]

    def getProcessInfo(self, name):  # noqa: N802
        return {"statename": "RUNNING", "pid": 1, "start": 1, "now": 2}

    def __getattr__(self, verb):
        return lambda *a: self.log.append(f"{verb} {a[0]}")


def test_supervisord_recreates_a_programs_own_group_and_leaves_the_others() -> None:
    api = FakeSupervisor({"dsv4-decode-0": "dsv4-decode-0", "dsv4-decode-1": "dsv4-decode-1"},
                         ["dsv4-decode-0", "dsv4-decode-1"])
    rc, _ = Supervisord(api=lambda: api).act("restart", ["dsv4-decode-0"], 10)
    assert rc == 0
    assert api.log == ["reloadConfig", "stopProcessGroup dsv4-decode-0",
                       "removeProcessGroup dsv4-decode-0", "addProcessGroup dsv4-decode-0"]


def test_supervisord_refuses_to_recreate_a_shared_group_for_one_program() -> None:
    api = FakeSupervisor({"dsv4-decode-0": "dsv4-pd", "dsv4-decode-1": "dsv4-pd"}, ["dsv4-pd"])
    rc, out = Supervisord(api=lambda: api).act("restart", ["dsv4-pd:dsv4-decode-0"], 10)
    assert rc == 1 and "would stop dsv4-pd:dsv4-decode-1 too" in out
    assert api.log == ["reloadConfig"]


def test_supervisord_restarts_a_program_whose_definition_did_not_change() -> None:
    api = FakeSupervisor({"dsv4-decode-0": "dsv4-pd", "dsv4-decode-1": "dsv4-pd"}, [])
    rc, _ = Supervisord(api=lambda: api).act("restart", ["dsv4-pd:dsv4-decode-0"], 10)
    assert rc == 0
    assert api.log == ["reloadConfig", "stopProcess dsv4-pd:dsv4-decode-0",
                       "startProcess dsv4-pd:dsv4-decode-0"]


def test_supervisord_regroups_removing_the_old_group_before_adding_any() -> None:
    api = FakeSupervisor({"p": "dsv4-pd", "d": "dsv4-pd"}, [], added=("p", "d"),
                         removed=("dsv4-pd",))
    rc, _ = Supervisord(api=lambda: api).act("restart", ["p", "d"], 10)
    assert rc == 0
    assert api.log == ["reloadConfig", "stopProcessGroup dsv4-pd", "removeProcessGroup dsv4-pd",
                       "addProcessGroup p", "addProcessGroup d"]


ONE_ONE = """\
name: dsv4
format: supervisord
model: {path: /srv/models/x}
prefill: %s
decode: {gpus: [4, 5, 6, 7]}
"""


def test_a_layout_is_one_step_that_removes_the_old_program_before_adding_the_new(
        tmp_path) -> None:
    """1P1D -> 2P1D under supervisord: one step (serving stops anyway, apply/rollout.py), in
    which supervisord's re-read drops the old prefill's group before the new prefills' are
    added (their GPUs were the old one's), and re-creates the decode's with its new pairs."""
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(ONE_ONE % "{gpus: [0, 1, 2, 3]}")
    new.write_text(ONE_ONE % "[{gpus: [0, 1], tp: 2}, {gpus: [2, 3], tp: 2}]")
    r = plan(*({f.path: f.content for f in render_supervisord(load_plan(c, None, TOPO), "r")}
               for c in (old, new)))
    engines = ("dsv4-prefill-0", "dsv4-prefill-1", "dsv4-decode")
    assert [(s.action, s.units) for s in r.steps][0] == ("restart together", engines)
    api = FakeSupervisor({"dsv4-prefill": "dsv4-prefill", "dsv4-decode": "dsv4-decode"},
                         ["dsv4-decode"], added=engines[:2], removed=("dsv4-prefill",))
    rc, _ = Supervisord(api=lambda: api).act("restart", list(engines), 10)
    assert rc == 0
    assert api.log == ["reloadConfig", "stopProcessGroup dsv4-prefill",
                       "removeProcessGroup dsv4-prefill", "addProcessGroup dsv4-prefill-0",
                       "addProcessGroup dsv4-prefill-1", "stopProcessGroup dsv4-decode",
                       "removeProcessGroup dsv4-decode", "addProcessGroup dsv4-decode"]
