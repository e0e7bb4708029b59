"""The lifecycle guarantees of the supervisord bundle, proven with the REAL supervisord (the
serve venv's `supervisor`), the real sglang-router 0.3.2 and the stand-in engines
(tests/support/fake_sglang.py), driven as a user would: supervisorctl, kill, HTTP.

The stack runs on this machine (no container): every port is a free one on 127.0.0.1, every
process carries a marker in its environment so that only this stack's processes are counted
(other tests may run SGLang stand-ins at the same time), and the fixture shuts supervisord
down and SIGKILLs whatever is left. The tests of the shared stack run in file order and each
leaves it serving again.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import xmlrpc.client
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_ports
from stack import e2e_config, host_topology
from timing import within

from pdsvc.cli.kit import read_config_text
from pdsvc.config.load import parse_config
from pdsvc.plan.build import Plan, build_plan
from pdsvc.render.bundle import write_bundle
from pdsvc.render.supervisord import keygen_command, program_names, render_supervisord
from pdsvc.ship.runtime.endings import Exit
from pdsvc.ship.runtime.listener import supervisor_rpc
from pdsvc.ship.runtime.proctree import process_table
from pdsvc.topology import load_topology_file

pytestmark = pytest.mark.e2e

NAME = "sve2e"
MARKER = "PDSVC_SV_E2E"  # env var carried by every process of one stack (value: its id)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def dist_init_bases(taken: list[int], count: int = 2) -> tuple[int, ...]:
    """`count` dist-init bases 100 apart whose 100-port spans hold none of `taken` (the
    stand-in binds none of them; the config check only wants them clear of the other ports)."""
    span = 100 * count
    for base in range(20000, 60000, span):
        if not any(base <= p < base + span for p in taken):
            return tuple(base + 100 * i for i in range(count))
    raise AssertionError("no free dist-init span")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class SupervisordStack:
    """One rendered bundle under a real supervisord, and what a user does with it."""

    def __init__(self, work: Path, venv: Path, logs: str = "files", engines: int = 1,
                 **overrides: Any) -> None:
        """`engines` of each role: 1 (the scalar form: names by role) or more (the list
        form, one GPU each: names prefill-0, decode-1, …)."""
        self.work = work
        self.venv = venv
        self.id = uuid.uuid4().hex[:12]
        self.run_dir = Path(tempfile.mkdtemp(prefix="pdsvc-sv-"))  # short: a socket path
        prefill, decode, bootstrap, router, prom, *more = free_ports(5 + 3 * (engines - 1))
        self.router_port = router
        ports = [prefill, decode, bootstrap, router, prom, *more]
        di_p, di_d, *di_more = dist_init_bases(ports, 2 * engines)
        if engines > 1:
            p_ports, d_ports, b_ports = [prefill, *more[0::3]], [decode, *more[1::3]], \
                [bootstrap, *more[2::3]]
            overrides = {
                "prefill": [{"gpus": [i], "port": p_ports[i], "bootstrap_port": b_ports[i],
                             "dist_init_port": ([di_p, *di_more[0::2]])[i]}
                            for i in range(engines)],
                "decode": [{"gpus": [engines + i], "port": d_ports[i],
                            "dist_init_port": ([di_d, *di_more[1::2]])[i]}
                           for i in range(engines)],
                **overrides}
        numactl = shutil.which("numactl")
        model = work / "model"
        model.mkdir(parents=True, exist_ok=True)
        user = pwd.getpwuid(os.getuid()).pw_name
        cfg = e2e_config(NAME, venv, str(model), **{
            "runtime.user": user,
            "runtime.group": grp.getgrgid(os.getgid()).gr_name,
            "runtime.jit_cache": str(work / "jit"),
            "runtime.pinning": "numa" if numactl else "off",
            f"runtime.env.{MARKER}": self.id,
            "runtime.env.FAKE_SGLANG_SPAWN_ORPHAN": 1,
            **({"prefill.port": prefill, "prefill.bootstrap_port": bootstrap,
                "prefill.dist_init_port": di_p,
                "decode.port": decode, "decode.dist_init_port": di_d} if engines == 1 else {}),
            "router.host": "127.0.0.1", "router.port": router, "router.prometheus_port": prom,
            f"router.env.{MARKER}": self.id,
            "supervisord": {"numactl": numactl, "logs": logs,
                            "log_dir": str(work / "logs"), "run_dir": str(self.run_dir)},
            "router.control_plane_key": str(work / "router.key"),
            **overrides,
        })
        (work / "logs").mkdir(exist_ok=True)
        (work / "config.yaml").write_text(yaml.safe_dump(cfg))
        (work / "topology.json").write_text(json.dumps(host_topology(max(2, 2 * engines))))
        config = parse_config(read_config_text(work / "config.yaml"), str(work / "config.yaml"))
        self.plan: Plan = build_plan(
            config, load_topology_file(work / "topology.json"),
            config_source=str(work / "config.yaml"),
            config_text=(work / "config.yaml").read_text(),
        )
        self.bundle = work / "units-supervisord"
        write_bundle(render_supervisord(self.plan, "test"), self.bundle)
        # the key, made by the line the bundle's header gives (install.sh does it for systemd)
        subprocess.run(["sh", "-c", keygen_command(self.plan)], check=True, timeout=10)
        assert len((work / "router.key").read_text()) == 64
        self.conf = self.bundle / "supervisord.conf"
        by_unit = program_names(self.plan)
        # by role (prefill) in the scalar form, by engine (prefill-0) in the list form
        self.names = {e.name.removeprefix(f"{NAME}-"): by_unit[e.unit] for e in self.plan.engines}
        self.names["router"] = by_unit[self.plan.router.unit]
        self.proc: subprocess.Popen | None = None
        self.rpc = supervisor_rpc(
            f"unix://{self.run_dir}/{NAME}-supervisord.sock", timeout=30)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with open(self.work / "supervisord.out", "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.venv / "bin" / "supervisord"), "-c", str(self.conf)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: self._rpc_up(), 30, "supervisord's control socket")

    def _rpc_up(self) -> bool:
        try:
            return self.rpc.supervisor.getState()["statename"] == "RUNNING"
        except (OSError, xmlrpc.client.Error):
            return False

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "supervisorctl"), "-c", str(self.conf), *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def down(self) -> None:
        """Shut supervisord down, then SIGKILL anything of this stack still alive."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.ctl("shutdown", timeout=90)
                try:
                    self.proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
        finally:
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ------------------------------------------------------------------ looking
    def processes(self) -> dict[int, str]:
        """{pid: command line} of every live process that carries this stack's marker."""
        found = {}
        needle = f"{MARKER}={self.id}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                if needle not in environ.split(b"\0"):
                    continue
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state == "Z":
                    continue
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                found[int(entry)] = cmd.decode(errors="replace").strip()
            except (OSError, IndexError):
                continue
        return found

    def orphans(self) -> list[int]:
        return [pid for pid, cmd in self.processes().items() if "fake-sglang-orphan" in cmd]

    def info(self, role: str) -> dict:
        return self.rpc.supervisor.getProcessInfo(self.names[role])

    def runtime_pid(self, role: str) -> int:
        return int(self.info(role)["pid"])

    def engine_pid(self, role: str) -> int:
        """The engine (or router) process: the runtime program's child."""
        parent = self.runtime_pid(role)
        kids = [pid for pid, (ppid, state, name) in process_table().items()
                if ppid == parent and state != "Z" and "orphan" not in self.cmdline(pid)]
        assert kids, f"{role}: runtime {parent} has no child"
        return kids[0]

    @staticmethod
    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""

    def log(self, role: str) -> str:
        name = self.names[role]
        path = self.work / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def listener_log(self) -> str:
        path = self.work / "logs" / f"{NAME}-events.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def generate(self, timeout: float = 10) -> tuple[int, str]:
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.router_port}/generate", data=body,
            headers={"Content-Type": "application/json"}, method="POST")
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError as e:
            return 0, str(e)

    def serves(self) -> bool:
        code, body = self.generate(timeout=5)
        return code == 200 and "hello from fake engine" in body

    def wait_serving(self, timeout: float = 120, what: str = "the stack serves") -> float:
        t0 = time.monotonic()
        try:
            wait_for(self.serves, timeout, what, interval=0.5)
        except AssertionError as e:
            status = self.ctl("status", timeout=30).stdout
            raise AssertionError(f"{e}\n{status}\nlast generate: {self.generate(5)}\n"
                                 f"router log tail: {self.log('router')[-2000:]}") from None
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[SupervisordStack]:
    s = SupervisordStack(tmp_path_factory.mktemp("sv-e2e"), serve_python.parent.parent,
                         **{"router.package": router_package})
    try:
        s.start()
        s.start_seconds = s.wait_serving(180, "the stack serves after `supervisord -c`")
        yield s
    finally:
        s.down()


