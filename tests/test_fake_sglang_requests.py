"""Requests that take time (tests/support/standin/generate.py ``Pace``, reusing the latency
model of tests/support/fake_latency.py), what a SIGTERM and a kill -9 do to them, and the one
place the stand-in's knobs are read (standin/config.py)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import standin_client
from standin_client import SUPPORT, get_json, pd_body, request, wait_until
from timing import within

# the stand-in's fixtures (tests/support/standin_client.py)
engines, model_dir = standin_client.engines, standin_client.model_dir

PACED = {"FAKE_SGLANG_PACED": "1", "FAKE_SGLANG_TTFT_MS": "200", "FAKE_SGLANG_ITL_MS": "100"}


def open_stream(port: int, path: str, body: dict) -> tuple[http.client.HTTPConnection,
                                                             http.client.HTTPResponse, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    t0 = time.monotonic()
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse(), t0


def read_events(resp: http.client.HTTPResponse, t0: float, limit: int | None = None) -> list:
    """(seconds since the request, payload) per SSE event, up to ``limit`` events. (readline
    takes a chunked body cut short for its end; read() raises IncompleteRead.)"""
    events: list[tuple[float, str]] = []
    while limit is None or len(events) < limit:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append((time.monotonic() - t0, line[6:].strip().decode()))
    return events


def timed(port: int, path: str, body: dict) -> tuple[float, int, dict]:
    t0 = time.monotonic()
    status, raw = request(port, "POST", path, body, timeout=10)
    return time.monotonic() - t0, status, json.loads(raw)


# ---------------------------------------------------------------------------- paced requests


def test_paced_non_stream_takes_ttft_then_one_itl_per_token(engines):
    eng = engines("null", env=PACED)
    eng.wait_healthy()
    took, status, out = timed(eng.port, "/generate",
                              {"text": "hi", "sampling_params": {"max_new_tokens": 10}})
    # at least TTFT + 9 ITL (load cannot shorten a sleep); at most that with a busy machine's
    # slack (tests/support/timing.py)
    assert status == 200 and took >= 0.2 + 9 * 0.1, took
    within(took, 0.2 + 9 * 0.1 + 0.1, "a paced request")
    assert out["meta_info"]["completion_tokens"] == 10 and len(out["text"].split()) == 10
    assert out["text"].startswith(f"[null@{eng.port}] hello")
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    took, status, out = timed(eng.port, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200 and took >= 0.4, took
    within(took, 0.4 + 0.1, "a paced completion")
    assert out["usage"]["completion_tokens"] == 3
    # per request: its own rate on an engine that is not paced
    plain = engines("null")
    plain.wait_healthy()
    took, status, out = timed(plain.port, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                               "fake_ttft_ms": 50, "fake_itl_ms": 300})  # fmt: skip
    assert status == 200 and took >= 0.05 + 4 * 0.3, took
    within(took, 0.05 + 4 * 0.3 + 0.1, "a request paced by its own fields")
    assert out["usage"]["completion_tokens"] == 5
    took, status, _ = timed(plain.port, "/generate", {"text": "hi"})
    # unpaced: at once, as before (paced, 16 tokens would take 0.2 + 15 × 0.1 s)
    assert status == 200
    within(took, 0.3, "an unpaced request")


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions", "/v1/completions"])
def test_paced_stream_sends_its_tokens_over_time(engines, path):
    eng = engines("null", env=PACED)
    eng.wait_healthy()
    body: dict = {"stream": True, "max_tokens": 8, "sampling_params": {"max_new_tokens": 8}}
    body.update({"text": "hi"} if path == "/generate" else
                {"prompt": "hi"} if path == "/v1/completions" else
                {"messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    conn, resp, t0 = open_stream(eng.port, path, body)
    try:
        assert resp.status == 200
        events = read_events(resp, t0)
    finally:
        conn.close()
    assert events[-1][1] == "[DONE]"
    tokens = [t for t, data in events[:-1] if _is_token(path, json.loads(data))]
    assert len(tokens) == 8, events
    # lower bounds from the request's start, which a late reader cannot shorten (it can
    # bunch the gaps between tokens it reads late, so those are not asserted)
    assert tokens[0] >= 0.2, tokens  # the TTFT
    assert tokens[-1] >= 0.2 + 7 * 0.1 * 0.9, tokens  # then one token every ITL
    assert tokens[-1] > tokens[0], tokens  # over time, not in one piece


def _is_token(path: str, chunk: dict) -> bool:
    if path == "/generate":
        return chunk["meta_info"]["finish_reason"] is None
    choice = (chunk.get("choices") or [{}])[0]
    if path == "/v1/chat/completions":
        return bool(choice.get("delta", {}).get("content"))
    return bool(choice.get("text"))


def test_paced_prefill_pays_the_ttft_and_its_decode_the_tokens(engines):
    pre = engines("prefill", env=PACED)
    dec = engines("decode", env=PACED, bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    took, status, out = timed(pre.port, "/generate", pd_body(room=1, bport=pre.bport))
    assert status == 200 and out["text"] == "" and took >= 0.2, took
    within(took, 0.2 + 0.1, "a paced prefill")
    took, status, out = timed(dec.port, "/generate", pd_body(room=2, bport=pre.bport))
    assert status == 200 and out["meta_info"]["completion_tokens"] == 8, out  # max_new_tokens
    assert took >= 0.2 + 7 * 0.1, took
    within(took, 0.2 + 7 * 0.1 + 0.1, "a paced decode")
    assert get_json(dec.port, "/_fake/control")["paced"] is True


# ------------------------------------------------------------- SIGTERM and kill -9 in flight


def test_sigterm_lets_a_paced_stream_finish_then_exits_0(engines):
    eng = engines("decode", env={**PACED, "FAKE_SGLANG_DRAIN_POLL_SECS": "0.2"})
    eng.wait_healthy()
    body = pd_body(room=5, bport=None, host="2.2.2.2", stream=True,
                   sampling_params={"max_new_tokens": 15})  # ~1.6 s
    conn, resp, t0 = open_stream(eng.port, "/generate", body)
    try:
        first = read_events(resp, t0, limit=2)
        eng.proc.send_signal(signal.SIGTERM)
        rest = read_events(resp, t0)
    finally:
        conn.close()
    assert rest[-1][1] == "[DONE]" and len(first) + len(rest) == 15 + 2, (first, rest)
    assert json.loads(rest[-2][1])["meta_info"]["finish_reason"]["type"] == "length"
    assert eng.wait_exit(timeout=3) == 0


def test_kill_9_cuts_in_flight_streams_and_requests_with_an_error_the_client_sees(engines):
    eng = engines("decode", env={**PACED, "FAKE_SGLANG_ITL_MS": "200"})
    eng.wait_healthy()
    body = pd_body(room=6, bport=None, host="2.2.2.2", stream=True,
                   sampling_params={"max_new_tokens": 50})  # 10 s, were it not cut
    conn, resp, t0 = open_stream(eng.port, "/generate", body)
    whole: list = []

    def non_stream() -> None:
        try:
            whole.append(request(eng.port, "POST", "/v1/completions",
                                 {"prompt": "x", "max_tokens": 50, "bootstrap_host": "2.2.2.2",
                                  "bootstrap_port": None, "bootstrap_room": 7}, timeout=10))
        except (OSError, http.client.HTTPException) as e:
            whole.append(e)

    t = threading.Thread(target=non_stream)
    t.start()
    try:
        assert len(read_events(resp, t0, limit=2)) == 2  # tokens are flowing
        wait_until(lambda: get_json(eng.port, "/get_load")[0]["num_reqs"] == 2, 2.0, "2 in flight")
        eng.proc.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        # the chunked body ends without its last chunk: a client reading it sees an error
        # (http.client: IncompleteRead), never a clean end or a hang
        with pytest.raises((http.client.IncompleteRead, ConnectionError)) as cut:
            resp.read()
        assert b"[DONE]" not in getattr(cut.value, "partial", b"")
        assert time.monotonic() - t_kill < 2.0, "the cut is seen at once, not after a timeout"
    finally:
        conn.close()
    t.join(5)
    assert len(whole) == 1 and isinstance(whole[0], (ConnectionError, http.client.HTTPException,
                                                     OSError)), whole  # fmt: skip
    assert eng.wait_exit(timeout=3) == -signal.SIGKILL


# ------------------------------------------------------------------------- one place for knobs


def test_every_knob_is_read_in_config_only():
    """standin/config.py is the one reader of FAKE_SGLANG_* (and SGL_*) variables; the latency
    model's own knobs (fake_latency.py) are named there; each knob is documented once."""
    from standin import config

    fields = {f.name for f in __import__("dataclasses").fields(config.Knobs)}
    text = (SUPPORT / "standin" / "config.py").read_text()
    read = set(re.findall(r'"((?:FAKE_SGLANG|SGL)_[A-Z_]+)"', text))
    for mod in [*(SUPPORT / "standin").glob("*.py"), SUPPORT / "fake_sglang.py"]:
        if mod.name != "config.py":
            src = mod.read_text()
            assert not re.search(r"environ(?:\.get)?\(?\[?\s*[\"']FAKE_SGLANG", src), mod
            assert "getenv" not in src, mod
    for name in read - set(config.LATENCY_KNOBS):
        assert f"# {name}" in text or name in ("FAKE_SGLANG_CLEAN_EXIT", "SGL_FORCE_SHUTDOWN"), (
            f"{name} has no Knobs field comment")
    latency = Path(SUPPORT / "fake_latency.py").read_text()
    assert set(re.findall(r'"(FAKE_SGLANG_[A-Z_]+)"', latency)) == set(config.LATENCY_KNOBS)
    assert {"paced", "paced_tokens", "drain_poll_secs", "sigterm_exit"} <= fields
