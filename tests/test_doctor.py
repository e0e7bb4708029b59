"""`pdsvc doctor` against fixture hosts: a sysfs tree, a /proc-like tree, fake nvidia-smi,
systemctl and python scripts that answer the way the real ones do, and sockets on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from sysfs import H200X2_VM, LAPTOP, N0, SEED, Dev, Host, build_sysfs

from pdsvc import doctor as dr
from pdsvc.cli.doctor import doctor
from pdsvc.doctor import limits as dr_limits
from pdsvc.doctor.ports import describe_use

SEED_TOPOLOGY = REPO / "etc/seed-host.topology.json"
H200_MIB = 143771
BUSY_GPU2 = "00000000:3A:00.0, 1234, python, 69000 MiB\n"


# --------------------------------------------------------------------------------------------
# Fixture hosts


def _bus_ids(host: Host) -> list[str]:
    """The host's GPUs in CUDA PCI_BUS_ID order, as nvidia-smi prints them."""
    gpus = [d.bdf for d in host.devices
            if d.vendor == "0x10de" and d.klass.startswith(("0x0300", "0x0302"))]
    return [f"0000{bdf.upper()}" for bdf in sorted(gpus)]


def write_nvidia_smi(directory: Path, host: Host = SEED, used: dict[int, int] | None = None,
                     apps: str = "") -> Path:
    """A fake nvidia-smi answering doctor's queries in nvidia-smi's own CSV (real shape:
    ../shared/fixtures/h200-vm/nvidia-smi-query-gpu.csv)."""
    used = used or {}
    gpus = "".join(f"{i}, {bus}, {H200_MIB} MiB, {used.get(i, 0)} MiB\n"
                   for i, bus in enumerate(_bus_ids(host)))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  {dr.QUERY_GPU[0]}) printf '%s' '{gpus}' ;;\n"
        f"  {dr.QUERY_APPS[0]}) printf '%s' '{apps}' ;;\n"
        f"  {dr.QUERY_DRIVER[0]}) echo 580.159.04 ;;\n"
        "  *) echo \"fake nvidia-smi: unexpected $*\" >&2; exit 2 ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return path


FAKE_PYTHON = """\
#!{python}
# A stand-in for the venv's python: answers doctor's version probe and parser probe.
import json, sys
VERSIONS = {versions!r}
REFUSE = {refuse!r}
if {versions_marker!r} in sys.argv:
    print({prefix!r} + json.dumps(
        {{"python": "3.11.9", "executable": sys.argv[0], "versions": VERSIONS}}))
elif {parse_marker!r} in sys.argv:
    items = json.load(sys.stdin)
    with open({log!r}, "w") as f:
        json.dump(items, f)
    results = []
    for item in items:
        bad = [flag for flag in REFUSE if flag in item["argv"]]
        error = "sglang serve: error: unrecognized arguments: " + bad[0] if bad else None
        results.append({{"ok": not bad, "error": error, "parser": True, "abbreviated": []}})
    print("some import noise")
    print({prefix!r} + json.dumps(results))
else:
    sys.exit(2)
"""

ALL_THERE = {"sglang": "0.5.23", "sglang-router": "0.3.2", "nixl": "0.7.1"}


def write_python(directory: Path, versions: dict | None = None,
                 refuse: tuple[str, ...] = ()) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "python"
    path.write_text(FAKE_PYTHON.format(
        python=sys.executable, versions=ALL_THERE if versions is None else versions,
        refuse=list(refuse), versions_marker=dr.VERSIONS_MARKER, parse_marker=dr.PARSE_MARKER,
        prefix=dr.RESULT_PREFIX, log=str(directory / "parse-probe.json"),
    ))
    path.chmod(0o755)
    return path


def write_systemctl(directory: Path, version: int = 252) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "systemctl"
    path.write_text(f"#!/bin/sh\necho 'systemd {version} ({version}.22-1~deb12u1)'\n"
                    "echo '+PAM +AUDIT +SELINUX +APPARMOR +IMA +SMACK +SECCOMP'\n")
    path.chmod(0o755)
    return path


