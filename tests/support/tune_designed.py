"""The designed search space of the `pdsvc tune` end-to-end tests (test_e2e_tune.py,
test_e2e_tune_supervisord.py): two capacities 8× apart, so that any valid measurement tells
them apart, on any machine, in as few bench_serving runs as the SLO search allows. These
tests check the orchestration (switch, a refused candidate, going back, SIGTERM and resume,
ending on the answer, the side load); the measurement's precision is benchmarks/tune.py's.

The stand-in's capacity (tests/support/fake_latency.py): a decode serves SLOT_RATE requests/s
per slot, its slots the smallest capacity flag it was given. Two decodes behind a round-robin
router:

* the baseline, BASE_SLOTS a decode: 2 × 2 × 2 = 8 req/s;
* the best, BEST_SLOTS a decode: 2 × 16 × 2 = 64 req/s.

The SLO search bisects rates 4..144 geometrically, to a precision of 5 (it stops once the
range is within 6×): one run at the middle, 24 req/s, then one at an end. So each measurement
is two runs:

* the baseline misses the SLO at 24 (3× its capacity: each request queues a third of a
  service time more than the one before it, ~1.2 s by the 8th a decode, over the 1 s TTFT
  bound for a third of them) and meets it at 4 (half its capacity), or misses it there too
  when the tests' side load (up to 5 req/s more) fills the rest: goodput 4 or none (0), below
  24 either way;
* the best meets it at 24 (under 0.4 of its capacity) and at 144 (2.25× its capacity but 16
  requests queue it ~0.15 s at most): goodput ≥ 144, or 24 where a busy machine slows the
  burst past the TTFT bound — either way above anything the baseline measures.

So one measurement of each tells them apart: the baseline and the best are measured once
(``repeats: 1``); the repeats' rules are tests/test_tune_search.py's, with a designed fake.

The ITL bound, 100 ms, is 5× the best's designed 20 ms (10 ms × (1 + 16/ITL_SLOTS)): a busy
machine's scheduling cannot break it, and no lever here is judged by it.
"""

from __future__ import annotations

BASE_SLOTS, BEST_SLOTS = 2, 16
SLOT_RATE = 2  # FAKE_SGLANG_SLOT_RATE: requests/s per slot
ITL_SLOTS = 16  # FAKE_SGLANG_ITL_SLOTS: the ITL doubles at 16 slots
BEST_LEVER = "decode.args.cuda-graph-max-bs-decode"

#: the stand-in's environment of the stack tuned (runtime.env)
ENV = {"runtime.env.FAKE_SGLANG_SLOT_RATE": SLOT_RATE,
       "runtime.env.FAKE_SGLANG_ITL_SLOTS": ITL_SLOTS}


def space(**levers: list) -> dict:
    """The space: the designed SLO, workload and rates, one measurement of the baseline and
    of the best, and ``levers`` (the best lever's BEST_SLOTS when none is given)."""
    return {
        "slo": {"ttft_ms": 1000, "itl_ms": 100, "share": 0.99},
        "workload": {"input_len": 16, "output_len": 8, "num_prompts": 16},
        "rates": {"low": 4, "high": 144, "precision": 5.0},
        "engine_load_secs": 2,
        "repeats": 1,
        "search": "one-at-a-time",
        "levers": levers or {BEST_LEVER: [BEST_SLOTS]},
    }
