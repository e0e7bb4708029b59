"""Port checks: every port the plan opens can be bound here (and SGLang's dist-init span is
free); when one cannot, who holds it (/proc/net/tcp{,6} and /proc/*/fd)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from pdsvc.plan.build import DIST_INIT_SPAN, EnginePlan, Plan
from pdsvc.topology import format_cpulist

from .host import comm
from .rows import Row, fail, ok, warn

DP_ZMQ_PORTS = 6  # with --enable-dp-attention SGLang binds base+1…base+6 (PortArgs.init_new)


@dataclass(frozen=True)
class PlannedPort:
    host: str
    port: int
    what: str


def planned_ports(plan: Plan) -> list[PlannedPort]:
    """Every port the plan's units bind, with the address they bind it on."""
    ports = []
    for e in plan.engines:
        ports.append(PlannedPort(e.host, e.port, f"{e.name} HTTP"))
        if e.role == "prefill":
            ports.append(PlannedPort(e.host, e.bootstrap_port, f"{e.name} KV bootstrap"))
        if e.node_rank == 0:  # the other ranks of an engine spanning hosts dial rank 0's
            dist_host, dist_port = e.dist_init_addr.rsplit(":", 1)
            ports.append(PlannedPort(dist_host, int(dist_port), f"{e.name} dist-init"))
    # one port per engine host, bound by each of its engine runtimes (SO_REUSEPORT, fleet.py)
    for listen in dict.fromkeys(e.fleet_listen for e in plan.engines if e.fleet_listen):
        host, port = listen.rsplit(":", 1)
        ports.append(PlannedPort(host, int(port), "the engine runtimes' heals and cures "
                                 "(lifecycle.cascade_port)"))
    for r in plan.routers:  # none: one host of several, without the router
        ports.append(PlannedPort(r.host, r.port, f"{r.name} HTTP"))
        ports.append(PlannedPort(r.prometheus_host, r.prometheus_port, f"{r.name} Prometheus"))
    if plan.front is not None:
        f = plan.front
        ports.append(PlannedPort(f.host, f.port, f"{f.name} HTTP"))
        ports.append(PlannedPort(f.prometheus_host, f.prometheus_port, f"{f.name} Prometheus"))
    return ports


