"""`pdsvc doctor`'s fixture hosts (tests/test_doctor*.py): a sysfs tree, a /proc-like tree,
fake nvidia-smi, systemctl and python scripts that answer the way the real ones do, and the
config and report helpers the doctor tests share."""


from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from ports import HIGH, SLICES, bindable, worker_slice
from sysfs import SEED, Host, build_sysfs

from pdsvc import doctor as dr
from pdsvc.doctor import limits as dr_limits

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


def free_block() -> int:
    """A base B with B…B+299 free on 127.0.0.1: HTTP/bootstrap/router ports B…B+4,
    dist-init bases B+100 and B+200 (and the 99 ports above each). Each xdist worker looks in
    blocks of its own (two doctor tests at once once took the same block: one's servers left
    TIME_WAIT on the other's planned ports), and a port in TIME_WAIT is not free (the bind
    sets no SO_REUSEADDR, as doctor's own does)."""
    for base in range(HIGH + 1300 * worker_slice(), 60000, 1300 * SLICES):
        if all(bindable(p) for p in range(base, base + 300)):
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


def big_disks(monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/shm and the JIT cache disk are large unless a test says otherwise."""
    monkeypatch.setattr(dr_limits, "fs_space", lambda path: (64 * dr.GIB, 60 * dr.GIB))


def box(tmp_path: Path) -> Box:
    return make_box(tmp_path)
