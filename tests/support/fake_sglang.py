"""fake_sglang: a TEST STAND-IN for ``python -m sglang.launch_server``.

Test support only: it is NOT part of the rendered product and pdsvc never installs or renders it.
pdsvc's tests run it where a real unit would run SGLang, so that rendered units, the real
sglang-router and the failure handling can be exercised on a machine without a GPU. It is
stdlib-only (Python >= 3.10) and takes exactly the argv that ``sglang.launch_server`` gets::

    python -m fake_sglang ARGS            # with tests/support on PYTHONPATH
    python tests/support/fake_sglang.py ARGS

This file is the entry point and the manual; the code is the package ``standin/`` beside it,
one module per concern (``standin/__init__.py`` lists them).

Flags it reads (every other ``--flag [value]`` and any stray token is accepted and ignored;
standin/cli.py): ``--model-path/--model`` (must be an existing directory, else
``OSError: Incorrect path_or_model_id`` and exit 1), ``--served-model-name``,
``--tokenizer-path``, ``--host`` (127.0.0.1), ``--port`` (30000),
``--disaggregation-mode {null,prefill,decode}``, ``--disaggregation-bootstrap-port`` (8998),
``--disaggregation-transfer-backend``, ``--tp/--tp-size``, ``--dp/--dp-size``,
``--dist-init-addr``, ``--api-key``, ``--max-running-requests``, ``--enable-metrics``
(``/metrics`` is 404 without it, as in SGLang), ``--nnodes``/``--node-rank``.

Behaviour, in the order it happens:

* start-up (standin/lifecycle.py, jit.py, rendezvous.py): binds the prefill bootstrap server
  (prefill only) and the HTTP port at once (``FAKE_SGLANG_HTTP_AFTER_LOAD=1``: only after
  loading, as SGLang does); ``/health`` and ``/health_generate`` answer 503 until loading is
  done; "loads weights" for ``FAKE_SGLANG_LOAD_SECS``, then "JIT-compiles" into
  ``$TRITON_CACHE_DIR/fake-sglang/`` under a lock (cold/warm times are knobs); with
  ``--nnodes`` > 1 rank 0 waits at ``--dist-init-addr`` for the other ranks, which serve no
  HTTP, and a lost peer is fatal on both sides, like an NCCL error;
* requests (standin/api.py, generate.py): SGLang's HTTP API, native and OpenAI generation,
  stream and non-stream; PD requests must carry the router's ``bootstrap_*`` fields (400
  otherwise). Requests that take time: with ``FAKE_SGLANG_PACED=1`` (or control ``paced``, or
  ``fake_ttft_ms``/``fake_itl_ms`` in a request) the first token comes after
  ``FAKE_SGLANG_TTFT_MS`` and each next one after ``FAKE_SGLANG_ITL_MS`` (the latency model's
  knobs and knee, tests/support/fake_latency.py), streamed as it comes or returned whole;
  tokens per request: its ``max_new_tokens`` / ``max_tokens`` (else
  ``FAKE_SGLANG_PACED_TOKENS``, 16); a prefill pays the TTFT only;
* PD pairing (standin/bootstrap.py, pair.py): a decode reaches the prefill's bootstrap server
  named in each request (500 "KV transfer failed" if unreachable) and registers there; each
  side remembers its peer's instance and, when ``FAKE_SGLANG_STALE_PAIR`` names its role, goes
  stale once that peer is replaced (sglang #33789 / PR #34289; smg #2382, vllm #49238);
* SIGTERM (standin/lifecycle.py), as SGLang 0.5.23's ``sigterm_watchdog`` handles it:
  /health, /health_generate and /ready answer 503 at once, NEW requests are still accepted and
  served, in-flight ones finish (no bound; ``FAKE_SGLANG_DRAIN_MAX_SECS`` stands in for
  systemd's TimeoutStopSec), checked every ``FAKE_SGLANG_DRAIN_POLL_SECS`` (SGLang: 5 s);
  an unhealthy engine (``health: "fail"``) or ``SGL_FORCE_SHUTDOWN=1`` skips the drain; then
  it SIGKILLs its descendants (not itself) and exits 0 (``FAKE_SGLANG_SIGTERM_EXIT=137``: the
  SIGKILL-itself exit of SGLang before its graceful stop);
* kill -9 (or ``crash``): the sockets close with the process; a client in the middle of a
  reply sees the connection drop (a stream's chunked body ends incomplete);
* the profiler (standin/profiler.py): ``/start_profile`` and ``/stop_profile`` as SGLang
  0.5.23 answers them, N forward steps counted while requests are in flight, one real
  PyTorch-profiler trace per TP rank (tests/fixtures/traces) written in pieces while the
  scheduler is frozen for ``FAKE_SGLANG_PROFILE_WRITE_SECS``: no token, /health 503 after
  ``SGLANG_HEALTH_CHECK_TIMEOUT``; ``--admin-api-key`` guards it.

Knobs: every ``FAKE_SGLANG_*`` environment variable is read in standin/config.py (``Knobs``,
one field per knob, with its default), except the latency model's own
(tests/support/fake_latency.py: ``FAKE_SGLANG_KNEE_RATE`` …).

Runtime control (main port, never needs the API key, never hangs): ``POST /_fake/control``
with a JSON object of ``hang`` (bool), ``hang_bootstrap`` (bool), ``health`` ("ok"|"fail"),
``gen_delay`` (seconds), ``paced`` (bool), ``crash`` (true: exit 1 right after replying),
``stale_pair`` (off|decode|prefill|both), ``pair_failure`` (abort200|error500),
``new_instance`` (true: a fresh instance id and empty peer memory, a replaced process behind
the same ports);
``GET /_fake/control`` returns the current state (including ``instance_id``, ``peers``,
``stale_peers``).
"""

from __future__ import annotations

import os
import sys

# The package standin/ lies beside this file. Run as a script, as ``python -m fake_sglang``
# with tests/support on the path, or imported by a test: it is found the same way each time.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from standin.cli import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
