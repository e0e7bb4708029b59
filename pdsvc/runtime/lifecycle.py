"""One unit's life: preflight, start, readiness, liveness, stop, exit status."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence

from .child import Child, exit_status, supervisor_exit_code
from .codes import EXIT_HUNG, EXIT_PEER, EXIT_REFUSED, KILL_WAIT_S
from .gpu import check_gpus_idle
from .jitlock import JitLock
from .notify import Log, Notifier
from .phases import PeerWatch, liveness_loop, wait_for_urls, wait_until_healthy
from .probe import (
    START_PROBE_TIMEOUT_S,
    ProbeResult,
    base_url,
    http_probe,
    liveness_url_for,
    router_start_probe,
)
from .proctree import become_subreaper


def _watchdog_hint(args: argparse.Namespace, log: Log) -> None:
    """Warn when the liveness cadence cannot keep the unit's watchdog fed."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit():
        if os.environ.get("NOTIFY_SOCKET"):
            log("WatchdogSec= is not set for this unit: failed liveness probes are only logged")
        return
    watchdog = int(usec) / 1e6
    if args.liveness_interval + args.liveness_timeout >= watchdog:
        log(
            f"warning: --liveness-interval {args.liveness_interval:g} s + --liveness-timeout "
            f"{args.liveness_timeout:g} s >= WatchdogSec={watchdog:g} s: a single slow probe "
            "gets the unit killed"
        )


def engine_fingerprint() -> str:
    """What the cached kernels depend on besides the engine's name: the SGLang (and torch)
    versions of this interpreter — the engine's own venv. An upgrade makes the cache cold
    again, so engines serialise their compiles after it too."""
    from importlib import metadata

    parts = []
    for dist in ("sglang", "torch"):
        try:
            parts.append(f"{dist}-{metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"no-{dist}")
    return "_".join(parts)


def engine_preflight(
    args: argparse.Namespace, log: Log, notifier: Notifier, child: Child
) -> tuple[int | None, JitLock | None]:
    """GPU idle check, then the JIT compile lock when the cache is cold for this engine.

    Returns (exit status, None) when the engine must not start, else (None, the lock or None).
    """
    if args.gpus:
        notifier.status(f"checking that GPUs {','.join(map(str, args.gpus))} are idle")
        if not check_gpus_idle(args.nvidia_smi, args.gpus, log):
            notifier.status("refused to start: GPUs busy or nvidia-smi failed")
            return EXIT_REFUSED, None
    if not args.jit_cache:
        return None, None
    key = f"{args.jit_key}@{engine_fingerprint()}"
    jit = JitLock(args.jit_cache, key, args.name, log, args.progress_every)
    if jit.is_warm():
        log(f"JIT cache warm for {args.jit_key}: starting without the compile lock")
        return None, jit
    try:
        taken = jit.acquire(
            should_stop=child.stopping,
            on_wait=lambda holder: notifier.status(
                f"JIT cache cold: waiting for {holder} to finish compiling"
            ),
        )
    except OSError as exc:
        log(f"cannot use JIT cache {args.jit_cache}: {exc}")
        return EXIT_REFUSED, None
    if not taken:
        log("stopped while waiting for the JIT compile lock")
        return 0, None
    log(
        f"JIT cache cold for {args.jit_key}: holding {jit.lock_path} until healthy, "
        "so engines sharing this cache compile one at a time"
    )
    return None, jit


def probes_for(args: argparse.Namespace, log: Log) -> tuple[Callable[[], ProbeResult], str, str]:
    """(start-phase probe, what it waits for, liveness URL) for the mode."""
    if args.mode == "engine":
        url = args.health_url
        return (lambda: http_probe(url, START_PROBE_TIMEOUT_S)), url, url
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env) or None
        if api_key is None:
            log(f"--api-key-env {args.api_key_env}: variable not set; probing without a key")
    probe = router_start_probe(
        args.readiness_url, args.generate_url, api_key, args.generate_timeout
    )
    what = f"{args.readiness_url} + a generation via {args.generate_url}"
    return probe, what, args.liveness_url or liveness_url_for(args.readiness_url)