def write_proc(root: Path, driver: bool = True, memlock_hard: str = "unlimited",
               cap_eff: str = "000001ffffffffff") -> Path:
    """A /proc-like tree; net/ and this process's own directory link to the real ones so the
    port-holder lookup finds the test's sockets without scanning every process."""
    root.mkdir(parents=True, exist_ok=True)
    if driver:
        (root / "driver/nvidia").mkdir(parents=True)
        (root / "driver/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build "
            "(dvs-builder@U22-I3-AF03-09-1)  Thu Nov 27 2025\nGCC version:  gcc version 12.2.0\n")
    (root / "1").mkdir()
    soft = "8388608" if memlock_hard != "unlimited" else "unlimited"
    (root / "1/limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max open files            1048576              1048576              files     \n"
        f"Max locked memory         {soft:<20} {memlock_hard:<20} bytes     \n")
    (root / "1/status").write_text(f"Name:\tsystemd\nCapInh:\t0000000000000000\n"
                                   f"CapEff:\t{cap_eff}\n")
    (root / "net").symlink_to("/proc/self/net")
    (root / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    return root


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_block() -> int:
    """A base B with B…B+299 free on 127.0.0.1: HTTP/bootstrap/router ports B…B+4,
    dist-init bases B+100 and B+200 (and the 99 ports above each)."""
    for base in range(21000, 60000, 1300):
        if all(_bindable(p) for p in range(base, base + 300)):
            return base
    raise RuntimeError("no free port block on 127.0.0.1")


def write_config(path: Path, python: Path, base: int | None = None, **changes: dict) -> Path:
    """etc/pdsvc.yaml with free ports (from `base`), the router on 127.0.0.1, `python` as
    runtime.python, and `changes` merged into its sections."""
    config = yaml.safe_load((REPO / "etc/pdsvc.yaml").read_text())
    base = free_block() if base is None else base
    config["runtime"]["python"] = str(python)
    config["prefill"].update(port=base, bootstrap_port=base + 2, dist_init_port=base + 100)
    config["decode"].update(port=base + 1, dist_init_port=base + 200)
    config["router"].update(host="127.0.0.1", port=base + 3, prometheus_port=base + 4)
    for section, values in changes.items():
        config.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclasses.dataclass
class Box:
    """One fixture host: the files doctor is pointed at."""

    tmp: Path
    sysfs: Path
    proc: Path
    smi: Path
    python: Path
    systemctl: Path
    run_dir: Path
    shm: Path

    def args(self, config: Path, *extra: str, topology: bool = False) -> list[str]:
        where = ["--topology", str(SEED_TOPOLOGY)] if topology else []
        return ["--config", str(config), "--sysfs-root", str(self.sysfs), *where,
                "--proc-root", str(self.proc), "--nvidia-smi", str(self.smi),
                "--systemctl", str(self.systemctl), "--systemd-run-dir", str(self.run_dir),
                "--shm-path", str(self.shm), *extra]


def make_box(tmp: Path, host: Host = SEED, **smi) -> Box:
    run_dir = tmp / "run/systemd/system"
    run_dir.mkdir(parents=True)
    (tmp / "shm").mkdir()
    return Box(
        tmp=tmp, sysfs=build_sysfs(tmp / "sys", host), proc=write_proc(tmp / "proc"),
        smi=write_nvidia_smi(tmp / "bin", host, **smi), python=write_python(tmp / "venv"),
        systemctl=write_systemctl(tmp / "bin"), run_dir=run_dir, shm=tmp / "shm",
    )


@pytest.fixture(autouse=True)
def big_disks(monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/shm and the JIT cache disk are large unless a test says otherwise."""
    monkeypatch.setattr(dr_limits, "fs_space", lambda path: (64 * dr.GIB, 60 * dr.GIB))


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return make_box(tmp_path)


def rows(result) -> list[dict]:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return json.loads(result.output)["checks"]


def by_check(result, check: str) -> list[dict]:
    return [r for r in rows(result) if r["check"] == check]


def statuses(result) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rows(result):
        out.setdefault(r["check"], set()).add(r["status"])
    return out


# --------------------------------------------------------------------------------------------
# The whole report


def test_idle_seed_host_fits_the_plan(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"pdsvc doctor — dsv4-pd.target on this host (config {config})"
    assert " ✓ driver" in result.output and "NVIDIA 580.159.04 loaded" in lines[1]
    for check in ("gpus", "gpus idle", "gpu memory", "topology", "numa", "ports", "python",
                  "flags prefill", "flags decode", "flags router", "memlock", "/dev/shm",
                  "jit cache", "systemd"):
        assert any(line.startswith(f" ✓ {check} ") for line in lines), (check, result.output)
    assert "✗" not in result.output and "fix:" not in result.output
    assert lines[-1].endswith("this host fits the plan (exit 0)")


def test_json_shape_and_exit_codes(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    ok = runner.invoke(doctor, box.args(config, "--json"))
    report = json.loads(ok.output)
    assert ok.exit_code == 0
    assert set(report) == {"format", "config", "target", "topology_source", "ok", "exit_code",
                           "counts", "checks"}
    assert (report["format"], report["target"], report["ok"], report["exit_code"]) == (
        "pdsvc-doctor/1", "dsv4-pd.target", True, 0)
    assert report["counts"]["failed"] == 0
    assert report["counts"]["ok"] + report["counts"]["warning"] == len(report["checks"])
    for row in report["checks"]:
        assert set(row) == {"check", "status", "detail", "fix"}
        assert row["status"] in ("ok", "warning", "failed")
        assert (row["fix"] is None) == (row["status"] == "ok")
        assert "\n" not in row["detail"]

    busy = make_box(box.tmp / "busy", apps=BUSY_GPU2, used={2: 69000})
    failed = runner.invoke(doctor, busy.args(config, "--json"))
    assert failed.exit_code == 3
    report = json.loads(failed.output)
    assert (report["ok"], report["exit_code"]) == (False, 3)
    assert report["counts"]["failed"] >= 1


def test_a_busy_gpu_names_its_holder(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path, apps=BUSY_GPU2, used={2: 69000})
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 3
    line = next(x for x in result.output.splitlines() if x.startswith(" ✗ gpus idle"))
    assert "GPU 2 (0000:3a:00.0, dsv4-prefill) held by pid 1234 python (69000 MiB)" in line
    assert "fix: stop it" in line
    memory = runner.invoke(doctor, box.args(config, "--json"))
    (row,) = by_check(memory, "gpu memory")
    assert row["status"] == "failed"
    assert "74771 MiB free, dsv4-prefill needs 0.7 × 143771 = 100640 MiB" in row["detail"]
    assert result.output.splitlines()[-1].endswith("does not fit the plan (exit 3)")


def test_memory_in_use_is_judged_by_mem_fraction_static(runner, tmp_path: Path) -> None:
    # 2000 MiB used on GPU 1 (prefill: mem-fraction-static 0.7 still fits) and GPU 5 (decode
    # without mem-fraction-static: "memory.used is not ~0"), no process nvidia-smi can see
    box = make_box(tmp_path, used={1: 2000, 5: 2000})
    config = write_config(tmp_path / "pdsvc.yaml", box.python,
                          decode={"args": {"chunked-prefill-size": 8192}})
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 0
    (row,) = by_check(result, "gpu memory")
    assert row["status"] == "warning"
    assert row["detail"] == ("GPU 5 (0000:ab:00.0): 2000 of 143771 MiB already in use (no "
                             "process listed: another container or VM?)")
    assert "decode.args.mem-fraction-static" in row["fix"]


def test_nvidia_smi_missing_and_no_driver(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path)
    box.smi = tmp_path / "nowhere/nvidia-smi"
    box.proc = write_proc(tmp_path / "proc-nodriver", driver=False)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 3
    line = next(x for x in result.output.splitlines() if x.startswith(" ✗ driver"))
    assert "NVIDIA driver not loaded" in line and "nvidia-smi not found (--nvidia-smi)" in line
    assert "fix: install and load the NVIDIA driver" in line
    assert not any(x.startswith((" ✓ gpus", " ✗ gpus")) for x in result.output.splitlines())


def test_driver_loaded_but_nvidia_smi_missing(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path)
    box.smi = tmp_path / "nowhere/nvidia-smi"
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    assert by_check(result, "driver")[0]["status"] == "ok"
    (gpus,) = by_check(result, "gpus")
    assert gpus["status"] == "failed" and "nvidia-smi not found" in gpus["detail"]
    assert "install nvidia-smi" in gpus["fix"]


def test_a_gpu_the_driver_does_not_list(runner, tmp_path: Path) -> None:
    small = dataclasses.replace(SEED, devices=SEED.devices[1:])  # 0000:9a:00.0 (GPU 4) gone
    box = make_box(tmp_path, host=small)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--json", topology=True))
    assert result.exit_code == 3
    details = [r["detail"] for r in by_check(result, "gpus") if r["status"] == "failed"]
    assert any("GPU 4 (0000:9a:00.0) of dsv4-decode is not listed by nvidia-smi" in d
               for d in details), details


# --------------------------------------------------------------------------------------------
# Python, packages, flags


def test_python_missing(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.tmp / "no/venv/bin/python")
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    (row,) = by_check(result, "python")
    assert row["status"] == "failed" and "not found" in row["detail"]
    assert "python3 -m venv" in row["fix"]
    assert not [r for r in rows(result) if r["check"].startswith("flags")]


def test_python_without_nixl(runner, box: Box) -> None:
    python = write_python(box.tmp / "venv2", versions={**ALL_THERE, "nixl": None})
    config = write_config(box.tmp / "pdsvc.yaml", python)
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    (row,) = by_check(result, "python")
    assert row["status"] == "failed"
    assert row["detail"].endswith("sglang 0.5.23, sglang-router 0.3.2, nixl MISSING")
    assert row["fix"] == f"{python} -m pip install nixl"


def test_refused_flag_and_what_the_parser_probe_is_given(runner, box: Box) -> None:
    python = write_python(box.tmp / "venv2", refuse=("--bogus-flag",))
    config = write_config(box.tmp / "pdsvc.yaml", python, decode={"args": {"bogus-flag": True}})
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    assert statuses(result)["flags prefill"] == {"ok"}
    assert statuses(result)["flags router"] == {"ok"}
    (row,) = by_check(result, "flags decode")
    assert row["status"] == "failed"
    assert "refuses dsv4-decode: sglang serve: error: unrecognized arguments: --bogus-flag" in \
        row["detail"]
    assert row["fix"].startswith("fix decode.args in the config")
    # the probe got each unit's argv after `python -m MODULE`, and its env less HOME and caches
    batch = json.loads((box.tmp / "venv2/parse-probe.json").read_text())
    assert [item["kind"] for item in batch] == ["sglang", "sglang", "router"]
    assert batch[1]["argv"][:2] == ["--model-path", "/srv/models/DeepSeek-V4-Flash"]
    assert "--bogus-flag" in batch[1]["argv"]
    assert batch[2]["argv"][0] == "--pd-disaggregation"
    env = batch[0]["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and env["HF_HUB_OFFLINE"] == "1"
    assert not {"HOME", "TRITON_CACHE_DIR", "SGLANG_DG_CACHE_DIR"} & set(env)


def test_stand_in_engine_module_is_not_parsed(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python,
                          runtime={"engine_module": "fake_sglang"})
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 0
    for role in ("prefill", "decode"):
        (row,) = by_check(result, f"flags {role}")
        assert row["status"] == "warning"
        assert "runs fake_sglang, not sglang.launch_server" in row["detail"]
    assert statuses(result)["flags router"] == {"ok"}


def test_real_parsers_of_the_serve_venv(runner, box: Box, serve_python: Path) -> None:
    """SGLang 0.5.23's own parser refuses the seed's --cuda-graph-max-bs as ambiguous."""
    config = write_config(box.tmp / "pdsvc.yaml", serve_python,
                          decode={"args": {"cuda-graph-max-bs": 32}})
    result = runner.invoke(doctor, box.args(config, "--json"))
    found = {r["check"]: r for r in rows(result)}
    assert "sglang 0.5.23" in found["python"]["detail"]
    assert "sglang-router 0.3.2" in found["python"]["detail"]
    assert found["flags prefill"]["status"] == "ok", found["flags prefill"]
    assert found["flags router"]["status"] == "ok", found["flags router"]
    assert found["flags decode"]["status"] == "failed"
    assert "ambiguous option: --cuda-graph-max-bs could match" in found["flags decode"]["detail"]


FAKE_SERVER_ARGS = """\
import argparse


def prepare_server_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tp-size", type=int)
    return parser.parse_args(argv)
"""


def test_the_probe_files_under_another_interpreter(tmp_path: Path) -> None:
    """The probes are files doctor runs as `PY -I FILE`: a venv without pdsvc runs them (the
    parser probe against a stand-in sglang whose parser is plain argparse)."""
    import subprocess

    from pdsvc.doctor.probes import result_line, run_probe

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin/python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "sglang/srt").mkdir(parents=True)
    (Path(site) / "sglang/__init__.py").write_text("")
    (Path(site) / "sglang/srt/__init__.py").write_text("")
    (Path(site) / "sglang/srt/server_args.py").write_text(FAKE_SERVER_ARGS)

    wanted = {"sglang": {"dists": ["sglang"], "module": "sglang"},
              "pdsvc": {"dists": ["no-such-dist"], "module": "pdsvc"}}
    answer = result_line(run_probe(python, "versions.py", [json.dumps(wanted)], 60).stdout)
    assert answer["versions"] == {"sglang": "(importable, version unknown)", "pdsvc": None}

    items = [{"kind": "sglang", "argv": ["--model-path", "/m", "--tp-size", "2"], "env": {}},
             {"kind": "sglang", "argv": ["--model", "/m"], "env": {}},
             {"kind": "sglang", "argv": ["--model-path", "/m", "--bogus"], "env": {}},
             {"kind": "router", "argv": ["--pd-disaggregation"], "env": {}}]
    proc = run_probe(python, "parser.py", [], 60, stdin=json.dumps(items))
    good, short, bogus, router = result_line(proc.stdout)
    assert good == {"ok": True, "error": None, "parser": True, "abbreviated": []}
    assert short["ok"] and short["abbreviated"] == [["--model", "--model-path"]]
    assert not bogus["ok"] and "unrecognized arguments: --bogus" in bogus["error"]
    assert (router["ok"], router["parser"]) == (False, False)
    assert router["error"].startswith("ModuleNotFoundError: No module named 'sglang_router'")


# --------------------------------------------------------------------------------------------
# Ports


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def test_a_port_in_use_names_the_holder(runner, box: Box, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    config = write_config(box.tmp / "pdsvc.yaml", box.python, prefill={"port": port})
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    (row,) = [r for r in by_check(result, "ports") if r["status"] == "failed"]
    assert row["detail"].startswith(f"127.0.0.1:{port} (dsv4-prefill HTTP) in use by pid "
                                    f"{os.getpid()} ")
    assert f"sport = :{port}" in row["fix"]


def test_a_busy_port_in_the_dist_init_span_is_a_warning(runner, box: Box) -> None:
    base = free_block()
    busy = base + 150  # inside prefill's dist-init span base+101…base+199
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", busy))
        sock.listen()
        config = write_config(box.tmp / "pdsvc.yaml", box.python, base=base)
        result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 0, result.output
    (row,) = by_check(result, "ports")
    assert row["status"] == "warning"
    assert row["detail"].startswith(
        f"dsv4-prefill: {busy} in use, within {base + 101}…{base + 199} kept for SGLang")


def test_a_privileged_port_fails_for_the_service_user(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python, router={"port": 80})
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    (row,) = [r for r in by_check(result, "ports") if r["status"] == "failed"]
    assert "127.0.0.1:80 (dsv4-router HTTP) is a privileged port" in row["detail"]


def test_port_use_reads_proc_net_tcp(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  " \
             "timeout inode\n"
    (tmp_path / "net/tcp").write_text(
        header
        + "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999 "
          "       0 4242 1 0000000000000000 100 0 0 10 0\n"
        + "   1: 0100007F:1F40 0100007F:9C40 06 00000000:00000000 03:00000F3C 00000000     0 "
          "       0 0 3 0000000000000000\n")
    listen = dr.port_use(tmp_path, 30000)
    assert listen.states == {"0A"} and listen.uids == {999} and listen.holders == ()
    assert "listening, uid 999" in describe_use(listen)
    assert dr.port_use(tmp_path, 8000).states == {"06"}
    assert dr.port_use(tmp_path, 1234).states == frozenset()


# --------------------------------------------------------------------------------------------
# Topology and NUMA


def test_topology_mismatch_against_a_plan_rendered_elsewhere(runner, tmp_path: Path) -> None:
    """The plan comes from etc/seed-host.topology.json; on this host GPU 4 sits on node 0."""
    moved = dataclasses.replace(SEED, devices=tuple(
        Dev(d.bdf, 0, N0, d.klass, d.vendor) if d.bdf == "0000:9a:00.0" else d
        for d in SEED.devices))
    box = make_box(tmp_path, host=moved)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, topology=True))
    assert result.exit_code == 3
    line = next(x for x in result.output.splitlines() if x.startswith(" ✗ topology"))
    assert "GPU 4 (0000:9a:00.0) is on NUMA node 0 here; the plan pins dsv4-decode to node 1" \
        in line
    assert "fix: re-render on this host" in line
    same = runner.invoke(doctor, make_box(tmp_path / "same").args(config, topology=True))
    assert " ✓ topology " in same.output


ONE_NODE_SEED = dataclasses.replace(SEED, nodes={0: "0-223"}, devices=tuple(
    Dev(d.bdf, 0, "0-223", d.klass, d.vendor) for d in SEED.devices))


def test_one_finding_per_fact_and_a_fix_said_once(runner, tmp_path: Path) -> None:
    """A plan made for the seed host (decode pinned to node 1) on a host
    with one NUMA node. The missing node is one ✗ row, not one more per GPU that is therefore
    on node 0; no ✓ row vouches for the pinning that ✗ refutes; no fix is printed twice."""
    box = make_box(tmp_path, host=ONE_NODE_SEED)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, topology=True))
    assert result.exit_code == 3
    lines = result.output.splitlines()[1:-1]
    (failed,) = [x for x in lines if x.startswith(" ✗ ")]
    assert failed.startswith(" ✗ topology ")
    assert "dsv4-decode is pinned to NUMA node 1, which this host lacks (nodes 0" in failed
    assert not [x for x in lines if x.startswith(" ✓ ") and "node 1" in x], result.output
    assert any(x.startswith(" ✓ numa ") and "dsv4-prefill pinned to node 0" in x
               for x in lines), result.output
    fixes = [x.split("   fix: ", 1)[1] for x in lines if "   fix: " in x]
    assert len(fixes) == len(set(fixes)), result.output

    # a host with neither the plan's GPUs nor its nodes: many findings, each fix said once
    many = make_box(tmp_path / "vm", host=H200X2_VM)
    result = runner.invoke(doctor, many.args(config, topology=True))
    lines = result.output.splitlines()
    fixes = [x.split("   fix: ", 1)[1] for x in lines if "   fix: " in x]
    assert len(fixes) == len(set(fixes)), result.output
    assert any(x.endswith("(fix as above)") for x in lines), result.output
    assert not any(x.startswith(" ✓ gpus idle") for x in lines), result.output
    report = json.loads(runner.invoke(doctor, many.args(config, "--json", topology=True)).output)
    assert all(r["fix"] for r in report["checks"] if r["status"] != "ok")  # JSON keeps each fix


def test_numa_minus_one_is_a_warning_with_what_the_plan_did(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path, host=H200X2_VM)
    config = write_config(
        tmp_path / "pdsvc.yaml", box.python,
        prefill={"gpus": [0], "tp": 1}, decode={"gpus": [1], "tp": 1})
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 0, result.output
    numa = [x for x in result.output.splitlines() if x.startswith(" ! numa")]
    assert len(numa) == 2
    assert "dsv4-prefill: GPUs 0 report numa_node -1 (unknown, common on VMs); the host has one " \
           "NUMA node (0), so the role runs on its CPUs 0-31" in numa[0]
    assert "fix: nothing to do on a one-node VM" in numa[0]
    assert " ✓ topology " in result.output and " ✓ gpus " in result.output


def test_a_plan_that_cannot_fit_still_reports_the_host(runner, tmp_path: Path) -> None:
    box = make_box(tmp_path, host=LAPTOP)
    config = write_config(tmp_path / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 3
    report = json.loads(result.output)
    assert report["target"] is None
    first = report["checks"][0]
    assert (first["check"], first["status"]) == ("plan", "failed")
    assert "no NVIDIA GPU found" in first["detail"]
    assert {r["check"] for r in report["checks"]} >= {"driver", "memlock", "systemd"}


def test_bad_config_is_exit_2(runner, box: Box) -> None:
    config = box.tmp / "bad.yaml"
    config.write_text("name: dsv4\nmodel:\n  path: /m\nprefill:\n  prot: 1\n")
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 2
    assert "did you mean 'prefill.port'" in result.stderr


# --------------------------------------------------------------------------------------------
# systemd, limits, disks


def test_systemd_too_old(runner, box: Box) -> None:
    box.systemctl = write_systemctl(box.tmp / "old", version=239)
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config))
    assert result.exit_code == 3
    line = next(x for x in result.output.splitlines() if x.startswith(" ✗ systemd"))
    assert "systemd 239 is older than 245" in line and "NUMAPolicy= (243)" in line


def test_no_systemd_points_to_supervisord(runner, box: Box) -> None:
    """The H200 VMs: no systemctl, PID 1 is not systemd (shared/fixtures/*/probe.log)."""
    box.systemctl = box.tmp / "nowhere/systemctl"
    box.run_dir = box.tmp / "nowhere/run"
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--json"))
    assert result.exit_code == 0
    (row,) = by_check(result, "systemd")
    assert row["status"] == "warning" and "not PID 1" in row["detail"]
    assert "supervisord" in row["fix"]


@pytest.mark.parametrize(("hard", "cap_eff", "status"), [
    ("unlimited", "0000000000000000", "ok"),
    ("8388608", "000001ffffffffff", "ok"),  # CAP_SYS_RESOURCE: systemd raises it anyway
    ("65536", "00000000a80425fb", "failed"),  # docker's default set: no CAP_SYS_RESOURCE
])
def test_memlock(tmp_path: Path, hard: str, cap_eff: str, status: str) -> None:
    host = dr.Host(proc_root=write_proc(tmp_path, memlock_hard=hard, cap_eff=cap_eff))
    (row,) = dr.check_memlock(host)
    assert row.status == status, row


def test_shm_and_jit_cache_thresholds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pdsvc.cli.kit import load_plan

    plan = load_plan(REPO / "etc/pdsvc.yaml", None, SEED_TOPOLOGY)
    for free_gib, status in ((100, "ok"), (10, "warning"), (2, "failed")):
        monkeypatch.setattr(dr_limits, "fs_space", lambda p, f=free_gib: (f * dr.GIB, f * dr.GIB))
        (row,) = dr.check_jit_cache(plan)
        assert row.status == status, row
        assert row.detail.startswith("/var/cache/dsv4/jit")
    monkeypatch.setattr(dr_limits, "fs_space", lambda p: (64 << 20, 64 << 20))
    (row,) = dr.check_shm(dr.Host(shm_path=tmp_path))
    assert row.status == "warning" and "64.0 MiB" in row.detail and "--shm-size" in row.fix

    def missing(path: Path) -> tuple[int, int]:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(dr_limits, "fs_space", missing)
    (row,) = dr.check_shm(dr.Host(shm_path=tmp_path / "none"))
    assert row.status == "failed"


def test_parsers_of_tool_output(tmp_path: Path) -> None:
    # the h200x2-vm fixture's GPUs, in the columns doctor asks for
    gpus = dr.parse_query_gpu(
        "0, 00000000:00:06.0, 143771 MiB, 0 MiB\n1, 00000000:00:07.0, 143771 MiB, 0 MiB\n")
    assert [(g.index, g.bus_id, g.total_mib, g.used_mib) for g in gpus] == [
        (0, "00000000:00:06.0", 143771, 0), (1, "00000000:00:07.0", 143771, 0)]
    assert dr.parse_query_gpu("0, 00000000:00:06.0, [N/A], [N/A]\n")[0].total_mib is None
    with pytest.raises(dr.GpuQueryError):
        dr.parse_query_gpu("NVIDIA-SMI has failed because it couldn't communicate with the driver")
    assert dr.mem_fraction(["--mem-fraction-static", "0.70"]) == 0.7
    assert dr.mem_fraction(["--mem-fraction-static=0.5"]) == 0.5
    assert dr.mem_fraction(["--port", "1"]) is None
    assert dr.proc_driver_version(write_proc(tmp_path / "proc")) == "580.159.04"
    assert dr.proc_driver_version(tmp_path / "none") is None


# --------------------------------------------------------------------------------------------
# One host of several


def test_each_host_of_several_is_checked_for_what_runs_there(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    cfg = yaml.safe_load(config.read_text())
    cfg["hosts"] = {"lb": {"address": "127.0.0.3", "run": ["router"]},
                    "gpu-a": {"address": "127.0.0.1", "run": ["prefill", "decode"]}}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    lb = runner.invoke(doctor, box.args(config, "--host", "lb"))
    assert lb.exit_code == 0, lb.output
    lines = lb.output.splitlines()
    assert lines[0] == f"pdsvc doctor — dsv4-pd.target on host lb (config {config})"
    assert any(line.startswith(" ✓ gpus") and "none planned here (dsv4-router.service only)"
               in line for line in lines), lb.output
    # a router host needs no driver, GPU or JIT cache; its router's flags are still checked
    assert not any(line.startswith((" ✓ driver", " ✓ jit cache", " ✓ flags prefill"))
                   for line in lines), lb.output
    assert any(line.startswith(" ✓ flags router") for line in lines), lb.output
    assert any(line.startswith(" ✓ network") and "127.0.0.3 (hosts.lb.address) is on this host"
               in line for line in lines), lb.output
    gpu = runner.invoke(doctor, box.args(config, "--host", "gpu-a", "--json"))
    assert gpu.exit_code == 0, gpu.output
    checks = {r["check"] for r in rows(gpu)}
    assert {"driver", "gpus", "flags prefill", "flags decode", "jit cache"} <= checks
    assert "flags router" not in checks


def test_host_option_without_hosts_is_a_usage_error(runner, box: Box) -> None:
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    result = runner.invoke(doctor, box.args(config, "--host", "lb"))
    assert result.exit_code == 2 and "has no `hosts`; leave --host out" in result.output


def test_network_of_one_host_of_several(runner, box: Box) -> None:
    """The host's address must be this machine's; each UCX_NET_DEVICES entry a link that is up
    (an RDMA port's state, a netdev's operstate, read from --sysfs-root)."""
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    cfg = yaml.safe_load(config.read_text())
    cfg["hosts"] = {"gpu-a": {"address": "10.255.0.8", "run": ["prefill", "decode"],
                              "ucx_net_devices": "mlx5_0:1,mlx5_1:1,eth1,eth9"},
                    "gpu-b": {"address": "10.255.0.9", "run": ["router"]}}
    cfg["router"]["host"] = "0.0.0.0"  # the engines on gpu-a register with it across hosts
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    ib = box.sysfs / "class/infiniband"
    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        (ib / dev / "ports/1").mkdir(parents=True)
        (ib / dev / "ports/1/state").write_text(state + "\n")
    (box.sysfs / "class/net/eth1").mkdir(parents=True)
    (box.sysfs / "class/net/eth1/operstate").write_text("up\n")
    result = runner.invoke(doctor, box.args(config, "--host", "gpu-a", "--json"))
    net = [(r["status"], r["detail"]) for r in by_check(result, "network")]
    assert net[0][0] == "failed" and net[0][1] == (
        "10.255.0.8 (hosts.gpu-a.address) is not an address of this host")
    assert ("ok", "UCX_NET_DEVICES mlx5_0:1 is up") in net
    assert any(s == "failed" and "UCX_NET_DEVICES mlx5_1:1 is down" in d for s, d in net), net
    assert ("ok", "UCX_NET_DEVICES eth1 is up") in net
    assert any(s == "failed" and "UCX_NET_DEVICES eth9: no such device" in d for s, d in net)
    assert result.exit_code == 3


def test_only_this_hosts_engines_are_laid_on_its_topology(runner, box: Box) -> None:
    """gpu-b runs the decode on GPUs 4-7; doctor on gpu-a (whose /sys is the seed host's, but
    could have 4 GPUs) and on the router host check their own engines only."""
    config = write_config(box.tmp / "pdsvc.yaml", box.python)
    cfg = yaml.safe_load(config.read_text())
    cfg["hosts"] = {"lb": {"address": "127.0.0.3", "run": ["router"]},
                    "gpu-a": {"address": "127.0.0.1", "run": ["prefill"]},
                    "gpu-b": {"address": "127.0.0.2", "run": ["decode"]}}
    cfg["decode"]["gpus"] = [8, 9, 10, 11]  # not on this box: gpu-b's own
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for host in ("lb", "gpu-a"):
        result = runner.invoke(doctor, box.args(config, "--host", host, "--json"))
        assert not any(r["check"] == "plan" and r["status"] == "failed"
                       for r in rows(result)), (host, result.output)
    result = runner.invoke(doctor, box.args(config, "--host", "gpu-b", "--json"))
    failed = [r["detail"] for r in by_check(result, "plan") if r["status"] == "failed"]
    assert failed and "decode.gpus: GPU 8 does not exist on host gpu-b" in failed[0]


@pytest.mark.parametrize("package, versions, status, said", [
    ("sglang-router", {"sglang-router": "0.3.2"}, "ok", "sglang-router 0.3.2 (router.package)"),
    ("smg", {"smg": "1.13.0"}, "ok", "smg 1.13.0 (router.package)"),
    ("smg", {"smg": "1.12.0"}, "warning", "smg 1.12.0 installed; pdsvc renders for smg==1.13.0"),
])
def test_doctor_names_the_router_package_and_its_version(package, versions, status,
                                                          said) -> None:
    from pdsvc.config.schema import parse_config
    from pdsvc.doctor.venv import Installed, check_router_package, requirements
    from pdsvc.plan.build import build_plan
    from pdsvc.topology import load_topology_file

    repo = Path(__file__).resolve().parent.parent
    cfg = yaml.safe_load((repo / "etc/pdsvc.yaml").read_text())
    cfg["router"]["package"] = package
    text = yaml.safe_dump(cfg)
    plan = build_plan(parse_config(text, "c.yaml"),
                      load_topology_file(repo / "etc/seed-host.topology.json"),
                      config_source="c.yaml", config_text=text)
    assert [r.label for r in requirements(plan)][:2] == ["sglang", package]
    (row,) = check_router_package(plan, Installed("/py", "3.11", versions))
    assert (row.status, row.detail) == (status, said)
