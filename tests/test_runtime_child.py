"""The supervised command (pdsvc/ship/runtime/child.py): the exit status the runtime passes on,
a crash, a stop, the child's last error line, a drain the runtime began.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest
from ports import free_port
from runtime_procs import (
    engine_args,
    wait_for,
)
from timing import within

from pdsvc.ship.runtime.child import Child, runtime_exit_code
from pdsvc.ship.runtime.notify import Log, Notifier
from pdsvc.ship.runtime.timings import CHILD_WAIT_SLICE_S


@pytest.mark.parametrize(
    ("returncode", "stop_signal", "expected"),
    [
        (0, None, 0),
        (3, None, 3),
        (-signal.SIGKILL, None, 137),
        (-signal.SIGSEGV, None, 139),
        (0, signal.SIGTERM, 0),
        (-signal.SIGTERM, signal.SIGTERM, 0),
        (-signal.SIGKILL, signal.SIGTERM, 0),
        (137, signal.SIGTERM, 0),
        (-signal.SIGINT, signal.SIGINT, 0),
        (1, signal.SIGTERM, 1),
        (-signal.SIGSEGV, signal.SIGTERM, 139),
    ],
)
def test_exit_code_mapping(returncode, stop_signal, expected):
    assert runtime_exit_code(returncode, stop_signal) == expected


def test_missing_command_exits_127(procs, tmp_path):
    proc = procs.start(engine_args(free_port(), "x", "--", str(tmp_path / "no-such-binary")))
    assert procs.wait(proc) == 127
    assert "command not found" in procs.log(proc)


@pytest.mark.parametrize(
    ("child_args", "expected"),
    [
        (["--healthy-after", "100", "--exit-after", "0.3", "--exit-code", "3"], 3),
        (["--exit-after", "1.5", "--exit-signal", str(int(signal.SIGKILL))], 137),
    ],
    ids=["exit-3-before-healthy", "sigkill-after-healthy"],
)
def test_engine_child_crash_passes_status_on(procs, notify_socket, tmp_path, child_args, expected):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-prefill", "--") + procs.child(port, events, *child_args),
        notify=notify_socket,
    )
    assert procs.wait(proc) == expected
    assert f"dsv4-prefill: engine exited with status {expected}" in procs.log(proc)
    assert bool(notify_socket.times("READY=1")) == (expected == 137)


def test_engine_child_sigkilling_itself_on_sigterm_is_a_clean_stop(procs, notify_socket, tmp_path):
    port, events = free_port(), tmp_path / "child.jsonl"
    proc = procs.start(
        engine_args(port, "dsv4-prefill", "--")
        + procs.child(port, events, "--on-sigterm", "sigkill"),
        notify=notify_socket,
    )
    wait_for(lambda: notify_socket.times("READY=1"), what="READY=1")
    proc.send_signal(signal.SIGTERM)
    assert procs.wait(proc) == 0
    log = procs.log(proc)
    assert "engine exited with status 137 (killed by SIGKILL)" in log
    assert "treating it as a clean stop" in log


def test_engine_error_line_is_repeated_at_its_exit(procs, notify_socket, tmp_path):
    """`systemctl status` shows 10 journal lines; the engine's own error must survive them."""
    script = tmp_path / "broken_engine.py"
    script.write_text(
        "import sys\n"
        "print('loading weights', file=sys.stderr)\n"
        "print(\"OSError: Incorrect path_or_model_id: '/srv/x'\", file=sys.stderr)\n"
        "print('shutting down', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    proc = procs.start(
        engine_args(free_port(), "dsv4-decode", "--") + [sys.executable, str(script)],
        notify=notify_socket,
    )
    assert procs.wait(proc) == 1
    log = procs.log(proc)
    assert "shutting down" in log  # the child's stderr still reaches ours, line by line
    assert ("dsv4-decode: engine exited with status 1; its last error: "
            "OSError: Incorrect path_or_model_id: '/srv/x'") in log
    assert any("Incorrect path_or_model_id" in s for s in notify_socket.statuses())


def test_a_drain_the_supervisor_began_keeps_the_watchdog_fed_and_is_bounded(tmp_path) -> None:
    log = Log("t")
    child = Child(log, Notifier(log, env={}), "engine")
    assert child.start(["sleep", "30"]) is None  # ignores nothing, but never exits by itself
    ticks: list[float] = []
    t0 = time.monotonic()
    child.stop_time = t0
    returncode = child.wait_after_stop(10, timeout=1.5, tick=lambda: ticks.append(1))
    took = time.monotonic() - t0
    # not before the bound; then within a slice: idle, 1.5 s and one CHILD_WAIT_SLICE_S look
    assert returncode == -signal.SIGKILL and took >= 1.5, took
    within(took, 1.5 + CHILD_WAIT_SLICE_S, "a drain past --stop-timeout killed")
    assert len(ticks) >= 1  # the watchdog was pinged while it drained