def test_start_serves_through_the_router_once_both_engines_are_healthy(
        stack: SupervisordStack) -> None:
    code, body = stack.generate()
    assert code == 200 and "[decode@" in body and "hello from fake engine" in body, body
    assert f'"bootstrap_port_seen": {stack.plan.engines[0].bootstrap_port}' in body
    # the router started at once, with no workers; each engine registered itself once healthy
    for role in ("prefill", "decode"):
        wait_for(lambda role=role: f"{NAME}-{role}: registered {role} http://127.0.0.1:"
                 in stack.log(role), 60, f"{role} registered with the router")
    # and the router's own gate (one good completion through router -> prefill + decode)
    wait_for(lambda: f"{NAME}-router: healthy after" in stack.log("router"), 60,
             "the router's readiness gate")
    for role in ("prefill", "decode"):
        assert f"{NAME}-{role}: healthy after" in stack.log(role)
        assert stack.info(role)["statename"] == "RUNNING"
    # pinned as the plan says (numactl, when this machine has it)
    if shutil.which("numactl"):
        cpus = stack.plan.engines[0].pinning.cpulist
        assert f"--physcpubind={cpus}" in stack.cmdline(stack.runtime_pid("prefill")) or \
            Path(f"/proc/{stack.engine_pid('prefill')}/status").read_text().count(
                f"Cpus_allowed_list:\t{cpus}") == 1


