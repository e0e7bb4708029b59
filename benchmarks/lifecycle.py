"""Lifecycle figures under a real systemd (nspawn), the stand-in engines and the real router.

Prints, from one run on one machine (so ratios compare like with like):
  readiness  — last engine READY → target active (goal ≤ 1 s), with its parts;
  recovery   — decode `kill -9` → first good request through the router
               (goal ≤ RestartSec + engine start + 5 s);
  warm/cold  — engine phase and whole stack start: cold cache, warm cache, and the two engines
               started one after the other (goal: warm ≈ max(prefill, decode) ≤ 0.6 × serial).
Times come from systemd's own monotonic timestamps where it has them.

    sudo python benchmarks/lifecycle.py        # needs root, systemd-nspawn, .venv-serve
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

from stack import Stack  # noqa: E402

LOAD, COLD, WARM = 3.0, 4.0, 0.2  # stand-in engine: weights, cold compile, warm compile (s)


def ts(stack: Stack, unit: str, prop: str) -> float:
    return int(stack.prop(unit, prop)) / 1e6


def engines_up(stack: Stack, t0: float) -> float:
    """Seconds from t0 (monotonic, container clock) until both engines were active."""
    return max(ts(stack, stack.unit(r), "ActiveEnterTimestampMonotonic") for r in
               ("prefill", "decode")) - t0


def now_in_container(stack: Stack) -> float:
    return float(stack.c.run(["cat", "/proc/uptime"]).stdout.split()[0])


ROUTER_VENV = REPO / ".venv-router"  # sglang-router alone, no sglang


def router_only_venv() -> Path:
    """A venv with sglang-router and not sglang: its launcher then skips importing sglang."""
    if not (ROUTER_VENV / "bin" / "python").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(ROUTER_VENV)], check=True)
        subprocess.run([str(ROUTER_VENV / "bin" / "pip"), "install", "-q",
                        "sglang-router==0.3.2"], check=True)
    return ROUTER_VENV / "bin" / "python"


def up(work: Path, **extra: object) -> Stack:
    return Stack.up(work, REPO / ".venv-serve", start=False, **{
        "runtime.env.FAKE_SGLANG_LOAD_SECS": LOAD,
        "runtime.env.FAKE_SGLANG_COMPILE_COLD_SECS": COLD,
        "runtime.env.FAKE_SGLANG_COMPILE_WARM_SECS": WARM,
        **extra,
    })


def readiness_rows(stack: Stack, label: str) -> list[tuple[str, float | None, str]]:
    last_ready = max(ts(stack, stack.unit(r), "ActiveEnterTimestampMonotonic")
                     for r in ("prefill", "decode"))
    router_exec = ts(stack, stack.unit("router"), "ExecMainStartTimestampMonotonic")
    router_ready = ts(stack, stack.unit("router"), "ActiveEnterTimestampMonotonic")
    target_ready = ts(stack, stack.target, "ActiveEnterTimestampMonotonic")
    return [
        (f"readiness ({label}): last engine READY → target active",
         target_ready - last_ready, "goal ≤ 1 s"),
        ("  of which systemd dispatch (→ router exec)", router_exec - last_ready, ""),
        ("  of which router boot + registration + 1 generation", router_ready - router_exec, ""),
        ("  of which router READY → target active", target_ready - router_ready, ""),
    ]


def main() -> None:
    rows: list[tuple[str, float | None, str]] = []
    # the router from the engines' venv (sglang installed beside it)
    shared = up(Path(tempfile.mkdtemp(prefix="pdsvc-bench-")))
    try:
        shared.start()
        rows += readiness_rows(shared, "router in the sglang venv")
    finally:
        shared.down()
    stack = up(Path(tempfile.mkdtemp(prefix="pdsvc-bench-")),
               **{"router.python": str(router_only_venv())})
    try:
        # cold: empty JIT cache, whole stack
        t0 = now_in_container(stack)
        cold_total = stack.start()
        cold_engines = engines_up(stack, t0)
        rows += readiness_rows(stack, "router.python: a router-only venv")

        # recovery: decode kill -9 → first good request through the router
        recoveries = []
        for _ in range(3):
            before = stack.restarts("decode")
            t = time.monotonic()
            stack.c.run(["kill", "-9", str(stack.engine_pid("decode"))])
            stack.c.wait_for(lambda b=before: stack.restarts("decode") > b, 60, interval=0.1,
                             what="decode restarted")
            stack.c.wait_for(lambda: stack.generate(timeout=5)[0] == 200, 120, interval=0.1,
                             what="first good request")
            recoveries.append(time.monotonic() - t)
        restart = stack.plan["lifecycle"]["restart_secs"]
        engine_start = LOAD + WARM
        rows.append(("recovery: decode kill -9 → first good request (median of 3)",
                     statistics.median(recoveries),
                     f"goal ≤ RestartSec {restart} + start {engine_start:g} + 5 = "
                     f"{restart + engine_start + 5:g} s"))

        # warm: whole stack again, cache warm
        stack.stop()
        t0 = now_in_container(stack)
        warm_total = stack.start()
        warm_engines = engines_up(stack, t0)
        # serial: the two engines one after the other (warm), then the router
        stack.stop()
        t0 = now_in_container(stack)
        t = time.monotonic()
        stack.c.systemctl("start", stack.unit("prefill"))
        stack.c.systemctl("start", stack.unit("decode"))
        serial_engines = engines_up(stack, t0)
        stack.c.systemctl("start", stack.target)
        serial_total = time.monotonic() - t
        rows += [
            ("engines up, cold cache (compiles serialised)", cold_engines, ""),
            ("engines up, warm cache (parallel)", warm_engines,
             f"max(prefill, decode) ≈ {engine_start:g} s"),
            ("engines up, serial (prefill then decode)", serial_engines, ""),
            ("warm / serial, engine phase", warm_engines / serial_engines, "goal ≤ 0.6"),
            ("whole stack: cold / warm / serial (s)", None,
             f"{cold_total:.1f} / {warm_total:.1f} / {serial_total:.1f}"),
            ("warm / serial, whole stack", warm_total / serial_total, ""),
        ]
        print(f"stand-in engine: load {LOAD:g} s, cold compile {COLD:g} s, warm {WARM:g} s; "
              "real sglang-router 0.3.2; real systemd 252 in nspawn")
        for name, value, note in rows:
            shown = "" if value is None else (f"{value:7.3f}" if "/" in name and "(s)" not in name
                                              else f"{value:7.2f} s")
            print(f"{name:<62} {shown:>10}  {note}")
    finally:
        stack.down()


if __name__ == "__main__":
    main()
