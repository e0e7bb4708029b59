"""Checks across the config's sections that need only the config (the host's are the plan's,
pdsvc/plan/pinning.py): hosts name what they run, TP sizes fit the GPUs, GPUs and ports are
not shared. Each problem is a (key path, message) pair; parse_config reports the first.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from pdsvc.config.fields import dotted
from pdsvc.config.pairing import pair_problems
from pdsvc.config.roles import Instance
from pdsvc.config.schema import Config
from pdsvc.config.sections import RUN_REF, expand_ref
from pdsvc.sglang import DIST_INIT_SPAN


def cross_field_problems(config: Config) -> list[tuple[tuple, str]]:
    """Checks across sections, as (key path, problem) pairs; the first one is reported."""
    problems: list[tuple[tuple, str]] = []
    engines = config.engines
    problems += _host_problems(config)
    placed = config.placement()
    for inst in engines:
        nodes = max(1, len(placed.get(inst.key, ())))  # the hosts it spans
        want = len(inst.cfg.gpus) * nodes
        if inst.cfg.tp is not None and inst.cfg.tp != want:
            across = f" on each of its {nodes} hosts" if nodes > 1 else ""
            problems.append((inst.loc + ("tp",), (
                f"tp is {inst.cfg.tp} but {len(inst.cfg.gpus)} GPUs are listed{across}; one TP "
                f"rank runs per GPU, so make it {want}"
            )))
    for i, inst in enumerate(engines):
        for other in engines[:i]:
            if placed and not set(placed.get(inst.key, ())) & set(placed.get(other.key, ())):
                continue  # on different hosts: GPU 0 of one is not GPU 0 of the other
            shared = sorted(set(inst.cfg.gpus) & set(other.cfg.gpus))
            if shared:
                whom = "role" if inst.index is None and other.index is None else "engine"
                problems.append((inst.loc + ("gpus",), (
                    f"GPU {shared[0]} is also in {other.key}.gpus; give each {whom} its own GPUs"
                )))
    problems += _port_problems(config)
    problems += _replica_problems(config)
    problems += pair_problems(config)
    return problems


def _host_problems(config: Config) -> list[tuple[tuple, str]]:
    """`hosts`: every run item names something, every engine runs somewhere, the router once."""
    if not config.hosts:
        return []
    by_role = {role: config.instances(role) for role in ("prefill", "decode")}
    placed = config.placement()
    loopback = [h for h, hc in config.hosts.items() if is_loopback(hc.address)]
    return [
        *_address_problems(config, loopback),
        *_run_problems(config, by_role),
        *_placement_problems(config, by_role, placed),
        *_router_reach_problems(config, placed, loopback=bool(loopback)),
        *_ucx_problems(config, placed),
    ]


def _address_problems(config: Config, loopback: list[str]) -> list[tuple[tuple, str]]:
    """One address per host, and none on loopback unless every host is (one machine)."""
    hosts = config.hosts or {}
    problems: list[tuple[tuple, str]] = []
    seen: dict[str, str] = {}
    for host, hc in hosts.items():
        if hc.address in seen:
            problems.append((("hosts", host, "address"), (
                f"{hc.address} is also hosts.{seen[hc.address]}.address; one address per host"
            )))
        seen.setdefault(hc.address, host)
    if loopback and len(loopback) < len(hosts):  # all loopback: hosts of one machine
        problems.append((("hosts", loopback[0], "address"), (
            f"{hosts[loopback[0]].address} is a loopback address, which the other hosts "
            "cannot reach (the router and decode dial it); give the host's routable IP"
        )))
    return problems


def _run_problems(
    config: Config, by_role: dict[str, tuple[Instance, ...]]
) -> list[tuple[tuple, str]]:
    """Each item of a host's `run` that names no engine of the config."""
    hosts = config.hosts or {}
    problems: list[tuple[tuple, str]] = []
    for host, hc in hosts.items():
        for j, ref in enumerate(hc.run):
            if expand_ref(ref, by_role):
                continue
            m = RUN_REF.match(ref)
            assert m is not None  # HostConfig checked the syntax
            role = m.group(1)
            spec = config.prefill if role == "prefill" else config.decode
            have = (f"{role} is one mapping; write `{role}`" if not isinstance(spec, list)
                    else f"{role} has items 0…{len(spec) - 1}")
            problems.append((("hosts", host, "run", j), f"{ref} names no engine: {have}"))
    return problems


