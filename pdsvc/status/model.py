"""What `pdsvc status` knows, as data: one probe's answer, the router's workers, each unit's view
and the report that collect.py fills, judge.py decides and format.py prints."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdsvc.ship.runtime.probe import HttpReply, NoAnswerKind
from pdsvc.status import runstate
from pdsvc.status.managers import ServiceState


@dataclass(frozen=True)
class Probe:
    """One GET: the HTTP status and latency, or why no HTTP answer came."""

    url: str
    code: int | None = None  # None: no HTTP answer (see error)
    latency_ms: float | None = None
    error: str | None = None  # connection refused, no answer within 2s, …
    body: str = field(default="", repr=False, compare=False)

    @classmethod
    def of(cls, url: str, reply: HttpReply) -> Probe:
        """The reply of the one client (pdsvc.ship.runtime.probe), in status's words."""
        if reply.status is None:
            return cls(url, error=no_answer_words(reply))
        return cls(url, reply.status, reply.latency_ms,
                   body=reply.body.decode("utf-8", "replace"))

    @property
    def ok(self) -> bool:
        return self.code == 200

    def summary(self) -> str:
        """`200 (3 ms)`, `503 (2 ms)`, `connection refused`."""
        if self.code is None:
            return self.error or "no answer"
        return f"{self.code} ({self.latency_ms:.0f} ms)"

    def reason(self) -> str:
        """The `reason` (or `status`) a JSON error body gives, e.g. the router's
        `insufficient healthy workers`; empty when there is none."""
        try:
            doc = json.loads(self.body)
        except ValueError:
            return ""
        if isinstance(doc, dict):
            return str(doc.get("reason") or doc.get("status") or "")
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "code": self.code, "latency_ms": self.latency_ms,
                "error": self.error}


def no_answer_words(reply: HttpReply) -> str:
    """Why no answer came, as a status row says it: `no answer within 2s`, `cannot resolve
    host (…)`, the OS's words as they are."""
    why = reply.no_answer
    if why is None:
        return reply.detail
    if why.kind is NoAnswerKind.TIMEOUT:
        return f"no answer within {why.timeout:g}s"
    if why.kind is NoAnswerKind.RESOLVE:
        return f"cannot resolve host ({why.text})"
    return why.words() if why.kind is NoAnswerKind.REFUSED else why.text


@dataclass(frozen=True)
class Worker:
    """One worker in the router's own view (GET /workers)."""

    url: str
    type: str  # prefill, decode (regular outside PD mode)
    healthy: bool


@dataclass(frozen=True)
class UnitView:
    role: str  # target, prefill, decode, router
    state: ServiceState
    probe: Probe | None  # engines: /health; router: /readiness; target: none


@dataclass(frozen=True)
class RouterList:
    """Another router's own view of its workers (router.replicas ≥ 2: the first router's is
    the Report's ``workers``)."""

    probe: Probe
    workers: tuple[Worker, ...] | None  # None: unread (see error)
    error: str | None


@dataclass(frozen=True)
class FrontServer:
    """One router as the front (HAProxy) sees it: ``show stat`` on its runtime API."""

    name: str
    status: str  # UP, DOWN, DRAIN, MAINT, "UP 1/2" (going down), ... as HAProxy says it
    sessions: int  # requests it is serving now (scur)

    @property
    def in_rotation(self) -> bool:
        return self.status.startswith("UP")


@dataclass(frozen=True)
class Report:
    name: str
    backend: str
    units: tuple[UnitView, ...]  # the target first, then the services of the plan
    workers: tuple[Worker, ...] | None  # None: the router's view could not be read
    workers_probe: Probe
    workers_error: str | None
    url: str  # where clients send requests
    serving: bool
    problems: tuple[str, ...]
    runs: tuple[runstate.UnitRun, ...] = ()  # how each unit's last run ended (the runtime's)
    pairs: tuple[runstate.PairView, ...] = ()  # the pair canary's P x D matrix
    more: tuple[RouterList, ...] = ()  # the other routers' lists, behind the front
    front: tuple[FrontServer, ...] | None = None  # the front's view of each router, if read
    front_error: str | None = None  # why it was not (no front: both None)
    #: a router host of a moving address (router.vip): (the address, whether this host has it)
    address: tuple[str, bool] | None = None

    @property
    def verdict(self) -> str:
        if self.serving:
            return "serving" + (f", but: {'; '.join(self.problems)}" if self.problems else "")
        return "not serving: " + ("; ".join(self.problems) or "unknown reason")