def try_bind(host: str, port: int) -> int:
    """0 when ``host:port`` can be bound (SO_REUSEADDR off, so any socket on it counts); else
    the errno (EADDRINUSE, EADDRNOTAVAIL, EACCES …)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return errno.EADDRNOTAVAIL
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.errno or errno.EADDRINUSE
    return 0


@dataclass(frozen=True)
class PortUse:
    states: frozenset[str]  # /proc/net/tcp st column: 0A LISTEN, 06 TIME_WAIT, 01 ESTABLISHED
    holders: tuple[tuple[int, str], ...]  # (pid, comm)
    uids: frozenset[int]


def port_use(proc_root: Path, port: int) -> PortUse:
    """Who holds ``port``: /proc/net/tcp{,6} for the sockets, /proc/*/fd for their owners
    (other users' processes are visible to root only)."""
    states, inodes, uids = set(), set(), set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or ":" not in f[1]:
                continue
            try:
                local_port = int(f[1].rsplit(":", 1)[1], 16)
            except ValueError:
                continue
            if local_port != port:
                continue
            states.add(f[3].upper())
            with contextlib.suppress(ValueError):
                uids.add(int(f[7]))
            if f[9] != "0":
                inodes.add(f"socket:[{f[9]}]")
    holders: set[tuple[int, str]] = set()
    if inodes:
        try:
            pids = [p for p in os.listdir(proc_root) if p.isdigit()]
        except OSError:
            pids = []
        for pid in pids:
            fd_dir = proc_root / pid / "fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(fd_dir / fd)
                except OSError:
                    continue
                if link in inodes:
                    holders.add((int(pid), comm(proc_root, int(pid))))
                    break
    return PortUse(frozenset(states), tuple(sorted(holders)), frozenset(uids))


def _time_wait_only(use: PortUse) -> bool:
    """Only closed connections waiting out TIME_WAIT: a server with SO_REUSEADDR binds."""
    return bool(use.states) and use.states <= {"06"}


def describe_use(use: PortUse) -> str:
    if use.holders:
        return "in use by " + ", ".join(f"pid {pid} {comm}" for pid, comm in use.holders)
    if "0A" in use.states and use.uids:
        owner = ", ".join(str(u) for u in sorted(use.uids))
        return f"in use (listening, uid {owner}; run as root to see the process)"
    return "in use"


def _unprivileged_start(proc_root: Path) -> int:
    try:
        return int((proc_root / "sys/net/ipv4/ip_unprivileged_port_start").read_text().strip())
    except (OSError, ValueError):
        return 1024


def check_ports(plan: Plan, proc_root: Path) -> list[Row]:
    """Every planned port binds here; who holds one that does not."""
    rows = []
    low = _unprivileged_start(proc_root)
    free: list[PlannedPort] = []
    for p in planned_ports(plan):
        where = f"{p.host}:{p.port}"
        if p.port < low and plan.user != "root":
            rows.append(fail("ports", f"{where} ({p.what}) is a privileged port (< {low}); the "
                                      f"units run as {plan.user} without capabilities",
                             f"use a port ≥ {low} in the config"))
            continue
        err = try_bind(p.host, p.port)
        if err == 0:
            free.append(p)
        elif err == errno.EADDRNOTAVAIL:
            rows.append(fail("ports", f"{where} ({p.what}): {p.host} is not an address of this "
                                      "host", "set the host to an address of this machine "
                                              "(or 0.0.0.0)"))
        elif err == errno.EADDRINUSE:
            use = port_use(proc_root, p.port)
            if _time_wait_only(use):
                rows.append(warn("ports", f"{where} ({p.what}) has only TIME_WAIT connections; "
                                          "servers that set SO_REUSEADDR (uvicorn) can bind it",
                                 "wait a minute and re-run pdsvc doctor"))
            else:
                rows.append(fail("ports", f"{where} ({p.what}) {describe_use(use)}",
                                 "stop what holds it (`ss -ltnp 'sport = :"
                                 f"{p.port}'`) or move the port in the config"))
        else:
            rows.append(warn("ports", f"{where} ({p.what}): cannot test: "
                                      f"{os.strerror(err)}", "re-run pdsvc doctor as root"))
    rows += _span_rows(plan, proc_root)
    if not rows:
        by_host: dict[str, list[str]] = {}
        for p in free:
            by_host.setdefault(p.host, []).append(str(p.port))
        listed = "  ".join(f"{h}:{','.join(ps)}" for h, ps in by_host.items())
        spans = ", ".join(f"{b + 1}…{b + DIST_INIT_SPAN - 1}" for _, b in _dist_bases(plan))
        kept = f" (and {spans} kept for SGLang)" if spans else ""
        rows.append(ok("ports", f"{len(free)} free: {listed}{kept}"))
    return rows


def _dist_bases(plan: Plan) -> list[tuple[EnginePlan, int]]:
    return [(e, e.dist_init_port) for e in plan.engines if e.node_rank == 0]


def _span_rows(plan: Plan, proc_root: Path) -> list[Row]:
    """SGLang takes ports above each dist-init base (ZMQ with --enable-dp-attention)."""
    rows = []
    for e, base in _dist_bases(plan):
        dist_host = e.dist_init_addr.rsplit(":", 1)[0]
        dp = "--enable-dp-attention" in e.argv
        busy = [port for port in range(base + 1, min(base + DIST_INIT_SPAN, 65536))
                if try_bind(dist_host, port) == errno.EADDRINUSE
                and not _time_wait_only(port_use(proc_root, port))]
        if not busy:
            continue
        needed = [p for p in busy if p <= base + DP_ZMQ_PORTS]
        text = (f"{e.name}: {format_cpulist(busy)} in use, within {base + 1}…"
                f"{base + DIST_INIT_SPAN - 1} kept for SGLang (dist-init {base})")
        fix = f"free them or move {e.role}.dist_init_port"
        if dp and needed:
            rows.append(fail("ports", text + f"; with --enable-dp-attention SGLang binds "
                                             f"{base + 1}…{base + DP_ZMQ_PORTS}", fix))
        else:
            rows.append(warn("ports", text + "; SGLang binds base+1…+6 with "
                                             "--enable-dp-attention", fix))
    return rows
