"""`pdsvc apply`'s command line and the executor's order of things against a fake host. The
rollout plan is test_apply_rollout.py's; the e2e under systemd is test_e2e_apply.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from apply_bundles import ONE_ONE, TOPO, bundle, two_two
from click.testing import CliRunner

from pdsvc.apply.execute import STEP_RUNS, Bounds, Executor, StepFailed
from pdsvc.apply.rollout import Rollout, StepKind, plan_rollout
from pdsvc.apply.units import Unit
from pdsvc.cli.commands import main

# ---------------------------------------------------------------------- validate

def test_validate_refuses_a_prefill_and_decode_that_cannot_pair(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(two_two(p=", args: {kv-cache-dtype: fp8_e4m3}"))
    res = CliRunner().invoke(main, ["validate", "-c", str(cfg), "--topology", str(TOPO)])
    assert res.exit_code == 2
    [line] = res.output.strip().splitlines()
    assert "decode[0].args.kv-cache-dtype: is not set (SGLang's default: 'auto') but " \
        "prefill[0].args.kv-cache-dtype is 'fp8_e4m3'" in line
    assert "give both the same args value" in line


# ---------------------------------------------------------------------- the command line


def rendered(tmp_path: Path, text: str) -> tuple[Path, Path]:
    cfg, out = tmp_path / "c.yaml", tmp_path / "units"
    cfg.write_text(text)
    res = CliRunner().invoke(main, ["render", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    return cfg, out


def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path) -> None:
    cfg, out = rendered(tmp_path, two_two())
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    cfg.write_text(two_two(d=", args: {max-running-requests: 64}"))
    args = ["apply", "-c", str(cfg), "--topology", str(TOPO), "-o", str(out), "--dry-run"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "1. restart dsv4-decode-0.service" in res.output
    assert "serving: never stops" in res.output
    res = CliRunner().invoke(main, [*args, "--json"])
    doc = json.loads(res.output)
    assert doc["format"] == "pdsvc-apply/1" and doc["serving_stops"] is False
    assert [s["units"] for s in doc["steps"]] == [["dsv4-decode-0.service"],
                                                  ["dsv4-decode-1.service"]]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (out / ".pdsvc-previous").exists()


def test_nothing_to_do_exits_0(tmp_path) -> None:
    cfg, out = rendered(tmp_path, two_two())
    res = CliRunner().invoke(main, ["apply", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "nothing to do" in res.output


def test_bytecode_the_runtime_wrote_in_the_bundle_is_no_change(tmp_path) -> None:
    """A runtime run from the bundle (supervisord's) leaves runtime/__pycache__/ there when
    the host's Python writes bytecode, the default: apply restarted every engine and the
    router for 'the runtime's code (21 files)' until it left the caches out."""
    cfg, out = rendered(tmp_path, two_two())
    cache = out / "runtime" / "__pycache__"
    cache.mkdir()
    for module in ("lifecycle", "canary"):
        (cache / f"{module}.cpython-311.pyc").write_bytes(b"\xa7\r\r\n\x00bytecode")
    res = CliRunner().invoke(main, ["apply", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "nothing to do" in res.output


def test_an_outage_is_not_taken_without_yes(tmp_path) -> None:
    cfg, out = rendered(tmp_path, ONE_ONE % "")
    cfg.write_text(ONE_ONE % ", args: {max-running-requests: 64}")
    res = CliRunner().invoke(main, ["apply", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out)], input="")
    assert res.exit_code == 3, res.output
    assert "pass --yes to accept the outage" in res.output
    assert not (out / ".pdsvc-previous").exists()


@pytest.mark.parametrize("args, says", [
    (["-o", "nowhere"], "no rendered bundle here to compare with"),
    (["-c", "missing.yaml"], "config file not found"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, says) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(two_two())
    res = CliRunner().invoke(main, ["apply", "-c", "c.yaml", "--topology", str(TOPO), *args])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and says in res.output


# ---------------------------------------------------------------------- the executor


def test_every_step_kind_has_its_run_and_keeps_its_words() -> None:
    """The executor runs each kind through its own method; a kind prints, compares and goes
    into --json as the words the plan always used."""
    assert set(STEP_RUNS) == set(StepKind)
    assert f"{StepKind.SWITCH_HALVES}" == "switch halves" == StepKind.SWITCH_HALVES
    assert json.dumps([StepKind.RESTART_ROUTER]) == '["restart router"]'


class FakeClock:
    t = 0.0

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t

    def sleep(self, secs: float) -> None:
        self.t += secs


class FakeHost(FakeClock):
    """systemd and the router as far as one decode's step needs them; a log of what was done."""

    def __init__(self, unit: Unit, others: Sequence[Unit] = (), others_from: float = 0.0) -> None:
        self.unit = unit
        self.others = others  # the other engines, listed healthy from others_from on
        self.others_from = others_from
        self.log: list[str] = []
        self.t = 0.0
        self.running = 2  # requests in flight when the step begins
        self.listed = True
        self.invocation = "old"

    def run(self, argv: list[str], timeout: float = 0) -> tuple[int, str]:
        if argv[1] == "show":
            return 0, f"ActiveState=active\nInvocationID={self.invocation}\n"
        self.log.append(" ".join(argv[1:]))
        self.invocation = "new"
        return 0, ""

    def http(self, method: str, url: str, headers=None, timeout: float = 0,
             body: bytes | None = None) -> tuple[int, str]:
        if url.endswith("/metrics"):
            self.running = max(0, self.running - 1)
            return 200, f"sglang:num_running_reqs{{x=\"1\"}} {self.running}.0\n"
        if url.endswith("/workers") and method == "GET":
            ws = [{"id": "w1", "url": self.unit.url, "is_healthy": True}] * self.listed
            if self.t >= self.others_from:
                ws += [{"id": u.name, "url": u.url, "is_healthy": True} for u in self.others]
            return 200, json.dumps({"workers": ws})
        if method == "DELETE":
            self.log.append(f"DELETE {url.rsplit('/', 1)[1]}")
            self.deleted_at = self.t
            self.listed = False
            return 202, ""
        if method == "POST":
            self.log.append("POST")
        self.listed = self.invocation == "new"
        return 200, ""

    def read(self, path: str) -> str | None:
        if path.endswith(".canary.json"):
            pairs = [{"pair": f"{p} -> {d}", "state": "ok", "last_ok": self.t}
                     for p, d in self.unit.pairs]
            return json.dumps({"at": self.t, "pairs": pairs})
        return "key"

    def write_hold(self, path: str, out: bool, peers, why: str, until=None, since=None,
                   by="pdsvc apply", profile=None) -> bool:
        self.log.append(f"hold {path.rsplit('/', 1)[1]} out={out}")
        return True

    def clear_hold(self, path: str) -> None:
        self.log.append(f"release {path.rsplit('/', 1)[1]}")


def decode_0_changed(tmp_path: Path) -> tuple[Rollout, dict[str, Unit]]:
    """A 2P2D bundle whose decode-0 gains an argument: its rollout and the new units."""
    b = bundle(tmp_path, two_two())
    new = dict(b)
    new["dsv4-decode-0.service"] = new["dsv4-decode-0.service"].replace(
        "--enable-metrics", "--enable-metrics --max-running-requests 64")
    r = plan_rollout(b, new)
    units = {n: Unit.parse(n, t) for n, t in new.items() if n.endswith(".service")}
    return r, units


def test_a_step_deregisters_drains_then_restarts_and_waits_for_the_canary(tmp_path) -> None:
    r, units = decode_0_changed(tmp_path)
    host = FakeHost(units["dsv4-decode-0.service"], engines_but(units, "dsv4-decode-0.service"))
    said: list[str] = []
    Executor(units, host, Bounds(10, 10, 0.5), said.append).run_step(r.steps[0])
    # held first (the runtime does not re-add it); once healthy and its pairs good, apply
    # registers it itself, then releases it
    assert host.log == ["hold dsv4-decode-0.hold.json out=True", "DELETE w1",
                        "restart dsv4-decode-0.service", "POST",
                        "release dsv4-decode-0.hold.json"]
    assert host.running == 0  # drained before the restart
    assert said[-2] == "  dsv4-decode-0.service: serving again"
    assert said[-1].startswith("  took (s): out and drained ")


@pytest.mark.parametrize(("metrics", "said_of_it"), [
    ((0, ""), "not answering (no engine running): nothing to drain"),  # a crashed candidate
    ((200, "# no gauge\n"), "no sglang:num_running_reqs (metrics off?)"),
])
def test_the_drain_says_why_nothing_is_left_to_wait_for(tmp_path, metrics, said_of_it) -> None:
    r, units = decode_0_changed(tmp_path)
    host = FakeHost(units["dsv4-decode-0.service"], engines_but(units, "dsv4-decode-0.service"))
    real = host.http
    host.http = lambda method, url, *a, **k: metrics if url.endswith("/metrics") \
        else real(method, url, *a, **k)  # type: ignore[method-assign]
    said: list[str] = []
    Executor(units, host, Bounds(10, 10, 0.5), said.append).run_step(r.steps[0])
    drained = [line for line in said if line.startswith("  dsv4-decode-0.service: n")]
    assert drained == [f"  dsv4-decode-0.service: {said_of_it}" + (
        ": SGLang's own SIGTERM drain finishes what runs" if metrics[0] else "")], said


def engines_but(units: dict[str, Unit], name: str) -> list[Unit]:
    return [u for n, u in units.items() if u.kind == "engine" and n != name]


@pytest.mark.parametrize("joins_at", [4.0, None])
def test_an_engine_leaves_the_router_only_once_another_of_its_role_is_listed(
        tmp_path, joins_at: float | None) -> None:
    """decode-1 not (yet) in the router — just started, back from a crash, still proving its
    pairs: the step waits for it before decode-0 leaves, and fails, taking nothing out, if
    it never comes within the bound."""
    r, units = decode_0_changed(tmp_path)
    host = FakeHost(units["dsv4-decode-0.service"], engines_but(units, "dsv4-decode-0.service"),
                    others_from=joins_at if joins_at is not None else float("inf"))
    said: list[str] = []
    ex = Executor(units, host, Bounds(10, 10, 0.5), said.append)
    if joins_at is None:
        with pytest.raises(StepFailed, match="no other healthy decode within 10 s"):
            ex.run_step(r.steps[0])
        assert host.log == [] and host.listed  # nothing held, nothing taken out
        return
    ex.run_step(r.steps[0])
    assert host.log[:2] == ["hold dsv4-decode-0.hold.json out=True", "DELETE w1"]
    assert host.deleted_at >= joins_at  # not a moment before decode-1 is listed
    assert any("waiting until the router lists another decode" in line for line in said), said


class FakeStack(FakeClock):
    """systemd and the router for every engine of a 2P2D bundle; the holds apply writes; a
    log of what was done, in order."""

    def __init__(self, units: dict[str, Unit]) -> None:
        self.units = units
        self.by_url = {u.url: n for n, u in units.items() if u.url}
        self.listed = set(self.by_url)
        self.runs = dict.fromkeys(units, 0)
        self.holds: dict[str, bool] = {}
        self.log: list[str] = []
        self.t = 0.0

    def run(self, argv: list[str], timeout: float = 0) -> tuple[int, str]:
        if argv[1] == "show":
            return 0, f"ActiveState=active\nInvocationID={self.runs[argv[2]]}\n"
        self.log.append(" ".join(a.removesuffix(".service").removeprefix("dsv4-")
                                 for a in argv[1:]))
        for name in argv[2:]:
            self.runs[name] += 1
        return 0, ""

    def http(self, method: str, url: str, headers=None, timeout: float = 0,
             body: bytes | None = None) -> tuple[int, str]:
        if url.endswith("/metrics"):
            return 200, "sglang:num_running_reqs 0.0\n"
        if url.endswith("/workers") and method == "GET":
            return 200, json.dumps({"workers": [
                {"id": self.by_url[u], "url": u, "is_healthy": True} for u in self.listed]})
        if method == "DELETE":
            name = url.rsplit("/", 1)[1]
            self.log.append(f"DELETE {name.removesuffix('.service')[5:]}")
            self.listed.discard(self.units[name].url)
        elif method == "POST":
            url = json.loads(body or b"{}")["url"]
            self.log.append(f"POST {self.by_url[url].removesuffix('.service')[5:]}")
            self.listed.add(url)
        return 200, ""

    def read(self, path: str) -> str | None:
        if path.endswith(".canary.json"):
            name = path.rsplit("/", 1)[1].removesuffix(".canary.json") + ".service"
            pairs = [{"pair": f"{p} -> {d}", "state": "ok", "last_ok": self.t}
                     for p, d in self.units[name].pairs]
            return json.dumps({"at": self.t, "pairs": pairs})
        return "key"

    def write_hold(self, path: str, out: bool, peers, why: str, until=None, since=None,
                   by="pdsvc apply", profile=None) -> bool:
        name = path.rsplit("/", 1)[1].removesuffix(".hold.json").removeprefix("dsv4-")
        self.log.append(f"hold {name} {'out' if out else 'in'} "
                        f"peers={','.join(self.by_url[p][5:-8] for p in peers or [])}")
        self.holds[path] = out
        return True

    def clear_hold(self, path: str) -> None:
        self.holds.pop(path, None)
        self.log.append(f"release {path.rsplit('/', 1)[1].removesuffix('.hold.json')[5:]}")
        # the runtime joins once released
        name = path.rsplit("/", 1)[1].removesuffix(".hold.json") + ".service"
        self.listed.add(self.units[name].url)


def calls_at_once(log: list[str]) -> list[str]:
    """The log with each run of DELETEs or POSTs sorted: apply makes those calls at once."""
    out: list[str] = []
    for line in log:
        run = out and line.split()[0] in ("DELETE", "POST") and \
            out[-1].split()[0] == line.split()[0]
        out.append(line)
        if run:
            i = len(out) - 1
            while i and out[i - 1].split()[0] == line.split()[0]:
                i -= 1
            out[i:] = sorted(out[i:])
    return out


def test_halves_never_let_old_and_new_meet_and_every_hold_is_released(tmp_path) -> None:
    new = bundle(tmp_path, two_two(p=", args: {page-size: 64}", d=", args: {page-size: 64}"))
    r = plan_rollout(bundle(tmp_path, two_two(), "old.yaml"), new)
    units = {n: Unit.parse(n, t) for n, t in new.items() if n.endswith(".service")}
    host = FakeStack(units)
    ex = Executor(units, host, Bounds(10, 10, 0.5), lambda s: None)
    for step in r.steps:
        ex.run_step(step)
    assert not ex.holds and not host.holds
    assert calls_at_once(host.log) == [
        # 1: A out and held, its canary among A; B serves, its canary among B
        "hold prefill-0 out peers=prefill-0,decode-0", "hold decode-0 out peers=prefill-0,"
        "decode-0", "hold prefill-1 in peers=prefill-1,decode-1",
        "hold decode-1 in peers=prefill-1,decode-1",
        "DELETE decode-0", "DELETE prefill-0", "restart prefill-0 decode-0",
        # 2: B held, out at once, then A in at once (posted by apply), then A's hold lets
        # it in (its runtime keeps the entry)
        "hold prefill-1 out peers=prefill-1,decode-1", "hold decode-1 out peers=prefill-1,"
        "decode-1", "DELETE decode-1", "DELETE prefill-1", "POST decode-0", "POST prefill-0",
        "hold prefill-0 in peers=prefill-0,decode-0",
        "hold decode-0 in peers=prefill-0,decode-0",
        # 3: B restarts held, then everyone is released
        "hold prefill-1 out peers=prefill-1,decode-1", "hold decode-1 out peers=prefill-1,"
        "decode-1", "restart prefill-1 decode-1",
        "release prefill-0", "release decode-0", "release prefill-1", "release decode-1"]


class OneSideProves(FakeStack):
    """1P1D restarted as one step (2 s): the prefill's canary found the decode not up yet
    (peer-down); the decode's judged the pair ok at ``proved`` s after the restart began."""

    def __init__(self, units: dict[str, Unit], proved: float) -> None:
        super().__init__(units)
        self.proved = proved
        self.restarted_at = float("inf")

    def run(self, argv: list[str], timeout: float = 0) -> tuple[int, str]:
        if argv[1] == "restart":
            self.restarted_at = self.t
            self.t += 2.0
        return super().run(argv, timeout)

    def read(self, path: str) -> str | None:
        if not path.endswith(".canary.json"):
            return "key"
        (p, d), = next(u for u in self.units.values() if u.role == "prefill").pairs
        ok = path.endswith("decode.canary.json") and self.t >= self.restarted_at + self.proved
        pair = {"pair": f"{p} -> {d}", "state": "ok" if ok else "peer-down",
                "last_ok": self.restarted_at + self.proved if ok else None}
        return json.dumps({"at": self.t, "pairs": [pair]})


def one_one_step(tmp_path: Path) -> tuple[dict[str, Unit], Rollout]:
    """1P1D, a pair-incompatible change: one step restarts both."""
    new = bundle(tmp_path, ONE_ONE.replace("gpus: [0, 1, 2, 3]", "gpus: [0, 1, 2, 3], "
                                           "args: {page-size: 64}") % ", args: {page-size: 64}")
    r = plan_rollout(bundle(tmp_path, ONE_ONE % "", "old.yaml"), new)
    assert [s.down for s in r.steps] == [("dsv4-prefill.service", "dsv4-decode.service")]
    return {n: Unit.parse(n, t) for n, t in new.items() if n.endswith(".service")}, r


def test_1p1d_one_end_proves_the_pair_and_apply_registers_both_at_once(tmp_path) -> None:
    """The decode's round through the new prefill proves the pair for both ends: apply
    registers both (not one membership check after the other's own retry), then releases."""
    units, r = one_one_step(tmp_path)
    host = OneSideProves(units, proved=2.5)  # after both run anew (2 s)
    Executor(units, host, Bounds(10, 10, 0.1), lambda s: None).run_step(r.steps[0])
    assert calls_at_once(host.log)[-4:] == ["POST decode", "POST prefill", "release prefill",
                                            "release decode"]


def test_a_peer_round_from_before_the_new_run_proves_nothing(tmp_path) -> None:
    """A round the peer judged good while the engine was still restarting went through the
    old engine: it is no proof for the new one."""
    units, r = one_one_step(tmp_path)
    host = OneSideProves(units, proved=1.0)  # during the restart
    with pytest.raises(StepFailed, match="prefill.service: pair canary not good yet"):
        Executor(units, host, Bounds(10, 5, 0.1), lambda s: None).run_step(r.steps[0])
    assert not any(line.startswith("POST") for line in host.log)

