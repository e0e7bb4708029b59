"""Zero failed requests: what a client sees while one engine of a running 2P2D
deployment restarts, dies or is changed, under a real systemd (nspawn), the stand-in engines
and both real routers (sglang-router 0.3.2, smg 1.13.0).

Steady load through the router (tests/support/loadgen.py: 6 requests a second, half of them
streamed, each ~0.5-1 s, every one judged by content: an HTTP 200 that aborted or came back
empty fails, a stream without its final chunk and [DONE] is cut), then one event at a time
(tests/support/zero_loss.py), each after a steady window at full capacity:

  systemctl restart of one prefill, then of one decode;
  kill -9 of one prefill's engine, then of one decode's, then of each one's runtime (the
  unit's main process, as the OOM killer would: its ExecStopPost= takes the engine out);
  systemctl restart of the router;
  `pdsvc apply` of a pair-compatible change and of a pair-incompatible change, and a 1P1D
  apply's outage against the engine's load time;
  then with two routers behind HAProxy (router.replicas: 2): a restart of one router, a kill
  -9 of the other, both restarted in turn (an upgrade), `pdsvc apply` of a router change, and
  the latency and memory the front adds.

For each: requests sent while it lasted, failed (by kind), p99 latency of the good requests
before and during, and the seconds until full capacity (every engine active, the hit one a
new process, the router listing every engine healthy). Goals: 0 failed for an
apply or a restart of one engine; for kill -9 of one engine 0 non-streamed and no more
streams cut than were in flight on that engine (the bound is printed as ≤N); a router
restart as few as the routers allow.

    sudo python benchmarks/zero_loss.py        # needs root, systemd-nspawn, .venv-serve
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))

import zero_loss as zl  # noqa: E402

VENV = REPO / ".venv-serve"


def events(stack: zl.Stack, ld: zl.Load, which: tuple[zl.Event, ...]) -> None:
    """Each event's row, as it ends, with what it misses of its goal."""
    for event in which:
        out = zl.run_event(stack, ld, event)
        miss = "; ".join(out.misses())
        print(out.row() + (f"   MISSES: {miss}" if miss else ""), flush=True)


def run(package: str) -> None:
    with zl.loaded(Path(tempfile.mkdtemp(prefix="pdsvc-zero-loss-")), VENV,
                   package) as (stack, ld):
        events(stack, ld, zl.EVENTS)
        print(f"  (load: {len(ld.results)} requests in all, {ld.skipped} not sent for "
              f"{ld.max_in_flight} in flight)")
    print("  " + zl.apply_outage_1p1d(Path(tempfile.mkdtemp(prefix="pdsvc-zero-loss-1p1d-")),
                                      VENV, package))
    run_front(package)


def run_front(package: str) -> None:
    """router.replicas: 2 behind HAProxy: the router's own events, then what the front costs
    (latency beside the router alone, in the same run; memory)."""
    with zl.loaded(Path(tempfile.mkdtemp(prefix="pdsvc-zero-loss-front-")), VENV, package,
                   front=True) as (stack, ld):
        events(stack, ld, zl.FRONT_EVENTS)
        print(f"  {zl.front_latency(stack)[1]}\n  {zl.front_memory(stack)}", flush=True)


def main() -> None:
    print(f"# python benchmarks/zero_loss.py — {time.strftime('%Y-%m-%d')}; real systemd in "
          f"nspawn, stand-in engines: load {zl.LOAD_SECS:g} s, every generation "
          f"{zl.GEN_DELAY:g} s, streams {zl.TOKENS} tokens every {zl.ITL_MS} ms; "
          f"{zl.RATE:g} requests/s, half streamed")
    for package in sys.argv[1:] or ("sglang-router", "smg"):
        run(package)


if __name__ == "__main__":
    main()
