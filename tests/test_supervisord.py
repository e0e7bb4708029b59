"""The supervisord bundle (pdsvc/render/supervisord.py) and what the runtime does in it.

Rendered configs are read back with supervisor's OWN config reader (the serve venv's
`supervisor` package), so escaping is checked against the parser that will run it: every
command word and environment value must come back exactly as the plan has it. What the
bundle says for a given config (options, pinning, logs, the restart listener) is in
tests/cases/supervisord-*.yaml (tests/test_cases.py).
The runtime's options for managers without systemd (--watchdog-secs, --kill-tree,
--stop-timeout, --wait-for) are tested in-process and as processes (the eventlistener mode:
tests/test_runtime_listener.py),
with the stand-ins of tests/test_runtime_*.py; the whole stack under the real supervisord is
tests/test_e2e_supervisord.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from ports import free_port
from runtime_procs import (
    RUNTIME,
    FakeClock,
    child_pid,
    engine_args,
    wait_for,
)
from timing import within

from pdsvc.config.load import parse_config
from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan, build_plan
from pdsvc.plan.runtime_argv import router_command
from pdsvc.render.bundle import write_bundle
from pdsvc.render.kit import MARKER, runtime_modules
from pdsvc.render.supervisord import (
    STARTSECS,
    program_names,
    render_supervisord,
    sv_env,
    sv_word,
)
from pdsvc.ship.runtime.endings import Exit
from pdsvc.ship.runtime.phases import wait_for_urls
from pdsvc.ship.runtime.probe import ProbeResult
from pdsvc.ship.runtime.timings import CHILD_WAIT_SLICE_S
from pdsvc.topology import load_topology_file

SEED = load_topology_file(REPO / "etc/seed-host.topology.json")
DEFAULT_CONFIG = (REPO / "etc/pdsvc.yaml").read_text()

# Reads a supervisord.conf with supervisor's own reader and prints what it would run as JSON.
PARSE = textwrap.dedent('''
    import json, shlex, sys
    import supervisor.options as so
    so.name_to_uid = lambda name: "uid:" + name  # the service user need not exist here
    opts = so.ServerOptions()
    opts.configfile = sys.argv[1]
    opts.process_config(do_usage=False)
    out = {"groups": {}}
    for g in opts.process_group_configs:
        group = out["groups"][g.name] = {"programs": {}}
        for pc in g.process_configs:
            group["programs"][pc.name] = {
                "argv": shlex.split(pc.command), "environment": pc.environment,
                "startsecs": pc.startsecs}
    print(json.dumps(out, default=str))
''')


def programs_of(out: dict) -> dict[str, dict]:
    """The programs supervisord would run, each of which must be alone in a group named as it
    (so that `supervisorctl update NAME` re-reads one program: docs/apply.md)."""
    groups = out["groups"]
    assert all(list(g["programs"]) == [name] for name, g in groups.items()), groups
    return {name: g["programs"][name] for name, g in groups.items()}


def plan_of(text: str, topology=SEED) -> Plan:
    config = parse_config(text, "test.yaml")
    return build_plan(config, topology, config_source="test.yaml", config_text=text)


def with_(base: str = DEFAULT_CONFIG, **sections: Any) -> str:
    """The config text with some keys set (dotted, e.g. {'runtime.pinning': 'off'})."""
    data = yaml.safe_load(base)
    for dotted, value in sections.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return yaml.safe_dump(data)


def conf_of(text: str, topology=SEED) -> str:
    plan = plan_of(text, topology)
    return render_supervisord(plan, "pdsvc render --format supervisord")[0].content


def parsed(serve_python: Path, tmp_path: Path, text: str, topology=SEED) -> tuple[Plan, dict]:
    """Render, write the bundle, and read its config back with supervisor's own reader."""
    plan = plan_of(text, topology)
    bundle = tmp_path / "bundle"
    write_bundle(render_supervisord(plan, "test"), bundle)
    out = subprocess.run([str(serve_python), "-c", PARSE, str(bundle / "supervisord.conf")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return plan, json.loads(out.stdout)


def after_dashes(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1:]


# --------------------------------------------------------------------------- escaping


@pytest.mark.parametrize(("word", "written"), [
    ("/bin/x", "/bin/x"),
    ("100%", "100%%"),
    ("a b", "'a b'"),
    ("a ;b", "'a '';b'"),  # no ';' after a space: configparser would cut a comment there
    ("x #y", "'x ''#y'"),
    ("it's", "'it'\"'\"'s'"),
    ("", "''"),
    ("%(there)s", "'%%(there)s'"),
])
def test_command_words(word: str, written: str) -> None:
    assert sv_word(word) == written


def test_env_values_are_quoted_and_refused_when_supervisord_cannot_hold_them() -> None:
    assert sv_env("A", "x y,z %", "p") == 'A="x y,z %%"'
    assert sv_env("A", 'say "hi" now', "p") == "A='say \"hi\" now'"
    assert sv_env("A", "", "p") == 'A=""'
    for bad, why in [("both ' and \" here", "both quote characters"),
                     ("'quoted'", "strips quotes"), ('ends"', "strips quotes"),
                     ("a ;b", "starts a comment"), ("a #b", "starts a comment"),
                     ("two\nlines", "line break")]:
        with pytest.raises(ConfigError, match=why) as err:
            sv_env("SECRET", bad, "dsv4-decode")
        assert "dsv4-decode: environment variable SECRET=" in str(err.value)
        assert "runtime.env" in str(err.value)


def test_every_word_and_value_survives_supervisords_own_reader(serve_python: Path,
                                                             tmp_path: Path) -> None:
    rng = random.Random(20261129)
    alphabet = [chr(c) for c in range(32, 127)] + ["é", "→", "\t"]
    nasty = ["a ;b", "x #y", "#start", ";start", "100%", "%(there)s", "%%", "it's", 'say "hi"',
             "$HOME", "back\\slash", "a,b", "k=v", "  lead", "trail  ", "", "é→"]
    nasty += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
              for _ in range(60)]
    env = {"A_PERCENT": "100% sure", "A_COMMA": "a,b,c", "A_SINGLE": "it's", "A_DOUBLE":
           'say "x" now', "A_DOLLAR": "$HOME/x", "A_BACKSLASH": "C:\\tmp", "A_EQ": "k=v;w",
           "A_HASH": "x#y", "A_EMPTY": "", "A_SPACES": "a  b"}
    text = with_(**{"model.path": "/srv/my models/100% DeepSeek", "prefill.args":
                    {"extra-words": nasty}, "runtime.env": env})
    plan, out = parsed(serve_python, tmp_path, text)
    programs = programs_of(out)
    for e in plan.engines:
        prog = programs[e.name]
        assert after_dashes(prog["argv"]) == list(e.argv)
        assert prog["environment"] == dict(e.env)
    router = programs["dsv4-router"]
    assert after_dashes(router["argv"]) == [plan.router.argv[0], f"{tmp_path}/bundle/runtime",
                                            *router_command(plan, plan.router, "supervisord")[2:]]
    assert router["environment"] == dict(plan.router.env)


def test_a_value_supervisord_cannot_hold_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"dsv4-prefill: environment variable X="):
        conf_of(with_(**{"prefill.env": {"X": "a ;b"}}))
    with pytest.raises(ConfigError, match="newline"):  # refused at load
        conf_of(with_(**{"prefill.args": {"chat-template": "a\nb"}}))
    with pytest.raises(ConfigError, match=r"replaces the text %\(here\)s everywhere"):
        conf_of(with_(**{"prefill.args": {"chat-template": "/x/%(here)s"}}))