def test_cold_jit_cache_is_never_compiled_into_twice_at_once(stack: SupervisordStack) -> None:
    """Both engines started at once on a cold cache: exactly one waited for the other's
    compile; the stand-in would have crashed loudly (DeepGEMM #301) on a concurrent one."""
    logs = {r: stack.log(r) for r in ("prefill", "decode")}
    waited = [r for r, other in (("prefill", "decode"), ("decode", "prefill"))
              if f"waiting for {NAME}-{other}" in logs[r]]
    # the mechanism is the stand-in's own detector: a concurrent cold compile crashes it
    # loudly ("JIT cache race"). One engine waits for the other's lock when their starts
    # overlap; a busy machine can space the starts further apart than a compile, and then
    # neither needs to wait: both waiting would be a dead-lock
    assert len(waited) <= 1, logs
    print(f"\nwaited for the other's compile: {waited or 'neither (the starts did not overlap)'}")
    assert "JIT cache race" not in logs["prefill"] + logs["decode"]
    for role in ("prefill", "decode"):
        assert logs[role].count("started engine pid") == 1, logs[role]  # never restarted
        assert "jit cache cold: compiled" in logs[role]


def test_engine_kill_9_is_restarted_and_the_router_serves_again(stack: SupervisordStack) -> None:
    before = stack.runtime_pid("decode")
    router_before = stack.runtime_pid("router")
    os.kill(stack.engine_pid("decode"), signal.SIGKILL)
    wait_for(lambda: stack.info("decode")["pid"] not in (0, before), 60,
             "supervisord restarts decode")
    stack.wait_serving(90, "serving again after decode's kill -9")
    assert stack.runtime_pid("router") == router_before  # nothing else restarted
    assert "killed 1 process(es) the engine left behind" in stack.log("decode")
    assert len(stack.orphans()) == 2, stack.processes()  # the dead engine's orphan is gone


