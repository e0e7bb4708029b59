"""`pdsvc doctor` on fixture hosts (tests/support/doctor_box.py): the whole report, GPUs, the
serve venv's Python, packages and flags, and ports."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_box import (
    ALL_THERE,
    BUSY_GPU2,
    Box,
    by_check,
    free_block,
    make_box,
    rows,
    statuses,
    write_config,
    write_proc,
    write_python,
)
from doctor_box import big_disks as doctor_box_big_disks
from doctor_box import box as doctor_box_box
from sysfs import SEED

from pdsvc import doctor as dr
from pdsvc.cli.doctor import doctor
from pdsvc.doctor.ports import describe_use

#: doctor_box's fixtures, made visible here: big disks unless a test says otherwise, one host.
big_disks = pytest.fixture(autouse=True)(doctor_box_big_disks)
box = pytest.fixture(doctor_box_box)


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
