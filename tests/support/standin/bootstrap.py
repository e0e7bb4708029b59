"""PD pairing: the prefill's bootstrap server and each side's check of its peer.

SGLang's prefill runs a bootstrap server (CommonKVBootstrapServer, aiohttp) on
``--disaggregation-bootstrap-port``; a decode learns the prefill from it and registers its own
KV args there. The stand-in adds ``/_fake/pair`` (pair.py) so that each side can tell when its
peer was replaced (sglang #33789 / PR #34289; smg #2382, vllm #49238).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from typing import Any
from urllib.parse import parse_qs

from . import pair
from .engine import Engine
from .http_base import BaseHandler
from .util import log

#: SGLang's warmup/health probes use this bootstrap host so that they never touch the peer.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class BootstrapHandler(BaseHandler):
    """The prefill's bootstrap server."""

    def route(self, url: Any, body: Any, parse_error: str | None) -> None:
        eng = self.server.engine
        eng.wait_while_hung("bootstrap")
        a = eng.args
        path, method = url.path, self.command
        if path == "/health" and method == "GET":
            self._text(200, "OK")
        elif path == "/route" and method == "GET":
            q = parse_qs(url.query)
            rank = int(q.get("engine_rank", ["-1"])[0] or -1)
            if rank == -1:
                self._json(200, {"prefill_attn_tp_size": a.tp_size,
                                 "prefill_dp_size": a.dp_size, "prefill_pp_size": 1,
                                 "prefill_page_size": a.page_size, "page_size": a.page_size,
                                 "kv_cache_dtype": a.kv_cache_dtype, "fake_sglang": True,
                                 "fake_instance_id": eng.pair.instance_id})  # fmt: skip
            else:
                self._json(200, {"rank_ip": a.host, "rank_port": a.disaggregation_bootstrap_port})
        elif path == "/route" and method == "PUT":
            self._text(200, "OK")
        elif path in ("/register_dp_rank", "/query_dp_ranks") and method == "POST":
            self._json(200, {"dp_rank": 0, "fake_sglang": True})
        elif path == pair.PAIR_PATH and method == "GET":
            self._json(200, {"role": eng.role, **eng.pair.snapshot()})
        elif path == pair.PAIR_PATH and method == "POST":
            self._pair(body)
        else:
            self._text(404, "404: Not Found")

    def _pair(self, body: Any) -> None:
        """A decode registers (its KV args, in SGLang) and learns our instance id."""
        eng = self.server.engine
        rooms = body.get("bootstrap_rooms") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("peer"), str)
            or not isinstance(body.get("instance_id"), str)
            or not isinstance(rooms, list)
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in rooms)
        ):
            self._json(400, {"error": "expected {peer: str, instance_id: str, "
                                      "bootstrap_rooms: [int]}"})  # fmt: skip
            return
        # A decode bound to a wildcard address is known by the address it connects from (SGLang's
        # decode registers its own reachable IP likewise), so that two decode hosts listening
        # on 0.0.0.0:30000 stay two peers.
        host, _, port = body["peer"].rpartition(":")
        peer = body["peer"]
        if host.strip("[]") in ("0.0.0.0", "::", ""):
            peer = f"{self.client_address[0]}:{port}"
        # see the peer first: a room's registration must find the staleness already decided
        message = eng.pair.see_peer(peer, body["instance_id"])
        eng.pair.register_rooms(peer, rooms)
        self._json(200, {"instance_id": eng.pair.instance_id, "role": eng.role,
                         "stale": message is not None, "message": message})  # fmt: skip


