"""Fakes of the router's /workers API and of canary rounds, shared by the runtime's pair tests
(tests/test_runtime_pairs.py, tests/test_runtime_hold.py)."""

from __future__ import annotations

import json
from collections import Counter

from pdsvc.ship.runtime.canary import Pair, Round
from pdsvc.ship.runtime.membership import Worker
from pdsvc.ship.runtime.probe import HttpReply, NoAnswer, NoAnswerKind


class FakeRouter:
    """The /workers API of sglang-router 0.3.2 or smg (status, 409 on a re-post); a worker's
    health checks paused by smg's PATCH (nested ``health``) or, on 0.3.2 (no PATCH route:
    405), by a POST with the flat ``disable_health_check`` or its PUT; ``checks_off`` says
    whose. What 0.3.2's PUT also does: ``listed_twice``, the URLs it registered once more
    (its worker_registry appends on every PUT), and ``breaker_reset``, the URLs whose
    circuit breaker it rebuilt with the default, whatever the router was started with."""

    def __init__(self, smg: bool = False, key: str = "k") -> None:
        self.smg, self.key = smg, key
        self.workers: list[dict] = []
        self.up = True
        self.lost = False  # its host gone: every call times out (after its whole timeout)
        self.waited = 0.0  # the seconds callers spent waiting on it
        self.calls: list[tuple[str, str]] = []
        self.posted: list[dict] = []  # each POST /workers body
        self.checks_off: set[str] = set()  # worker ids whose health checks are paused
        self.listed_twice: Counter[str] = Counter()  # URL -> the extra registrations
        self.breaker_reset: set[str] = set()
        self.added = 0  # workers ever registered: each gets an id of its own

    def __call__(self, url: str, timeout: float, body: bytes | None = None,
                 headers: dict | None = None, method: str | None = None) -> HttpReply:
        method = method or ("GET" if body is None else "POST")
        self.calls.append((method, url))
        if self.lost:
            self.waited += timeout
            return HttpReply(None, b"", f"timed out after {timeout:g} s",
                             no_answer=NoAnswer(NoAnswerKind.TIMEOUT, "", timeout))
        if not self.up:
            return HttpReply(None, b"", "connection refused",
                             no_answer=NoAnswer(NoAnswerKind.REFUSED, "", timeout))
        if (headers or {}).get("Authorization") != f"Bearer {self.key}":
            return HttpReply(401, b"", "HTTP 401")
        if method == "GET":
            return HttpReply(200, json.dumps({"workers": self.workers}).encode(), "HTTP 200")
        if method == "DELETE":
            wid = url.rsplit("/", 1)[1]
            for w in self.workers:
                if w["id"] == wid:
                    self.checks_off.discard(wid)
                    self.listed_twice.pop(w["url"], None)
                    if self.smg:
                        w["status"], w["is_healthy"] = "draining", False
                    else:
                        self.workers.remove(w)
            return HttpReply(202, b"{}", "HTTP 202")
        if method in ("PATCH", "PUT"):
            return self.update(method, url.rsplit("/", 1)[1], json.loads(body or b"{}"))
        doc = json.loads(body or b"{}")
        self.posted.append(doc)
        if any(w["url"] == doc["url"] for w in self.workers):
            return HttpReply(409, b"{}", "HTTP 409") if self.smg else HttpReply(202, b"", "")
        wid, self.added = f"id{self.added}", self.added + 1
        off = bool(doc.get("disable_health_check")) and not self.smg
        self.workers.append({"id": wid, "url": doc["url"], "worker_type": doc["worker_type"],
                             "is_healthy": True, **({"status": "ready"} if self.smg else
                                                    {"disable_health_check": off})})
        if off:
            self.checks_off.add(wid)
        return HttpReply(202, b"{}", "HTTP 202")


    def update(self, method: str, wid: str, doc: dict) -> HttpReply:
        worker = next((w for w in self.workers if w["id"] == wid), None)
        if worker is None:
            return HttpReply(404, b"{}", "HTTP 404")
        if self.smg and method == "PUT":
            raise AssertionError("smg's PUT replaces the worker (and probes /health): never")
        if not self.smg and method == "PATCH":
            return HttpReply(405, b"", "HTTP 405")
        off = doc["health"]["disable_health_check"] if self.smg else doc["disable_health_check"]
        (self.checks_off.add if off else self.checks_off.discard)(wid)
        worker["is_healthy"] = True  # either makes it healthy: smg Ready, 0.3.2 rebuilt
        if not self.smg:
            worker["disable_health_check"] = off
            self.listed_twice[worker["url"]] += 1
            self.breaker_reset.add(worker["url"])
        return HttpReply(202, b"{}", "HTTP 202")


WORKER = Worker("http://10.0.0.2:30000", "prefill", 8998)


def rounds(pair: Pair, ok: bool) -> list[Round]:
    return [Round(pair, ok, "" if ok else "decode: HTTP 200 with finish_reason abort")]