# --------------------------------------------------------------------------- the bundle


def test_conf_d_overrides_options_without_editing(serve_python: Path, tmp_path: Path) -> None:
    """The header's promise: conf.d/*.conf beside the config is read last and wins."""
    (tmp_path / "bundle" / "conf.d").mkdir(parents=True)
    (tmp_path / "bundle" / "conf.d" / "local.conf").write_text(
        "[program:dsv4-decode]\nstartsecs=99\nenvironment=ONLY=\"this\"\n")
    _, out = parsed(serve_python, tmp_path, DEFAULT_CONFIG)
    decode = programs_of(out)["dsv4-decode"]
    assert decode["startsecs"] == 99 and decode["environment"] == {"ONLY": "this"}
    assert decode["argv"][0] == "/usr/bin/numactl"  # the rest as rendered
    assert programs_of(out)["dsv4-prefill"]["startsecs"] == STARTSECS


def test_pinning_without_numactl_is_a_config_error_naming_the_key_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        conf_of(with_(**{"supervisord": {"numactl": None}}))
    message = str(err.value)
    assert message.startswith("test.yaml: supervisord.numactl is null but prefill is to be "
                              "pinned to CPUs 0-55,112-167 and NUMA node 0")
    assert "runtime.pinning: numa" in message
    assert "set supervisord.numactl to its path" in message and "runtime.pinning: off" in message
    assert err.value.exit_code == 2
    # YAML's `off` for "not installed" reads the same
    with pytest.raises(ConfigError, match="supervisord.numactl is null"):
        conf_of(DEFAULT_CONFIG + "supervisord:\n  numactl: off\n")


