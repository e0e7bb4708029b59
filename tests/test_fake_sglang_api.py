"""The stand-in's HTTP API (tests/support/standin/api.py, generate.py, metrics.py): start-up
health, the endpoints SGLang serves, PD request checks and the metrics that move."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from pathlib import Path

import standin_client
from ports import free_ports
from standin_client import (
    EXTRA_ARGS,
    _metric,
    get_json,
    pd_body,
    request,
    status_or_none,
    wait_until,
)

# the stand-in's fixtures (tests/support/standin_client.py)
engines, model_dir = standin_client.engines, standin_client.model_dir

# ----------------------------------------------------------------------------------- startup


def test_health_is_503_while_loading_then_200(engines):
    eng = engines(
        "prefill",
        env={"FAKE_SGLANG_LOAD_SECS": "1.5"},
        args=["--tp", "4", *EXTRA_ARGS],
        as_module=True,
    )
    first = wait_until(lambda: status_or_none(eng.port), 3.0, "the HTTP port to answer")
    assert first == 503
    assert status_or_none(eng.port, "/health_generate") == 503
    eng.wait_healthy(timeout=5.0)
    assert status_or_none(eng.port, "/health_generate") == 200
    info = get_json(eng.port, "/server_info")
    assert info["disaggregation_mode"] == "prefill"
    assert info["tp_size"] == 4
    assert Path(info["model_path"]).is_dir()
    assert "stray-token" in eng.stderr  # logged as ignored, not fatal
    assert "The server is fired up and ready to roll!" in eng.stderr


def test_missing_model_path_exits_1_with_error_line(engines, tmp_path):
    missing = str(tmp_path / "no" / "such-model")
    eng = engines("decode", model=missing)
    assert eng.wait_exit(timeout=8) == 1
    lines = [ln for ln in eng.stderr.splitlines() if "Incorrect path_or_model_id" in ln]
    assert lines and lines[0].startswith("OSError:") and missing in lines[0], eng.stderr
    assert "Uvicorn running" not in eng.stderr  # it exits before it binds its port


def test_api_surface(engines, model_dir):
    eng = engines("null", args=["--api-key", "sk-test", "--enable-metrics", "--tp", "2"])
    eng.wait_healthy()
    auth = {"Authorization": "Bearer sk-test"}
    assert status_or_none(eng.port, "/health") == 200  # /health* needs no key
    assert request(eng.port, "GET", "/server_info")[0] == 401
    for path in ("/server_info", "/get_server_info"):
        info = get_json(eng.port, path, headers=auth)
        assert info["model_path"] == str(model_dir)
        assert info["served_model_name"] == "Fake-Model-1B"
        assert info["tp_size"] == 2 and info["dp_size"] == 1
        assert info["disaggregation_mode"] == "null"
        assert info["disaggregation_bootstrap_port"] == eng.bport
        assert {"tokenizer_path", "load_balance_method", "max_running_requests"} <= set(info)
    for path in ("/model_info", "/get_model_info"):
        mi = get_json(eng.port, path, headers=auth)
        assert mi["model_path"] == str(model_dir)
        assert mi["architectures"] == ["LlamaForCausalLM"]
    models = get_json(eng.port, "/v1/models", headers=auth)
    assert models["data"][0]["id"] == "Fake-Model-1B"
    assert get_json(eng.port, "/get_load", headers=auth)[0]["num_reqs"] == 0
    status, raw = request(eng.port, "GET", "/metrics")
    assert status == 200 and b"sglang:num_running_reqs" in raw
    assert request(eng.port, "POST", "/flush_cache", headers=auth)[0] == 200
    status, raw = request(eng.port, "GET", "/nope", headers=auth)
    assert status == 404 and json.loads(raw) == {"detail": "Not Found"}
    assert request(eng.port, "GET", "/generate", headers=auth)[0] == 405

    # non-PD generation: no bootstrap fields needed
    status, raw = request(eng.port, "POST", "/generate", {"text": "hi"}, headers=auth)
    assert status == 200 and json.loads(raw)["text"].startswith(f"[null@{eng.port}]")
    status, raw = request(
        eng.port, "POST", "/v1/chat/completions",
        {"model": "Fake-Model-1B", "messages": [{"role": "user", "content": "hi"}]},
        headers=auth,
    )  # fmt: skip
    assert status == 200 and json.loads(raw)["object"] == "chat.completion"

    # keep-alive: two requests on one connection
    conn = http.client.HTTPConnection("127.0.0.1", eng.port, timeout=5)
    try:
        for _ in range(2):
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
    finally:
        conn.close()

    # HTTP/2 prior-knowledge preface (the router's gRPC probe): an error reply, then close
    with socket.create_connection(("127.0.0.1", eng.port), timeout=3) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 505")
    assert status_or_none(eng.port) == 200
    assert eng.proc.poll() is None


def test_metrics_404_without_enable_metrics(engines):
    eng = engines("decode")
    eng.wait_healthy()
    assert request(eng.port, "GET", "/metrics")[0] == 404


# -------------------------------------------------------------------------------- PD checks


def test_prefill_bootstrap_server_answers_while_loading(engines):
    pre = engines("prefill", env={"FAKE_SGLANG_LOAD_SECS": "3"}, args=["--tp", "4"])
    wait_until(lambda: status_or_none(pre.bport) == 200, 3.0, "the bootstrap /health")
    # its own port opens in a thread of its own, a moment apart on a loaded machine (CI
    # once asked before it listened); once it answers, it says loading for the 3 s
    wait_until(lambda: status_or_none(pre.port) is not None, 2.0, "the engine's port")
    assert status_or_none(pre.port) == 503  # the engine itself is still loading
    status, raw = request(pre.bport, "GET", "/route?engine_rank=-1&target_dp_group=-1")
    assert status == 200 and json.loads(raw)["prefill_attn_tp_size"] == 4

    dec = engines("decode")
    dec.wait_healthy()
    assert not dec.listens(dec.bport)  # decode binds no bootstrap port


def test_pd_request_without_bootstrap_fields_is_400(engines):
    pre = engines("prefill")
    dec = engines("decode", bport=None)
    pre.wait_healthy()
    dec.wait_healthy()
    for eng in (pre, dec):
        status, raw = request(eng.port, "POST", "/generate", {"text": "hi"})
        assert status == 400, raw
        err = json.loads(raw)["error"]
        assert err["param"] == "bootstrap_host" and "bootstrap_host" in err["message"]
        body = pd_body(room=1, bport=pre.bport)
        del body["bootstrap_room"]
        status, raw = request(eng.port, "POST", "/v1/chat/completions", body)
        assert status == 400 and "bootstrap_room" in json.loads(raw)["error"]["message"]


def test_decode_with_reachable_prefill_bootstrap_returns_200_and_echoes_room(engines, tmp_path):
    reqlog = tmp_path / "requests.jsonl"
    env = {"FAKE_SGLANG_LOG": str(reqlog)}
    pre = engines("prefill", env=env)
    dec = engines("decode", env=env, bport=pre.bport)  # same bootstrap port on both (fact 4)
    pre.wait_healthy()
    dec.wait_healthy()

    # like the router: the same body to both roles at the same moment
    room = 4505680217004773795
    body = pd_body(room=room, bport=pre.bport)
    results: dict[str, tuple[int, bytes]] = {}

    def send(name: str, port: int) -> None:
        results[name] = request(port, "POST", "/generate", body)

    threads = [threading.Thread(target=send, args=a) for a in (("p", pre.port), ("d", dec.port))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results["p"][0] == 200 and json.loads(results["p"][1])["text"] == ""
    status, raw = results["d"]
    assert status == 200, raw
    out = json.loads(raw)
    assert out["text"].startswith(f"[decode@{dec.port}]")
    assert out["meta_info"]["bootstrap_room_seen"] == room

    # bootstrap_port null: decode falls back to its own --disaggregation-bootstrap-port
    status, raw = request(dec.port, "POST", "/generate", pd_body(room=7, bport=None))
    assert status == 200 and json.loads(raw)["meta_info"]["bootstrap_room_seen"] == 7

    # OpenAI chat, streamed
    chat = {"model": "Fake-Model-1B", "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "bootstrap_host": "127.0.0.1", "bootstrap_port": pre.bport,
            "bootstrap_room": 99}  # fmt: skip
    status, raw = request(dec.port, "POST", "/v1/chat/completions", chat)
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: ") :])["meta_info"]["bootstrap_room_seen"] == 99

    # batch completions carry lists of bootstrap values
    batch = {"prompt": ["a", "b"], "bootstrap_host": ["127.0.0.1"] * 2,
             "bootstrap_port": [pre.bport] * 2, "bootstrap_room": [1, 2]}  # fmt: skip
    status, raw = request(dec.port, "POST", "/v1/completions", batch)
    assert status == 200, raw
    out = json.loads(raw)
    assert len(out["choices"]) == 2
    assert [m["bootstrap_room_seen"] for m in out["meta_info"]] == [1, 2]

    lines = [json.loads(ln) for ln in reqlog.read_text().splitlines()]
    gens = [ln for ln in lines if ln["path"] == "/generate" and ln["method"] == "POST"]
    assert {(ln["role"], ln["port"]) for ln in gens} >= {
        ("prefill", pre.port),
        ("decode", dec.port),
    }
    assert any(ln["body"].get("bootstrap_room") == room for ln in gens)


def test_decode_with_unreachable_bootstrap_is_500(engines):
    dec = engines("decode")
    dec.wait_healthy()
    (dead_port,) = free_ports(1)
    status, raw = request(dec.port, "POST", "/generate", pd_body(room=5, bport=dead_port))
    assert status == 500, raw
    msg = json.loads(raw)["error"]["message"]
    assert msg.startswith(f"KV transfer failed: cannot reach prefill bootstrap server "
                          f"127.0.0.1:{dead_port}")  # fmt: skip
    # SGLang's own warmup/health host never touches a peer
    status, _ = request(dec.port, "POST", "/generate", pd_body(room=0, bport=None, host="2.2.2.2"))
    assert status == 200


def test_metrics_move_under_load_and_faults(engines):
    """SGLang's names (metrics_collector.py): a served request counts and observes its TTFT
    (a slow one lands in a high bucket); a bootstrap that fails counts too (fake_metrics.py)."""
    pre = engines("prefill", args=["--enable-metrics"])
    dec = engines("decode", bport=pre.bport, args=["--enable-metrics"])
    pre.wait_healthy()
    dec.wait_healthy()
    assert request(dec.port, "POST", "/generate", pd_body(room=1, bport=pre.bport))[0] == 200
    request(dec.port, "POST", "/_fake/control", {"gen_delay": 1.2})
    assert request(dec.port, "POST", "/generate", pd_body(room=2, bport=pre.bport))[0] == 200
    (dead_port,) = free_ports(1)
    assert request(dec.port, "POST", "/generate", pd_body(room=3, bport=dead_port))[0] == 500
    raw = request(dec.port, "GET", "/metrics")[1]
    assert _metric(raw, "sglang:num_requests_total") == 2
    assert _metric(raw, "sglang:time_to_first_token_seconds_count") == 2
    assert 'engine_type="decode"' in raw.decode()
    fast = next(line for line in raw.decode().splitlines()
                if line.startswith("sglang:time_to_first_token_seconds_bucket") and
                'le="1.0"' in line)
    assert fast.endswith(" 1.0")  # the 1.2 s one is above that bucket
    assert _metric(raw, "sglang:num_bootstrap_failed_reqs_total") == 1
    assert _metric(raw, "sglang:num_transfer_failed_reqs_total") == 0
