"""The tools that check the suite itself (docs/testing.md): tests/support/busy.sh runs a
command with CPU hogs beside it and ends them with it; tests/support/ci_runs.sh runs CI's
script in fresh clones. Both, and .ci/run, are shellcheck-clean."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

BUSY = REPO / "tests" / "support" / "busy.sh"
CI_RUNS = REPO / "tests" / "support" / "ci_runs.sh"


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed")
@pytest.mark.parametrize("script", [BUSY, CI_RUNS, REPO / ".ci" / "run"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_the_scripts_are_shellcheck_clean(script: Path) -> None:
    r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout


def test_busy_runs_its_hogs_beside_the_command_and_ends_them_with_it(tmp_path: Path) -> None:
    seen = tmp_path / "hogs"
    # inside the command, busy.sh is the parent: its hogs are the timeout(1)s it started
    r = subprocess.run(["bash", str(BUSY), "2", "sh", "-c",
                        f"pgrep -P $PPID -x timeout > {seen}; exit 3"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 3, r.stderr  # the command's own status
    assert "2 CPU hog(s) running beside" in r.stderr
    pids = seen.read_text().split()
    assert len(pids) == 2, pids
    assert not any(os.path.exists(f"/proc/{p}") for p in pids), pids  # gone with it


@pytest.mark.parametrize("script,args", [(BUSY, ["x", "true"]), (BUSY, ["2"]),
                                         (CI_RUNS, []), (CI_RUNS, ["1", "--busy"])])
def test_a_wrong_call_says_how_and_exits_2(script: Path, args: list[str]) -> None:
    r = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                       timeout=30, check=False)
    assert r.returncode == 2 and r.stderr.startswith("usage: "), (r.returncode, r.stderr)