def _placement_problems(
    config: Config, by_role: dict[str, tuple[Instance, ...]],
    placed: dict[str, tuple[str, ...]],
) -> list[tuple[tuple, str]]:
    """Every engine named alike on each host it runs on and run somewhere; the router on
    exactly one host."""
    hosts = config.hosts or {}
    problems: list[tuple[tuple, str]] = []
    for inst in config.engines:
        named = {(host, ref) for host, hc in hosts.items() for ref in hc.run
                 if inst.key in expand_ref(ref, by_role)}
        if len({ref for _, ref in named}) > 1:  # e.g. `prefill` on a, `prefill[1]` on b
            how = ", ".join(f"{h} (as `{r}`)" for h, r in sorted(named))
            problems.append((("hosts",), (
                f"{inst.key} is named on several hosts in different ways: {how}; an engine "
                "spans hosts only when each names it alike — name items one per host "
                f"(`{inst.role}[0]`, `{inst.role}[1]`, …) to run them apart"
            )))
        if inst.key not in placed:
            problems.append((("hosts",), (
                f"{inst.key} runs on no host; add `{inst.key}` (or `{inst.role}`) to a host's run"
            )))
    routers = placed.get("router", ())
    if not routers:
        problems.append((("hosts",), "the router runs on no host; add `router` to one host's run"))
    elif len(routers) > 1 and config.router.vip.address is None:
        problems.append((("router", "vip", "address"), (
            f"the router is on {len(routers)} hosts ({', '.join(routers)}) and clients need one "
            "address: set router.vip.address (keepalived moves it between them) and "
            "router.vip.interface, or run the router on one host")))
    return problems


def _ucx_problems(config: Config, placed: dict[str, tuple[str, ...]]) -> list[tuple[tuple, str]]:
    """A host's ucx_net_devices that an engine there also sets in its env (or the host's)."""
    hosts = config.hosts or {}
    problems: list[tuple[tuple, str]] = []
    for host, hc in hosts.items():
        if hc.ucx_net_devices is None:
            continue
        for inst in config.engines:
            if host in placed.get(inst.key, ()) and "UCX_NET_DEVICES" in (
                {**config.runtime.env, **inst.cfg.env, **hc.env}
            ):
                problems.append((("hosts", host, "ucx_net_devices"), (
                    f"{inst.key} or hosts.{host}.env also sets UCX_NET_DEVICES; set it in one "
                    "place"
                )))
    return problems