def test_socket_path_must_fit_a_unix_socket() -> None:
    with pytest.raises(ConfigError, match="supervisord.run_dir: the control socket"):
        conf_of(with_(**{"supervisord": {"run_dir": "/" + "x" * 100}}))


def test_supervisord_section_is_strict() -> None:
    with pytest.raises(ConfigError, match="did you mean 'supervisord.log_dir'"):
        parse_config(with_(**{"supervisord": {"logdir": "/x"}}))
    with pytest.raises(ConfigError, match="supervisord.logs"):
        parse_config(with_(**{"supervisord": {"logs": "journal"}}))
    with pytest.raises(ConfigError, match="must be an absolute path"):
        parse_config(with_(**{"supervisord": {"numactl": "numactl"}}))


def test_bundle_files_carry_provenance_and_rewrite_cleanly(tmp_path: Path) -> None:
    plan = plan_of(DEFAULT_CONFIG)
    files = render_supervisord(plan, "pdsvc render --format supervisord")
    monitoring = [f"monitoring/dsv4-{n}" for n in ("prometheus.yml", "rules.yml",
                                                   "dashboard.json")]
    assert [(f.path, f.mode) for f in files] == [("supervisord.conf", 0o644)] + [
        (f"runtime/{name}", 0o644) for name, _ in runtime_modules()] + [
        (path, 0o644) for path in monitoring]
    files = [f for f in files if not f.path.startswith("monitoring/")]
    conf, copy = files[0].content, files[-1].content
    assert conf.startswith(f"; {MARKER} ")
    assert "; Command: pdsvc render --format supervisord" in conf
    assert "install -d -m 0750 -o sglang -g sglang /var/cache/dsv4/jit /var/lib/dsv4" in conf
    assert MARKER in copy.splitlines()[1] and "%(here)s/runtime" in copy.splitlines()[1]
    name = files[-1].path.split("/")[1]
    assert copy.split("\n", 2)[2] == (RUNTIME / name).read_text()  # verbatim
    write_bundle(files, tmp_path)
    assert {status for _, status in write_bundle(files, tmp_path)} == {"unchanged"}
    # each program alone in a group of its own, named as it (supervisor's split_namespec)
    assert program_names(plan) == {"dsv4-prefill.service": "dsv4-prefill",
                                   "dsv4-decode.service": "dsv4-decode",
                                   "dsv4-router.service": "dsv4-router"}


# --------------------------------------------------------------------------- the runtime


def test_wait_for_urls_waits_for_all_of_them_and_stops_on_request():
    clock = FakeClock()
    up = {"a": 3, "b": 5}  # healthy from this many probes on

    def probe(url: str):
        up[url] -= 1
        return ProbeResult(up[url] <= 0, "HTTP 503")

    lines: list[str] = []
    ok = wait_for_urls(["a", "b"], log=lines.append, status=lambda s: None,
                           poll_interval=1.0, progress_every=100.0,
                           should_stop=lambda: False, probe=probe, sleep=clock.wait, clock=clock)
    assert ok and lines[0] == "waiting for a, b before starting"
    assert lines[-1].startswith("a, b: all healthy after")
    stop = wait_for_urls(["a"], log=lines.append, status=lambda s: None, poll_interval=1.0,
                             progress_every=100.0, should_stop=lambda: True,
                             probe=lambda url: ProbeResult(False, "refused"),
                             sleep=clock.wait, clock=clock)
    assert stop is False


def test_watchdog_secs_kills_a_hung_child_and_exits_124(procs, tmp_path):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(engine_args(port, "dsv4-decode", "--liveness-timeout", "0.3",
                                   "--watchdog-secs", "1.5", "--kill-tree", "--")
                       + procs.child(port, events))
    wait_for(lambda: "healthy after" in procs.log(proc), what="healthy")
    pid = child_pid(events)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    assert procs.wait(proc) == Exit.HUNG
    # idle: the watchdog + one probe interval; the exit status and the log are the verdict
    within(time.monotonic() - t0, 1.5 + 0.2, "the hung child is killed")
    log = procs.log(proc)
    assert "(--watchdog-secs 1.5): the engine is hung: sending SIGKILL" in log
    assert "exiting 124 so that the process manager restarts the engine" in log
    assert not Path(f"/proc/{pid}").exists()


ORPHAN_CHILD = textwrap.dedent('''
    """Leaves an orphan in a session of its own that ignores SIGTERM (sglang #23627), then
    waits; exits on SIGTERM (default action)."""
    import subprocess, sys, time
    sleeper = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "time.sleep(120)")
    launcher = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                "sys.argv[1]], start_new_session=True, stdin=subprocess.DEVNULL, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", launcher, sleeper], capture_output=True,
                         text=True, check=True)
    open(sys.argv[1], "w").write(out.stdout)
    {after}
''')


