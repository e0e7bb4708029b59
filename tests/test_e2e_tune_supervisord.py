"""`pdsvc tune` on a supervisord bundle under the REAL supervisord (the serve venv's), with
the real router (the config's default, sglang-router; both routers are test_e2e_tune's under
systemd), SGLang's own bench_serving and the stand-in engines on free 127.0.0.1 ports: a 2P2D
stack whose decodes run 2 slots (FAKE_SGLANG_SLOTS) is tuned over one lever, 16 slots, while a
side load runs through the router (the designed space: tests/support/tune_designed.py).

Checked: the 16-slot candidate wins (each of its measurements beats each of the baseline's),
supervisord runs it at the end (the decodes' argv), and no request of the side load failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bench_stack import make_tokenizer
from conftest import REPO
from test_e2e_supervisord import SupervisordStack
from tune_designed import BASE_SLOTS, BEST_LEVER, BEST_SLOTS, ENV, space

pytestmark = pytest.mark.e2e

SPACE = space()


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[SupervisordStack]:
    s = SupervisordStack(tmp_path_factory.mktemp("sv-tune"), serve_python.parent.parent,
                         engines=2, format="supervisord", **{
                             "router.policy": "round_robin",
                             "runtime.env.FAKE_SGLANG_SLOTS": BASE_SLOTS, **ENV})
    make_tokenizer(serve_python, s.work / "model")
    try:
        s.start()
        s.wait_serving(180, "the 2P2D stack serves after `supervisord -c`")
        yield s
    finally:
        s.down()


def side_load(s: SupervisordStack, stop: threading.Event, results: list) -> None:
    while not stop.is_set():
        code, body = s.generate(timeout=20)
        results.append((code == 200 and "hello from fake engine" in body, code, body[-200:]))
        time.sleep(0.2)


def test_tune_switches_supervisord_programs_to_the_best_while_serving(
        stack: SupervisordStack, tmp_path: Path) -> None:
    space = tmp_path / "tune.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO}/tests/support/bench_site"}
    stop, load = threading.Event(), []
    loop = threading.Thread(target=side_load, args=(stack, stop, load), daemon=True)
    loop.start()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pdsvc.cli", "tune", "-c", str(stack.work / "config.yaml"),
             "--topology", str(stack.work / "topology.json"), "-o", str(stack.bundle),
             "--space", str(space), "--results", str(tmp_path / "results"),
             "--drain-timeout", "20", "--step-timeout", "120", "--json"],
            capture_output=True, text=True, timeout=1200, check=False, env=env,
            stdin=subprocess.DEVNULL)
    finally:
        stop.set()
        loop.join(30)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    doc = json.loads(r.stdout)
    assert doc["wins"] and doc["best"]["changes"] == {BEST_LEVER: BEST_SLOTS}, doc["verdict"]
    base, best = ([g["rate"] for g in doc[k]["goodput"]] for k in ("baseline", "best"))
    print(f"\ngoodput: baseline {base}, best {best} req/s")
    assert min(best) > max(base)
    for d in ("decode-0", "decode-1"):
        assert f"--cuda-graph-max-bs-decode {BEST_SLOTS}" in stack.cmdline(stack.engine_pid(d))
    bad = [x for x in load if not x[0]]
    print(f"side load: {len(load)} requests, {len(bad)} failed")
    assert len(load) > 20 and not bad, bad[:5]
