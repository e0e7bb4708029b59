"""The supervised command: start, signal forwarding, its stderr, its exit status."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from .duties import Duties, quiet
from .endings import Exit
from .notify import Log, Notifier, notify
from .proctree import descendants, process_table
from .timings import (
    CHILD_WAIT_SLICE_S,
    KILL_WAIT_S,
    LEFTOVER_LOOK_S,
    STOP_GRACE_S,
)


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell would report it: death by signal N becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def runtime_exit_code(returncode: int, stop_signal: int | None) -> int:
    """What the runtime exits with once the child is gone.

    After a stop (SIGTERM/SIGINT/SIGHUP to the runtime), exit 0, SIGTERM, SIGKILL (SGLang's
    SIGTERM handler SIGKILLs its own process tree, so 137) or death by the forwarded signal
    count as a clean stop, so ``systemctl stop`` does not mark the unit failed. Otherwise
    the child's status is passed on and ``Restart=on-failure`` decides.
    """
    status = exit_status(returncode)
    if stop_signal is not None:
        clean = {0, 128 + signal.SIGTERM, 128 + signal.SIGKILL, 128 + stop_signal}
        if status in clean:
            return 0
    return status


#: Words that mark a line of the child's stderr as the error worth repeating at its exit.
ERROR_MARKERS = ("Error", "error:", "Exception", "Traceback", "FATAL", "Fatal", "failed")


class StderrTap:
    """Pass the child's stderr through to ours line by line (so it still reaches the journal)
    and remember its last error line, repeated when the child exits: `systemctl status` shows
    only the last 10 journal lines, and systemd's own exit lines would push it out."""

    def __init__(self, pipe: IO[bytes], sink: IO[bytes], prefix: bytes = b"",
                 duties: Duties | None = None) -> None:
        self.last_error = ""
        self._pipe, self._sink, self._prefix = pipe, sink, prefix
        self._duties = duties or quiet()
        self._thread = threading.Thread(target=self._run, name="stderr-tap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Pump line by line; should that raise, copy the bytes as they come: an engine whose
        stderr nobody reads blocks on its next write (duties.py: stderr-tap goes on)."""
        if self._duties.guard("stderr-tap", self._pump) is None and not self._pipe.closed:
            self._raw()

    def _pump(self) -> bool:
        for raw in iter(self._pipe.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                self._sink.write(self._prefix + raw)
                self._sink.flush()
            line = raw.decode("utf-8", "replace").strip()
            if line and any(marker in line for marker in ERROR_MARKERS):
                self.last_error = line
        return True

    def _raw(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            fd = self._pipe.fileno()
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return
                with contextlib.suppress(OSError, ValueError):
                    self._sink.write(chunk)
                    self._sink.flush()

    def drain(self, timeout: float = 2.0) -> str:
        """Wait (briefly) for the child's last lines, then return its last error line."""
        self._thread.join(timeout)
        return self.last_error




#: the signals that ask this runtime to stop (the process manager's, an operator's Ctrl-C)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec function that makes the child get SIGKILL when we die, by any death (kill -9
    included). Under systemd the unit's cgroup does this; under supervisord nothing else would:
    the engine, re-parented to PID 1, would keep its GPU memory. SGLang's own subprocesses do
    the same towards the engine (``kill_itself_when_parent_died``, sglang/srt/utils). prctl(2):
    the signal fires when the *thread* that forked exits, so the child is started from the main
    thread. None where prctl is not to be had (not Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # we died between fork and prctl: follow now
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class Child:
    """The supervised command, plus signal forwarding to it."""

    def __init__(
        self, log: Log, notifier: Notifier, role: str, kill_tree: bool = False,
        prefix_output: bool = False,
    ) -> None:
        self.log = log
        self.notifier = notifier
        self.role = role
        self.kill_tree = kill_tree
        self.prefix = f"{log.name}: ".encode() if prefix_output else b""
        self._reaped_at = 0.0
        self.process: subprocess.Popen[bytes] | None = None
        self.duties: Duties = quiet()  # the unit's (lifecycle.Unit sets it)
        self.stop_signal: int | None = None
        self.stop_time: float | None = None
        self.tap: StderrTap | None = None
        self.forwarded = False  # the stop signal went to the child
        # SERVING's loop wakes on it (events.Inbox.post: safe in a signal handler)
        self.on_stop: Callable[[int], None] | None = None

    def install_signal_handlers(self) -> None:
        for signo in STOP_SIGNALS:
            signal.signal(signo, self._on_signal)

    def stopping(self) -> bool:
        return self.stop_signal is not None

    def _on_signal(self, signo: int, _frame: object) -> None:
        """Only record the stop (gunicorn's arbiter: handlers queue, one loop dispatches): the
        loop takes the engine out of the router first, then forwards the signal (forward_stop).
        A signal after that is forwarded at once (a second SIGINT stays a second SIGINT)."""
        name = signal.Signals(signo).name
        if self.stop_signal is None:
            self.stop_signal = signo
            self.stop_time = time.monotonic()
            # notify() directly: Notifier may log, which a signal handler must not do.
            notify("STOPPING=1", f"STATUS=stopping ({name})", env=self.notifier.env)
            if self.on_stop is not None:
                self.on_stop(signo)
        process = self.process
        if self.forwarded and process is not None and process.returncode is None:
            self.log.from_signal_handler(
                f"got {name}: forwarding it to {self.role} pid {process.pid}"
            )
            process.send_signal(signo)
        else:
            self.log.from_signal_handler(f"got {name}: stopping")

    def forward_stop(self) -> None:
        """Send the recorded stop signal to the child (once the loop is ready to stop it)."""
        process = self.process
        if self.stop_signal is None or self.forwarded:
            return
        self.forwarded = True
        if process is not None and process.returncode is None:
            self.log(f"forwarding {signal.Signals(self.stop_signal).name} to {self.role} pid "
                     f"{process.pid}")
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(self.stop_signal)

    def start(self, argv: Sequence[str]) -> int | None:
        """Start the command; returns an exit status if it could not be started at all."""
        env = dict(os.environ)
        # The child must not talk to systemd itself: with NotifyAccess=main its messages would
        # be dropped with a warning each, and only we decide when the unit is ready or alive.
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(name, None)
        try:
            self.process = subprocess.Popen(
                list(argv), env=env, close_fds=True, stderr=subprocess.PIPE,
                stdout=subprocess.PIPE if self.prefix else None,
                preexec_fn=die_with_parent(os.getpid()),
            )
        except FileNotFoundError:
            self.log(f"cannot start {self.role}: {argv[0]}: command not found")
            return Exit.NOT_FOUND
        except OSError as exc:
            self.log(f"cannot start {self.role}: {argv[0]}: {exc.strerror or exc}")
            return Exit.CANNOT_EXEC
        assert self.process.stderr is not None
        self.tap = StderrTap(self.process.stderr, sys.stderr.buffer, self.prefix, self.duties)
        if self.process.stdout is not None:  # --prefix-output: its stdout lines too
            StderrTap(self.process.stdout, sys.stdout.buffer, self.prefix, self.duties)
        self.log(f"started {self.role} pid {self.process.pid}: {' '.join(argv)}")
        if self.stop_signal is not None:  # a stop arrived while we were starting it
            self.forward_stop()
        return None

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s; the returncode if the child has exited."""
        assert self.process is not None
        try:
            returncode = self.process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            returncode = None
        if self.kill_tree and time.monotonic() - self._reaped_at >= CHILD_WAIT_SLICE_S:
            self.reap_adopted()  # at most once a second: it reads all of /proc
        return returncode

    def reap_adopted(self) -> None:
        """Reap exited orphans reparented to us (as subreaper), never the child itself: its
        status belongs to Popen."""
        self._reaped_at = time.monotonic()
        mine = self.process.pid if self.process is not None else None
        me = os.getpid()
        for pid, (ppid, state, _) in process_table().items():
            if ppid == me and pid != mine and state in ("Z", "X"):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def kill_everything(self, timeout: float = KILL_WAIT_S) -> list[str]:
        """SIGKILL the child and every descendant, and wait until they are all gone (so their
        GPU memory is free before a restart). Returns "pid (name)" of each one killed."""
        me = os.getpid()
        killed: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while True:
            table = process_table()
            tree = descendants(me, table)
            for pid in tree:
                if table[pid][1] not in ("Z", "X"):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                    killed.setdefault(pid, f"{pid} ({table[pid][2]})")
            if self.process is not None:
                self.process.poll()  # reaps the child once it is dead
            self.reap_adopted()
            if not tree:
                return list(killed.values())
            if time.monotonic() >= deadline:
                left = ", ".join(f"{pid} ({table[pid][2]})" for pid in tree if pid in table)
                self.log(f"still not gone {timeout:g} s after SIGKILL: {left}")
                return list(killed.values())
            time.sleep(LEFTOVER_LOOK_S)

    def kill_leftovers(self) -> None:
        """After the child exited: SIGKILL whatever it left behind (``--kill-tree``), as
        systemd's KillMode=mixed does with what is left in the unit's cgroup."""
        if not self.kill_tree:
            return
        killed = self.kill_everything()
        if killed:
            self.log(
                f"killed {len(killed)} process(es) the {self.role} left behind: "
                + ", ".join(killed)
            )

    def kill_now(self, why: str) -> None:
        """SIGKILL the child (and with ``--kill-tree`` its whole tree) at once."""
        assert self.process is not None
        self.log(f"{why}: sending SIGKILL to the {self.role} pid {self.process.pid}"
                 + (" and all its descendants" if self.kill_tree else ""))
        if self.kill_tree:
            self.kill_everything()
        elif self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    def wait_after_stop(self, progress_every: float, timeout: float | None = None,
                        tick: Callable[[], None] | None = None) -> int:
        """Wait for the child's exit after a stop signal. Without ``timeout``, however long it
        takes: systemd's TimeoutStopSec= and its cgroup SIGKILL are the bound, not us (killing
        early would skip SGLang's cleanup). With it (``--stop-timeout``, for managers whose
        SIGKILL cannot reach every process), SIGKILL the child's tree once it runs out."""
        assert self.process is not None
        since = self.stop_time if self.stop_time is not None else time.monotonic()
        next_log = since + STOP_GRACE_S
        bound = "--stop-timeout" if timeout is not None else "systemd's TimeoutStopSec="
        while True:
            returncode = self.wait(CHILD_WAIT_SLICE_S)
            if returncode is not None:
                return returncode
            if tick is not None:
                tick()
            now = time.monotonic()
            if timeout is not None and now - since >= timeout:
                self.kill_now(f"still running {now - since:.0f} s after the stop signal "
                              f"(--stop-timeout {timeout:g})")
                return self.process.wait()
            if now >= next_log:
                self.log(
                    f"{self.role} pid {self.process.pid} still running {now - since:.0f} s "
                    f"after the stop signal; waiting ({bound} is the bound)"
                )
                next_log = now + progress_every