def test_a_runtime_killed_takes_its_engine_out_of_the_router_at_once(
        stack: SupervisordStack) -> None:
    """kill -9 of the decode's runtime (the program's own process): the event listener sees
    PROCESS_STATE_EXITED and deletes the decode from the router (the units' ExecStopPost=),
    seconds before the router's health checks would; supervisord restarts it and it joins.
    What the dead runtime's engine left in a session of its own (the stand-in's orphan) is
    nobody's to reap under supervisord (systemd's cgroup kills it): the test reaps it."""
    # RUNNING (past startsecs), as a real engine is long before it serves; one killed within
    # its startsecs is BACKOFF to supervisord, which the listener takes as well (unit test)
    wait_for(lambda: stack.info("decode")["statename"] == "RUNNING", 30, "decode RUNNING")
    before, engine = stack.runtime_pid("decode"), stack.engine_pid("decode")
    table = process_table()
    left = [pid for pid in stack.orphans() if table[pid][0] in (engine, before)]
    url = stack.plan.engines[1].url
    said = stack.listener_log().count(f"taking {url} out of the router")
    os.kill(before, signal.SIGKILL)
    try:
        wait_for(lambda: stack.listener_log().count(f"taking {url} out of the router") > said,
                 30, "the listener takes the dead runtime's decode out of the router")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{stack.listener_log()[-3000:]}") from None
    assert "exited unexpectedly" in stack.listener_log()
    wait_for(lambda: stack.info("decode")["pid"] not in (0, before), 60,
             "supervisord restarts decode")
    stack.wait_serving(90, "serving again after the decode's runtime was killed")
    wait_for(lambda: stack.info("decode")["statename"] == "RUNNING", 30, "decode RUNNING")
    for pid in left:  # the dead engine's orphan (the stand-in's), if it is still there
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(stack.orphans()) == 2, 10, "the dead engine's orphan reaped")


def test_hung_engine_is_killed_and_restarted_within_the_watchdog_bound(
        stack: SupervisordStack) -> None:
    bound = stack.plan.watchdog_secs
    lc = stack.plan.lifecycle
    assert bound == lc.liveness_interval_secs * lc.liveness_failures + \
        lc.liveness_timeout_secs
    before = stack.runtime_pid("decode")
    engine = stack.engine_pid("decode")
    t0 = time.monotonic()
    os.kill(engine, signal.SIGSTOP)
    try:
        wait_for(lambda: stack.info("decode")["pid"] not in (0, before), bound + 30,
                 "decode restarted after the hang", interval=0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGCONT)
    detected = time.monotonic() - t0
    # idle: watchdog_secs after the last good probe (≤ one interval before the STOP), plus
    # the SIGKILL, the runtime's exit and supervisord's respawn; the log lines are the verdict
    print(f"\nhung decode killed and respawned after {detected:.1f} s (watchdog {bound} s)")
    within(detected, bound + lc.liveness_interval_secs + 1, "the hung decode is respawned")
    log = stack.log("decode")
    assert f"(--watchdog-secs {bound}): the engine is hung" in log, log[-3000:]
    assert "exiting 124 so that the process manager restarts the engine" in log
    assert not Path(f"/proc/{engine}").exists()
    stack.wait_serving(90, "serving again after the hang")


@pytest.mark.parametrize("how", ["kill -9", "supervisorctl restart"])
def test_prefill_restart_restarts_decode_and_the_pair_serves(stack: SupervisordStack,
                                                             how: str) -> None:
    prefill_before, decode_before = stack.runtime_pid("prefill"), stack.runtime_pid("decode")
    time.sleep(1.1)  # supervisord's start times are whole seconds
    if how == "kill -9":
        os.kill(stack.engine_pid("prefill"), signal.SIGKILL)
    else:
        result = stack.ctl("restart", stack.names["prefill"])
        assert result.returncode == 0, result.stdout + result.stderr
    wait_for(lambda: stack.info("prefill")["pid"] not in (0, prefill_before), 60,
             "prefill restarted")
    wait_for(lambda: stack.info("decode")["pid"] not in (0, decode_before), 60,
             "decode restarted with prefill (the event listener)")
    assert f"restarting {stack.names['decode']}" in stack.listener_log()
    stack.wait_serving(120, f"the pair serves after prefill's {how}")


