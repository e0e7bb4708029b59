"""The supervisord bundles of a three-host config, each under the REAL supervisord in a network
namespace of a NetLab (and a private tmpfs for its socket and JIT cache, as separate machines
would have), with the real sglang-router 0.3.2 and the stand-in engines.

No containers: supervisord runs as root here (supervisord.drop_privileges: false). Every
process carries a marker in its environment; teardown SIGTERMs each supervisord, then SIGKILLs
whatever of this test is left, then removes the namespaces.

The control-plane key follows docs/hosts.md ("Several hosts", supervisord): lb runs its header's
line that makes the key, in lb's own tmpfs; the lab carries it to each engine host as scp
would; each engine host runs the rest of its header's copy line (install -D -m 0640 …).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require
from netlab import NetLab, netlab_available
from stack import e2e_config, host_topology

from pdsvc.cli.kit import load_plan
from pdsvc.render.kit import key_fetch_command
from pdsvc.render.supervisord import key_copy_command, keygen_command

pytestmark = pytest.mark.e2e

MARKER = "PDSVC_SVMH_E2E"


def marked(stack_id: str) -> dict[int, str]:
    """{pid: command line} of every live process carrying this test's marker."""
    found = {}
    needle = f"{MARKER}={stack_id}".encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                found[int(entry)] = cmd.decode(errors="replace")
    return found


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
    return value


def key_steps(config: Path, topology: Path, host: str, header: str, carried: Path) -> str:
    """The key lines HOST's supervisord.conf header gives, as docs/hosts.md says to run them: the
    router's host makes the key (and the lab carries it off), an engine host waits for it to
    arrive and runs its copy line with the lab's carrier in place of scp."""
    plan = load_plan(config, None, topology).for_host(host)
    if plan.key_use == "make":
        make = keygen_command(plan)
        assert f";     {make}\n" in header
        return (f"{{ {make}; }} && cp {plan.paths.router_key} {carried}.tmp && "
                f"mv {carried}.tmp {carried}")
    copy = key_copy_command(plan)
    assert f";     {copy}\n" in header and "/dev/urandom" not in header
    fetch = key_fetch_command(plan)
    assert copy.startswith(f"{fetch} && ")
    return (f"while [ ! -s {carried} ]; do sleep 0.1; done && cp {carried} router.key && "
            f"{copy[len(fetch) + 4:]}")


def test_three_hosts_under_supervisord_serve_and_recouple(serve_python: Path,
                                                          tmp_path: Path) -> None:
    require(netlab_available())
    venv = serve_python.parent.parent
    stack_id = uuid.uuid4().hex[:12]
    base = Path(tempfile.mkdtemp(prefix="pdsvc-svmh-"))  # each host mounts its own tmpfs here
    procs: dict[str, subprocess.Popen] = {}
    with NetLab(["lb", "gpu-a", "gpu-b"]) as lab:
        try:
            model = tmp_path / "model"
            model.mkdir()
            run = {"lb": ["router"], "gpu-a": ["prefill"], "gpu-b": ["decode"]}
            cfg = e2e_config("svmh", venv, str(model), **{
                "hosts": {h: {"address": lab.address(h), "run": r} for h, r in run.items()},
                "runtime.jit_cache": f"{base}/jit",
                "runtime.pinning": "off",
                "runtime.group": "root",  # the key's group: this machine has no sglang
                f"runtime.env.{MARKER}": stack_id,
                # SGLang's order: its port is closed while it loads (supervisord restarts at once)
                "runtime.env.FAKE_SGLANG_HTTP_AFTER_LOAD": 1,
                f"router.env.{MARKER}": stack_id,
                # in each host's own tmpfs, as on separate machines: made on lb, copied to
                # the engine hosts
                "router.control_plane_key": f"{base}/etc/router.key",
                "supervisord": {"numactl": None, "logs": "stdout", "run_dir": f"{base}/run",
                                "drop_privileges": False},
            })
            (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
            (tmp_path / "t.json").write_text(json.dumps(host_topology()))
            render = subprocess.run(
                [sys.executable, "-m", "pdsvc.cli", "render", "-c", str(tmp_path / "c.yaml"),
                 "--topology", str(tmp_path / "t.json"), "--format", "supervisord",
                 "-o", str(tmp_path / "sv")], capture_output=True, text=True, cwd=REPO,
                timeout=60)
            assert render.returncode == 0, render.stderr
            carried = tmp_path / "carried.key"  # lb's key on its way, as scp carries it
            for host in run:
                conf = tmp_path / "sv" / host / "supervisord.conf"
                key_lines = key_steps(tmp_path / "c.yaml", tmp_path / "t.json", host,
                                      conf.read_text(), carried)
                script = (f"mount -t tmpfs tmpfs {base} && mkdir -p {base}/run {base}/jit && "
                          f"cd {base} && {key_lines} && "
                          f"exec {venv}/bin/supervisord -c {conf}")
                with open(tmp_path / f"{host}.out", "wb") as out:
                    procs[host] = subprocess.Popen(
                        lab.exec_argv(host, "unshare", "-m", "sh", "-c", script),
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        env={**os.environ, MARKER: stack_id}, start_new_session=True)

            def out(host: str) -> str:
                return (tmp_path / f"{host}.out").read_text(errors="replace")

            def generate() -> dict | None:
                r = subprocess.run(lab.exec_argv(
                    "lb", "curl", "-sS", "-m", "5", "-H", "content-type: application/json",
                    "-d", '{"text": "hi", "sampling_params": {"max_new_tokens": 2}}',
                    "http://127.0.0.1:8000/generate"), capture_output=True, text=True,
                    timeout=15)
                if "hello from fake engine" not in r.stdout:
                    return None
                return json.loads(r.stdout)["meta_info"]

            meta = wait_for(generate, 90, "the router on lb to serve across the hosts")
            assert meta["bootstrap_host_seen"] == lab.address("gpu-a"), meta
            wait_for(lambda: "svmh-router: healthy after" in out("lb"), 30,
                     "the router's own gate (one generation) to pass")
            wait_for(lambda: "is up: a restart of it will restart this engine" in out("gpu-b"),
                     30, "the decode's supervisor to see gpu-a's prefill up")
            # kill -9 the prefill engine on gpu-a: supervisord restarts it there; the decode's
            # runtime on gpu-b sees its port refused, and restarts the decode with it
            (engine,) = [pid for pid, cmd in marked(stack_id).items()
                         if "fake_sglang" in cmd and "--disaggregation-mode prefill" in cmd
                         and "/runtime " not in cmd]
            os.kill(engine, signal.SIGKILL)
            wait_for(lambda: "probes in a row and its port was closed" in out("gpu-b"), 60,
                     "the decode on gpu-b to see gpu-a's prefill restart")
            assert "exiting 75 so that the process manager restarts it" in out("gpu-b")
            meta = wait_for(generate, 60, "serving again after the restart")
            assert meta["bootstrap_host_seen"] == lab.address("gpu-a")
        finally:
            for p in procs.values():
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
            for pid in marked(stack_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                base.rmdir()
    assert not marked(stack_id)
