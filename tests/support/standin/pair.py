"""The NIXL pair state of the SGLang stand-in (tests/support/fake_sglang.py; stdlib only).

Real SGLang names each NIXL agent with a fresh uuid4 per process. A decode learns a prefill's
info from the prefill's bootstrap server (``--disaggregation-bootstrap-port``) and registers
its own KV args there; both sides then keep what they learnt about the other. Field reports
show what happens when one side is replaced by a new process behind an address that stays
reachable:

* sglang #33789 (fixed by sglang PR #34289): the decode keeps the cached endpoints of the dead
  prefill; every transfer with it fails until the decode restarts ("decode is stale");
* smg-project/smg #2382, vllm #49238: after decode peers are replaced, prefills that had peered
  with them keep stale NIXL/UCX agent state; every later KV transfer through them fails while
  every pod reports healthy, and the failed generations come back as HTTP 200 with a
  ``finish_reason`` of type abort and empty text; only restarting the prefill heals it
  ("prefill is stale").

This module holds one process's side of that: its instance id, the peer instance it first
paired with per peer key, and the peers it is stale for. A peer key is the address the peer is
known by: the decode knows a prefill by its bootstrap ``host:port`` (from the request), the
prefill knows a decode by the decode's own ``--host:--port`` (sent when it registers).

Knobs (read by config.py): ``FAKE_SGLANG_STALE_PAIR`` = ``decode`` | ``prefill`` | ``both`` |
unset/``off`` (each process applies it to its own role only), ``FAKE_SGLANG_PAIR_FAILURE`` =
``abort200`` (default) | ``error500``, ``FAKE_SGLANG_PAIR_WAIT_SECS`` (2.0: how long a prefill
that may go stale waits for the decode's registration of a bootstrap_room before it answers).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

STALE_MODES = ("off", "decode", "prefill", "both")
FAILURE_MODES = ("abort200", "error500")
#: the fake endpoint on the prefill's bootstrap server (GET: its instance, POST: a decode
#: registers itself and the bootstrap_rooms it expects KV for)
PAIR_PATH = "/_fake/pair"
_ROOMS_KEPT = 4096


def parse_stale_mode(raw: str | None) -> str:
    """``None``/"" -> "off"; raises ValueError on anything not in STALE_MODES."""
    value = (raw or "").strip().lower() or "off"
    if value in ("none", "0", "false", "no"):
        value = "off"
    if value not in STALE_MODES:
        raise ValueError(f"stale_pair must be one of {', '.join(STALE_MODES)}; got {raw!r}")
    return value


def parse_failure_mode(raw: str | None) -> str:
    value = (raw or "").strip().lower() or "abort200"
    if value not in FAILURE_MODES:
        raise ValueError(f"pair_failure must be one of {', '.join(FAILURE_MODES)}; got {raw!r}")
    return value


class PairState:
    """One engine process's NIXL pair memory. Thread-safe."""

    def __init__(
        self,
        role: str,
        stale_mode: str = "off",
        failure_mode: str = "abort200",
        log: Callable[[str], None] = lambda msg: None,
    ) -> None:
        self.role = role
        self.stale_mode = parse_stale_mode(stale_mode)
        self.failure_mode = parse_failure_mode(failure_mode)
        self._log = log
        self._cond = threading.Condition()
        self.instance_id = str(uuid.uuid4())
        self.peers: dict[str, dict[str, Any]] = {}
        self.stale: dict[str, dict[str, Any]] = {}
        # prefill side: bootstrap_room -> the decode peer key that registered it
        self._rooms: OrderedDict[int, str] = OrderedDict()

    # ---- switches ----------------------------------------------------------------------------

    @property
    def stale_enabled(self) -> bool:
        """Whether this process (by its own role) goes stale when a peer is replaced."""
        return self.stale_mode == "both" or self.stale_mode == self.role

    def new_instance(self) -> str:
        """Imitate a replaced process behind the same ports: fresh id, empty memory."""
        with self._cond:
            old = self.instance_id
            self.instance_id = str(uuid.uuid4())
            self.peers.clear()
            self.stale.clear()
            self._rooms.clear()
            self._cond.notify_all()
        self._log(
            f"NIXL agent {old} replaced by a new agent {self.instance_id} "
            "(fake new_instance: peer memory forgotten)"
        )
        return self.instance_id

    # ---- pairing -----------------------------------------------------------------------------

    def see_peer(self, key: str, peer_instance: str) -> str | None:
        """Record that peer ``key`` now runs ``peer_instance``. Returns the failure message if
        this side is (or just became) stale for ``key``, else None."""
        now = time.time()
        with self._cond:
            if key in self.stale:
                self.stale[key]["failures"] += 1
                return self._stale_message(key)
            known = self.peers.get(key)
            if known is None:
                self.peers[key] = {"instance_id": peer_instance, "first_seen": now,
                                   "replacements": 0}  # fmt: skip
                return None
            if known["instance_id"] == peer_instance:
                return None
            if not self.stale_enabled:
                # the fixed behaviour (sglang PR #34289): re-bootstrap with the new peer
                old = known["instance_id"]
                known.update(instance_id=peer_instance, first_seen=now)
                known["replacements"] += 1
                went_stale = False
            else:
                old = known["instance_id"]
                self.stale[key] = {"remembered_instance": old, "seen_instance": peer_instance,
                                   "since": now, "failures": 1}  # fmt: skip
                went_stale = True
        if went_stale:
            self._log(
                f"NIXL transfer to peer {key} failed: stale agent for instance {old} (the peer "
                f"now runs instance {peer_instance}); this {self.role} keeps the dead agent's "
                "metadata and every transfer with this peer will fail until it restarts"
            )
            return self._stale_message(key)
        self._log(
            f"NIXL peer {key} was replaced (instance {old} -> {peer_instance}); re-bootstrapped"
        )
        return None

    def stale_for(self, key: str) -> str | None:
        with self._cond:
            if key not in self.stale:
                return None
            self.stale[key]["failures"] += 1
            return self._stale_message(key)

    def _stale_message(self, key: str) -> str:
        s = self.stale[key]
        return (
            f"KV transfer failed: NIXL transfer to peer {key} failed: stale agent for instance "
            f"{s['remembered_instance']} (peer now runs {s['seen_instance']}; {self.role} "
            f"{self.instance_id} must be restarted)"
        )

    # ---- prefill side: which decode a bootstrap_room belongs to ------------------------------

    def register_rooms(self, key: str, rooms: Iterable[int]) -> None:
        with self._cond:
            for room in rooms:
                self._rooms[room] = key
                self._rooms.move_to_end(room)
            while len(self._rooms) > _ROOMS_KEPT:
                self._rooms.popitem(last=False)
            self._cond.notify_all()

    def wait_room(self, room: int, timeout: float) -> str | None:
        """The decode peer key that registered ``room``; waits up to ``timeout`` seconds."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while room not in self._rooms:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.1))
            return self._rooms[room]

    # ---- reporting ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {
                "instance_id": self.instance_id,
                "stale_pair": self.stale_mode,
                "stale_enabled": self.stale_enabled,
                "pair_failure": self.failure_mode,
                "peers": {k: dict(v) for k, v in self.peers.items()},
                "stale_peers": {k: dict(v) for k, v in self.stale.items()},
            }


# ---- decode side: the exchange with a prefill's bootstrap server ----------------------------


def exchange(
    host: str,
    port: int,
    me: str,
    instance_id: str,
    rooms: list[int],
    timeout: float,
) -> tuple[dict[str, Any] | None, str | None]:
    """POST our registration to the prefill bootstrap server at host:port.

    Returns (reply, None) on 200, (None, None) when the server has no pair endpoint (404: not a
    fake that tracks pairs), (None, reason) on any other failure."""
    payload = json.dumps({"peer": me, "instance_id": instance_id, "role": "decode",
                          "bootstrap_rooms": rooms}).encode()  # fmt: skip
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", PAIR_PATH, body=payload,
                     headers={"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status == 404:
            return None, None
        if resp.status != 200:
            return None, f"POST {PAIR_PATH} returned {resp.status}"
        reply = json.loads(raw)
        if not isinstance(reply, dict) or not isinstance(reply.get("instance_id"), str):
            return None, f"POST {PAIR_PATH} returned no instance_id"
        return reply, None
    except (OSError, http.client.HTTPException, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        conn.close()