def reach_prefill(eng: Engine, boot: dict[str, list]) -> tuple[str | None, dict[int, str]]:
    """Decode side: contact the prefill bootstrap server(s) named in the request, register with
    each (its NIXL pair exchange) and learn the prefill's instance id. Returns a hard failure
    (500 whatever the failure mode) or the items whose transfer fails by pair state."""
    peers: dict[tuple[str, int], list[int]] = {}  # (host, port) -> item indices
    for i, (host, port) in enumerate(
        zip(boot["bootstrap_host"], boot["bootstrap_port"], strict=True)
    ):
        if port is None:  # SGLang's decode scheduler substitutes its own flag value
            port = eng.args.disaggregation_bootstrap_port
        if host != FAKE_BOOTSTRAP_HOST:
            peers.setdefault((host, port), []).append(i)
    failures: dict[int, str] = {}
    timeout = eng.knobs.bootstrap_timeout
    for (host, port), items in peers.items():
        rooms = [boot["bootstrap_room"][i] for i in items]
        reason = probe_bootstrap(host, port, timeout)
        reply = None
        if reason is None:
            reason = ensure_parallel_info(eng, host, port, timeout)
        if reason is None:
            reply, reason = pair.exchange(host, port, eng.pair_key, eng.pair.instance_id, rooms,
                                          timeout)  # fmt: skip
        if reason is not None:
            log(f"KV transfer failed for bootstrap_room={rooms[0]}: cannot reach prefill "
                f"bootstrap server {host}:{port} ({reason})", "TP0")
            return (f"KV transfer failed: cannot reach prefill bootstrap server {host}:{port} "
                    f"({reason}); bootstrap_room={rooms[0]}"), {}
        if reply is None:  # a bootstrap server without pair state: nothing to check
            continue
        # sglang #33789: a decode keeps the dead prefill's endpoints (this side is stale);
        # smg #2382 / vllm #49238: the prefill kept a replaced decode's agent (that side is)
        why = eng.pair.see_peer(f"{host}:{port}", reply["instance_id"])
        if why is None and reply.get("stale"):
            why = str(reply.get("message") or "KV transfer failed: prefill peer is stale")
        if why is not None:
            for i in items:
                failures[i] = why
            log(f"KV transfer failed for bootstrap_room={rooms[0]}: {why}", "TP0")
    return None, failures


def ensure_parallel_info(eng: Engine, host: str, port: int, timeout: float) -> str | None:
    """SGLang 0.5.23's decode, the first time it meets a prefill (its bootstrap address):
    GET /route for the prefill's parallel info, then the sanity checks of
    disaggregation/common/conn.py ``try_ensure_parallel_info``. A page size or KV cache dtype
    that differs raises RuntimeError in the decode scheduler (decode.py
    ``_ensure_prefill_info``, uncaught), which ends the scheduler: ``run_scheduler_process``
    logs "Scheduler hit an exception" and SIGQUITs the server, whose handler kills the whole
    process tree. So the decode dies, and every request on it with it (the client sees its
    connection cut, no HTTP status). None when the info was fetched and matches (then cached,
    as SGLang's prefill_info_table), else why it could not be fetched (a failed bootstrap)."""
    addr = f"{host}:{port}"
    if addr in eng.prefill_info:
        return None
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
                     "&target_pp_rank=-1&engine_rank=-1")
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            return f"Failed to get prefill server info: {resp.status}"
        info = json.loads(raw)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return f"Error fetching prefill server info from bootstrap: {e}"
    finally:
        conn.close()
    a = eng.args
    mismatch = None
    if info.get("page_size") is not None and info["page_size"] != a.page_size:
        mismatch = (f"Page size mismatch: prefill server has page_size={info['page_size']}, "
                    f"but decode server has page_size={a.page_size}. Both servers must use "
                    "the same --page-size value.")
    elif info.get("kv_cache_dtype") is not None and info["kv_cache_dtype"] != a.kv_cache_dtype:
        mismatch = (f"KV cache dtype mismatch: prefill server has kv_cache_dtype="
                    f"{info['kv_cache_dtype']}, but decode server has kv_cache_dtype="
                    f"{a.kv_cache_dtype}. Both servers must use the same --kv-cache-dtype value.")
    if mismatch is not None:
        log(f"Scheduler hit an exception: Traceback (most recent call last):\n"
            f"RuntimeError: {mismatch}", "TP0")
        log("Received sigquit from a child process. It usually means the child failed.")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(5)  # not reached
        os._exit(137)
    eng.prefill_info[addr] = info
    return None


def pair_failures(eng: Engine, boot: dict[str, list]) -> dict[int, str]:
    """Prefill side: the items whose decode peer this prefill is stale for (smg #2382,
    vllm #49238). Only a prefill that may go stale (or already is) waits for the decode's
    registration of each bootstrap_room; otherwise nothing changes."""
    if not boot or not (eng.pair.stale_enabled or eng.pair.stale):
        return {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + eng.knobs.pair_wait_secs
    for i, (host, room) in enumerate(
        zip(boot["bootstrap_host"], boot["bootstrap_room"], strict=True)
    ):
        if host == FAKE_BOOTSTRAP_HOST:
            continue
        peer = eng.pair.wait_room(room, deadline - time.monotonic())
        why = eng.pair.stale_for(peer) if peer is not None else None
        if why is not None:
            failures[i] = why
            log(f"KV transfer failed for bootstrap_room={room}: {why}", "TP0")
    return failures


def probe_bootstrap(host: str, port: int, timeout: float) -> str | None:
    """GET http://host:port/health without proxies; None if it answered 200."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            return f"GET /health returned {resp.status}"
        return None
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()
