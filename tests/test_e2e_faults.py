"""The fault marathon: every fault a real fleet sees, one after another on one stack, under a
real systemd with the real router (both generations: sglang-router 0.3.2 and smg), stand-in
engines that keep NIXL pair state in both directions (a replaced peer poisons the side that
stays, which then fails every transfer as HTTP 200 + abort), and nobody typing reset-failed.

Each test is one fault: it asserts the state it ends in (the stack serves real completions,
what restarted) and prints `BENCH fault -> serving: S s`. The tests share the stack and run in
file order; at the end no unit is failed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from faults import canaries_ok
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

#: A stand-in nvidia-smi: two GPUs, and the compute processes the test writes into
#: /srv/e2e/gpu-apps.csv (a busy GPU at restart).
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
    *query-gpu*) printf '0, 00000000:06:00.0\\n1, 00000000:07:00.0\\n' ;;
    *query-compute-apps*) cat /srv/e2e/gpu-apps.csv 2>/dev/null || true ;;
esac
"""


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    work = tmp_path_factory.mktemp("faults")
    fakebin = work / "fakebin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    s = Stack.up(work, serve_python.parent.parent, start=False, **{
        "router.package": router_package,
        "runtime.env.FAKE_SGLANG_STALE_PAIR": "both",  # both directions of a stale pair
        "runtime.env.PATH": "/srv/e2e/fakebin:/usr/local/bin:/usr/bin:/bin",
    })
    s.start()
    assert s.serves()
    yield s
    s.down()


def bench(what: str, seconds: float, package: str) -> None:
    print(f"\nBENCH [{package}] {what} -> serving: {seconds:.1f} s")


def journal_since(stack: Stack, unit: str, cursor_lines: int) -> str:
    return "\n".join(stack.c.journal(unit, lines=2000).splitlines()[cursor_lines:])


def lines(stack: Stack, unit: str) -> int:
    return len(stack.c.journal(unit, lines=2000).splitlines())


def fault(stack: Stack, package: str, what: str, act, settle: float = 0.0) -> float:
    """Do the fault, then time until the stack serves again (asserting it does)."""
    t0 = time.monotonic()
    act()
    if settle:
        time.sleep(settle)  # let the fault take effect before "serving" can be judged
    stack.wait_serving(timeout=120, what=f"the stack serves again after: {what}")
    seconds = time.monotonic() - t0
    bench(what, seconds, package)
    # before the next fault, the pair canaries agree (as `pdsvc status` would show): each
    # fault starts from a pair its runtimes have seen work, not one second after a restart
    stack.c.wait_for(lambda: canaries_ok(stack), 30, interval=0.25, what="the canaries agree")
    return seconds


