"""A `pdsvc profile` run (pdsvc/profile/run.py) against a host double: engines that answer as
SGLang 0.5.23 does and write the real fixture traces some seconds after they are asked, and
runtimes that answer a hold as profiled.py does. The order of things, what each engine is
asked, and every way a run ends: it leaves no hold and no engine profiling behind."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from apply_bundles import ONE_ONE, bundle
from click.testing import CliRunner
from conftest import REPO

from pdsvc.apply.flow import _refuse_profiled
from pdsvc.cli import profile as cli
from pdsvc.cli.kit import load_plan
from pdsvc.errors import ConfigError, OutputError
from pdsvc.profile.engines import engine_of, select
from pdsvc.profile.options import CannotProfile, ProfileError, ProfileOptions
from pdsvc.profile.run import Run
from pdsvc.profile.trace import TraceError
from pdsvc.ship.runtime.hold import write_hold
from pdsvc.ship.runtime.statefile import Kind, state_path, write_state

TRACES = REPO / "tests" / "fixtures" / "traces"
PLAN = load_plan(REPO / "etc/pdsvc.yaml", None, REPO / "etc/seed-host.topology.json")
DECODE, PREFILL = "http://127.0.0.1:30001", "http://127.0.0.1:30000"
RUN = "r1"


class Engines:
    """The seed plan's two engines and their runtimes, on a clock the run's sleeps move."""

    def __init__(self, state: Path, write_secs: float = 3.0, **info: Any) -> None:
        self.state, self.write_secs = state, write_secs
        self.t = 1000.0
        self.calls: list[tuple[str, str, Any]] = []
        self.info = {"tp_size": 4, "max_running_requests": 64, "cuda_graph_max_bs": 32,
                     "speculative_algorithm": None, **info}
        self.start_status = 200
        self.ack = True  # the runtimes answer holds
        self.paused = ""  # each router's answer to the pause ("" paused)
        self.truncate = False
        self.kinds = {PREFILL: "prefill", DECODE: "decode"}
        self.due: list[tuple[float, dict, str]] = []  # (when, body, engine url): a write
        self.interrupt_at: float | None = None
        self.lock = threading.Lock()

    # ---- the Host protocol
    def http(self, method: str, url: str, headers: dict | None = None, timeout: float = 3.0,
             body: bytes | None = None) -> tuple[int, str]:
        base, path = url[:len(DECODE)], url[len(DECODE):]
        doc = json.loads(body) if body else None
        with self.lock:
            self.calls.append((method, path, doc))
        if path == "/server_info":
            return 200, json.dumps(self.info)
        if path == "/metrics":
            running = 32 if self.kinds[base] == "decode" else 2
            tokens = 100 * self.t
            return 200, (f'sglang:num_running_reqs{{a="b"}} {running}\n'
                         f'sglang:num_queue_reqs{{a="b"}} 0\n'
                         f'sglang:generation_tokens_total{{a="b"}} {tokens}\n'
                         f'sglang:prompt_tokens_total{{a="b"}} {tokens}\n')
        if path == "/health":
            return 200, ""
        if path == "/start_profile":
            if self.start_status != 200:
                return self.start_status, "Internal Server Error"
            self.due.append((self.t + 1 + self.write_secs, doc or {}, base))
            return 200, "Start profiling.\n"
        if path == "/stop_profile":
            return 500, "Internal Server Error"  # stopped itself after its steps
        return 404, ""

    def write_hold(self, path: str, out: bool, peers, why: str, until=None, since=None,
                   by="pdsvc apply", profile=None) -> bool:
        write_hold(path, out=out, peers=peers, why=why, until=until, since=since, by=by,
                   profile=profile)
        name = Path(path).name.removesuffix(".hold.json")
        if self.ack:  # the runtime's answer (profiled.py), at once
            write_state(state_path(str(self.state), name, Kind.PROFILE),
                        {"run": profile, "routers": {"http://127.0.0.1:8000": self.paused}})
        return True

    def clear_hold(self, path: str) -> None:
        Path(path).unlink(missing_ok=True)

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t

    def sleep(self, secs: float) -> None:
        self.t += secs
        for when, body, base in [d for d in self.due if d[0] <= self.t]:
            self.due.remove((when, body, base))
            self.write(body, base)
        if self.interrupt_at is not None and self.t >= self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt

    def write(self, body: dict, base: str) -> None:
        kind = self.kinds[base] if "GPU" in body["activities"] else "cpu-only"
        out = Path(body["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        stage = {"prefill": "-EXTEND", "decode": "-DECODE"}[self.kinds[base]] \
            if body["profile_by_stage"] else ""
        for r in range(self.info["tp_size"]):
            src = TRACES / f"{kind}-TP-{0 if kind == 'cpu-only' else r}.trace.json.gz"
            dst = out / f"{body['profile_prefix']}-{body['profile_id']}-TP-{r}{stage}" \
                        ".trace.json.gz"
            data = src.read_bytes()
            dst.write_bytes(data[:-20] if self.truncate else data)

    # ---- reading it
    def asked(self, path: str) -> list[Any]:
        return [doc for _, p, doc in self.calls if p == path]


def run_of(tmp_path: Path, engines: Engines, lines: list[str] | None = None,
           **opts: Any) -> Run:
    state = tmp_path / "run"
    state.mkdir(exist_ok=True)
    logs = {"dsv4-decode.service": ["RuntimeError: Profiling is already in progress. Call "
                                    "/stop_profile first."]}
    return Run(PLAN, PLAN, ProfileOptions(**{"load": False, "warmup_timeout": 30, **opts}),
               engines, (lines if lines is not None else []).append, str(state),
               lambda unit: logs.get(unit, []), run=RUN, profiles=tmp_path / "profiles")


def holds(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "run").glob("*.hold.json"))


def test_a_decode_capture_asks_each_engine_directly_and_breaks_its_traces_down(
        tmp_path: Path) -> None:
    engines, lines = Engines(tmp_path / "run"), []
    run = run_of(tmp_path, engines, lines)
    run.prepare()
    result = run.execute(None)
    (body,) = engines.asked("/start_profile")
    assert body == {"output_dir": str(tmp_path / "profiles" / RUN / "dsv4-decode"),
                    "num_steps": 20, "activities": ["GPU"], "with_stack": False,
                    "record_shapes": False, "profile_by_stage": False, "profile_id": RUN,
                    "profile_prefix": "pdsvc"}
    (role,) = result.roles
    assert role.role == "decode" and role.breakdown.kernels[0].name == \
        "_tiled_sparse_decode_kernel"
    (e,) = role.engines
    assert [Path(t).name for t in e.traces] == [
        f"pdsvc-{RUN}-TP-{r}.trace.json.gz" for r in range(4)]
    assert e.tok_s == pytest.approx(100.0)  # the counter's pace on the double's clock
    assert "32 running" in e.batch and "its share of the load" not in e.batch
    assert holds(tmp_path) == []  # released
    order = [p for _, p, _ in engines.calls if p in ("/start_profile", "/health")]
    assert order[0] == "/start_profile" and order[-1] == "/health"
    assert any("held dsv4-decode" in x for x in lines)


def test_by_stage_names_the_stage_and_is_refused_under_a_speculative_algorithm(
        tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    run = run_of(tmp_path, engines, by_stage=True)
    run.prepare()
    (role,) = run.execute(None).roles
    assert engines.asked("/start_profile")[0]["profile_by_stage"] is True
    assert role.engines[0].traces[0].endswith(f"{RUN}-TP-0-DECODE.trace.json.gz")
    spec = Engines(tmp_path / "run", speculative_algorithm="EAGLE")
    with pytest.raises(ConfigError, match=r"--by-stage: dsv4-decode runs speculative decoding "
                                          r"\(speculative_algorithm EAGLE\).*sglang #34943"):
        run_of(tmp_path, spec, by_stage=True).prepare()
    assert spec.asked("/start_profile") == []


def test_both_roles_go_prefill_first_each_under_its_own_hold(tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    run = run_of(tmp_path, engines, roles=("prefill", "decode"))
    run.prepare()
    result = run.execute(None)
    assert [r.role for r in result.roles] == ["prefill", "decode"]
    dirs = [Path(b["output_dir"]).name for b in engines.asked("/start_profile")]
    assert dirs == ["dsv4-prefill", "dsv4-decode"]


@pytest.mark.parametrize(("status", "said"), [
    (404, "has no /start_profile (HTTP 404): not an SGLang with the profiler's HTTP API"),
    (500, "refused /start_profile (HTTP 500); its log says: RuntimeError: Profiling is "
          "already in progress. Call /stop_profile first."),
    (401, "takes the engine's --admin-api-key when it has one, else its --api-key"),
])
def test_an_engine_that_refuses_the_capture_is_named_and_the_hold_released(
        tmp_path: Path, status: int, said: str) -> None:
    engines = Engines(tmp_path / "run")
    engines.start_status = status
    run = run_of(tmp_path, engines)
    run.prepare()
    with pytest.raises(ProfileError) as err:
        run.execute(None)
    assert said in str(err.value) and err.value.exit_code == 1
    assert holds(tmp_path) == []


def test_a_runtime_that_does_not_answer_the_hold_is_never_asked_for_a_capture(
        tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    engines.ack = False
    run = run_of(tmp_path, engines)
    run.prepare()
    with pytest.raises(CannotProfile, match="did not take the profile hold .* predates pdsvc "
                                            "profile") as err:
        run.execute(None)
    assert err.value.exit_code == 3
    assert engines.asked("/start_profile") == [] and holds(tmp_path) == []


def test_a_router_that_keeps_health_checking_stops_the_run_before_the_capture(
        tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    engines.paused = "router http://127.0.0.1:8000 did not answer: timed out"
    run = run_of(tmp_path, engines)
    run.prepare()
    with pytest.raises(CannotProfile, match="did not pause its health checks .* fail requests"):
        run.execute(None)
    assert engines.asked("/start_profile") == [] and holds(tmp_path) == []


def test_a_trace_that_never_completes_ends_the_run_after_the_bound(tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    engines.truncate = True
    run = run_of(tmp_path, engines, write_timeout=20)
    run.prepare()
    with pytest.raises(ProfileError, match=r"0 of 4 rank traces whole after 20 s \(TP-0: "
                                           r"truncated"):
        run.execute(None)
    assert holds(tmp_path) == []
    assert engines.asked("/stop_profile") == [{}]  # told to stop: none is left profiling


def test_a_capture_of_the_cpu_only_has_no_breakdown_and_says_why(tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    run = run_of(tmp_path, engines, activities=("CPU",))
    run.prepare()
    with pytest.raises(TraceError, match="no kernel events"):
        run.execute(None)


def test_an_interrupt_mid_write_stops_the_capture_and_keeps_the_hold_until_written(
        tmp_path: Path) -> None:
    engines, lines = Engines(tmp_path / "run", write_secs=30), []
    engines.interrupt_at = engines.t + 12  # while the engine writes
    run = run_of(tmp_path, engines, lines)
    run.prepare()
    seen_hold: list[list[str]] = []
    original = engines.clear_hold

    def clear(path: str) -> None:
        seen_hold.append(sorted(p.name for p in (tmp_path / "profiles" / RUN /
                                                 "dsv4-decode").glob("*.gz")))
        original(path)

    engines.clear_hold = clear  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.execute(None)
    assert engines.asked("/stop_profile") == [{}]  # told to stop (it had: 500, harmless)
    assert len(seen_hold[0]) == 4  # the hold was released only once the ranks were written
    assert holds(tmp_path) == []
    [said] = [x for x in lines if "ending the capture on dsv4-decode" in x]
    assert said.endswith("(Ctrl-C: release it now; the engine may then be judged hung)")


def test_under_tune_the_wind_down_offers_no_second_interrupt(tmp_path: Path) -> None:
    """pdsvc tune turns a second signal into "wait" (cli/tune.py): the line must not offer
    Ctrl-C as a way to release the hold."""
    engines, lines = Engines(tmp_path / "run", write_secs=30), []
    engines.interrupt_at = engines.t + 12
    run = run_of(tmp_path, engines, lines)
    run.second_interrupt = ""
    run.prepare()
    with pytest.raises(KeyboardInterrupt):
        run.execute(None)
    [said] = [x for x in lines if "ending the capture on dsv4-decode" in x]
    assert said.endswith("before the hold is released") and "Ctrl-C" not in said


def test_a_second_interrupt_releases_the_hold_at_once(tmp_path: Path) -> None:
    engines, lines = Engines(tmp_path / "run", write_secs=60), []
    run = run_of(tmp_path, engines, lines)
    run.prepare()
    sleeps = {"n": 0}
    original = engines.sleep

    def sleep(secs: float) -> None:
        original(secs)
        if engines.asked("/start_profile"):
            sleeps["n"] += 1
            if sleeps["n"] in (3, 6):  # once while waiting, once while winding down
                raise KeyboardInterrupt

    engines.sleep = sleep  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.execute(None)
    assert holds(tmp_path) == [] and any("releasing the hold now" in x for x in lines)
    assert not list((tmp_path / "profiles" / RUN / "dsv4-decode").glob("*.gz"))  # not yet


def test_an_engine_held_by_apply_is_not_profiled(tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    run = run_of(tmp_path, engines)
    write_hold(str(tmp_path / "run" / "dsv4-decode.hold.json"), out=True, why="step 1/2")
    with pytest.raises(CannotProfile, match=r"dsv4-decode is held by pdsvc apply \(step 1/2\)"):
        run.prepare()


def test_an_unknown_engine_or_a_role_without_engines_is_a_usage_error(tmp_path: Path) -> None:
    engines = Engines(tmp_path / "run")
    with pytest.raises(ConfigError, match="--engine dsv4-decode-9: not a decode engine .*"
                                          "its engines: dsv4-prefill, dsv4-decode"):
        run_of(tmp_path, engines, engine="dsv4-decode-9").prepare()
    shutil.rmtree(tmp_path / "run")


def test_on_several_hosts_each_other_host_is_named_with_the_command_to_run_there() -> None:
    whole = load_plan(REPO / "etc/examples/three-hosts.yaml", None,
                      REPO / "etc/seed-host.topology.json", scheduled=True)
    gpu_a, gpu_b = whole.for_host("gpu-a"), whole.for_host("gpu-b")
    local, lines = select(whole, gpu_a, "decode", None)  # run on the prefill's host
    assert local == [] and lines == [
        "dsv4-decode run on host gpu-b (10.0.0.3): there, run "
        "`sudo pdsvc profile --role decode --host gpu-b`"]
    local, lines = select(whole, gpu_b, "decode", None)
    assert [e.name for e in local] == ["dsv4-decode"] and lines == []
    assert local[0].url == "http://10.0.0.3:30001"  # asked where the router reaches it


def test_a_run_with_no_engine_of_the_role_here_is_a_usage_error_naming_where(
        tmp_path: Path) -> None:
    whole = load_plan(REPO / "etc/examples/three-hosts.yaml", None,
                      REPO / "etc/seed-host.topology.json", scheduled=True)
    run = Run(whole, whole.for_host("lb"), ProfileOptions(), Engines(tmp_path), print,
              str(tmp_path), lambda u: [], run=RUN, profiles=tmp_path)
    with pytest.raises(ConfigError, match=r"no engine to profile on this host \(dsv4-decode "
                                          r"run on host gpu-b"):
        run.prepare()


def test_the_engine_key_is_its_admin_key_else_its_api_key() -> None:
    (decode,) = [e for e in PLAN.engines if e.role == "decode"]
    assert engine_of(decode).key is None
    both = dataclasses.replace(decode, extra_args=("--api-key", "u", "--admin-api-key=a"))
    assert engine_of(both).key == "a"
    assert engine_of(dataclasses.replace(decode, extra_args=("--api-key", "u"))).key == "u"


def test_apply_refuses_to_replace_the_hold_of_an_engine_being_profiled(tmp_path: Path) -> None:
    units = {k: v.replace("--state-dir /run/dsv4", f"--state-dir {tmp_path}")
             for k, v in bundle(tmp_path, ONE_ONE % "").items()}
    _refuse_profiled([units])  # no hold: nothing to refuse
    write_hold(str(tmp_path / "dsv4-decode.hold.json"), out=True, why="apply's own")
    _refuse_profiled([units])  # apply's own hold: its business
    write_hold(str(tmp_path / "dsv4-decode.hold.json"), out=False, peers=[],
               by="pdsvc profile", profile="r7")
    with pytest.raises(OutputError, match=r"dsv4-decode is held by pdsvc profile \(run r7, "
                                          r"at most until .*wait for pdsvc profile to end"):
        _refuse_profiled([units])


def test_not_root_is_refused_in_one_line_with_the_command_to_run(monkeypatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cli.sys, "argv", ["pdsvc", "profile", "--steps", "5"])
    result = CliRunner().invoke(cli.profile, ["-c", str(REPO / "etc/pdsvc.yaml"), "--topology",
                                              str(REPO / "etc/seed-host.topology.json"),
                                              "--steps", "5"])
    assert result.exit_code == 3
    assert result.stderr.strip() == (
        "pdsvc: error: pdsvc profile writes holds into /run/dsv4 and reads the traces under "
        "/var/lib/dsv4/profiles: run it as root; sudo pdsvc profile --steps 5")
