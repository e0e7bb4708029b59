"""The exit-code table of docs/commands.md, command by command: the exact command, its exit
code and the first line it prints. Every error is one line on stderr; click's usage errors too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO

from pdsvc.cli.commands import main

CONFIG = str(REPO / "etc/pdsvc.yaml")
SEED = str(REPO / "etc/seed-host.topology.json")
SEED_SYS = "<sysfs seed>"  # replaced by the fixture tree
NO_GPU = "<sysfs laptop>"
EMPTY = "<topology without GPUs>"
AFILE = "<a file>"


def _cases() -> list[tuple[list[str], int, str]]:
    c = ["-c", CONFIG]
    return [
        # render: 0 written · 1 not written (or --diff: differences) · 2 usage/config · 3 fit
        (["render", *c, "--topology", SEED, "--dry-run", "-o", "x"], 0, "would write x/"),
        (["render", *c, "--topology", SEED, "--diff", "-o", "x"], 1, "--- /dev/null"),
        (["render", *c, "--topology", SEED, "-o", AFILE], 2,
         "pdsvc: error: Invalid value for '--output' / '-o': Directory '<a file>' is a file."),
        (["render", "-c", str(REPO / "etc"), "--topology", SEED], 2,
         f"pdsvc: error: Invalid value for '--config' / '-c': File '{REPO / 'etc'}' is a "
         "directory. (see: pdsvc render --help)"),
        (["render", *c, "--topology", str(REPO / "etc")], 2,
         f"pdsvc: error: Invalid value for '--topology': File '{REPO / 'etc'}' is a directory."),
        (["render", *c, "--topology", "/nonexistent.json"], 2,
         "pdsvc: error: Invalid value for '--topology': File '/nonexistent.json' does not "
         "exist."),
        (["render", *c, "--sysfs-root", "/nonexistent"], 2,
         "pdsvc: error: Invalid value for '--sysfs-root': Directory '/nonexistent' does not "
         "exist."),
        (["render", "--frobnicate"], 2, "pdsvc: error: No such option '--frobnicate'."),
        (["render", *c, "--sysfs-root", NO_GPU], 3, "pdsvc: error: no NVIDIA GPU found"),
        # validate: 0 fits · 2 usage/config · 3 does not fit
        (["validate", *c, "--topology", SEED], 0, f"ok: {CONFIG} fits file:{SEED} (3 units)"),
        (["validate", "-c", "/nonexistent.yaml"], 2,
         "pdsvc: error: /nonexistent.yaml: config file not found"),
        (["validate", *c, "--topology", EMPTY], 3,
         "pdsvc: error: no NVIDIA GPU found (file:<topology without GPUs>); that file lists "
         "no GPU: write it on the GPU host with `pdsvc topology --json > host.json`"),
        # plan: as validate
        (["plan", *c, "--topology", SEED], 0, "dsv4-pd.target  (config "),
        (["plan", *c, "--topology", SEED, "--json"], 0, "{"),
        (["plan", *c, "--sysfs-root", NO_GPU, "--json"], 3, "pdsvc: error: no NVIDIA GPU"),
        # topology: 0 GPUs found · 2 usage · 3 no GPU (with --json too)
        (["topology", "--sysfs-root", SEED_SYS], 0, "8 GPUs, 2 NUMA nodes"),
        (["topology", "--sysfs-root", NO_GPU], 3, "pdsvc: error: no NVIDIA GPU found"),
        (["topology", "--sysfs-root", NO_GPU, "--json"], 3, "pdsvc: error: no NVIDIA GPU found"),
        (["topology", "--sysfs-root", "/nonexistent"], 2,
         "pdsvc: error: Invalid value for '--sysfs-root': Directory '/nonexistent' does not "
         "exist. (see: pdsvc topology --help)"),
        # status: 0 serving · 1 not · 2 usage/config; a plan that does not fit is a finding
        (["status", *c, "--topology", SEED, "--systemctl", "/bin/false"], 1,
         "dsv4 PD stack (systemd)"),
        (["status", *c, "--sysfs-root", NO_GPU, "--systemctl", "/bin/false"], 1,
         "dsv4 PD stack (systemd)"),
        (["status", "-c", "/nonexistent.yaml"], 2,
         "pdsvc: error: /nonexistent.yaml: config file not found"),
        (["status", *c, "--backend", "upstart"], 2,
         "pdsvc: error: Invalid value for '--backend': 'upstart' is not one of"),
        # bench: 0 valid · 1 a gate failed (tests/test_bench.py) · 2 usage · 3 cannot run
        (["bench", *c, "--topology", SEED, "--dry-run"], 0,
         "/opt/sglang/venv/bin/python -m sglang.bench_serving --backend sglang --base-url "
         "http://127.0.0.1:8000 --model /srv/models/DeepSeek-V4-Flash"),
        (["bench", *c, "--topology", SEED, "--slo", "ttft=fast"], 2,
         "pdsvc: error: Invalid value for '--slo': 'ttft=fast': expected ttft=MS,itl=MS"),
        (["bench", *c, "--topology", SEED, "--rate-range", "8:2"], 2,
         "pdsvc: error: Invalid value for '--rate-range': '8:2': need 0 < LO < HI"),
        (["bench", *c, "--topology", SEED, "-o", "out"], 3,
         "pdsvc: error: not loading http://127.0.0.1:8000: "),
        (["bench", *c, "--topology", SEED, "-o", "out", "--url", "http://127.0.0.1:9"], 3,
         "pdsvc bench: warning: this loads http://127.0.0.1:9"),
        # tune: 0 an answer (tests/test_e2e_tune.py) or listed · 1 the baseline cannot be
        # measured (tests/test_tune_search.py) · 2 bad space, config or usage · 3 the plan does
        # not fit, or the router does not serve this deployment
        (["tune", *c, "--topology", SEED, "--dry-run"], 0, "search: one-at-a-time (search: auto"),
        (["tune", *c, "--topology", SEED], 3,
         "pdsvc: error: not tuning: http://127.0.0.1:8000/v1/models: "),
        (["tune", *c, "--topology", SEED, "--dry-run", "--space", "/nonexistent.yaml"], 2,
         "pdsvc: error: --space /nonexistent.yaml: cannot read it"),
        (["tune", *c, "--topology", EMPTY, "--dry-run"], 3, "pdsvc: error: "),
        # profile: 0 the breakdown (tests/test_e2e_profile.py) · 1 a capture failed
        # (tests/test_profile_run.py) · 2 config or usage · 3 cannot run
        (["profile", *c, "--topology", SEED, "--dry-run"], 0,
         "load: /opt/sglang/venv/bin/python -m sglang.bench_serving --backend sglang"),
        (["profile", *c, "--topology", SEED, "--concurrency", "4", "--rate", "2"], 2,
         "pdsvc: error: give --concurrency or --rate, not both"),
        (["profile", *c, "--topology", SEED, "--dry-run", "--engine", "dsv4-decode-9"], 2,
         f"pdsvc: error: --engine dsv4-decode-9: not a decode engine of {CONFIG}; its "
         "engines: dsv4-prefill, dsv4-decode"),
        (["profile", *c, "--topology", SEED, "--write-timeout", "900"], 2,
         "pdsvc: error: Invalid value for '--write-timeout': 900.0 is not in the range"),
        (["profile", *c, "--topology", SEED], 3,
         "pdsvc: error: dsv4-decode (http://127.0.0.1:30001) does not answer: connection "
         "refused; is it running? see `pdsvc status`"),
        # the program itself
        ([], 0, "Usage: pdsvc [OPTIONS]"),  # click 8.5 writes [COMMAND], 8.4 COMMAND
        (["--version"], 0, "pdsvc, version "),
        (["nosuch"], 2, "pdsvc: error: No such command 'nosuch'. (see: pdsvc --help)"),
    ]


@pytest.mark.parametrize("args,code,first", _cases(), ids=lambda v: None)
def test_exit_code_and_first_line(runner, sysfs_hosts, tmp_path: Path, monkeypatch,
                                  args: list[str], code: int, first: str) -> None:
    empty = tmp_path / "empty.json"
    doc = json.loads(Path(SEED).read_text())
    doc["gpus"] = []
    empty.write_text(json.dumps(doc))
    afile = tmp_path / "afile"
    afile.write_text("")
    subst = {SEED_SYS: str(sysfs_hosts["seed"]), NO_GPU: str(sysfs_hosts["laptop"]),
             EMPTY: str(empty), AFILE: str(afile)}
    args = [subst.get(a, a) for a in args]
    for placeholder, real in subst.items():
        first = first.replace(placeholder, real)
    monkeypatch.chdir(tmp_path)  # render -o x, --diff: written here, nowhere else
    result = runner.invoke(main, args, prog_name="pdsvc")
    out = result.stdout if code in (0, 1) and not first.startswith("pdsvc: error") else \
        result.stderr
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert out.splitlines()[0].startswith(first), out
    if first.startswith("pdsvc: error"):
        assert result.stderr.count("\n") == 1, result.stderr  # one line per error
        assert result.stdout == ""


def test_the_documented_exit_code_table_is_the_one_tested() -> None:
    readme = (REPO / "docs" / "commands.md").read_text()
    table = readme[readme.index("| command | 0 | 1 | 2 | 3 |"):]
    table = table[:table.index("\n\n")]
    rows = {re.match(r"\| `?([a-z, ]+)", line).group(1).strip(): line
            for line in table.splitlines()[2:]}
    assert set(rows) == {"render", "validate, plan", "topology", "status", "doctor", "bench",
                         "tune", "profile"}
    assert "a finding" in rows["status"] and "| – (" in rows["status"]
