"""What a user installs is what the tests prove: the sdist and the wheel built from this checkout
with the standard front end (``python -m build``: the sdist first, the wheel from it), installed
into a fresh venv with no checkout on ``sys.path`` and run from a directory outside it.

Every other test imports the editable checkout, which hides a package left out of the wheel
(``pdsvc/apply/`` once was: ``pdsvc`` itself ended in a traceback). Needs PyPI (the build's own
setuptools, pdsvc's dependencies in the venv); without it the test skips, or fails under
PDSVC_REQUIRE_E2E=1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, require

from pdsvc import __version__

SEED_CONFIG = REPO / "etc" / "pdsvc.yaml"
SEED_TOPOLOGY = REPO / "etc" / "seed-host.topology.json"


@dataclass
class Installed:
    wheel: Path
    sdist: Path
    venv: Path
    outside: Path  # a directory outside the checkout, where every command runs

    @property
    def pdsvc(self) -> Path:
        return self.venv / "bin" / "pdsvc"


def _clean_env() -> dict[str, str]:
    """The environment a user's shell has: nothing that points back at this checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}


def _run(argv: list[str | Path], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=_clean_env(), text=True,
                          capture_output=True, timeout=timeout, check=False)


def _ok(proc: subprocess.CompletedProcess, what: str) -> str:
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the sdist and the wheel from a copy of the checkout's tracked files, install the
    wheel into a fresh venv (no --system-site-packages: the editable pdsvc stays out)."""
    if shutil.which("git") is None:
        require("git is needed to copy the checkout's tracked files")
    try:
        import build  # noqa: F401
    except ImportError:
        require("the build front end is missing: pip install -e '.[test]'")
    root = tmp_path_factory.mktemp("wheel")
    src, dist, outside = root / "src", root / "dist", root / "elsewhere"
    outside.mkdir()
    # the tracked files only (what a release tarball or a clone has): nothing rendered or
    # built in the checkout can leak into the wheel
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, archive):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    proc = _run([sys.executable, "-m", "build", "--outdir", dist, src], cwd=outside)
    if proc.returncode != 0 and "Could not find a version" in proc.stdout + proc.stderr:
        require(f"python -m build could not reach PyPI: {proc.stderr.strip()[-300:]}")
    _ok(proc, "python -m build")
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    venv = root / "venv"
    _ok(_run([sys.executable, "-m", "venv", venv], cwd=outside), "python -m venv")
    _ok(_run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], cwd=outside),
        "pip install the wheel")
    return Installed(wheel, sdist, venv, outside)


def test_twine_check_passes_the_metadata(installed: Installed) -> None:
    try:
        import twine  # noqa: F401
    except ImportError:
        require("twine is missing: pip install -e '.[test]'")
    out = _ok(_run([sys.executable, "-m", "twine", "check", "--strict", installed.wheel,
                    installed.sdist], cwd=installed.outside), "twine check")
    assert out.count("PASSED") == 2, out


def shipped_in_checkout() -> set[str]:
    """Every module of pdsvc/ and every template, as the wheel names them."""
    mods = {p.relative_to(REPO).as_posix() for p in (REPO / "pdsvc").rglob("*.py")
            if "__pycache__" not in p.parts}
    templates = {"pdsvc/templates/" + p.relative_to(REPO / "templates").as_posix()
                 for p in (REPO / "templates").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    return mods | templates


def test_every_module_and_template_is_in_the_wheel(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    missing = sorted(shipped_in_checkout() - names)
    assert not missing, (f"{len(missing)} files of the checkout missing from the wheel: {missing}"
                         " (it is built from the files git tracks, as a clone's: git add them)")
    assert any(n.endswith(".data/data/share/pdsvc/install.sh") for n in names)


def test_the_venv_imports_the_installed_pdsvc_not_the_checkout(installed: Installed) -> None:
    out = _ok(_run([installed.venv / "bin" / "python", "-c",
                    "import pdsvc, sys; print(pdsvc.__file__); print(sys.path)"],
                   cwd=installed.outside), "import pdsvc")
    where, path = out.splitlines()
    assert Path(where).is_relative_to(installed.venv), where
    assert str(REPO) not in path


def test_version_is_the_one_the_wheel_was_built_with(installed: Installed) -> None:
    built = installed.wheel.name.split("-")[1]
    assert built == __version__
    out = _ok(_run([installed.pdsvc, "--version"], cwd=installed.outside), "pdsvc --version")
    assert out.strip() == f"pdsvc, version {built}"


def test_pdsvc_and_every_command_help_exit_0(installed: Installed) -> None:
    out = _ok(_run([installed.pdsvc], cwd=installed.outside), "pdsvc")
    commands = re.findall(r"^  (\w+)\s", out.split("Commands:", 1)[1].split("\n\n")[0], re.M)
    assert {"apply", "render", "status", "doctor"} <= set(commands), out
    for cmd in commands:
        _ok(_run([installed.pdsvc, cmd, "--help"], cwd=installed.outside), f"pdsvc {cmd} --help")


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_render_writes_the_checkouts_bundle_and_apply_dry_run_runs(installed: Installed,
                                                                    tmp_path: Path) -> None:
    """The seed config rendered by the installed pdsvc and by the checkout's, each in a
    directory of its own: the same files, line for line; the next step's install.sh exists."""
    wheel_dir, checkout_dir = installed.outside / "wheel", tmp_path / "checkout"
    outs = []
    for work, argv in ((wheel_dir, [installed.pdsvc]),
                       (checkout_dir, ["env", f"PYTHONPATH={REPO}", sys.executable, "-m",
                                       "pdsvc.cli"])):
        (work / "etc").mkdir(parents=True)
        shutil.copy(SEED_CONFIG, work / "etc" / "pdsvc.yaml")
        shutil.copy(SEED_TOPOLOGY, work / "etc" / "seed-host.topology.json")
        outs.append(_ok(_run([*argv, "render", "--topology", "etc/seed-host.topology.json"],
                             cwd=work), f"{work.name}: pdsvc render"))
    wheel_out = outs[0]
    assert _tree(wheel_dir / "units") == _tree(checkout_dir / "units")

    nxt = re.search(r"^next: sudo (\S+) --bundle units", wheel_out, re.M)
    assert nxt, wheel_out
    script = Path(nxt.group(1))
    assert script.is_file() and script.is_relative_to(installed.venv), script
    assert script.read_text() == (REPO / "install.sh").read_text()

    out = _ok(_run([installed.pdsvc, "apply", "--dry-run", "--topology",
                    "etc/seed-host.topology.json"], cwd=wheel_dir), "pdsvc apply --dry-run")
    assert "nothing to do" in out
