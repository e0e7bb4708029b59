"""`pdsvc tune` never stops serving without --allow-outage, under a real systemd (nspawn), the
real router and the stand-in engines: a 1P1D stack (every engine change restarts the one decode
or the one prefill: an outage) whose config file has a decode flag edited and not applied.

Issue 51 saw, on this very setup, tune restart the decode ("step 1/1 done in 9.0 s") and 2 of
32 requests of a steady load fail with 503: the first switch was refused, and the way back
applied the same config with an outage allowed. Checked: tune ends at once (exit 1) saying the
deployment does not run the file and that applying it would stop serving, nothing changed
(the decode's invocation, its flags), and no request of the side load failed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bench_stack import make_tokenizer
from conftest import REPO, require
from loadgen import Load, failures
from nspawn import nspawn_available
from stack import APPLY_DIR, Stack, pdsvc_argv
from tune_designed import BASE_SLOTS, BEST_LEVER, ENV, space

pytestmark = pytest.mark.e2e

EDITED = BASE_SLOTS + 1  # the decode flag in the file, not applied


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    work = tmp_path_factory.mktemp("e2e-tune-outage")
    make_tokenizer(serve_python, work / "model")
    s = Stack.up(work, serve_python.parent.parent, **{
        "decode.args": {"cuda-graph-max-bs-decode": BASE_SLOTS}, **ENV})
    s.c.run(["mkdir", "-p", APPLY_DIR])
    s.c.run(["cp", "-a", "/srv/e2e/units", f"{APPLY_DIR}/units"])
    edited = yaml.safe_load((work / "config.yaml").read_text())
    edited["decode"]["args"]["cuda-graph-max-bs-decode"] = EDITED
    s.c.write_file(f"{APPLY_DIR}/config.yaml", yaml.safe_dump(edited))
    (work / "tune.yaml").write_text(yaml.safe_dump(space(**{BEST_LEVER: [16]})))
    yield s
    s.down()


def test_tune_on_an_unapplied_edit_of_1p1d_changes_nothing_and_fails_no_request(
        stack: Stack) -> None:
    before = (stack.invocation("decode"), stack.restarts("decode"))
    load = Load(f"{stack.plan['client_url']}/generate", rate=4, tokens=8, timeout=30,
                netns=stack.netns, stream_share=0.5)
    load.start()
    t0 = time.monotonic()
    try:
        argv = pdsvc_argv(stack.work, stack.plan["python"], "tune", "-c",
                          f"{APPLY_DIR}/config.yaml", "--topology", "/srv/e2e/topology.json",
                          "-o", f"{APPLY_DIR}/units", "--space", "/srv/e2e/tune.yaml",
                          "--results", "/var/lib/pdsvc-tune")
        argv[1] += f":{REPO}/tests/support/bench_site"
        run = stack.c.run(argv, check=False, timeout=300)
        time.sleep(3)  # a restart would show within the load's next requests
    finally:
        load.stop()
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-3000:]
    assert "tune: the deployment does not run the config yet: applying it first" in run.stderr
    assert "and applying it serving would stop while" in run.stderr, run.stderr
    assert "nothing was changed" in run.stderr
    assert (stack.invocation("decode"), stack.restarts("decode")) == before
    cmdline = stack.c.run(["cat", f"/proc/{stack.engine_pid('decode')}/cmdline"]).stdout
    args = cmdline.split("\0")
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == str(BASE_SLOTS)
    failed = failures(load.between(t0, time.monotonic()))
    assert not failed, failed
