"""The stand-in's process lifecycle: bind, load, JIT compile, serve, SIGTERM drain, exit.

Also the fault timers (``FAKE_SGLANG_CRASH_AFTER`` / ``_HANG_AFTER``), the orphan
(``FAKE_SGLANG_SPAWN_ORPHAN``) and the lifetime safety net (``FAKE_SGLANG_MAX_LIFETIME``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from . import jit
from .engine import VERSION, Engine
from .rendezvous import Rendezvous
from .util import descendants, emit, kill_quietly, log, write_atomic


class Lifecycle:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def run(self) -> int:
        eng, a, knobs = self.engine, self.engine.args, self.engine.knobs
        signal.signal(signal.SIGTERM, self._on_sigterm)
        log(
            f"fake_sglang {VERSION} (test stand-in, not SGLang) pid={os.getpid()} "
            f"server_args: model_path={a.model_path!r} served_model_name={eng.served_name!r} "
            f"host={a.host} port={a.port} disaggregation_mode={eng.role} "
            f"disaggregation_bootstrap_port={a.disaggregation_bootstrap_port} "
            f"disaggregation_transfer_backend={a.disaggregation_transfer_backend} "
            f"tp_size={a.tp_size} dp_size={a.dp_size} dist_init_addr={a.dist_init_addr}"
        )
        if eng.pd:
            log(f"NIXL agent name: {eng.pair.instance_id} (fresh uuid4 per process; "
                f"stale_pair={eng.pair.stale_mode} pair_failure={eng.pair.failure_mode})", "TP0")
        if eng.ignored:
            log(f"fake_sglang: ignoring {len(eng.ignored)} argv item(s): {' '.join(eng.ignored)}")

        if not os.path.isdir(a.model_path):
            # What transformers (AutoConfig, via SGLang's get_config) raises for a local path that
            # does not exist: it is not a valid Hub repo id either.
            emit(f"OSError: Incorrect path_or_model_id: '{a.model_path}'. Please provide either "
                 "the path to a local folder or the repo_id of a model on the Hub.")
            return 1

        if knobs.state_dir:
            os.makedirs(knobs.state_dir, exist_ok=True)
            write_atomic(os.path.join(knobs.state_dir, "engine.pid"), f"{os.getpid()}\n")
        if knobs.spawn_orphan:
            self._spawn_orphan()

        if a.nnodes > 1 and not a.dist_init_addr:
            emit("ValueError: --dist-init-addr is required when --nnodes > 1")
            return 1
        # SGLang itself starts its HTTP server only once the schedulers loaded the weights (the
        # port is closed meanwhile); by default the stand-in binds at once (503 while loading),
        # FAKE_SGLANG_HTTP_AFTER_LOAD=1 keeps SGLang's order
        late_bind = knobs.http_after_load
        if a.node_rank == 0 and not late_bind:
            rc = self._bind()
            if rc:
                return rc
        elif a.node_rank:  # SGLang: ranks > 0 run no tokenizer/detokenizer, hence no HTTP
            log(f"node_rank={a.node_rank}: no HTTP server (rank 0 serves {a.port})", tag="TP0")
        if a.nnodes > 1:
            rc = Rendezvous(eng, self.sleep).join()
            if rc:
                return rc

        # Loading: weights, then JIT kernels (warmup). /health stays 503 meanwhile.
        log(f"Load weight begin. role={eng.role}", tag="TP0")
        t = time.monotonic()
        self.sleep(knobs.load_secs)
        log(f"Load weight end. type=FakeForCausalLM, elapsed={time.monotonic() - t:.2f} s", "TP0")
        if a.node_rank == 0 and late_bind:
            rc = self._bind()
            if rc:
                return rc
        rc = jit.compile_kernels(eng, self.sleep)
        if rc:
            return rc
        if eng.role == "prefill":
            log("Cuda graph is disabled for prefill server (fake)", tag="TP0")
        eng.state = "ready"
        eng.ready_at = ready_at = time.monotonic()
        log(f"The server is fired up and ready to roll! (fake_sglang {eng.role} on "
            f"{a.host}:{a.port}, startup {ready_at - eng.started:.2f} s)")
        self._serve(ready_at)
        return 0  # not reached: the loop ends by exiting

    def _serve(self, ready_at: float) -> None:
        knobs = self.engine.knobs
        crash_at = ready_at + knobs.crash_after if knobs.crash_after is not None else None
        hang_at = ready_at + knobs.hang_after if knobs.hang_after is not None else None
        while True:
            self.sleep(0.05)
            now = time.monotonic()
            if crash_at is not None and now >= crash_at:
                log(f"Scheduler hit an exception: RuntimeError: fake crash "
                    f"(FAKE_SGLANG_CRASH_AFTER={knobs.crash_after}); exiting with status 1")
                os._exit(1)
            if hang_at is not None and now >= hang_at:
                hang_at = None
                self.engine.hang = True
                log(f"fake_sglang: hanging now (FAKE_SGLANG_HANG_AFTER={knobs.hang_after}): "
                    "connections are accepted, requests are never answered")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Runs in the main thread between bytecodes; only set a flag (no I/O, no locks).
        self.engine.term_requested = True

    def sleep(self, secs: float) -> None:
        """Sleep in short steps; act on SIGTERM and the lifetime limit in the meantime."""
        eng = self.engine
        end = time.monotonic() + max(0.0, secs)
        while True:
            if eng.term_requested:
                self.terminate()
            limit = eng.knobs.max_lifetime
            if limit is not None and time.monotonic() - eng.started > limit:
                log(f"fake_sglang: FAKE_SGLANG_MAX_LIFETIME={limit} s reached; "
                    "exiting (safety net)")
                os._exit(0)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.05, left))

    def terminate(self) -> None:
        """SGLang 0.5.23's SIGTERM path (python/sglang/srt/managers/tokenizer_manager.py):

        * ``SignalHandler.sigterm_handler`` sets ``gracefully_exit``: from then on /health and
          /health_generate answer 503 (http_server.py ``health_generate``) and so does /ready
          (``is_ready``), but ``generate_request`` checks nothing: NEW requests are still
          accepted and served, and they keep the drain going;
        * ``sigterm_watchdog`` wakes every 5 s (``FAKE_SGLANG_DRAIN_POLL_SECS`` here, 0.05 by
          default so tests stay fast; its ticks are counted from start-up, as the watchdog's
          loop runs from then), and at each tick: if the server is UnHealthy (its health check
          failed: ``health: "fail"`` here) it exits at once without draining; if
          ``SGL_FORCE_SHUTDOWN`` is set, too; otherwise it logs the requests left and waits for
          the next tick while any remain (``rid_to_state``). There is no time bound;
          ``FAKE_SGLANG_DRAIN_MAX_SECS`` stands in for systemd's TimeoutStopSec;
        * then it kills its children (``kill_process_tree(os.getpid(), include_parent=False)``),
          stops the HTTP server and the process exits 0 (see config._sigterm_exit for 137).
        """
        eng, knobs = self.engine, self.engine.knobs
        eng.term_requested = False
        if eng.graceful_exit:
            return  # already draining (nested call from sleep)
        eng.graceful_exit = True
        t0 = time.monotonic()
        log(f"SIGTERM received. signum=15 frame=None. Draining requests and shutting down... "
            f"(fake_sglang {eng.role})")
        poll = knobs.drain_poll_secs
        phase = eng.ready_at if eng.ready_at is not None else eng.started
        last: int | None = None
        while True:
            # the watchdog's next tick
            self.sleep(poll - ((time.monotonic() - phase) % poll))
            left = eng.inflight
            if eng.health_override == "fail":
                log("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if knobs.force_shutdown:
                log("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            if left != last or poll >= 1.0:
                log(f"Gracefully exiting... Remaining number of requests {left}.")
                last = left
            if left == 0:
                break
            if knobs.drain_max_secs is not None and time.monotonic() - t0 >= knobs.drain_max_secs:
                log(f"fake_sglang: FAKE_SGLANG_DRAIN_MAX_SECS={knobs.drain_max_secs} s reached")
                break
        victims = descendants(os.getpid())
        log(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent="
            f"{knobs.sigterm_exit == 137}, pid={os.getpid()} ({len(victims)} descendant(s))")
        for pid in victims:
            kill_quietly(pid)
        if knobs.sigterm_exit == 137:
            log(f"Killing process tree of pid {os.getpid()} with SIGKILL, including itself; "
                "exit status will be 137 (FAKE_SGLANG_SIGTERM_EXIT=137)")
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(5)  # not reached
            os._exit(137)
        for srv in (eng.http, eng.bootstrap):
            if srv is not None:
                srv.stop()
        log(f"fake_sglang: shut down after SIGTERM in {time.monotonic() - t0:.2f} s; exit 0")
        os._exit(0)

    # ---- start-up pieces --------------------------------------------------------------------

    def _bind(self) -> int:
        from .api import EngineHandler  # the HTTP layer imports the engine, not the reverse
        from .bootstrap import BootstrapHandler
        from .http_base import Server

        eng, a = self.engine, self.engine.args
        binding = (a.host, a.disaggregation_bootstrap_port)
        try:
            if eng.role == "prefill":  # SGLang starts it for prefill only, on --host
                eng.bootstrap = Server(binding, BootstrapHandler, eng, "bootstrap")
                eng.bootstrap.start()
                log(f"Bootstrap server listening on {a.host}:{a.disaggregation_bootstrap_port} "
                    "(GET /health, GET/PUT /route)")
            binding = (a.host, a.port)
            eng.http = Server(binding, EngineHandler, eng, "http")
            eng.http.start()
        except OSError as e:
            emit(f"OSError: [Errno {e.errno}] error while attempting to bind on address "
                 f"('{binding[0]}', {binding[1]}): {(e.strerror or str(e)).lower()}")
            return 1
        log(f"Uvicorn running on http://{a.host}:{a.port} (fake_sglang; /health: 503 until loaded)")
        return 0

    def _spawn_orphan(self) -> None:
        secs = self.engine.knobs.orphan_secs
        sleeper = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            f"time.sleep({secs!r})\n"
        )
        # Double fork: the sleeper starts in its own session and is reparented (to PID 1 or the
        # nearest subreaper) as soon as the launcher exits, like SGLang scheduler processes that
        # outlive their launcher (sglang #23627). Only killing its cgroup gets rid of it.
        launcher = (
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], 'fake-sglang-orphan'],"
            " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
            " stderr=subprocess.DEVNULL, close_fds=True)\n"
            "print(p.pid)\n"
        )
        out = subprocess.run([sys.executable, "-c", launcher, sleeper], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=30, check=True)
        pid = int(out.stdout.strip())
        log(f"fake_sglang: spawned orphan pid={pid} (own session, ignores SIGTERM, "
            f"sleeps {secs:g} s; FAKE_SGLANG_SPAWN_ORPHAN=1)")
        if self.engine.knobs.state_dir:
            write_atomic(os.path.join(self.engine.knobs.state_dir, "orphan.pid"), f"{pid}\n")
