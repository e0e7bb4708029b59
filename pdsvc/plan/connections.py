"""Plan -> every connection one host opens to another (`pdsvc plan`, for the firewalls).

Read from the same plan fields the units are rendered from, so a packet the units send is a
row here: an engine's ``router_urls`` (its runtime's ``--router``), ``url`` (``--advertise``, what
the router dials), ``pairs`` (``--pair``), ``peer_health`` (``--restart-with``), ``fleet``
(``--fleet``: the other engine hosts' heals and cures of a heal cascade), a rank's
``health_url`` and ``dist_init_addr``. SGLang's own KV/ZMQ and NCCL rank ports are ephemeral
and only named.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from pdsvc.plan.types import EnginePlan, Plan

Purpose = Literal["membership", "serving", "canary", "bootstrap", "peer watch", "cascade",
                  "dist-init", "rank ready", "front", "vrrp"]
#: VRRP (RFC 5798) is IP protocol 112, no port: its rows' target is ADDRESS:VRRP_PORT
VRRP_PORT = "vrrp"


@dataclass(frozen=True)
class Connection:
    """One connection between two hosts of the plan: who opens it, to where, and why."""

    source: str  # the inventory host that opens it
    target: str  # ADDRESS:PORT it dials (ADDRESS:vrrp: IP protocol 112, keepalived's)
    purpose: Purpose
    why: str  # one line for the reader

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def host_port(url: str) -> str:
    """ADDRESS:PORT of an http:// URL."""
    return urllib.parse.urlsplit(url).netloc


def connections(plan: Plan) -> list[Connection]:
    """Every (source host -> ADDRESS:PORT, why) between distinct hosts of the plan, by
    destination host, port and source; nothing on one host (no inventory)."""
    if not plan.hosts:
        return []
    r = plan.router
    assert r is not None  # the whole plan has its router
    address = {h.name: h.address for h in plan.hosts}
    by_address = {h.address: h.name for h in plan.hosts}
    whys: dict[tuple[str, str, Purpose], list[str]] = {}

    def add(source: str, target: str, purpose: Purpose, why: str) -> None:
        if target.rpartition(":")[0] != address[source]:  # to its own host: no firewall
            said = whys.setdefault((source, target, purpose), [])
            if why not in said:
                said.append(why)

    for e in plan.engines:
        for url in e.router_urls:  # the runtime registers the engine; each router dials it
            add(e.machine, host_port(url), "membership",
                f"{e.name} registers with the router (POST/GET/DELETE /workers)")
        for router in plan.routers if e.router_urls else ():
            add(router.machine, host_port(e.url), "serving",
                f"{'router' if len(plan.routers) == 1 else router.name} -> {e.name} HTTP "
                "(requests, /health)")
        for prefill, port, decode in e.pairs:
            _canary(e, prefill, port, decode, add)
        for url in e.peer_health:
            add(e.machine, host_port(url), "peer watch",
                f"{e.name} watches {url} (--restart-with)")
        for there in e.fleet:  # one row per pair of engine hosts, whichever engine reads
            add(e.machine, there, "cascade",
                f"{e.machine}'s engine runtimes read {by_address[there.rpartition(':')[0]]}'s "
                "heals and cures of a heal cascade (--fleet, keyed)")
        if e.node_rank > 0:
            add(e.machine, e.dist_init_addr, "dist-init",
                f"{e.name} rank {e.node_rank} -> rank 0 dist-init (and NCCL, ephemeral)")
            add(e.machine, host_port(e.health_url), "rank ready",
                f"{e.name} rank {e.node_rank} is ready when rank 0's {e.health_url} is")
    if plan.vip is not None:
        _moving_address(plan, add)
    order = {h.name: i for i, h in enumerate(plan.hosts)}

    def key(c: Connection) -> tuple[int, int, int, str]:
        addr, _, port = c.target.rpartition(":")
        return (order.get(by_address.get(addr, ""), len(order)),
                int(port) if port.isdigit() else 0, order[c.source], c.purpose)

    out = [Connection(*k, "; ".join(v)) for k, v in whys.items()]
    return sorted(out, key=key)


Add = Callable[[str, str, Purpose, str], None]


def _canary(e: EnginePlan, prefill: str, port: int, decode: str, add: Add) -> None:
    """The pair canary as pdsvc/ship/runtime/canary.py sends it from this engine's host: the peer's
    /health, then the same /generate to both sides; a decode taking it dials the prefill's
    bootstrap server at the prefill URL's host (the router hands decodes exactly that)."""
    me = e.url.rstrip("/")
    peer = decode if prefill.rstrip("/") == me else prefill
    paths: dict[str, list[str]] = {}
    for url, path in ((peer, "/health"), (prefill, "/generate"), (decode, "/generate")):
        paths.setdefault(url, []).append(path)
    for url, said in paths.items():
        add(e.machine, host_port(url), "canary",
            f"{e.name} pair canary -> {url} ({', '.join(said)})")
    if decode.rstrip("/") == me:
        add(e.machine, f"{urllib.parse.urlsplit(prefill).hostname}:{port}", "bootstrap",
            f"{e.name} -> {prefill} KV bootstrap (then NIXL/ZMQ rank ports, ephemeral, "
            "both ways)")


def _moving_address(plan: Plan, add: Add) -> None:
    """Routers on several hosts: each router host's front sends requests and health checks to
    every router, and the router hosts' keepalived speak VRRP to each other (unicast)."""
    assert plan.vip is not None and plan.front is not None
    for host, _ in plan.vip.members:
        for r in plan.routers:
            add(host, f"{r.host}:{r.port}", "front",
                f"{host}'s front (HAProxy) -> {r.name} (requests, GET /readiness checks)")
        for other, address in plan.vip.members:
            if other != host:
                add(host, f"{address}:{VRRP_PORT}", "vrrp",
                    f"{host}'s keepalived -> {other}: VRRP adverts (IP protocol 112, not TCP) "
                    f"for {plan.vip.address}")
