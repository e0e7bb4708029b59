"""The target's gate (dsv4-pd-ready.service): `systemctl start TARGET` ends in success only
when every unit is active, and a unit that is not is named in the gate's journal with why.

The script runs here under /bin/sh with a stand-in `systemctl` that answers from a table; the
end-to-end suites run it under a real systemd (tests/test_e2e_lifecycle.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pdsvc.render.systemd import GATE_SCRIPT, gate_command

FAKE_SYSTEMCTL = """#!/bin/sh
# is-active --quiet UNIT | show --property=... UNIT, answered from $STATES (UNIT=STATE lines)
unit=$(eval echo "\\${$#}")
state=$(grep "^$unit=" "$STATES" | cut -d= -f2)
case "$1" in
  is-active) [ "$state" = active ] ;;
  show) printf 'ActiveState=%s\\nSubState=%s\\nResult=exit-code\\n' "$state" "$state"
        printf 'ExecMainStatus=78\\nStatusText=gave up after 3 starts\\n' ;;
esac
"""


def run_gate(tmp_path: Path, states: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bindir / "systemctl").chmod(0o755)
    (tmp_path / "states").write_text("".join(f"{u}={s}\n" for u, s in states.items()))
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin", "STATES": str(tmp_path / "states")}
    return subprocess.run(["/bin/sh", "-c", GATE_SCRIPT, "gate", "t.target", *states],
                          capture_output=True, text=True, env=env, timeout=30)


def test_every_unit_active_passes(tmp_path: Path) -> None:
    done = run_gate(tmp_path, {"a.service": "active", "b.service": "active"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every unit of t.target is active: a.service b.service" in done.stdout


def test_one_failed_unit_fails_the_gate_and_is_named_with_its_reason(tmp_path: Path) -> None:
    """`systemctl is-active A B C` would exit 0 here: A is active (systemctl(1))."""
    done = run_gate(tmp_path, {"a.service": "active", "b.service": "failed",
                               "c.service": "active"})
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("b.service is not active: ActiveState=failed")
    assert "ExecMainStatus=78 StatusText=gave up after 3 starts" in lines[0]
    assert lines[0].endswith("(see: journalctl -u b.service)")
    assert lines[-1] == "t.target is not serving: fix the cause, then: systemctl start t.target"


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed")
def test_the_gate_script_is_clean_posix_sh(tmp_path: Path) -> None:
    (tmp_path / "gate.sh").write_text(GATE_SCRIPT + "\n")
    done = subprocess.run(["shellcheck", "-s", "sh", str(tmp_path / "gate.sh")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_gate_command_names_the_target_then_every_unit() -> None:
    class P:
        target, units = "x-pd.target", ("x-prefill.service", "x-router.service")

    argv = gate_command(P())  # type: ignore[arg-type]
    assert argv[:4] == ["/bin/sh", "-c", GATE_SCRIPT, "gate"]
    assert argv[4:] == ["x-pd.target", "x-prefill.service", "x-router.service"]
