"""``runtime launch`` (pdsvc/ship/runtime/launch.py) runs the real router launchers of the serve
venv in its own process: the key added to their arguments, never on a command line, and
sglang-router 0.3.2's router kept free of SGLang and torch, which its ``mini_lb`` import
would otherwise load (the serve venv holds sglang, as runtime.python's venv does), unless
``--mini-lb`` asks for that balancer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from runtime_procs import RUNTIME


def launched(serve_python: Path, key: Path, module: str, *args: str
             ) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``runtime launch MODULE ARGS --help`` under ``-X importtime``: the result and the
    modules the process imported (by full name: a package is in it once it loaded)."""
    r = subprocess.run([str(serve_python), "-X", "importtime", str(RUNTIME), "launch",
                        "--control-plane-key", str(key), module, *args, "--help"],
                       capture_output=True, text=True, timeout=120, check=False)
    names = {line.rsplit("|", 1)[-1].strip()
             for line in r.stderr.splitlines() if line.startswith("import time:")}
    return r, names


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "router.key"
    path.write_text("k" * 64 + "\n")
    return path


def test_sglang_router_starts_without_loading_sglang_or_torch(serve_python: Path,
                                                               key: Path) -> None:
    r, imported = launched(serve_python, key, "sglang_router.launch_router")
    assert r.returncode == 0 and "--pd-disaggregation" in r.stdout, r.stderr[-2000:]
    assert "sglang_router" in imported
    assert not imported & {"sglang", "torch"}, sorted(imported & {"sglang", "torch"})


def test_with_mini_lb_its_optional_tracing_import_is_left_alone(serve_python: Path,
                                                                key: Path) -> None:
    """The mini load balancer may trace (--otlp-traces-endpoint): its import is tried as
    upstream does, which in this venv loads torch (then fails on the missing triton)."""
    r, imported = launched(serve_python, key, "sglang_router.launch_router", "--mini-lb")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch" in imported


def test_smg_is_launched_as_it_is(serve_python: Path, key: Path) -> None:
    r, imported = launched(serve_python, key, "smg.launch_router")
    assert r.returncode == 0 and "--pd-disaggregation" in r.stdout, r.stderr[-2000:]
    assert "smg" in imported and "torch" not in imported
