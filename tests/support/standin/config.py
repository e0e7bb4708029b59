"""Every ``FAKE_SGLANG_*`` knob of the stand-in, read in one place into a typed dataclass.

``Knobs.from_env()`` reads the environment once at start; a malformed value is a
``KnobError`` (the stand-in prints it and exits 2). The latency model's own knobs
(``FAKE_SGLANG_KNEE_RATE``, ``FAKE_SGLANG_TTFT_MS``, ``FAKE_SGLANG_ITL_MS``,
``FAKE_SGLANG_EMPTY_EVERY``, ``FAKE_SGLANG_TRANSFER_FAIL_EVERY``) are read by
tests/support/fake_latency.py, which the stand-in reuses as it is; they are listed in
``LATENCY_KNOBS`` so that a test can check that no other module reads a knob of its own.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from . import pair

#: read by fake_latency.LatencyModel (tests/support/fake_latency.py), not here
LATENCY_KNOBS = (
    "FAKE_SGLANG_KNEE_RATE",
    "FAKE_SGLANG_TTFT_MS",
    "FAKE_SGLANG_ITL_MS",
    "FAKE_SGLANG_EMPTY_EVERY",
    "FAKE_SGLANG_TRANSFER_FAIL_EVERY",
    "FAKE_SGLANG_SLOT_RATE",
    "FAKE_SGLANG_SLOTS",
    "FAKE_SGLANG_ITL_SLOTS",
    "FAKE_SGLANG_ITL_BY_NCCL_PROTO",
)
ORPHAN_MAX_SECS = 900.0


def _sigterm_exit(env: Mapping[str, str]) -> int:
    """How the process ends after a SIGTERM's drain. SGLang 0.5.23 exits 0: the watchdog asks
    the schedulers to stop (ShutdownReq, sglang PR #28779), kills the children only
    (kill_process_tree(include_parent=False)) and hands the exit to uvicorn (server stop hook,
    sglang PR #39560); launch_server.py returns. Before those, it SIGKILLed itself with its tree
    (include_parent=True: status 137, as sglang PR #16484 describes). FAKE_SGLANG_CLEAN_EXIT=1
    (the old way to ask for 0) is still honoured."""
    raw = env.get("FAKE_SGLANG_SIGTERM_EXIT", "").strip().lower()
    if raw in ("", "0", "clean"):
        return 0
    if raw in ("137", "sigkill"):
        if env.get("FAKE_SGLANG_CLEAN_EXIT", "").strip().lower() in ("1", "true", "yes", "on"):
            raise KnobError("FAKE_SGLANG_SIGTERM_EXIT=137 contradicts FAKE_SGLANG_CLEAN_EXIT=1")
        return 137
    raise KnobError(f"FAKE_SGLANG_SIGTERM_EXIT must be 0 or 137 (sigkill); got {raw!r}")


class KnobError(ValueError):
    """A knob whose value cannot be used; the message names the variable."""


@dataclasses.dataclass
class Knobs:
    # ---- start-up: loading and JIT compile (lifecycle.py, jit.py)
    load_secs: float = 0.5  # FAKE_SGLANG_LOAD_SECS
    compile_cold_secs: float = 2.0  # FAKE_SGLANG_COMPILE_COLD_SECS
    compile_warm_secs: float = 0.1  # FAKE_SGLANG_COMPILE_WARM_SECS
    http_after_load: bool = False  # FAKE_SGLANG_HTTP_AFTER_LOAD
    rendezvous_timeout: float = 600.0  # FAKE_SGLANG_RENDEZVOUS_TIMEOUT
    # ---- faults (lifecycle.py, api.py)
    crash_after: float | None = None  # FAKE_SGLANG_CRASH_AFTER
    hang_after: float | None = None  # FAKE_SGLANG_HANG_AFTER
    hang_bootstrap: bool = False  # FAKE_SGLANG_HANG_BOOTSTRAP
    gen_delay: float = 0.0  # FAKE_SGLANG_GEN_DELAY
    # ---- requests that take time (generate.py; rates from fake_latency's TTFT/ITL knobs)
    paced: bool = False  # FAKE_SGLANG_PACED
    paced_tokens: int = 16  # FAKE_SGLANG_PACED_TOKENS: when a request names no max
    spawn_orphan: bool = False  # FAKE_SGLANG_SPAWN_ORPHAN
    orphan_secs: float = ORPHAN_MAX_SECS  # FAKE_SGLANG_ORPHAN_SECS (at most 900)
    # ---- shutdown (lifecycle.py)
    drain_max_secs: float | None = None  # FAKE_SGLANG_DRAIN_MAX_SECS
    drain_poll_secs: float = 0.05  # FAKE_SGLANG_DRAIN_POLL_SECS (SGLang's watchdog: 5)
    sigterm_exit: int = 0  # FAKE_SGLANG_SIGTERM_EXIT: 0 (SGLang 0.5.23) or 137 (before)
    force_shutdown: bool = False  # SGL_FORCE_SHUTDOWN (SGLang's own name, read as it reads it)
    max_lifetime: float | None = 1800.0  # FAKE_SGLANG_MAX_LIFETIME
    # ---- PD pair state (pair.py, bootstrap.py)
    stale_pair: str = "off"  # FAKE_SGLANG_STALE_PAIR
    pair_failure: str = "abort200"  # FAKE_SGLANG_PAIR_FAILURE
    pair_wait_secs: float = 2.0  # FAKE_SGLANG_PAIR_WAIT_SECS
    bootstrap_timeout: float = 2.0  # FAKE_SGLANG_BOOTSTRAP_TIMEOUT
    # ---- the profiler (profiler.py)
    profile_write_secs: float = 1.0  # FAKE_SGLANG_PROFILE_WRITE_SECS: the freeze of a write
    profile_truncate: bool = False  # FAKE_SGLANG_PROFILE_TRUNCATE: every trace ends early
    no_profile: bool = False  # FAKE_SGLANG_NO_PROFILE: no /start_profile, /stop_profile (404)
    step_ms: float = 10.0  # FAKE_SGLANG_STEP_MS: one forward step while requests are in flight
    health_check_timeout: float = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT (SGLang's own variable)
    # ---- a start refused (cli.py): SGLang refuses some MoE runner and quantization
    # combinations while it reads its arguments, before any GPU work (a ValueError, exit 1);
    # the stand-in refuses these --moe-runner-backend values the same way
    refuse_moe_backends: tuple[str, ...] = ()  # FAKE_SGLANG_REFUSE_MOE_BACKENDS (comma list)
    # ---- records
    state_dir: str | None = None  # FAKE_SGLANG_STATE_DIR
    request_log: str | None = None  # FAKE_SGLANG_LOG
    access_log: bool = False  # FAKE_SGLANG_ACCESS_LOG

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Knobs:
        env = os.environ if env is None else env

        def num(name: str, default: float | None) -> float | None:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError:
                raise KnobError(f"environment variable {name}={raw!r} is not a number") from None

        def flag(name: str) -> bool:
            return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")

        def text(name: str) -> str | None:
            return env.get(name) or None

        try:
            stale = pair.parse_stale_mode(env.get("FAKE_SGLANG_STALE_PAIR"))
            failure = pair.parse_failure_mode(env.get("FAKE_SGLANG_PAIR_FAILURE"))
        except ValueError as e:
            raise KnobError(f"FAKE_SGLANG_STALE_PAIR/FAKE_SGLANG_PAIR_FAILURE: {e}") from None
        return cls(
            refuse_moe_backends=tuple(x.strip() for x in (
                env.get("FAKE_SGLANG_REFUSE_MOE_BACKENDS") or "").split(",") if x.strip()),
            load_secs=num("FAKE_SGLANG_LOAD_SECS", 0.5) or 0.0,
            compile_cold_secs=num("FAKE_SGLANG_COMPILE_COLD_SECS", 2.0) or 0.0,
            compile_warm_secs=num("FAKE_SGLANG_COMPILE_WARM_SECS", 0.1) or 0.0,
            http_after_load=flag("FAKE_SGLANG_HTTP_AFTER_LOAD"),
            rendezvous_timeout=num("FAKE_SGLANG_RENDEZVOUS_TIMEOUT", 600.0) or 0.0,
            crash_after=num("FAKE_SGLANG_CRASH_AFTER", None),
            hang_after=num("FAKE_SGLANG_HANG_AFTER", None),
            hang_bootstrap=flag("FAKE_SGLANG_HANG_BOOTSTRAP"),
            gen_delay=num("FAKE_SGLANG_GEN_DELAY", 0.0) or 0.0,
            paced=flag("FAKE_SGLANG_PACED"),
            paced_tokens=max(1, int(num("FAKE_SGLANG_PACED_TOKENS", 16) or 16)),
            spawn_orphan=flag("FAKE_SGLANG_SPAWN_ORPHAN"),
            orphan_secs=min(ORPHAN_MAX_SECS,
                            num("FAKE_SGLANG_ORPHAN_SECS", ORPHAN_MAX_SECS) or 0.0),
            drain_max_secs=num("FAKE_SGLANG_DRAIN_MAX_SECS", None),
            drain_poll_secs=max(0.01, num("FAKE_SGLANG_DRAIN_POLL_SECS", 0.05) or 0.0),
            sigterm_exit=_sigterm_exit(env),
            # tokenizer_manager.sigterm_watchdog: get_bool_env_var("SGL_FORCE_SHUTDOWN"), which
            # only "true"/"1" turn on; environ.py copies SGL_* to SGLANG_*, never back, so
            # SGLANG_FORCE_SHUTDOWN alone does not force anything in 0.5.23
            force_shutdown=env.get("SGL_FORCE_SHUTDOWN", "").strip().lower() in ("1", "true"),
            max_lifetime=num("FAKE_SGLANG_MAX_LIFETIME", 1800.0),
            stale_pair=stale,
            pair_failure=failure,
            pair_wait_secs=num("FAKE_SGLANG_PAIR_WAIT_SECS", 2.0) or 0.0,
            bootstrap_timeout=num("FAKE_SGLANG_BOOTSTRAP_TIMEOUT", 2.0) or 2.0,
            profile_write_secs=num("FAKE_SGLANG_PROFILE_WRITE_SECS", 1.0) or 0.0,
            profile_truncate=flag("FAKE_SGLANG_PROFILE_TRUNCATE"),
            no_profile=flag("FAKE_SGLANG_NO_PROFILE"),
            step_ms=num("FAKE_SGLANG_STEP_MS", 10.0) or 10.0,
            health_check_timeout=num("SGLANG_HEALTH_CHECK_TIMEOUT", 20.0) or 20.0,
            state_dir=text("FAKE_SGLANG_STATE_DIR"),
            request_log=text("FAKE_SGLANG_LOG"),
            access_log=flag("FAKE_SGLANG_ACCESS_LOG"),
        )
