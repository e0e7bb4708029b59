"""How the suite runs in parallel (pytest-xdist: ``-n N --dist loadgroup``, .ci/run).

Most of an end-to-end test's time is waiting on timers and stand-in loads, not CPU, so
independent e2e stacks run side by side, each in a container and network namespace of its own
(unique names: ``Stack.up``, ``NetLab``, ``SystemdContainer``). The unit of work given to a
worker is a *group*: the tests that must share one process because they share a booted fixture.

- tests on a session-scoped host lab (``four_hosts``) run where that lab boots: one group per
  router generation (``lab_router``), whichever modules they are in;
- the tests of a module that share a fixture of that module wider than a test (its stack, its
  rendered bundle): one group per router generation (``router_package``), so the two stacks
  of a module boot in two workers at once;
- any other test is a group of its own.

Groups start longest first, by the seconds their tests took when last measured
(``tests/durations.json``: setup + call + teardown of each test that took 0.5 s or more), so
the long e2e stacks are never the tail of the run; a test the table does not know is assumed
to take a minute (e2e) or a tenth of a second. ``PDSVC_WRITE_DURATIONS=1`` merges a run's
seconds into the table (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
UNKNOWN_E2E_S, UNKNOWN_UNIT_S = 60.0, 0.1
KEEP_S = 0.5  #: the table keeps the tests that took this long or longer
#: session fixtures whose param names a shared stack: every test on it is one group
SHARED_PARAMS = ("lab_router",)
GROUPS_ENV = "PDSVC_TEST_GROUPS"  #: the file of node id -> group, for the scheduler


def group_of(item: pytest.Item) -> str:
    """The name of the work unit this test belongs to (see the module's docstring)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name in SHARED_PARAMS:
        if name in params:
            return f"{name}~{params[name]}"
    module = item.nodeid.split("::", 1)[0]
    if not _shares_a_module_fixture(item, module):
        return item.nodeid
    if "router_package" in params:
        return f"{module}~{params['router_package']}"
    return module


def _shares_a_module_fixture(item: pytest.Item, module: str) -> bool:
    """Whether the test uses a fixture of its own module of a scope wider than the test (the
    module's stack), which its group must build once."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        for d in defs:
            if d.scope != "function" and d.baseid.split("::", 1)[0] == module:
                return True
    return False


def _known() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def configure(config: pytest.Config) -> None:
    """In the process that runs the session (xdist's controller, or a run without xdist): a
    file for the groups, which every collecting process writes and the scheduler reads (xdist's
    own ``xdist_group`` marks rename the node ids, which pytest 9.2 no longer lets a plugin
    do: they would be ignored)."""
    if hasattr(config, "workerinput"):
        return
    fd, path = tempfile.mkstemp(prefix="pdsvc-test-groups-", suffix=".json")
    os.close(fd)
    os.environ[GROUPS_ENV] = path  # inherited by xdist's workers, spawned after this
    config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))
    config.pluginmanager.register(DurationRecorder(), "pdsvc-durations")


def collected(items: list[pytest.Item]) -> None:
    """Write every test's group for the scheduler, and sort the groups longest first, keeping
    the order of the tests within a group (pytest's own, by fixture)."""
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        groups[group_of(item)].append(item)
    path = os.environ.get(GROUPS_ENV)
    if path:
        tmp = f"{path}.{os.getpid()}"
        Path(tmp).write_text(json.dumps({i.nodeid: g for g, its in groups.items() for i in its}))
        os.replace(tmp, path)
    known = _known()

    def cost(group: str) -> float:
        return sum(known.get(i.nodeid, UNKNOWN_E2E_S if i.get_closest_marker("e2e")
                             else UNKNOWN_UNIT_S) for i in groups[group])

    items[:] = [i for g in sorted(groups, key=cost, reverse=True) for i in groups[g]]


def _groups() -> dict[str, str]:
    path = os.environ.get(GROUPS_ENV)
    try:
        return json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        return {}


def make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduler by scope, with our groups for its scopes and the collection's order
    (longest first) for its own: a worker takes the next group when it is nearly done."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = _groups()
            return self.groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


class DurationRecorder:
    """Each test's seconds (setup + call + teardown), merged into tests/durations.json at the
    end when PDSVC_WRITE_DURATIONS=1."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if os.environ.get("PDSVC_WRITE_DURATIONS") != "1" or not self.seconds:
            return
        # merged into the table: a run of some files refreshes theirs and keeps the others'
        table = {t: s for t, s in _known().items() if t not in self.seconds}
        table |= {t: round(s, 1) for t, s in self.seconds.items() if s >= KEEP_S}
        table = dict(sorted(table.items()))
        tmp = DURATIONS.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=0) + "\n")
        tmp.replace(DURATIONS)
