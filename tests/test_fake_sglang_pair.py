"""The stand-in's PD pair state (tests/support/standin/bootstrap.py, pair.py): stale pairs.

sglang #33789 / PR #34289: a decode keeps a replaced prefill's endpoints ("decode is stale").
smg #2382, vllm #49238: a prefill keeps a replaced decode's NIXL agent ("prefill is stale");
the failures come back as HTTP 200 with finish_reason abort and empty text, /health stays 200.
"""

from __future__ import annotations

import http.client
import json

import standin_client
from standin_client import (
    assert_pair_abort,
    assert_pair_ok,
    control,
    get_json,
    instance_id,
    pd_body,
    pd_pair,
    request,
    status_or_none,
)

# the stand-in's fixtures (tests/support/standin_client.py)
engines, model_dir = standin_client.engines, standin_client.model_dir


def test_pair_decode_goes_stale_when_prefill_is_replaced(engines):
    env = {"FAKE_SGLANG_STALE_PAIR": "decode"}
    pre = engines("prefill", env=env)
    dec = engines("decode", env=env, bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    pre_key, dec_key = f"127.0.0.1:{pre.bport}", f"127.0.0.1:{dec.port}"
    r = pd_pair(pre, dec, room=1)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)
    old_pre = instance_id(pre)
    assert get_json(pre.bport, "/_fake/pair")["instance_id"] == old_pre
    assert control(dec)["peers"][pre_key]["instance_id"] == old_pre
    assert control(pre)["peers"][dec_key]["instance_id"] == instance_id(dec)

    # the prefill is replaced by a new process behind the same (reachable) bootstrap address
    pre.proc.kill()
    pre.proc.wait(5)
    pre = engines("prefill", env=env, port=pre.port, bport=pre.bport)
    pre.wait_healthy()
    assert instance_id(pre) != old_pre
    for room in (2, 3, 4):
        r = pd_pair(pre, dec, room=room)
        assert_pair_ok(r["p"], "prefill", pre.port)  # the prefill itself is fine
        msg = assert_pair_abort(r["d"])
        assert old_pre in msg and pre_key in msg
    chat = {"messages": [{"role": "user", "content": "hi"}], "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pre.bport, "bootstrap_room": 5}  # fmt: skip
    status, raw = request(dec.port, "POST", "/v1/chat/completions", chat)
    choice = json.loads(raw)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "abort"
    assert choice["message"]["content"] == ""
    assert status_or_none(pre.port) == 200 and status_or_none(dec.port) == 200
    state = control(dec)
    assert state["stale_peers"][pre_key]["remembered_instance"] == old_pre
    assert state["stale_peers"][pre_key]["seen_instance"] == instance_id(pre)
    assert control(pre)["stale_peers"] == {}
    assert f"NIXL transfer to peer {pre_key} failed: stale agent for instance {old_pre}" in (
        dec.stderr
    )

    # error500: the same failure as an HTTP 500
    control(dec, {"pair_failure": "error500"})
    status, raw = pd_pair(pre, dec, room=6)["d"]
    assert status == 500 and "stale agent for instance" in json.loads(raw)["error"]["message"]

    # only restarting the stale decode heals it
    dec.proc.kill()
    dec.proc.wait(5)
    dec = engines("decode", env=env, port=dec.port, bport=pre.bport)
    dec.wait_healthy()
    r = pd_pair(pre, dec, room=7)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)
    assert control(dec)["stale_peers"] == {}


def test_pair_prefill_goes_stale_when_decode_is_replaced(engines):
    env = {"FAKE_SGLANG_STALE_PAIR": "prefill"}
    pre = engines("prefill", env=env, as_module=True)  # imports fake_pair as a module, too
    dec = engines("decode", env=env, bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    dec_key = f"127.0.0.1:{dec.port}"
    r = pd_pair(pre, dec, room=10)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)
    old_dec = instance_id(dec)

    # the decode is "replaced" without its port ever closing
    new_dec = control(dec, {"new_instance": True})["instance_id"]
    assert new_dec != old_dec and control(dec)["peers"] == {}
    for room in (11, 12, 13):
        r = pd_pair(pre, dec, room=room)
        assert old_dec in assert_pair_abort(r["p"])  # the prefill's own response fails
        assert old_dec in assert_pair_abort(r["d"])  # and so does what the router returns
    assert status_or_none(pre.port) == 200 and status_or_none(dec.port) == 200
    assert control(pre)["stale_peers"][dec_key]["seen_instance"] == new_dec
    assert control(dec)["stale_peers"] == {}
    assert f"NIXL transfer to peer {dec_key} failed: stale agent for instance {old_dec}" in (
        pre.stderr
    )

    # restarting the decode does not help: the prefill is poisoned
    dec.proc.kill()
    dec.proc.wait(5)
    dec = engines("decode", env={**env, "FAKE_SGLANG_PAIR_FAILURE": "error500"},
                  port=dec.port, bport=pre.bport)  # fmt: skip
    dec.wait_healthy()
    control(pre, {"pair_failure": "error500"})
    r = pd_pair(pre, dec, room=14)
    assert r["p"][0] == 500 and r["d"][0] == 500, r
    assert "stale agent for instance" in json.loads(r["d"][1])["error"]["message"]

    # restarting the stale prefill heals it
    pre.proc.kill()
    pre.proc.wait(5)
    pre = engines("prefill", env=env, port=pre.port, bport=pre.bport)
    pre.wait_healthy()
    r = pd_pair(pre, dec, room=15)
    assert_pair_ok(r["p"], "prefill", pre.port)
    assert_pair_ok(r["d"], "decode", dec.port)


