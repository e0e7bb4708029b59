"""bench_serving kept running between runs (pdsvc/bench/driver.py, serve_driver.py): each run
is ``python -m MODULE ARGV`` as a subprocess would run it (exit code, output, a fresh module
body) but the module's imports happen once per process. A module of the test's own stands in
for bench_serving here; test_bench.py runs the real one through the driver."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from pdsvc.bench.driver import Driver, DriverFailed, Drivers

#: a module whose import is counted (its "heavy" dependency appends a line on import) and
#: whose __main__ does what its first argument says
MAIN = """
import os, sys, time
import heavy
what = sys.argv[1]
print("argv", sys.argv[1:], "imports", heavy.count(), flush=True)
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "exit-true":
    sys.exit(True)
if what == "stdin":  # what fd 0 gives at once (a pipe with nothing in it: nothing)
    import select
    ready = select.select([0], [], [], 0.5)[0]
    print("stdin", repr(os.read(0, 100) if ready else "nothing yet"))
if what == "warn":
    heavy.careful()
if what == "sleep":
    time.sleep(60)
if what == "message":
    sys.exit("bad things")
if what == "raise":
    raise RuntimeError("boom")
if what == "fd":
    os.write(1, b"not a protocol line\\n")
    os.write(2, b"on fd 2\\n")
if what == "die":
    os._exit(7)
"""
HEAVY = """
import os
MARK = os.environ["MARK"]
with open(MARK, "a") as f:
    f.write("imported\\n")
def count():
    return len(open(MARK).read().splitlines())
def careful():
    import warnings
    warnings.warn("careful")  # the default filter: once per place, per registry
"""


@pytest.fixture
def driver(tmp_path: Path):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "fakebench.py").write_text(MAIN)
    (tmp_path / "mod" / "heavy.py").write_text(HEAVY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "mod"), "MARK": str(tmp_path / "mark")}
    d = Driver(sys.executable, "fakebench", env, tmp_path / "driver.log")
    yield d
    d.close()


def test_each_run_is_the_module_run_as_main_but_imported_once(driver: Driver,
                                                              tmp_path: Path) -> None:
    logs = [tmp_path / f"run-{i}.log" for i in range(3)]
    assert [driver.run(["ok", str(i)], log) for i, log in enumerate(logs)] == [0, 0, 0]
    # the module's body ran each time, with its own argv; its dependency was imported once
    # (when the driver started, before the first run)
    assert [log.read_text() for log in logs] == [
        f"argv ['ok', '{i}'] imports 1\n" for i in range(3)]
    assert (tmp_path / "mark").read_text() == "imported\n"


def test_exit_codes_are_what_the_process_would_have_exited_with(driver: Driver,
                                                                 tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    assert driver.run(["exit", "2"], log) == 2
    assert driver.run(["exit", "0"], log) == 0
    assert driver.run(["exit", "256"], log) == 0  # the OS keeps the code modulo 256
    assert driver.run(["exit", "-1"], log) == 255
    assert driver.run(["exit-true"], log) == 1
    assert driver.run(["message"], log) == 1
    assert log.read_text().splitlines()[-1] == "bad things"
    assert driver.run(["raise"], log) == 1
    assert log.read_text().splitlines()[-1] == "RuntimeError: boom"
    assert driver.run(["ok"], log) == 0  # the same process goes on after each
    assert (tmp_path / "mark").read_text() == "imported\n"


def test_output_on_the_file_descriptors_goes_to_the_run_log_not_the_protocol(
        driver: Driver, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    assert driver.run(["fd"], log) == 0
    assert log.read_text().splitlines()[1:] == ["not a protocol line", "on fd 2"]
    assert driver.run(["ok"], log) == 0


def test_a_driver_that_dies_fails_that_run_and_the_next_starts_another(
        driver: Driver, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with pytest.raises(DriverFailed) as e:
        driver.run(["die"], log)
    assert e.value.rc == 7
    # its last words are the run's own, where it wrote them
    assert e.value.log == log and e.value.tail == "argv ['die'] imports 1"
    assert driver.run(["ok"], log) == 0
    assert log.read_text() == "argv ['ok'] imports 2\n"  # a new process imported it again


def test_an_import_that_fails_is_told_with_the_traceback(tmp_path: Path) -> None:
    d = Driver(sys.executable, "no_such_module_here", dict(os.environ), tmp_path / "d.log")
    with pytest.raises(DriverFailed) as e:
        d.run(["x"], tmp_path / "run.log")
    assert e.value.rc == 3
    assert e.value.tail.endswith("ModuleNotFoundError: No module named 'no_such_module_here'")


def test_an_interpreter_that_cannot_run_raises_oserror(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "no-python"), "m", dict(os.environ), tmp_path / "d.log")
    with pytest.raises(FileNotFoundError):
        d.run([], tmp_path / "run.log")


def test_closing_ends_the_process(driver: Driver, tmp_path: Path) -> None:
    driver.run(["ok"], tmp_path / "run.log")
    proc = driver.proc
    assert proc is not None and proc.poll() is None
    driver.close()
    assert proc.poll() == 0  # it ended at the end of its stdin, not killed
    assert driver.proc is None


def test_one_driver_per_interpreter_module_and_environment(tmp_path: Path) -> None:
    drivers = Drivers()
    log = tmp_path / "d.log"
    a = drivers.get("py", "m", {"A": "1"}, log)
    assert drivers.get("py", "m", {"A": "1"}, tmp_path / "other.log") is a
    assert a.log == tmp_path / "other.log"  # its own words go beside the runs asking now
    assert drivers.get("py", "m", {"A": "2"}, log) is not a
    assert drivers.get("py2", "m", {"A": "1"}, log) is not a
    drivers.close()
    assert drivers.get("py", "m", {"A": "1"}, log) is not a  # closed: a new one


def test_a_run_reads_no_request_from_its_stdin_and_each_run_shows_its_warnings(
        driver: Driver, tmp_path: Path) -> None:
    logs = [tmp_path / f"run-{i}.log" for i in range(3)]
    assert driver.run(["stdin"], logs[0]) == 0
    assert "stdin b''" in logs[0].read_text()  # /dev/null's end, not the requests' pipe
    assert driver.run(["warn"], logs[1]) == 0 and driver.run(["warn"], logs[2]) == 0
    assert all("UserWarning: careful" in log.read_text() for log in logs[1:])


def test_an_interrupt_while_it_runs_kills_it_as_subprocess_run_would(
        driver: Driver, tmp_path: Path) -> None:
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    driver.run(["ok"], tmp_path / "first.log")
    proc = driver.proc
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            driver.run(["sleep"], tmp_path / "run.log")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert proc is not None and proc.poll() is not None  # no load outlives the run
    assert driver.proc is None
    assert driver.run(["ok"], tmp_path / "next.log") == 0  # a new one, in step
    assert (tmp_path / "next.log").read_text() == "argv ['ok'] imports 2\n"


def test_what_the_interpreter_prints_before_the_program_runs_is_passed_over(
        tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('hello from a sitecustomize')\n")
    (site / "quiet.py").write_text("print('ran')\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    d = Driver(sys.executable, "quiet", env, tmp_path / "d.log")
    try:
        assert d.run([], tmp_path / "run.log") == 0
        assert (tmp_path / "run.log").read_text() == "ran\n"
    finally:
        d.close()
