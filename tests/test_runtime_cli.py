"""The runtime's command line (pdsvc/ship/runtime/cli.py) and what it may import: the standard
library only.
"""

from __future__ import annotations

import subprocess
import sys

from runtime_procs import (
    PROC_TIMEOUT,
    RUNTIME,
    RUNTIME_PYTHON,
)

# ---------------------------------------------------------------------------------------------
# CLI


def test_help_and_usage_errors():
    def run(*args):
        return subprocess.run(
            [RUNTIME_PYTHON, str(RUNTIME), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    for mode, options in (
        ("engine", ["--health-url", "--gpus", "--nvidia-smi", "--jit-cache", "--jit-key"]),
        ("router", ["--readiness-url", "--generate-url", "--liveness-url", "--api-key-env"]),
    ):
        result = run(mode, "--help")
        assert result.returncode == 0
        for option in [*options, "--name", "--liveness-interval", "--liveness-timeout"]:
            assert option in result.stdout
        assert "Exit status:" in result.stdout
    usage_errors = [
        ["engine", "--name", "x", "--health-url", "http://127.0.0.1:1/health"],  # no -- CMD
        ["engine", "--name", "x", "--health-url", "http://h/health", "--gpus", "0,a", "--", "t"],
        ["engine", "--name", "x", "--health-url", "http://h/h", "--jit-key", "k", "--", "t"],
        ["router", "--name", "x", "--readiness-url", "http://h/readiness", "--", "t"],
        ["engine", "--name", "x", "--health-url", "h:1/health", "--", "t"],
    ]
    for argv in usage_errors:
        result = run(*argv)
        assert result.returncode == 2, argv
        assert "Traceback" not in result.stderr


def test_runtime_imports_only_the_standard_library() -> None:
    """The runtime runs under the SGLang venv's interpreter on the GPU host, shipped as plain
    files: every module it loads, for every mode, must come from the standard library."""
    probe = (
        "import importlib, sys\n"
        f"sys.path[:0] = [{str(RUNTIME.parent)!r}]\n"
        "for m in ('cli', 'lifecycle', 'listener', 'gpu', 'probe', 'jitlock', 'phases'):\n"
        "    importlib.import_module('runtime.' + m)\n"
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    out = subprocess.run([RUNTIME_PYTHON, "-I", "-S", "-c", probe], capture_output=True,
                         text=True, timeout=PROC_TIMEOUT, check=True).stdout.split()
    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    assert "runtime" in out
    assert [name for name in out if name not in stdlib | {"runtime", "__main__"}] == []




def test_the_runtime_runs_on_the_oldest_python_it_supports() -> None:
    """The runtime runs under the SGLang venv's interpreter, Python >= 3.9: every module
    imports there and the supervising modes parse (an `X | Y` evaluated at run time, a 3.10
    keyword, would not). Skipped where no 3.9 is installed (CI's Debian 12 has 3.11 only)."""
    import shutil
    from pathlib import Path

    import pytest

    found = [*map(str, Path("/root/.pyenv/versions").glob("3.9*/bin/python3.9")),
             shutil.which("python3.9") or ""]
    old = next((p for p in found if p and subprocess.run(
        [p, "-c", "pass"], capture_output=True).returncode == 0), None)
    if old is None:
        pytest.skip("no Python 3.9 here")
    ship = Path(__file__).resolve().parents[1] / "pdsvc" / "ship"
    modules = sorted(p.stem for p in (ship / "runtime").glob("*.py") if p.stem != "__main__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module('runtime.' + m)\n"
            "from runtime.cli import parse_args\n"
            "a, _ = parse_args(['engine', '--name', 'x', '--health-url', 'http://h:1/health',"
            " '--pair', 'http://p:1', '8998', 'http://d:2', '--', 'true'])\n"
            "assert a.pair == [['http://p:1', '8998', 'http://d:2']], a\n")
    done = subprocess.run([old, "-c", code], cwd=ship, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
