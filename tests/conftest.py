"""Shared fixtures: fixture hosts, the CLI runner, and the rule for tests that need real parts."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import settings

# No per-example deadline (Hypothesis' default is 200 ms): a duration measured under the
# suite's own load is not a verdict (tests/support/timing.py). A test's own settings inherit it.
settings.register_profile("pdsvc", deadline=None)
settings.load_profile("pdsvc")

REPO = Path(__file__).resolve().parent.parent

# running in parallel: groups of tests that share a booted stack, longest first (scheduling);
# the runtime's process fixtures (tests/test_runtime_*.py, tests/test_supervisord.py)
import scheduling  # noqa: E402
from runtime_procs import notify_socket, procs  # noqa: E402, F401

# pdsvc status's stand-in deployments (tests/test_status*.py, tests/test_first_hour.py)
from status_stands import dep, hosts_dep, short_dir, sv  # noqa: E402, F401
from sysfs import HOSTS, build_sysfs  # noqa: E402

# pdsvc's plan and template caches go to a throw-away dir, never the user's ~/.cache
_CACHE = tempfile.mkdtemp(prefix="pdsvc-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)


def require(reason: str | None) -> None:
    """Skip when a real part (systemd-analyze, nspawn, the serve venv) is missing — unless
    PDSVC_REQUIRE_E2E=1 (CI sets it), where a missing part is a failure, not a skip."""
    if reason is None:
        return
    if os.environ.get("PDSVC_REQUIRE_E2E") == "1":
        pytest.fail(f"PDSVC_REQUIRE_E2E=1 and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sysfs_hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture host laid out as a /sys tree, by name."""
    root = tmp_path_factory.mktemp("sysfs")
    return {name: build_sysfs(root / name, host) for name, host in HOSTS.items()}


STAMP = ".pdsvc-serve-venv.stamp"  # written by make_serve_venv.sh once its build succeeded


def serve_venv() -> Path:
    return Path(os.environ.get("PDSVC_SERVE_VENV") or REPO / ".venv-serve")


@pytest.fixture(scope="session")
def serve_python() -> Path:
    """The serve venv's python (sglang parser, sglang-router, supervisor), built by
    tests/support/make_serve_venv.sh; skip — or fail under PDSVC_REQUIRE_E2E=1 — without it."""
    venv = serve_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        require(f"serve venv not found ({python}); build it: tests/support/make_serve_venv.sh")
    elif not (venv / STAMP).is_file():
        require(f"serve venv {venv} is incomplete; rebuild: tests/support/make_serve_venv.sh")
    return python


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


#: Both router generations every end-to-end stack that has a router is run against.
ROUTER_PACKAGES = ("sglang-router", "smg")


@pytest.fixture(scope="module", params=ROUTER_PACKAGES)
def router_package(request: pytest.FixtureRequest) -> str:
    """sglang-router 0.3.2, then smg 1.13.0 (router.package): one module's stack per router."""
    return request.param

# the host labs several e2e modules share (session fixtures: one boot per router generation)
from host_labs import four_hosts, lab_router  # noqa: E402, F401


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    scheduling.collected(items)  # last: after pytest has ordered the tests by their fixtures


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    return scheduling.make_scheduler(config, log) if config.option.dist == "loadgroup" else None


def pytest_configure(config: pytest.Config) -> None:
    scheduling.configure(config)
