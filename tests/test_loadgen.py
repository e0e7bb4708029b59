"""The load generator's judgement of one request (tests/support/loadgen.py), against a paced
stand-in engine: which engine answered (the stand-in's meta_info.port), and a stream cut by
kill -9 of its engine is a `cut` the client sees at once, never a hang."""

from __future__ import annotations

import signal
import threading
import time

import loadgen
import standin_client
from standin_client import get_json, wait_until

engines, model_dir = standin_client.engines, standin_client.model_dir

PACED = {"FAKE_SGLANG_PACED": "1", "FAKE_SGLANG_TTFT_MS": "50", "FAKE_SGLANG_ITL_MS": "100"}


def test_a_request_says_which_engine_answered(engines):
    eng = engines("null", env=PACED)
    eng.wait_healthy()
    url = f"http://127.0.0.1:{eng.port}/generate"
    for stream in (False, True):
        res = loadgen.request(url, stream, timeout=10, tokens=3)
        assert res.ok and res.port == eng.port, res
    assert loadgen.served_by({"text": "x", "meta_info": {"port": True}}) is None
    assert loadgen.served_by([{"meta_info": {"port": 30001}}]) == 30001


def test_a_stream_cut_by_kill_9_is_cut_at_once_and_names_its_engine(engines):
    eng = engines("null", env=PACED)
    eng.wait_healthy()
    out: list[loadgen.Result] = []
    t = threading.Thread(target=lambda: out.append(loadgen.request(
        f"http://127.0.0.1:{eng.port}/generate", True, timeout=20, tokens=100)))  # 10 s whole
    t.start()
    wait_until(lambda: get_json(eng.port, "/get_load")[0]["num_reqs"] == 1, 2.0, "in flight")
    time.sleep(0.4)  # a few tokens sent
    eng.proc.send_signal(signal.SIGKILL)
    t_kill = time.monotonic()
    t.join(10)
    assert len(out) == 1
    res = out[0]
    assert res.kind == "cut" and res.tokens >= 1 and res.port == eng.port, res
    assert res.end - t_kill < 2.0, "the cut is seen at once, not after the client's timeout"
