"""bench_serving, imported once and run many times: the program `pdsvc bench` and `pdsvc
tune` hand to ``runtime.python`` (``python -c <this file's text> MODULE``). Standard library
only, Python 3.9: it runs in the deployment's SGLang venv, where pdsvc need not be installed.

``python -m sglang.bench_serving`` spends most of a short run importing SGLang and torch
(6 s on a 2-core machine, before the first request). This program imports MODULE once, then
runs it as ``python -m MODULE`` would, once per request line, in the same process:

* it says ``{"ready": true}`` once MODULE is imported (or exits 3, the traceback on stderr);
* each line on stdin is ``{"argv": [...], "log": PATH}``: MODULE's ``__main__`` runs with
  ``sys.argv = [MODULE, *argv]`` (runpy.run_module, as ``-m`` does), its stdout and stderr
  (file descriptors 1 and 2: prints, logging and warnings alike) written to PATH, its stdin
  /dev/null, under a fresh ``warnings.catch_warnings()`` (a warning shown "once" is shown
  again in the next run's log);
* it answers ``{"rc": N}``: N is what the process would have exited with (SystemExit's code
  as the interpreter maps it, 1 after an uncaught exception, whose traceback is in PATH);
* a KeyboardInterrupt (Ctrl-C reaches the whole process group) ends it, as it would end
  ``python -m``; so does the end of stdin (the caller closed it, or died).

MODULE's own body runs afresh each time; what it imports stays imported, with its state.
For ``sglang.bench_serving`` (a shim over ``sglang.benchmark.serving`` since 0.5.2x) that is
the point, and harmless: ``run_benchmark`` sets its global ``args`` and seeds ``random`` and
numpy from ``--seed`` before it draws the prompts and the arrivals.

The answers go out on a copy of the stdout it was started with; its own fd 1 is its stderr,
so nothing MODULE prints can break a line of the protocol.
"""

import json
import os
import runpy
import sys
import traceback
import warnings


def _exit_code(e: SystemExit) -> int:
    """What the interpreter exits with for ``raise SystemExit(code)``: None 0, an int (a
    bool is one) modulo 256 as the OS keeps it, anything else printed and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return int(e.code) & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def run_one(module: str, argv: list, log_path: str) -> int:
    """``python -m module *argv`` in this process: fds 1 and 2 into log_path, fd 0 from
    /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        print(f"cannot write the run's log {log_path}: {e}", file=sys.stderr)
        return 1
    null = os.open(os.devnull, os.O_RDONLY)
    saved = os.dup(0), os.dup(1), os.dup(2)
    try:
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.argv = [module, *argv]
        sys.modules.pop(module, None)  # run its body afresh, as __main__ (its imports stay)
        try:
            with warnings.catch_warnings():
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            return 0
        except SystemExit as e:
            return _exit_code(e)
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 -- the run's failure, told by its exit code
            traceback.print_exc()
            return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for to, fd in enumerate(saved):  # fds 0, 1, 2 as they were
            os.dup2(fd, to)
        for fd in (*saved, log, null):
            os.close(fd)


def main() -> int:
    module = sys.argv[1]
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray writes to fd 1 go to stderr, never into an answer
    try:
        __import__(module)
    except BaseException:  # noqa: BLE001 -- said on stderr, told by the exit code
        traceback.print_exc()
        return 3
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            rc = run_one(module, request["argv"], request["log"])
            answers.write(json.dumps({"rc": rc}) + "\n")
            answers.flush()
    except KeyboardInterrupt:
        return 130  # as a shell reports a process that SIGINT ended
    return 0


if __name__ == "__main__":
    sys.exit(main())