def not_serving_soon(stack: Stack, within: float = 8.0) -> bool:
    """The fault took hold: within `within` s a request through the router fails."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not stack.serves():
            return True
        time.sleep(0.1)
    return False


def test_systemctl_restart_prefill(stack: Stack, router_package: str) -> None:
    before = stack.invocation("decode")
    fault(stack, router_package, "systemctl restart prefill",
          lambda: stack.c.systemctl("restart", stack.unit("prefill")))
    assert stack.invocation("decode") != before  # PartOf=: decode restarted with it


def test_systemctl_restart_decode_heals_the_stale_prefill(stack: Stack,
                                                          router_package: str) -> None:
    mark = lines(stack, stack.unit("prefill"))
    prefill = stack.invocation("prefill")
    fault(stack, router_package, "systemctl restart decode (prefill goes stale)",
          lambda: stack.c.systemctl("restart", stack.unit("decode")))
    # the prefill held the old decode's NIXL state: its canary saw HTTP 200 + abort while
    # both /health said 200, and it restarted itself (the decode, fresh, left it alone)
    log = journal_since(stack, stack.unit("prefill"), mark)
    assert "restarting to heal its pair" in log, log
    assert stack.invocation("prefill") != prefill


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_kill_9_of_an_engine(stack: Stack, router_package: str, role: str) -> None:
    mark, before = lines(stack, stack.unit(role)), stack.invocation(role)
    pid = stack.engine_pid(role)
    fault(stack, router_package, f"kill -9 {role} engine",
          lambda: stack.c.run(["kill", "-9", str(pid)]), settle=0.5)
    # a crash, restarted (NRestarts is no witness: a restart that PartOf= or a pair heal
    # propagates resets it, systemd.service(5))
    log = journal_since(stack, stack.unit(role), mark)
    assert "engine exited with status 137 (killed by SIGKILL)" in log, log
    assert stack.invocation(role) != before


def test_kill_9_of_a_runtime(stack: Stack, router_package: str) -> None:
    main = stack.prop(stack.unit("decode"), "MainPID")
    engine = stack.engine_pid("decode")
    fault(stack, router_package, "kill -9 decode's runtime (its main process)",
          lambda: stack.c.run(["kill", "-9", main]), settle=0.5)
    # the engine went with it (the unit's cgroup; PR_SET_PDEATHSIG outside one)
    assert not stack.c.exists(f"/proc/{engine}")


def test_sigstop_of_an_engine_is_a_hang_the_watchdog_ends(stack: Stack,
                                                          router_package: str) -> None:
    pid = stack.engine_pid("prefill")
    mark = lines(stack, stack.unit("prefill"))
    fault(stack, router_package, "SIGSTOP prefill engine",
          lambda: stack.c.run(["kill", "-STOP", str(pid)]), settle=0.5)
    assert "Watchdog timeout" in journal_since(stack, stack.unit("prefill"), mark)
    assert not stack.c.exists(f"/proc/{pid}")


def test_kill_9_of_the_router(stack: Stack, router_package: str) -> None:
    router = stack.engine_pid("router")  # the router itself: the runtime's child
    engines = {r: stack.invocation(r) for r in ("prefill", "decode")}
    marks = {r: lines(stack, stack.unit(r)) for r in engines}
    fault(stack, router_package, "kill -9 router",
          lambda: stack.c.run(["kill", "-9", str(router)]), settle=0.5)
    # the engines never restarted: they registered again with the new, empty router
    assert {r: stack.invocation(r) for r in ("prefill", "decode")} == engines
    for role, mark in marks.items():
        log = journal_since(stack, stack.unit(role), mark)
        assert f"registered {role} http://127.0.0.1:3000" in log, log


def test_busy_gpu_at_restart_is_waited_for(stack: Stack, router_package: str) -> None:
    apps = stack.work / "gpu-apps.csv"
    apps.write_text("00000000:07:00.0, 4242, python3, 60000 MiB\n")  # someone on decode's GPU
    mark = lines(stack, stack.unit("decode"))
    pid = stack.engine_pid("decode")

    def act() -> None:
        stack.c.run(["kill", "-9", str(pid)])
        stack.c.wait_for(lambda: "waiting for GPUs 1 to be released" in journal_since(
            stack, stack.unit("decode"), mark), 30, interval=0.2, what="the GPU wait")
        time.sleep(2.0)  # the holder lets go a little later
        apps.unlink()

    fault(stack, router_package, "kill -9 decode with its GPU busy for 2 s", act)
    log = journal_since(stack, stack.unit("decode"), mark)
    assert "GPUs 1 are idle after" in log
    assert stack.prop(stack.unit("decode"), "ActiveState") == "active"


def test_a_prefill_replaced_behind_its_address_heals(stack: Stack, router_package: str) -> None:
    """sglang #33789: the prefill is a new instance at the same address, its port never
    closed; the decode keeps its old endpoints and fails every transfer, as HTTP 200."""
    marks = {r: lines(stack, stack.unit(r)) for r in ("prefill", "decode")}

    def act() -> None:
        code, _ = stack.curl("/_fake/control", {"new_instance": True}, port=30000)
        assert code == 200
        assert not_serving_soon(stack)  # the pair is broken while both /health say 200
        assert stack.curl("/health", port=30000)[0] == stack.curl("/health", port=30001)[0] \
            == 200

    fault(stack, router_package, "stale pair (prefill replaced, decode stale)", act)
    # a side that served the pair before restarted itself (with both directions poisoned,
    # whichever acts first; the prefill's restart takes the decode along through PartOf=)
    healed = [r for r, mark in marks.items()
              if "restarting to heal its pair" in journal_since(stack, stack.unit(r), mark)]
    assert healed, marks


def test_the_same_fault_three_times_in_a_row(stack: Stack, router_package: str) -> None:
    mark = lines(stack, stack.unit("decode"))
    for n in range(3):
        pid = stack.engine_pid("decode")
        fault(stack, router_package, f"kill -9 decode engine, #{n + 1} in a row",
              lambda pid=pid: stack.c.run(["kill", "-9", str(pid)]), settle=0.5)
    log = journal_since(stack, stack.unit("decode"), mark)
    # backing off longer each time, never giving up (the count also holds the marathon's
    # earlier decode crashes: less than lifecycle.restart_reset_secs of serving between them)
    counts = [int(n) for n in re.findall(r"crash #(\d+) in a row", log)]
    assert len(counts) >= 2 and counts == sorted(counts) and counts[-1] >= 3, log
    assert "gave up" not in log


def test_an_engine_down_three_times_the_routers_failure_window_rejoins(
        stack: Stack, router_package: str) -> None:
    """smg >= 1.5 moves a worker that keeps failing health checks to `failed` after 3x its
    failure threshold (model_gateway/src/worker/manager.rs): with interval 1 s and threshold 1,
    about 4 s. The decode's runtime is killed (so nobody deregisters the worker) and its GPU
    stays busy 3x that long; the worker must come back and serve."""
    hc = stack.plan["routers"][0]["options"]
    interval = int(hc[hc.index("--health-check-interval-secs") + 1])
    threshold = int(hc[hc.index("--health-failure-threshold") + 1])
    window = interval * threshold * 4  # NotReady after one window, failed after 3 more
    apps = stack.work / "gpu-apps.csv"
    main = stack.prop(stack.unit("decode"), "MainPID")

    def act() -> None:
        apps.write_text("00000000:07:00.0, 4242, python3, 60000 MiB\n")
        stack.c.run(["kill", "-9", main])
        time.sleep(3 * window)
        apps.unlink()

    fault(stack, router_package, f"decode down {3 * window} s (3x the router's failure "
          "window), no deregistration", act)


def test_no_unit_is_failed_and_nobody_typed_reset_failed(stack: Stack) -> None:
    for unit in (*stack.units, stack.target):
        assert stack.prop(unit, "ActiveState") == "active", unit
    failed = stack.c.run(["systemctl", "list-units", "--failed", "--plain", "--no-legend"]).stdout
    assert not failed.strip(), failed
    assert stack.serves()


def test_the_runtime_never_leaves_the_control_plane_key_in_the_journal(stack: Stack) -> None:
    key = stack.c.read_file("/etc/e2e/router.key").strip()
    assert len(key) == 64
    for unit in stack.units:
        assert key not in stack.c.journal(unit, lines=5000)