def test_pair_switch_off_means_no_staleness_and_runtime_switch(engines):
    pre = engines("prefill")
    dec = engines("decode", bport=pre.bport)
    pre.wait_healthy()
    dec.wait_healthy()
    assert control(pre)["stale_pair"] == "off" and control(dec)["pair_failure"] == "abort200"
    pre_key = f"127.0.0.1:{pre.bport}"
    assert_pair_ok(pd_pair(pre, dec, room=20)["d"], "decode", dec.port)
    for eng in (pre, dec, pre):
        control(eng, {"new_instance": True})
        r = pd_pair(pre, dec, room=21)
        assert_pair_ok(r["p"], "prefill", pre.port)
        assert_pair_ok(r["d"], "decode", dec.port)
    assert control(pre)["stale_peers"] == {} and control(dec)["stale_peers"] == {}
    assert control(dec)["peers"][pre_key]["instance_id"] == instance_id(pre)
    # the decode's own new_instance forgot its memory; the prefill was replaced once since
    assert control(dec)["peers"][pre_key]["replacements"] == 1

    # switched on at run time: the next replacement makes the decode stale
    assert control(dec, {"stale_pair": "both"})["stale_enabled"] is True
    control(pre, {"new_instance": True})
    assert_pair_abort(pd_pair(pre, dec, room=22)["d"])
    # switching it off again does not heal a stale side; a new instance (restart) does
    control(dec, {"stale_pair": "off"})
    assert_pair_abort(pd_pair(pre, dec, room=23)["d"])
    control(dec, {"new_instance": True})
    assert_pair_ok(pd_pair(pre, dec, room=24)["d"], "decode", dec.port)


def test_pair_knobs_are_validated(engines):
    bad = engines("decode", env={"FAKE_SGLANG_STALE_PAIR": "sideways"})
    assert bad.wait_exit(timeout=5) == 2
    assert "stale_pair must be one of" in bad.stderr
    eng = engines("decode")
    eng.wait_healthy()
    for body in ({"stale_pair": "sideways"}, {"pair_failure": "teapot"}, {"stale_pair": 3}):
        status, _ = request(eng.port, "POST", "/_fake/control", body)
        assert status == 400, body
    assert control(eng, {"pair_failure": "error500"})["pair_failure"] == "error500"


def test_pair_wildcard_decode_is_known_by_its_source_address(engines):
    pre = engines("prefill")
    dec = engines("decode", bport=pre.bport, args=["--host", "0.0.0.0"])
    pre.wait_healthy()
    dec.wait_healthy()
    assert_pair_ok(pd_pair(pre, dec, room=30)["d"], "decode", dec.port)
    assert list(control(pre)["peers"]) == [f"127.0.0.1:{dec.port}"]


def test_a_decode_that_meets_a_prefill_of_another_page_size_or_kv_dtype_dies(engines):
    """SGLang 0.5.23: disaggregation/common/conn.py try_ensure_parallel_info raises on a page
    size or KV cache dtype mismatch in the decode scheduler, which SIGQUITs the server: the
    decode dies with its requests (the client's connection is cut), the prefill lives on."""
    for args, said in ((["--page-size", "32"], "Page size mismatch"),
                       (["--kv-cache-dtype", "fp8_e4m3"], "KV cache dtype mismatch")):
        pre = engines("prefill", args=args)
        same = engines("decode", args=args, bport=pre.bport)
        other = engines("decode", bport=pre.bport)
        for e in (pre, same, other):
            e.wait_healthy()
        r = pd_pair(pre, same, room=1)
        assert_pair_ok(r["d"], "decode", same.port)  # alike: they pair
        try:  # the decode alone: its check runs before any KV moves
            cut = request(other.port, "POST", "/generate", pd_body(room=2, bport=pre.bport))
        except (OSError, http.client.HTTPException) as e:
            cut = e
        assert isinstance(cut, http.client.HTTPException | OSError), cut  # no status: cut
        assert other.wait_exit(10) != 0
        assert said in other.stderr and "Scheduler hit an exception" in other.stderr
        assert status_or_none(pre.port) == 200 and status_or_none(same.port) == 200
