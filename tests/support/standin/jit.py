"""The stand-in's "JIT compile" at start-up: a kernel cache under ``$TRITON_CACHE_DIR``.

Cold: ``compile_cold_secs`` under an O_EXCL lock file ``fake-sglang/.compiling`` (a live holder
makes a second compiler fail loudly, as DeepGEMM does, cf. DeepGEMM #301; a dead holder's lock
is taken over). Warm: ``compile_warm_secs``. Skipped when ``TRITON_CACHE_DIR`` is unset.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable

from .engine import Engine
from .util import emit, log, pid_alive, write_atomic


def compile_kernels(engine: Engine, sleep: Callable[[float], None]) -> int:
    """0 when the kernels are there (compiled or loaded), 1 on a failure (already printed)."""
    base = os.environ.get("TRITON_CACHE_DIR")
    if not base:
        log("jit cache: TRITON_CACHE_DIR is not set; skipping the fake kernel compile", "TP0")
        return 0
    role, knobs = engine.role, engine.knobs
    cdir = os.path.join(base, "fake-sglang")
    try:
        os.makedirs(cdir, exist_ok=True)
    except OSError as e:
        emit(f"{type(e).__name__}: cannot create JIT cache dir {cdir}: {e}")
        return 1
    artifact = os.path.join(cdir, f"{role}.kernels")
    t0 = time.monotonic()
    if os.path.exists(artifact):
        log(f"jit cache warm: loading kernels for role={role} from {artifact}", "TP0")
        sleep(knobs.compile_warm_secs)
        log(f"jit cache warm: loaded {artifact} in {time.monotonic() - t0:.2f} s", "TP0")
        return 0
    lock = os.path.join(cdir, ".compiling")
    err = _acquire_lock(lock, cdir)
    if err:
        emit(err)
        return 1
    log(f"jit cache cold: compiling kernels for role={role} into {cdir} "
        f"(lock {lock}, ~{knobs.compile_cold_secs:g} s)", "TP0")
    try:
        # A SIGTERM here leaves the lock behind, as a killed compile does; a later start
        # takes the stale lock over because its pid is dead.
        sleep(knobs.compile_cold_secs)
        payload = {
            "fake": True,
            "role": role,
            "model_path": engine.args.model_path,
            "tp_size": engine.args.tp_size,
            "compiled_by_pid": os.getpid(),
            "compiled_at": time.time(),
            "kernels": ["fused_moe_fake", "attention_fake", "sampling_fake"],
        }
        write_atomic(artifact, json.dumps(payload) + "\n")
    finally:
        if _read_lock_pid(lock, wait=False) == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
    log(f"jit cache cold: compiled {artifact} in {time.monotonic() - t0:.2f} s", "TP0")
    return 0


def _race(holder: int | None, cdir: str) -> str:
    return (f"RuntimeError: JIT cache race: another process (pid {holder}) is compiling into "
            f"cold cache {cdir} (FileExistsError EEXIST, cf. DeepGEMM #301)")


def _acquire_lock(lock: str, cdir: str) -> str | None:
    holder: int | None = None
    for _ in range(5):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read_lock_pid(lock, wait=True)
            if holder is not None and holder != os.getpid() and pid_alive(holder):
                return _race(holder, cdir)
            log(f"jit cache: taking over stale compile lock {lock} "
                f"(holder pid {holder} is not running)", "TP0")
            if _read_lock_pid(lock, wait=False) == holder:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return None
    return _race(holder, cdir)


def _read_lock_pid(lock: str, wait: bool) -> int | None:
    # The holder writes its pid right after the O_EXCL create; give it a moment.
    for _ in range(10 if wait else 1):
        try:
            with open(lock, encoding="utf-8") as f:
                text = f.read().strip()
        except FileNotFoundError:
            return None
        if text.isdigit():
            return int(text)
        if wait:
            time.sleep(0.05)
    return None
