"""The GPU idle check (pdsvc/ship/runtime/gpu.py): nvidia-smi's CSV read in-process, and a
start that waits for busy GPUs, as a process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_port
from runtime_procs import (
    engine_args,
    wait_for,
    write_nvidia_smi,
)

from pdsvc.ship.runtime.gpu import GpuCheckError, gpu_holders, normalize_bus_id


def test_gpu_holders_parses_real_nvidia_smi_csv(tmp_path):
    apps = (
        "00000000:3A:00.0, 1234, python, 69000 MiB\n"
        "00000000:18:00.0, 77, /usr/bin/weird, name, [N/A]\n"
        "00000000:3B:00.0, 99, other, 10 MiB\n"
    )
    smi = write_nvidia_smi(tmp_path / "bin", apps=apps)
    holders = gpu_holders(str(smi), [0, 1, 2])
    assert [h.describe() for h in holders] == [
        "GPU 0 (00000000:18:00.0) is held by pid 77 /usr/bin/weird, name [N/A]",
        "GPU 2 (00000000:3A:00.0) is held by pid 1234 python 69000 MiB",
    ]
    assert gpu_holders(str(smi), [1]) == []
    # nvidia-smi versions differ in domain width and case; the join must not care
    assert normalize_bus_id("0000:3a:00.0") == normalize_bus_id("00000000:3A:00.0")
    with pytest.raises(GpuCheckError, match="GPU 7 not present"):
        gpu_holders(str(smi), [0, 7])
    broken = write_nvidia_smi(tmp_path / "broken", fail=True)
    with pytest.raises(GpuCheckError, match="exited with status 9: NVIDIA-SMI has failed"):
        gpu_holders(str(broken), [0])


def test_gpu_holders_timeout_is_an_error(tmp_path):
    def slow_run(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    with pytest.raises(GpuCheckError, match="timed out after 30 s"):
        gpu_holders("/usr/bin/nvidia-smi", [0], run=slow_run)


# ---------------------------------------------------------------------------------------------
# GPU idle check


HOLDER_ON_GPU2 = "00000000:3A:00.0, 1234, python, 69000 MiB\n"


def _quick_child(tmp_path: Path) -> list[str]:
    """A child that proves it was started and exits 5 at once (no need to get healthy)."""
    marker = tmp_path / "child-started"
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').close(); raise SystemExit(5)"]


def test_gpu_busy_waits_visibly_then_refuses_to_start(procs, notify_socket, tmp_path):
    smi = write_nvidia_smi(tmp_path / "bin", apps=HOLDER_ON_GPU2)
    args = engine_args(free_port(), "dsv4-prefill", "--gpus", "0,1,2,3", "--nvidia-smi",
                       str(smi), "--gpu-wait", "1.5")
    proc = procs.start([*args, "--", *_quick_child(tmp_path)], notify=notify_socket)
    assert procs.wait(proc) == 1
    log = procs.log(proc)
    assert "dsv4-prefill: waiting for GPUs 0,1,2,3 to be released (0/1.5 s): GPU 2 " \
        "(00000000:3A:00.0) is held by pid 1234 python 69000 MiB" in log
    assert "GPUs still busy after 1.5 s: giving up this start" in log
    assert any("waiting for GPUs 0,1,2,3 to be released" in m for m in notify_socket.statuses())
    assert not (tmp_path / "child-started").exists()


def test_gpu_released_while_waiting_starts_the_engine(procs, tmp_path):
    smi = write_nvidia_smi(tmp_path / "bin", apps=HOLDER_ON_GPU2)
    args = engine_args(free_port(), "dsv4-prefill", "--gpus", "0,1,2,3", "--nvidia-smi",
                       str(smi), "--gpu-wait", "30")
    proc = procs.start([*args, "--", *_quick_child(tmp_path)])
    wait_for(lambda: "waiting for GPUs" in procs.log(proc), what="the wait")
    write_nvidia_smi(tmp_path / "bin", apps="")  # the old process let go of its memory
    assert procs.wait(proc) == 5  # the child ran (and exited 5)
    assert (tmp_path / "child-started").exists()
    assert re.search(r"GPUs 0,1,2,3 are idle after \d+\.\d s", procs.log(proc))


def test_gpu_holder_on_another_gpu_starts(procs, tmp_path):
    bindir = tmp_path / "bin"
    write_nvidia_smi(bindir, apps=HOLDER_ON_GPU2)
    args = engine_args(free_port(), "dsv4-decode", "--gpus", "0,1")  # nvidia-smi found on PATH
    proc = procs.start([*args, "--", *_quick_child(tmp_path)], env={"PATH": str(bindir)})
    assert procs.wait(proc) == 5
    assert (tmp_path / "child-started").exists()
    assert "GPUs 0,1 are idle" in procs.log(proc)


def test_missing_nvidia_smi_skips_the_check(procs, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    args = engine_args(free_port(), "dsv4-decode", "--gpus", "4,5,6,7")
    proc = procs.start([*args, "--", *_quick_child(tmp_path)], env={"PATH": str(empty)})
    assert procs.wait(proc) == 5
    assert (tmp_path / "child-started").exists()
    assert (
        "GPU idle check skipped: nvidia-smi not found (no NVIDIA driver on this host?)"
        in procs.log(proc)
    )


def test_broken_nvidia_smi_refuses(procs, tmp_path):
    smi = write_nvidia_smi(tmp_path / "bin", fail=True)
    args = engine_args(free_port(), "dsv4-prefill", "--gpus", "0", "--nvidia-smi", str(smi))
    proc = procs.start([*args, "--", *_quick_child(tmp_path)])
    assert procs.wait(proc) == 1
    assert "GPU idle check failed:" in procs.log(proc)
    assert not (tmp_path / "child-started").exists()