def is_loopback(host: str) -> bool:
    """An address only its own machine reaches: 127.0.0.0/8, or `localhost` and names below
    it (RFC 6761 section 6.3: they resolve to loopback)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        name = host.lower().rstrip(".")
        return name == "localhost" or name.endswith(".localhost")


def _router_reach_problems(config: Config, placed: dict[str, tuple[str, ...]], *,
                           loopback: bool) -> list[tuple[tuple, str]]:
    """The engines register with the router's URL (--router), built from router.host unless
    it is a wildcard (then: its host's address). Engines on another host cannot reach it at a
    loopback address; hosts that are all loopback are one machine's (tests), where they can."""
    router_host = (placed.get("router") or (None,))[0]
    if not config.hosts or router_host is None or not is_loopback(config.router.host):
        return []
    if loopback and all(is_loopback(hc.address) for hc in config.hosts.values()):
        return []
    elsewhere = sorted({hosts[0] for key, hosts in placed.items()
                        if key != "router" and hosts[0] != router_host})
    if not elsewhere:
        return []
    return [(("router", "host"), (
        f"{config.router.host} is a loopback address, but the engines on {', '.join(elsewhere)} "
        f"register with the router at http://{config.router.host}:{config.router.port}, which "
        f"on those hosts is their own; use 0.0.0.0 (the default: they then reach it at "
        f"hosts.{router_host}.address) or that host's routable address"))]


def _port_problems(config: Config) -> list[tuple[tuple, str]]:
    """Every port the plan opens is distinct, and dist-init bases keep their port span free.
    A port allocated from an instance's index is named as such: giving it is the fix."""
    # the router's first: the port clients know; an engine's that clashes with it is named
    ports = [_section_port(config, "router", key) for key in ("port", "prometheus_port")]
    r = config.router
    if r.vip.address is not None and r.replicas == 1:  # a router per host: the same ports
        ports += [(("router", "replica_port"), r.replica_port, ""),
                  _section_port(config.router, "front", "prometheus_port", ("router",))]
    if r.replicas > 1:  # each router's own port and metrics port, after the first's metrics
        ports += [(("router", "replica_port"), r.replica_port + i,
                   f"router {i}'s port is router.replica_port + {i}" if i else "")
                  for i in range(r.replicas)]
        ports += [(("router", "prometheus_port"), r.prometheus_port + i,
                   f"router {i}'s metrics port is router.prometheus_port + {i}")
                  for i in range(1, r.replicas)]
        ports.append(_section_port(config.router, "front", "prometheus_port", ("router",)))
    for inst in config.engines:
        for key in ("port", "bootstrap_port") if inst.role == "prefill" else ("port",):
            ports.append(_port_of(inst, key))
    if config.cascade_hosts():  # bound on each engine host only when there are several
        ports.append(_section_port(config, "lifecycle", "cascade_port"))
    if config.metrics.textfile:  # each host's node_exporter, where the scrape config points
        ports.append(_section_port(config, "metrics", "node_exporter_port"))
    spans: list[tuple[tuple, int, str]] = [
        _port_of(inst, "dist_init_port") for inst in config.engines
    ]
    problems: list[tuple[tuple, str]] = []
    seen: dict[int, tuple[tuple, int, str]] = {}
    for now in ports:
        if now[1] in seen:  # named at the key the user wrote: the other one is explained
            here, there = (seen[now[1]], now) if now[2] and not seen[now[1]][2] else (
                now, seen[now[1]])
            problems.append((here[0], f"port {now[1]} is also {dotted(there[0])}"
                             + _why_there(there[2]) + "; each service needs its own"
                             + _allocated_hint(here[2])))
        seen.setdefault(now[1], now)
    for i, (loc, base, name) in enumerate(spans):
        for other_loc, other, _ in spans[:i]:
            if abs(base - other) < DIST_INIT_SPAN:
                problems.append((loc, (
                    f"{base} is within {DIST_INIT_SPAN} of {dotted(other_loc)} {other}; SGLang "
                    f"takes ports base+1…base+5+dp from each, keep them ≥{DIST_INIT_SPAN} apart "
                    f"(e.g. {other + DIST_INIT_SPAN})" + _allocated_hint(name)
                )))
        for other_loc, port, _ in ports:
            if base <= port < base + DIST_INIT_SPAN:
                problems.append((loc, (
                    f"{base}…{base + DIST_INIT_SPAN - 1} is kept for SGLang's ZMQ/NCCL ports but "
                    f"{dotted(other_loc)} is {port}; move one of them" + _allocated_hint(name)
                )))
    return problems


def _replica_problems(config: Config) -> list[tuple[tuple, str]]:
    """Several routers: behind HAProxy on one host (router.replicas), or one per router host
    behind a moving address (router.vip) with `hosts`; the bundles other than systemd's refuse
    both (render/kit.systemd_only_front)."""
    r, vip = config.router, config.router.vip
    routers = config.placement().get("router", ())
    if r.replicas > 1 and config.hosts:
        return [(("router", "replicas"), "with hosts, run one router per host: `router` in the "
                 "run of two or more hosts and router.vip.address; set router.replicas: 1")]
    if vip.address is None:
        return []
    if len(routers) < 2:
        return [(("router", "vip", "address"), "a moving address needs routers on two or more "
                 "hosts (`router` in the run of each, under hosts); unset it for one")]
    if vip.interface is None:
        return [(("router", "vip", "interface"), "the NIC keepalived puts router.vip.address "
                 "on, the same name on every router host (`ip -br link`), e.g. eth0")]
    if r.host not in ("0.0.0.0", "::"):
        return [(("router", "host"), f"{r.host}: with router.vip the front on each router host "
                 "listens on every address (0.0.0.0), so it serves the moving one once it is "
                 "there; set router.host: 0.0.0.0")]
    taken = [h for h, hc in (config.hosts or {}).items() if hc.address == vip.address]
    if taken:
        return [(("router", "vip", "address"), f"{vip.address} is hosts.{taken[0]}.address; "
                 "the moving address must be one no host has")]
    return []


def _section_port(config: Any, section: str, key: str,
                  parents: tuple[str, ...] = ()) -> tuple[tuple, int, str]:
    """(key path, port, '' when given) of a section's port: one left out is its default, not
    allocated from an index. ``parents``: where ``config`` is itself (router.front)."""
    model = getattr(config, section)
    loc = (*parents, section, key)
    why = "" if key in model.model_fields_set else f"{'.'.join(loc)} is its default"
    return loc, getattr(model, key), why


def _port_of(inst: Instance, key: str) -> tuple[tuple, int, str]:
    """(key path, port, how it got a port the user did not write: '' when given)."""
    loc = inst.loc + (key,)
    if key in inst.allocated:
        why = f"{dotted(loc)} was allocated from the instance's index"
    elif inst.index is None and key not in inst.cfg.model_fields_set:
        why = f"{dotted(loc)} is its default"
    else:
        why = ""
    return loc, getattr(inst.cfg, key), why


def _allocated_hint(why: str) -> str:
    return f" ({why}; set it)" if why else ""


def _why_there(why: str) -> str:
    """Why the other key of a clash has its port, when the user did not write it."""
    return f" ({why})" if why else ""
