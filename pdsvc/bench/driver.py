"""bench_serving kept running between runs: one process per interpreter and environment,
which imports SGLang once (serve_driver.py, the program it runs) instead of once a run.

A run of ``python -m sglang.bench_serving`` spends seconds importing SGLang and torch before
its first request (6 s on a 2-core machine); `pdsvc tune` makes dozens of runs, most of them
short. The command line each run records (bench_argv) is still the one to type by hand: the
driver runs that module with those arguments, as ``-m`` would, in a process that has already
imported it.

A driver that cannot start, or dies, fails the run it was asked for with the words a
subprocess's failure would have had (its exit code and the last lines it wrote); the next run
starts a new one. A run interrupted in pdsvc (Ctrl-C; `pdsvc tune`'s SIGTERM) kills its
driver, as subprocess.run kills its child.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

#: the program run by runtime.python (python -c TEXT MODULE): standard library only
PROGRAM = (Path(__file__).with_name("serve_driver.py")).read_text(encoding="utf-8")
#: how long a closed driver gets to finish before it is killed
CLOSE_S = 5.0


class DriverFailed(Exception):
    """The driver could not run the run: its exit code, its last words and where they are."""

    def __init__(self, rc: int | None, tail: str, log: Path) -> None:
        super().__init__(f"exited {rc}" if rc is not None else "stopped answering")
        self.rc, self.tail, self.log = rc, tail, log


class Driver:
    """One serve_driver process: ``run`` is ``python -m MODULE *argv`` (its output into a
    log file) without the import."""

    def __init__(self, python: str, module: str, env: Mapping[str, str], log: Path) -> None:
        self.python, self.module, self.env, self.log = python, module, dict(env), log
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the process and wait until it has imported the module (OSError: the
        interpreter cannot be run; DriverFailed: the import failed, its words in self.log)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [self.python, "-c", PROGRAM, self.module], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, env=self.env, text=True)
        self._answer("ready", self.log)

    def run(self, argv: list[str], log_file: Path) -> int:
        """The exit code ``python -m MODULE *argv`` would have had; its output in log_file.
        Interrupted while it runs (Ctrl-C, or `pdsvc tune`'s SIGTERM as KeyboardInterrupt),
        the process is killed, as subprocess.run kills its child, and the interrupt goes on:
        no load outlives the run that was asked for."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            try:
                self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log_file)}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                self._failed(log_file)
            rc = self._answer("rc", log_file)
        except BaseException as e:
            if not isinstance(e, DriverFailed):
                self._kill()
            raise
        if not isinstance(rc, int) or isinstance(rc, bool):
            self._failed(log_file)
        return rc

    def _answer(self, key: str, log: Path) -> object:
        """The value of ``key`` in the process's next answer. Lines that are not an answer
        are passed over: a sitecustomize or .pth that prints writes them before the program
        moves its own output off the answers' way."""
        assert self.proc is not None and self.proc.stdout is not None
        while line := self.proc.stdout.readline():
            with contextlib.suppress(ValueError):
                said = json.loads(line)
                if isinstance(said, dict) and key in said:
                    return said[key]
        self._failed(log)

    def _failed(self, log: Path) -> NoReturn:
        """Raise DriverFailed with the process's exit code and the end of ``log`` (the run's,
        where it died running one; its own, where it died importing)."""
        proc, self.proc = self.proc, None
        assert proc is not None
        try:
            rc: int | None = proc.wait(timeout=CLOSE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        _close_pipes(proc)
        try:
            said = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            said = ""
        raise DriverFailed(rc, " | ".join(said.strip().splitlines()[-3:]), log)

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            _close_pipes(proc)

    def close(self) -> None:
        """End the process: its stdin closed, killed if it does not end within CLOSE_S."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin:
            with contextlib.suppress(OSError):  # a driver that died: a broken pipe
                proc.stdin.close()
        try:
            proc.wait(timeout=CLOSE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _close_pipes(proc)


def _close_pipes(proc: subprocess.Popen[str]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe:
            with contextlib.suppress(OSError):
                pipe.close()


class Drivers:
    """One driver per (interpreter, module, environment), kept until ``close``: a changed
    environment (or runtime.python) gets a process of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drivers: dict[tuple[str, str, str], Driver] = {}

    def get(self, python: str, module: str, env: Mapping[str, str], log: Path) -> Driver:
        """The driver for this interpreter, module and environment; ``log`` is where it
        writes its own words the next time it starts (beside the runs asking for it)."""
        key = (python, module, json.dumps(sorted(env.items())))
        with self._lock:
            driver = self._drivers.get(key)
            if driver is None:
                driver = self._drivers[key] = Driver(python, module, env, log)
            driver.log = log
            return driver

    def close(self) -> None:
        with self._lock:
            drivers, self._drivers = list(self._drivers.values()), {}
        for d in drivers:
            d.close()


#: the drivers of this pdsvc process, ended when it exits
DRIVERS = Drivers()
atexit.register(DRIVERS.close)