def test_stop_leaves_no_process_not_even_an_escaped_child(stack: SupervisordStack) -> None:
    # the stand-ins each spawned a SIGTERM-ignoring child in a session of its own, which
    # supervisord's stopasgroup/killasgroup cannot reach (Supervisor #1101/#1396)
    orphans = stack.orphans()
    assert len(orphans) == 2, stack.processes()
    for pid in orphans:
        assert os.getsid(pid) == pid  # its own session: out of every process group
    stop = stack.plan.lifecycle.stop_timeout_secs
    t0 = time.monotonic()
    result = stack.ctl("stop", "all", timeout=stop + 60)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_for(lambda: stack.processes() == {}, stop + 10, "no process of the stack left")
    assert time.monotonic() - t0 <= stop + 10
    status = stack.ctl("status").stdout
    assert "RUNNING" not in status and "FATAL" not in status, status
    for role in ("prefill", "decode"):
        assert "treating it as a clean stop" in stack.log(role)
        assert "killed 1 process(es) the engine left behind" in stack.log(role)


def test_start_all_brings_the_whole_deployment_back(stack: SupervisordStack) -> None:
    """The header's one command for all of it: each program is a group of its own, and this
    supervisord runs this deployment only, so `start all` is the deployment (after the `stop
    all` above); `supervisorctl status` lists each program by its own name."""
    result = stack.ctl("start", "all", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    stack.wait_serving(180, "serving again after `supervisorctl start all`")
    status = stack.ctl("status").stdout
    for name in (*stack.names.values(), f"{NAME}-events"):
        assert re.search(rf"^{re.escape(name)}\s+RUNNING", status, re.M), status


def gave_up(info: dict) -> bool:
    """supervisord will not start the program again: it exited with the runtime's give-up
    status (in the bundle's exitcodes=), or supervisord itself gave up."""
    return info["statename"] == "FATAL" or (
        info["statename"] == "EXITED" and info["exitstatus"] == Exit.GAVE_UP)


def test_broken_engine_stops_retrying_and_shows_its_own_error(serve_python: Path,
                                                              tmp_path: Path) -> None:
    """logs: stdout, as in a container: every program on supervisord's stdout, each line
    prefixed with its program's name."""
    s = SupervisordStack(tmp_path, serve_python.parent.parent, logs="stdout",
                         **{"model.path": str(tmp_path / "no-such-model")})
    try:
        s.start()
        # the runtime gives up after lifecycle.start_attempts starts and exits 78, which the
        # bundle's exitcodes= list as expected: EXITED, not restarted (systemd: Restart-
        # PreventExitStatus=)
        # (EXITED with another status is the moment between a failed start and supervisord's
        # restart: a loaded machine lets the poll see it)
        wait_for(lambda: gave_up(s.info("prefill")), 120,
                 "prefill gives up after start_attempts starts")
        out = (tmp_path / "supervisord.out").read_text(errors="replace")
        prefill = [line for line in out.splitlines() if line.startswith(f"{NAME}-prefill: ")]
        assert sum("started engine pid" in line for line in prefill) == 3, out
        error = f"Incorrect path_or_model_id: '{tmp_path / 'no-such-model'}'"
        assert any(error in line for line in prefill), out  # the engine's own line, prefixed
        assert any("gave up after 3 starts in a row that never became healthy" in line
                   for line in prefill), out
        time.sleep(3)
        assert sum("started engine pid" in line for line in (
            tmp_path / "supervisord.out").read_text(errors="replace").splitlines()
            if line.startswith(f"{NAME}-prefill: ")) == 3  # and it stays down
        assert s.info("router")["statename"] in ("STARTING", "RUNNING")  # waits for a pair
    finally:
        s.down()
