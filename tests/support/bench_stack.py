"""A stand-in PD stack on loopback for `pdsvc bench`'s tests: two fake_sglang engines (prefill,
decode with the latency model of fake_latency.py), the real sglang-router in PD mode in front,
a local tokenizer as the "model", and a config whose plan points at all of it.

Every process binds 127.0.0.1 only and is bounded: the engines by FAKE_SGLANG_MAX_LIFETIME,
the router by `timeout`; `down()` stops all of them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from ports import free_ports

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parent.parent
LIFETIME = 900  # seconds: no process of a stack outlives this

TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "tok": 1, **{f"w{i}": i for i in range(2, 512)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def make_tokenizer(python: Path, where: Path) -> Path:
    """A 512-word WordLevel tokenizer saved as a model directory (no hub, no weights)."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(python), "-c", TOKENIZER, str(where)], check=True, timeout=120)
    return where


def _up(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not 200 within {timeout:g}s")


#: The stack and the benchmark client run ahead of the rest of the machine (root may raise a
#: priority; anyone else runs at the usual one). What `pdsvc bench --slo` measures here is the
#: stand-in's capacity, its knee; on a machine the suite's other workers keep busy, the client's
#: sends come late and bunched and the queue they build moves the knee found by more than the
#: 10 % the test allows (0.898 of it once in four parallel runs of the suite).
NICE = -10


def _ahead() -> None:
    """In the child, before exec: run ahead of the machine's other work when allowed."""
    with contextlib.suppress(OSError):
        os.nice(NICE)


@dataclass
class BenchStack:
    work: Path
    python: Path
    config: Path
    router_url: str
    prefill_url: str = ""
    decode_url: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)

    @classmethod
    def up(cls, work: Path, python: Path, engine_env: dict[str, str]) -> BenchStack:
        model = make_tokenizer(python, work / "model")
        pport, bport, dport, rport, mport = free_ports(5)
        cfg = {
            "name": "bench",
            "model": {"path": str(model), "served_name": "stand-in"},
            "runtime": {"python": str(python)},
            "prefill": {"port": pport, "bootstrap_port": bport},
            "decode": {"port": dport},
            "metrics": {"engines": True},  # --enable-metrics (the default), for the gates
            "router": {"host": "127.0.0.1", "port": rport, "prometheus_port": mport},
        }
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(cfg))
        stack = cls(work, python, config, f"http://127.0.0.1:{rport}",
                    f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}")
        env = {**os.environ, "PYTHONPATH": str(SUPPORT), "FAKE_SGLANG_LOAD_SECS": "0.2",
               "FAKE_SGLANG_MAX_LIFETIME": str(LIFETIME), **engine_env}
        env.pop("TRITON_CACHE_DIR", None)
        common = ["--model-path", str(model), "--served-model-name", "stand-in",
                  "--host", "127.0.0.1", "--enable-metrics",
                  "--disaggregation-transfer-backend", "nixl"]
        try:
            for role, port in (("prefill", pport), ("decode", dport)):
                log = open(work / f"{role}.log", "w")  # noqa: SIM115 - the process keeps it
                stack.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "fake_sglang", *common, "--port", str(port),
                     "--disaggregation-mode", role, "--disaggregation-bootstrap-port",
                     str(bport)], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                    preexec_fn=_ahead))
            _up(f"http://127.0.0.1:{pport}/health", 30)
            _up(f"http://127.0.0.1:{dport}/health", 30)
            log = open(work / "router.log", "w")  # noqa: SIM115
            stack.procs.append(subprocess.Popen(
                ["timeout", str(LIFETIME), str(python), "-m", "sglang_router.launch_router",
                 "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{pport}", str(bport),
                 "--decode", f"http://127.0.0.1:{dport}", "--host", "127.0.0.1",
                 "--port", str(rport), "--prometheus-host", "127.0.0.1",
                 "--prometheus-port", str(mport), "--disable-circuit-breaker"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_ahead))
            _up(f"{stack.router_url}/readiness", 60)
        except BaseException:
            stack.down()
            raise
        return stack

    def bench(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`pdsvc bench` against this stack, as a user runs it (bench_site on PYTHONPATH:
        the test venv's stand-ins for triton; see bench_site/sitecustomize.py)."""
        env = {**os.environ, "PYTHONPATH": str(SUPPORT / "bench_site")}
        return subprocess.run(
            [sys.executable, "-m", "pdsvc.cli", "bench", "-c", str(self.config),
             "--topology", str(REPO / "etc/seed-host.topology.json"),
             "-o", str(self.work / "out"), "--state-dir", str(self.work / "state"), *args],
            capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout,
            preexec_fn=_ahead)

    def down(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
