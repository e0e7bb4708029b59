"""The steady load a capture runs under: SGLang's own bench_serving through the router, as
`pdsvc bench` runs it (pdsvc/bench/target.py: the same command line, the deployment's
runtime.python, its tokenizer), in the background until the traces are whole.

By default a fixed concurrency, as many requests in flight as the role's batches hold
(bench_serving ``--max-concurrency``, at an unbounded rate): every finished request is
replaced at once, so the running batch stays full whatever the engines' speed. ``--rate``
gives Poisson arrivals instead. A run that has sent every prompt is started again, and the
load is stopped once the traces are whole.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
from pathlib import Path

from pdsvc.bench.target import Load, Target, bench_argv, bench_env
from pdsvc.profile.options import CannotProfile, ProfileOptions

#: prompts per request in flight: a load outlasts the warm-up, the capture and its write
PROMPTS_PER_SLOT = 500
#: with --rate: the seconds of arrivals the run has prompts for
RATE_SECS = 900


def load_of(opts: ProfileOptions, concurrency: int) -> Load:
    """The bench_serving load of a run: ``concurrency`` in flight, or ``--rate``."""
    if opts.rate is not None:
        return Load(opts.rate, opts.input_len, opts.output_len, int(opts.rate * RATE_SECS))
    return Load(float("inf"), opts.input_len, opts.output_len,
                concurrency * PROMPTS_PER_SLOT, concurrency=concurrency)


def words(load: Load) -> str:
    """The load in words, for the report."""
    shape = f"{load.input_len} tokens in, {load.output_len} out"
    if load.concurrency:
        return f"bench_serving, {load.concurrency} requests in flight, {shape}"
    return f"bench_serving at {load.rate:g} req/s (Poisson), {shape}"


class Background:
    """bench_serving running in its own process group, its output in ``log``; started again
    whenever it ends having sent every prompt (a fast engine finishes them early), until
    ``stop``."""

    def __init__(self, target: Target, load: Load, log: Path) -> None:
        self.argv = bench_argv(target, load, os.devnull)
        self.target, self.log = target, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.failed: str | None = None  # why it stopped on its own, if it did
        self.runs = 0
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._spawn()
        self._thread = threading.Thread(target=self._keep, name="profile-load", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        """Start a run, unless stopped (under the lock stop() takes: no run starts after it)."""
        with self._lock:
            if self._stopped.is_set():
                return
            try:
                with open(self.log, "ab") as out:
                    self.proc = subprocess.Popen(
                        self.argv, stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, env=bench_env(self.target, os.environ),
                        start_new_session=True)
            except OSError as e:
                raise CannotProfile(f"cannot run {self.argv[0]} (runtime.python): "
                                    f"{e.strerror}",
                                    hint="--no-load captures the live traffic instead") from None
            self.runs += 1

    def _keep(self) -> None:
        while not self._stopped.is_set():
            proc = self.proc
            assert proc is not None
            rc = proc.wait()
            if self._stopped.is_set():
                return
            if rc != 0:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                self.failed = (f"bench_serving exited {rc} ({' | '.join(tail) or 'no output'};"
                               f" its log: {self.log})")
                return
            try:
                self._spawn()  # every prompt sent: the same load again
            except CannotProfile as e:
                self.failed = str(e)
                return

    def ended(self) -> str | None:
        """Why the load is no longer running, or None while it runs."""
        return self.failed

    def stop(self) -> None:
        """End it (its whole process group), at once: the traces are whole or given up."""
        with self._lock:
            self._stopped.set()
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