def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Supervise one engine or the router; returns the exit status (see cli.EPILOG)."""
    log = Log(args.name)
    notifier = Notifier(log)
    role = args.mode
    child = Child(log, notifier, role, kill_tree=args.kill_tree,
                  prefix_output=args.prefix_output)
    child.install_signal_handlers()
    if args.kill_tree:
        failed_subreaper = become_subreaper()
        if failed_subreaper:
            log(f"cannot become a child subreaper ({failed_subreaper}): descendants that leave "
                "the process group may survive a stop")

    if args.wait_for and not wait_for_urls(
        args.wait_for,
        log=log,
        status=notifier.status,
        poll_interval=args.poll_interval,
        progress_every=args.progress_every,
        should_stop=child.stopping,
    ):
        log(f"stopped while waiting for {', '.join(args.wait_for)}")
        return 0

    jit: JitLock | None = None
    if role == "engine":
        refused, jit = engine_preflight(args, log, notifier, child)
        if refused is not None:
            return refused
    probe, what, liveness_url = probes_for(args, log)
    if child.stopping():
        log(f"stopped before the {role} was started")
        return 0

    notifier.status(f"starting {role}")
    failed = child.start(command)
    if failed is not None:
        return failed
    started = time.monotonic()
    notifier.status(f"waiting for {what}")

    outcome = wait_until_healthy(
        probe,
        child.wait,
        what=what,
        log=log,
        status=notifier.status,
        poll_interval=args.poll_interval,
        progress_every=args.progress_every,
        should_stop=child.stopping,
        started=started,
    )
    if outcome.kind == "healthy":
        if jit is not None and jit.held:
            jit.mark_warm()
            log(f"JIT cache for {args.jit_key} marked warm; compile lock released")
        serving = f"serving on {base_url(liveness_url)} (healthy after {outcome.elapsed:.1f} s)"
        notifier("READY=1", f"STATUS={serving}")
        log(f"healthy after {outcome.elapsed:.1f} s")
        _watchdog_hint(args, log)
        outcome = liveness_loop(
            lambda left=args.liveness_timeout: http_probe(
                liveness_url, max(0.05, round(min(args.liveness_timeout, left), 2))
            ),
            child.wait,
            interval=args.liveness_interval,
            log=log,
            notify=notifier,
            serving_status=serving,
            should_stop=child.stopping,
            hang_after=args.watchdog_secs,
            # a peer probe must not hold up this engine's own probes (and its watchdog)
            peers=PeerWatch(args.restart_with, args.peer_down_probes,
                            min(args.liveness_timeout, args.liveness_interval), log=log)
            if getattr(args, "restart_with", None) else None,
        )
    hung = outcome.kind == "hung"
    if outcome.kind == "peer":
        assert child.process is not None
        log(f"{outcome.detail}; stopping the {role} (SIGTERM) and exiting {EXIT_PEER} so that "
            f"the process manager restarts it")
        notifier.status(f"restarting with its peer: {outcome.detail}")
        child.stop_time = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)
    if hung:
        child.kill_now(
            f"no successful liveness probe for {outcome.elapsed:.0f} s "
            f"(--watchdog-secs {args.watchdog_secs:g}): the {role} is hung"
        )
    if outcome.kind == "stop":
        returncode = child.wait_after_stop(args.progress_every, args.stop_timeout)
    elif outcome.kind == "peer":
        # our own stop, not the manager's: its watchdog still runs, so keep it fed while the
        # engine drains (bounded by --stop-timeout, which the units pass for this)
        returncode = child.wait_after_stop(args.progress_every, args.stop_timeout,
                                           tick=lambda: notifier("WATCHDOG=1"))
    elif hung:
        returncode = child.wait(KILL_WAIT_S)
        returncode = -signal.SIGKILL if returncode is None else returncode
    else:
        returncode = outcome.returncode if outcome.returncode is not None else 1
    child.kill_leftovers()
    if jit is not None:
        jit.release()

    status = exit_status(returncode)
    last_error = child.tap.drain() if child.tap is not None and status != 0 else ""
    said = f"; its last error: {last_error}" if last_error and child.stop_signal is None else ""
    log(f"{role} exited with status {status}" + _signal_suffix(returncode) + said)
    if said:
        notifier.status(f"{role} exited with status {status}: {last_error}")
    code = supervisor_exit_code(returncode, child.stop_signal)
    if hung and child.stop_signal is None:
        log(f"exiting {EXIT_HUNG} so that the process manager restarts the {role}")
        return EXIT_HUNG
    if outcome.kind == "peer" and child.stop_signal is None:
        return EXIT_PEER
    if child.stop_signal is not None:
        stop_name = signal.Signals(child.stop_signal).name
        verdict = "a clean stop" if code == 0 else "a failed stop"
        log(f"after {stop_name}: treating it as {verdict}; exiting {code}")
    return code


def _signal_suffix(returncode: int) -> str:
    if returncode >= 0:
        return ""
    try:
        return f" (killed by {signal.Signals(-returncode).name})"
    except ValueError:
        return f" (killed by signal {-returncode})"

