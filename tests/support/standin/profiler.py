"""SGLang 0.5.23's profiler, as the stand-in plays it: ``/start_profile`` and ``/stop_profile``
(srt/entrypoints/http_server.py), the scheduler's side (srt/managers/scheduler_components/
profiler_manager.py ``SchedulerProfilerManager``) and the freeze while a trace is written.

* **The request** is the IPC struct ``ProfileReq`` itself (io_struct.py): ``output_dir``,
  ``start_step``, ``num_steps``, ``activities``, ``profile_by_stage``, ``with_stack``,
  ``record_shapes``, ``profile_id``, ``profile_prefix`` are read; unknown fields are ignored
  (msgspec_utils: ``extra_behavior="ignore"``); a field of the wrong type is a 400.
  ``output_dir`` defaults to ``SGLANG_TORCH_PROFILER_DIR``, else /tmp; ``activities`` to
  CPU and GPU; ``profile_id`` to the time. Each is recorded (``last``) for the tests.
* **The reply comes before the trace.** Without ``num_steps`` the capture runs until
  ``/stop_profile``; with it, it stops itself once that many forward steps have run, counted
  on the scheduler (one every ``FAKE_SGLANG_STEP_MS`` while requests are in flight: an idle
  engine runs no step). ``profile_by_stage``: the engine's own stage only (a PD decode's
  DECODE, a prefill's EXTEND), named with that suffix; under ``--speculative-algorithm`` a
  by-stage decode window never ends (sglang #34943: TARGET_VERIFY counts as extend).
  ``/stop_profile`` answers once the write is over (the scheduler handles the stop
  synchronously).
* **The write freezes the scheduler** (SGLang exports on the scheduler thread, sglang #34943,
  PR #35115) for ``FAKE_SGLANG_PROFILE_WRITE_SECS``: generations neither start nor stream a
  token, /health answers 503 only after SGLANG_HEALTH_CHECK_TIMEOUT (20 s, SGLang's own
  variable) or 200 once the write ends within it, and every call that needs the scheduler
  (/server_info, /get_load, the profiler's own) waits; /metrics and /v1/models answer.
* **The files** are one per TP rank, ``[PREFIX-]ID-TP-N[-DECODE|-EXTEND].trace.json.gz``,
  real PyTorch-profiler traces (tests/fixtures/traces: a CUDA-graph decode, an eager prefill,
  a CPU-only capture for ``activities: ["CPU"]``; rank N is the fixture's rank N mod 4). Each
  appears at once and grows in pieces through the freeze, as torch's gzip of its JSON does:
  incomplete until the end (``FAKE_SGLANG_PROFILE_TRUNCATE=1``: never complete).
* **Errors** are SGLang's: a capture already running or armed is refused with success=False,
  which the HTTP layer turns into a bare 500 "Internal Server Error" and the message only in
  the log ("RuntimeError: Profiling is already in progress. Call /stop_profile first."); a
  stop with none running likewise; ``FAKE_SGLANG_NO_PROFILE=1``: no such endpoints (404).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from .util import log

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
FIELDS = {"output_dir": str, "start_step": int, "num_steps": int, "activities": list,
          "profile_by_stage": bool, "with_stack": bool, "record_shapes": bool,
          "profile_id": str, "profile_prefix": str, "merge_profiles": bool}
PIECES = 8  # a trace is written in this many pieces through the freeze


class Profiler:
    """One engine's profiler state: idle -> armed (by-stage, before its first step) ->
    running -> writing (the scheduler frozen) -> idle."""

    def __init__(self, engine: Any) -> None:
        self.eng = engine
        self.knobs = engine.knobs
        self.state = "idle"
        self.req: dict[str, Any] = {}
        self.steps = 0
        self.target: int | None = None
        self.last: dict[str, Any] | None = None  # the last /start_profile body, as read
        self.running = threading.Event()  # clear while the scheduler is frozen
        self.running.set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    # ---- the scheduler ---------------------------------------------------------------------

    def wait_unfrozen(self, timeout: float | None = None) -> bool:
        """Block while the scheduler is frozen (a trace being written); False on timeout."""
        return self.running.wait(timeout)

    def stage(self) -> str:
        return "EXTEND" if self.eng.role == "prefill" else "DECODE"

    def _tick(self) -> None:
        """The scheduler's forward steps while a capture is armed or running."""
        step = max(0.001, self.knobs.step_ms / 1000)
        while True:
            time.sleep(step)
            with self.lock:
                if self.state not in ("armed", "running"):
                    self.thread = None
                    return
                if self.eng.inflight <= 0:
                    continue  # no batch, no forward step
                stuck = self.req.get("profile_by_stage") and self.eng.args.speculative_algorithm
                if stuck:
                    continue  # TARGET_VERIFY is taken for extend: the window never ends
                if self.state == "armed":
                    self.state = "running"
                    log(f"Profiling starts for {self.stage()}. Traces will be saved to: "
                        f"{self.req['output_dir']} (with profile id: {self.req['profile_id']})")
                self.steps += 1
                done = self.target is not None and self.steps > self.target
            if done:
                self.write()

    # ---- the endpoints ---------------------------------------------------------------------

    def start(self, body: Any) -> tuple[int, str]:
        """/start_profile: (status, text reply); the reply comes before any trace."""
        if body is None:
            body = {}
        if not isinstance(body, dict):
            return 400, "request body must be a ProfileReq object"
        for key, kind in FIELDS.items():
            value = body.get(key)
            if value is not None and (not isinstance(value, kind) or
                                      (kind is int and isinstance(value, bool))):
                return 400, f"{key}: expected {kind.__name__}, got {type(value).__name__}"
        self.wait_unfrozen()  # the scheduler takes the request
        with self.lock:
            if self.state != "idle":
                log("RuntimeError: Profiling is already in progress. Call /stop_profile first.")
                return 500, "Internal Server Error"
            self.last = dict(body)
            self.req = {
                "output_dir": body.get("output_dir") or os.environ.get(
                    "SGLANG_TORCH_PROFILER_DIR", "/tmp"),
                "activities": body.get("activities") or ["CPU", "GPU"],
                "profile_id": body.get("profile_id") or str(time.time()),
                "profile_prefix": body.get("profile_prefix") or "",
                "profile_by_stage": bool(body.get("profile_by_stage")),
            }
            self.steps, self.target = 0, body.get("num_steps")
            by_stage = self.req["profile_by_stage"] and self.target
            self.state = "armed" if by_stage else "running"
            if self.state == "running":
                log(f"Profiling starts. Traces will be saved to: {self.req['output_dir']} "
                    f"(with profile id: {self.req['profile_id']})")
            if self.target and self.thread is None:
                self.thread = threading.Thread(target=self._tick, daemon=True,
                                               name="fake-scheduler")
                self.thread.start()
        return 200, "Start profiling.\n"

    def stop(self) -> tuple[int, str]:
        """/stop_profile: answers once the write is over."""
        self.wait_unfrozen()
        with self.lock:
            if self.state != "running":
                log("RuntimeError: Profiling is not in progress. Call /start_profile first.")
                return 500, "Internal Server Error"
        self.write()
        return 200, "Stop profiling. This will take some time.\n"

    # ---- the write -------------------------------------------------------------------------

    def files(self) -> list[tuple[Path, Path]]:
        """(source fixture, target path) of each rank's trace."""
        r = self.req
        cpu_only = "GPU" not in r["activities"]
        kind = "cpu-only" if cpu_only else ("prefill" if self.eng.role == "prefill" else "decode")
        prefix = f"{r['profile_prefix']}-" if r["profile_prefix"] else ""
        suffix = f"-{self.stage()}" if r["profile_by_stage"] else ""
        out = []
        for rank in range(max(1, self.eng.args.tp_size)):
            src = FIXTURES / f"{kind}-TP-{0 if cpu_only else rank % 4}.trace.json.gz"
            name = f"{prefix}{r['profile_id']}-TP-{rank}{suffix}.trace.json.gz"
            out.append((src, Path(r["output_dir"]).expanduser() / name))
        return out

    def write(self) -> None:
        """Export every rank's trace with the scheduler frozen; then idle again."""
        with self.lock:
            if self.state == "writing":
                return
            self.state = "writing"
            self.running.clear()
        secs = self.knobs.profile_write_secs
        log(f"Stop profiling{'-' + self.stage() if self.req['profile_by_stage'] else ''}... "
            f"(the scheduler is frozen while the trace is written: {secs:g} s)")
        try:
            self._pieces(self.files(), secs)
            log(f"Profiling done. Traces are saved to: {self.req['output_dir']}")
        except OSError as e:
            log(f"fake_sglang: cannot write the trace: {e}")
        finally:
            with self.lock:
                self.state = "idle"
            self.running.set()

    def _pieces(self, files: list[tuple[Path, Path]], secs: float) -> None:
        datas = [src.read_bytes() for src, _ in files]
        for _, dst in files:
            dst.parent.mkdir(parents=True, exist_ok=True)
        handles = [open(dst, "wb") for _, dst in files]  # noqa: SIM115 (closed below)
        try:
            for i in range(PIECES):
                for fh, data in zip(handles, datas, strict=True):
                    size = -(-len(data) // PIECES)
                    if not (self.knobs.profile_truncate and i == PIECES - 1):
                        fh.write(data[i * size:(i + 1) * size])  # the last piece: never
                        fh.flush()
                time.sleep(secs / PIECES)
        finally:
            for fh in handles:
                fh.close()
