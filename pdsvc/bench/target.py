"""What `pdsvc bench` loads and how: everything from the plan, nothing typed by hand.

The command line is SGLang's own load generator, ``python -m sglang.bench_serving``
(sglang/benchmark/serving.py since 0.5.2x; the old module name is kept as an alias, so one
command works on older venvs too), run by the deployment's ``runtime.python``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pdsvc.plan.build import Plan

BENCH_MODULE = "sglang.bench_serving"


@dataclass(frozen=True)
class Target:
    """The deployment as a benchmark sees it."""

    python: str  # runtime.python: the venv with sglang (and so bench_serving)
    url: str  # the router's base URL (or --url)
    model_path: str  # model.path: also the tokenizer (bench_serving --tokenizer)
    served_name: str  # what /v1/models lists (model.served_name, else the path)
    engines: tuple[tuple[str, str], ...]  # (unit name, base URL) of every engine to watch
    owned: bool  # False: --url pointed elsewhere (no engines, no canary to read)

    @property
    def offline(self) -> bool:
        """A local model path: the tokenizer is read from it, never from the hub."""
        return self.model_path.startswith("/")


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def target_from_plan(plan: Plan, url: str | None = None) -> Target:
    """The router the plan's clients use (as this host reaches it), the model and tokenizer
    from the engines' own ``--model-path``/``--served-model-name``, every HTTP-serving engine
    (rank 0) to watch. ``url``: load another endpoint instead (then nothing is watched)."""
    rank0 = [e for e in plan.engines if e.node_rank == 0]
    model_args = rank0[0].model_args if rank0 else ()
    model_path = _flag(model_args, "--model-path") or ""
    served = _flag(model_args, "--served-model-name") or model_path
    router = plan.router or plan.reachable_router()
    engines = tuple(dict.fromkeys((e.name, e.url) for e in rank0))
    if url is not None:
        return Target(plan.python, url.rstrip("/"), model_path, served, (), owned=False)
    client = plan.front.url if plan.front else router.url  # the front: one host (checks)
    return Target(plan.python, client.rstrip("/"), model_path, served, engines, owned=True)


@dataclass(frozen=True)
class Load:
    """One run's load: a Poisson arrival rate and fixed input/output lengths."""

    rate: float  # requests/s (inf: as fast as ``concurrency`` allows)
    input_len: int
    output_len: int
    num_prompts: int
    seed: int = 1
    concurrency: int | None = None  # at most this many requests in flight (None: no bound)


def bench_argv(target: Target, load: Load, output_file: str) -> list[str]:
    """The exact bench_serving command line of one run (every flag is checked by
    bench_serving's own parser in tests/test_bench_argv.py).

    * ``--backend sglang``: SGLang's native /generate, streamed; the router serves it in PD
      mode and the stream carries ``meta_info.completion_tokens`` per chunk.
    * ``--dataset-name random-ids``: prompts of random token ids from the tokenizer's
      vocabulary; ``random`` would download ShareGPT first. ``--random-range-ratio 1``: the
      lengths exactly as given.
    * ``--pd-separated``: the deployment is PD (PR #11542); in 0.5.23 it only changes
      where ``--profile`` is sent.
    * ``--output-details``: per-request TTFT, ITLs, texts and errors, which the gates and
      the SLO need (the summary alone hides an empty completion: srt-slurm #429).
    """
    return [
        target.python, "-m", BENCH_MODULE,
        "--backend", "sglang",
        "--base-url", target.url,
        "--model", target.model_path,
        "--served-model-name", target.served_name,
        "--tokenizer", target.model_path,
        "--dataset-name", "random-ids",
        "--random-input-len", str(load.input_len),
        "--random-output-len", str(load.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(load.num_prompts),
        "--request-rate", f"{load.rate:g}",
        "--seed", str(load.seed),
        "--warmup-requests", "1",
        "--ready-check-timeout-sec", "30",
        "--pd-separated",
        "--disable-tqdm",
        "--output-file", output_file,
        "--output-details",
        *(("--max-concurrency", str(load.concurrency)) if load.concurrency else ()),
    ]


def bench_env(target: Target, base: Mapping[str, str]) -> dict[str, str]:
    """The subprocess's environment: the caller's, and with a local model the hub is off
    (the tokenizer comes from model.path; nothing is downloaded at run time)."""
    env = dict(base)
    if target.offline:
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def current_env() -> dict[str, str]:
    return dict(os.environ)


@dataclass(frozen=True)
class Foreign:
    """Why the router at the plan's URL is not (yet) this deployment serving."""

    why: str
    engine_down: bool = False  # the router lists the model, an engine's /health failed


def foreign(target: Target) -> Foreign | None:
    """Why the router at the plan's URL is not this deployment (None: it is): it lists the
    plan's model, and each of the plan's engines answers /health."""
    from pdsvc.status.collect import http_get

    models = http_get(f"{target.url}/v1/models", timeout=5)
    if not models.ok:
        return Foreign(f"{target.url}/v1/models: {models.summary()}")
    try:
        ids = [m.get("id") for m in json.loads(models.body).get("data", [])]
    except (ValueError, AttributeError):
        ids = []
    if target.served_name not in ids and target.model_path not in ids:
        return Foreign(f"{target.url} serves {ids or 'no model'}, not the plan's "
                       f"{target.served_name!r}")
    for name, url in target.engines:
        health = http_get(f"{url}/health", timeout=5)
        if not health.ok:
            return Foreign(f"the plan's engine {name} at {url}: /health {health.summary()}",
                           engine_down=True)
    return None