def _orphan_child(tmp_path: Path, after: str = "time.sleep(120)") -> list[str]:
    script = tmp_path / "orphan_child.py"
    script.write_text(ORPHAN_CHILD.format(after=after))
    return [sys.executable, str(script), str(tmp_path / "orphan.pid")]


def _orphan(tmp_path: Path) -> int:
    path = tmp_path / "orphan.pid"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what="orphan pid"))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_kill_tree_kills_a_child_that_left_the_session_on_stop(procs, tmp_path):
    port = free_port()
    proc = procs.start(engine_args(port, "dsv4-prefill", "--kill-tree", "--")
                       + _orphan_child(tmp_path))
    orphan = _orphan(tmp_path)
    try:
        assert os.getsid(orphan) == orphan  # out of every process group supervisord knows
        wait_for(lambda: Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[1]
                 == str(proc.pid), what="the orphan reparented to the runtime (subreaper)")
        proc.send_signal(signal.SIGTERM)
        assert procs.wait(proc) == 0
        assert not _alive(orphan)
        assert "killed 1 process(es) the engine left behind" in procs.log(proc)
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_kill_tree_kills_what_a_crashed_child_left(procs, tmp_path):
    proc = procs.start(engine_args(free_port(), "dsv4-prefill", "--kill-tree", "--")
                       + _orphan_child(tmp_path, after="time.sleep(1); sys.exit(3)"))
    orphan = _orphan(tmp_path)
    try:
        assert procs.wait(proc) == 3
        assert not _alive(orphan)
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_stop_timeout_kills_a_child_that_ignores_sigterm(procs, tmp_path):
    child = [sys.executable, "-c", "import signal, time; "
             "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
    proc = procs.start(engine_args(free_port(), "dsv4-prefill", "--stop-timeout", "1",
                                   "--kill-tree", "--") + child)
    wait_for(lambda: "started engine pid" in procs.log(proc), what="child started")
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0  # SIGKILL after a stop is still a clean stop
    took = time.monotonic() - t0
    # not before --stop-timeout; then within a look: idle, 1 s and one CHILD_WAIT_SLICE_S
    assert took >= 0.9, took
    within(took, 1 + CHILD_WAIT_SLICE_S, "a child past --stop-timeout killed")
    assert "after the stop signal (--stop-timeout 1): sending SIGKILL" in procs.log(proc)


class _Health(BaseHTTPRequestHandler):
    healthy = False

    def log_message(self, *args):
        pass

    def do_GET(self):
        code = 200 if type(self).healthy else 503
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_wait_for_holds_the_command_until_the_url_is_healthy(procs, tmp_path):
    handler = type("Health", (_Health,), {"healthy": False})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    marker = tmp_path / "started"
    child = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close(); import time; "
             "time.sleep(60)"]
    url = f"http://127.0.0.1:{server.server_port}/health"
    try:
        proc = procs.start(engine_args(free_port(), "dsv4-router", "--wait-for", url, "--")
                           + child)
        wait_for(lambda: "before starting" in procs.log(proc), what="waiting line")
        time.sleep(1.5)
        assert not marker.exists()  # still held back
        handler.healthy = True
        wait_for(marker.exists, what="the command started once the URL is healthy")
        assert f"{url}: all healthy after" in procs.log(proc)
        proc.send_signal(signal.SIGTERM)
        assert procs.wait(proc) == 0
    finally:
        server.shutdown()


def test_prefix_output_marks_every_line_of_the_child(procs, tmp_path):
    child = [sys.executable, "-c", "import sys; print('to stdout', flush=True); "
             "print('Error: to stderr', file=sys.stderr, flush=True); sys.exit(4)"]
    proc = procs.start(engine_args(free_port(), "dsv4-decode", "--prefix-output", "--") + child)
    assert procs.wait(proc) == 4
    lines = procs.log(proc).splitlines()
    assert "dsv4-decode: to stdout" in lines and "dsv4-decode: Error: to stderr" in lines
    assert all(line.startswith("dsv4-decode: ") for line in lines), lines


def test_stop_while_waiting_for_urls_is_clean(procs, tmp_path):
    proc = procs.start(engine_args(free_port(), "x", "--wait-for",
                                   f"http://127.0.0.1:{free_port()}/health", "--", "true"))
    wait_for(lambda: "before starting" in procs.log(proc), what="waiting")
    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0
    assert "stopped while waiting for" in procs.log(proc)
