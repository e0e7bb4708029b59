"""Config + Topology -> Plan: every port, GPU, CPU, flag, path and env var, decided once.

Renderers (systemd, supervisord, …) and install.sh only *read* the plan; nothing downstream
derives a value of its own. The plan holds a tuple of engines — N prefill + M decode on one host
(one of each by default); several hosts would be a generalisation of the same shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pdsvc import __version__
from pdsvc.errors import TopologyError
from pdsvc.plan.flags import env_str, flag_args  # noqa: F401  (flag_args: re-exported)
from pdsvc.plan.pinning import resolve_pinning
from pdsvc.plan.routing import front_of, router_argv, routers_of, vip_of  # noqa: F401
from pdsvc.plan.types import (  # noqa: F401  (re-exported: the plan's types are importable from here)
    FRONT_CONFIG,
    UNPLACED,
    VIP_CONFIG,
    EnginePlan,
    FrontPlan,
    HostPlan,
    K8sPlan,
    KvCheck,
    LifecyclePlan,
    MetricsPlan,
    Paths,
    Pinning,
    Plan,
    Role,
    RouterPlan,
    SupervisordPlan,
    VipPlan,
    plan_from_dict,
)
from pdsvc.sglang import CUDA_CACHE_MAXSIZE, DIST_INIT_SPAN, JIT_CACHE_ENV  # noqa: F401
from pdsvc.topology import Topology

if TYPE_CHECKING:  # the plan only reads the validated config; importing it costs pydantic
    from pdsvc.config.schema import Config, DecodeConfig, Instance, PrefillConfig

#: The oldest systemd that knows every directive the units use: ProtectClock= (245).
SYSTEMD_MIN = 245


def build_plan(
    config: Config, topology: Topology | None, *, config_source: str, config_text: str,
    host_topologies: dict[str, tuple[Topology, str]] | None = None,
    only_host: str | None = None,
) -> Plan:
    """Resolve every concrete value; raise TopologyError when a host cannot run the config.

    ``topology`` is the layout pdsvc read where it runs; ``host_topologies`` maps an inventory
    host to (its layout, the sha256 of its file) when the config names one for it. None: no
    host at all — a scheduler (Kubernetes) places the engines, so nothing is pinned and GPU
    numbers are only counts.
    """
    warnings: list[str] = []
    name = config.name
    site = _Site(config, topology, host_topologies or {}, only_host)
    paths = _paths(config)
    engines = _engines(site, paths, warnings)
    router_machines = config.placement().get("router", ("",))
    router_machine = router_machines[0]
    routers = routers_of(config, engines, machines=router_machines, address=site.address)
    front = front_of(config, paths, routers)
    vip = vip_of(config, paths, site.address, routers)
    hosts = _host_plans(site, engines, routers, (front, vip), warnings)
    sv_run_dir = config.supervisord.run_dir.rstrip("/")
    return _members(config.cascade_hosts(), Plan(
        name=name,
        target=f"{name}-pd.target",
        version=__version__,
        config_source=config_source,
        config_sha256=hashlib.sha256(config_text.encode()).hexdigest(),
        topology_source=topology.source if topology else UNPLACED,
        python=config.runtime.python,
        user=config.runtime.user,
        group=config.runtime.group,
        transfer_backend=config.transfer.backend,
        metrics=MetricsPlan(**config.metrics.model_dump()),
        kv_check=KvCheck(config.transfer.kv_check_bytes, config.transfer.kv_check_blocks,
                         config.transfer.kv_check_min_gbps),
        paths=paths,
        engines=engines,
        routers=routers,
        front=front,
        vip=vip,
        lifecycle=LifecyclePlan(**config.lifecycle.model_dump()),
        protect_home=_protect_home(config),
        read_write_paths=tuple(
            ([] if paths.cache_directory else [paths.jit_cache])
            + list(config.runtime.read_write_paths)
        ),
        warnings=tuple(warnings),
        format=config.format,
        supervisord=SupervisordPlan(
            **config.supervisord.model_dump(),
            control_socket=f"{sv_run_dir}/{name}-supervisord.sock",
            state_dir=f"{sv_run_dir}/{name}",
        ),
        hosts=hosts,
        k8s=K8sPlan(**config.k8s.model_dump()),
        router_machine=router_machine,
    ))


def _paths(config: Config) -> Paths:
    """Where the deployment's runtime, env files, key, state and JIT cache live."""
    name, jit = config.name, config.runtime.jit_cache
    return Paths(
        runtime=f"{config.runtime.libexec_dir}/{name}/runtime",
        env_dir=f"/etc/{name}",
        router_key=config.router.control_plane_key or f"/etc/{name}/router.key",
        run_dir=f"/run/{name}",
        state_dir=f"/var/lib/{name}",
        jit_cache=jit,
        cache_directory=jit.removeprefix("/var/cache/") if jit.startswith("/var/cache/") else None,
    )


def _protect_home(config: Config) -> Literal["yes", "read-only"]:
    """ProtectHome=: read-only when a path the engines read or write lies under a home."""
    under_home = [
        p for p in (config.runtime.python, config.model.path, config.runtime.jit_cache,
                    *config.runtime.read_write_paths)
        if p.startswith(("/home/", "/root/", "/root", "/run/user/"))
    ]
    return "read-only" if under_home else "yes"


@dataclass(frozen=True)
class _Site:
    """Where the plan is made for: the config's hosts and the GPU layout of each."""

    config: Config
    topology: Topology | None  # the layout read where pdsvc runs; None: a scheduler places
    host_topologies: dict[str, tuple[Topology, str]]  # host -> (its layout, its file's sha256)
    only_host: str | None

    def address(self, machine: str) -> str:
        """The address a machine's engines listen on; loopback on one host."""
        hosts = self.config.hosts
        return hosts[machine].address if hosts and machine else "127.0.0.1"

    def layout(self, machine: str) -> Topology | None:
        """The machine's GPU layout; None where nothing is pinned (a scheduler places the
        engines, or another host's layout is not this run's to check)."""
        if self.topology is None or (self.only_host and machine != self.only_host):
            return None  # placed by a scheduler, or another host's to check
        topo = (self.host_topologies[machine][0] if machine in self.host_topologies
                else self.topology)
        if not topo.gpus:
            raise _no_gpu(machine, topo)
        return topo


def _no_gpu(machine: str, topo: Topology) -> TopologyError:
    """The error for a layout that lists no GPU, with how to get one that does."""
    where = f"for host {machine} " if machine else ""
    return TopologyError(
        f"no NVIDIA GPU found {where}({topo.source})",
        hint=(f"set hosts.{machine}.topology to the file `pdsvc topology --json` "
              "writes on that host") if machine else (
            "that file lists no GPU: write it on the GPU host with `pdsvc topology "
            "--json > host.json`" if topo.source.startswith("file:") else
            "on a machine without the GPUs pass --topology FILE, written on the GPU "
            "host by `pdsvc topology --json > host.json` (the seed host's is "
            "etc/seed-host.topology.json)"),
    )


def _engines(site: _Site, paths: Paths, warnings: list[str]) -> tuple[EnginePlan, ...]:
    """Every engine's plan: each item of prefill and decode, once per machine it spans."""
    config, name = site.config, site.config.name
    placement = config.placement()  # {} on one host: engines listen on loopback only
    prefills, decodes = config.instances("prefill"), config.instances("decode")
    machines = {i.key: placement.get(i.key, ("",)) for i in (*prefills, *decodes)}
    prefill_units = _prefill_units(name, prefills, machines)
    # a decode that does not find bootstrap_port in a request falls back to its own flag:
    # prefill[0]'s (the router sends each prefill's port with every request, sglang #5704)
    bootstrap_port = prefills[0].cfg.bootstrap_port
    engines = []
    for count, insts in ((len(prefills), prefills), (len(decodes), decodes)):
        for inst in insts:
            couple = inst.role == "decode" and inst.cfg.restart_with_prefill
            if couple == "auto":
                couple = config.transfer.backend == "nixl" and len(prefills) == 1
            where = machines[inst.key]
            for rank, machine in enumerate(where):
                restarts_with = prefill_units[machine] if couple else ()
                # PartOf= stops at the host: a prefill elsewhere is watched by the runtime
                remote = () if not couple else tuple(
                    f"http://{site.address(machines[p.key][0])}:{p.cfg.port}/health"
                    for p in prefills if machine not in machines[p.key]
                )
                engines.append(_engine(
                    config, site.layout(machine), inst.role, inst.cfg, key=inst.key,
                    name=unit_name(name, inst, count), host=site.address(machine),
                    leader=site.address(where[0]), nnodes=len(where), node_rank=rank,
                    machine=machine, paths=paths,
                    bootstrap_port=inst.cfg.bootstrap_port if inst.role == "prefill"
                    else bootstrap_port,
                    warnings=warnings,
                    # NIXL: any prefill's (re)start restarts the decode
                    restarts_with=restarts_with,
                    peer_health=remote,
                ))
    return tuple(engines)


def _prefill_units(
    name: str, prefills: tuple[Instance, ...], machines: dict[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """Per host, the prefill units there: what a coupled decode there is PartOf=.

    Coupling (PartOf= on one host, --restart-with across hosts): a decode restarts with its
    prefill only where that prefill is the deployment's only one (`auto`, NIXL). Then the
    prefill's restart stops serving anyway, so the decode reloads in its shadow and both come
    back with fresh NIXL agents in one step, with no later heal (sglang #33789: a decode
    keeps the endpoints of a prefill replaced behind its address; smg #2382: a prefill keeps
    stale agent state of replaced decodes). With several prefills a coupled decode would go
    down with each of them, and with it every pair the other prefills serve: there one
    engine's restart reloads that engine only, and a partner the pair canary proves stale
    heals alone, one engine of a role at a time (pdsvc/ship/runtime/canary.py).
    """
    return {  # PartOf= reaches no further than the host
        m: tuple(f"{unit_name(name, p, len(prefills))}.service" for p in prefills
                 if m in machines[p.key])
        for m in {m for ms in machines.values() for m in ms}
    }


def _host_plans(
    site: _Site, engines: tuple[EnginePlan, ...], routers: tuple[RouterPlan, ...],
    beside: tuple[FrontPlan | VipPlan | None, ...], warnings: list[str],
) -> tuple[HostPlan, ...]:
    """Each inventory host: its address, layout and units; a warning for a NIXL host whose
    UCX may pick the wrong NIC."""
    config = site.config
    hosts: list[HostPlan] = []
    for hname, hc in (config.hosts or {}).items():
        topo, sha = site.host_topologies.get(hname, (site.topology, ""))
        units = [e.unit for e in engines if e.machine == hname]
        units += [r.unit for r in routers if r.machine == hname]
        if any(r.machine == hname for r in routers):  # each router host runs the front (and
            units += [b.unit for b in beside if b is not None]  # keepalived) beside its router
        hosts.append(HostPlan(hname, hc.address, topo.source if topo else UNPLACED, sha,
                              tuple(dict.fromkeys(units))))
        if config.transfer.backend == "nixl" and hc.ucx_net_devices is None and any(
            e.machine == hname for e in engines
        ):
            warnings.append(
                f"hosts.{hname}.ucx_net_devices is not set: NIXL's UCX may move KV over the "
                f"wrong NIC across hosts (sglang #28737); set it (e.g. mlx5_0:1 or eth1)"
            )
    return tuple(hosts)


def _members(cascade_hosts: tuple[str, ...], plan: Plan) -> Plan:
    """Each serving engine's router (where it registers itself), the prefill x decode pairs
    it is part of (its canary's pairs): every prefill with every decode, as the router pairs
    them, and where its host shares a heal cascade. Ranks > 0 of an engine spanning
    hosts serve no HTTP: none of it."""
    serving = [e for e in plan.engines if e.node_rank == 0]
    pairs = [(p.url, p.bootstrap_port, d.url) for p in serving if p.role == "prefill"
             for d in serving if d.role == "decode"]
    following = {d.url for d in serving
                 if d.role == "decode" and (d.restarts_with or d.peer_health)}
    # several routers: each reached at its own URL (loopback on one host, its host's address
    # across hosts)
    reach = tuple(r.url for r in plan.routers) if plan.front else (plan.reachable_router().url,)
    fleet = _cascade_addresses(plan, cascade_hosts)  # {} on one host

    def mine(e: EnginePlan) -> tuple[tuple[str, int, str], ...]:
        return tuple(x for x in pairs if e.url in (x[0], x[2]))

    def siblings(e: EnginePlan) -> tuple[str, ...]:
        return tuple(o.url for o in serving if o.role == e.role and o.url != e.url)

    def turn(e: EnginePlan) -> int:
        return [o.url for o in serving if o.role == e.role].index(e.url)

    return replace(plan, engines=tuple(
        e if e.node_rank else replace(
            e, router_urls=reach, pairs=mine(e),
            followers=tuple(dict.fromkeys(d for _, _, d in mine(e) if d in following)),
            siblings=siblings(e), heal_turn=turn(e),
            fleet_listen=fleet.get(e.machine, ""),
            fleet=tuple(a for h, a in fleet.items() if h != e.machine))
        for e in plan.engines))


def _cascade_addresses(plan: Plan, hosts: tuple[str, ...]) -> dict[str, str]:
    """Host -> ADDRESS:lifecycle.cascade_port, for each host an engine serves from when there
    are several (Config.cascade_hosts), in the order of `hosts`: where its engine runtimes
    serve their heals and cures of a heal cascade to the others' (pdsvc/ship/runtime/
    cascade.py: a state directory is one host's)."""
    return {h: f"{plan.host(h).address}:{plan.lifecycle.cascade_port}" for h in hosts}


def unit_name(name: str, inst: Instance, count: int) -> str:
    """NAME-prefill for a role's only engine (a mapping or a one-item list), NAME-prefill-I for
    item I of several: stable across renders, readable in journalctl."""
    return f"{name}-{inst.role}" if count == 1 else f"{name}-{inst.role}-{inst.index}"


def _engine(
    config: Config,
    topology: Topology | None,
    role: Role,
    role_cfg: PrefillConfig | DecodeConfig,
    *,
    key: str,
    name: str,
    host: str,
    leader: str,
    nnodes: int,
    node_rank: int,
    machine: str,
    paths: Paths,
    bootstrap_port: int,
    warnings: list[str],
    restarts_with: tuple[str, ...],
    peer_health: tuple[str, ...] = (),
) -> EnginePlan:
    where = f"host {machine}" if machine else "this host"
    pinning, bus_ids = resolve_pinning(key, role_cfg, topology, config, warnings, where)
    rt = config.runtime
    env = _engine_env(config, role_cfg, paths)
    if machine and topology is not None:  # scheduled (k8s): no host of the inventory is used
        env.update(_host_env(config, machine, host))

    tp = role_cfg.tp or len(role_cfg.gpus) * nnodes
    # one role's rank 0 is every rank's rendezvous (SGLang's --dist-init-addr: each engine's
    # own torch.distributed rendezvous, per role, not shared)
    dist_init_addr = f"{leader}:{role_cfg.dist_init_port}"
    # only rank 0 serves HTTP: the others are ready when it is (and it is not before they join)
    url = f"http://{leader}:{role_cfg.port}"
    plan = EnginePlan(
        role=role,
        name=name,
        gpus=tuple(role_cfg.gpus),
        pci_bus_ids=bus_ids,
        tp=tp,
        host=host,
        port=role_cfg.port,
        bootstrap_port=bootstrap_port,
        dist_init_addr=dist_init_addr,
        pinning=pinning,
        env=tuple(env.items()),
        argv=(),
        health_url=f"{url}/health",
        url=url,
        restarts_with=restarts_with,
        peer_health=peer_health,
        machine=machine,
        nnodes=nnodes,
        node_rank=node_rank,
        launcher=(rt.python, "-m", rt.engine_module),
        model_args=_model_args(config),
        transfer_backend=config.transfer.backend,
        extra_args=tuple(flag_args(role_cfg.args)),
        metrics=config.metrics.engines,
    )
    return replace(plan, argv=engine_argv(plan))


def _engine_env(
    config: Config, role_cfg: PrefillConfig | DecodeConfig, paths: Paths
) -> dict[str, str]:
    """An engine's environment on any host: its GPUs, the transfer backend, the JIT caches,
    then the runtime's and the role's own variables."""
    env: dict[str, str] = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, role_cfg.gpus)),
        "PYTHONUNBUFFERED": "1",
        "HOME": paths.state_dir,
    }
    if config.transfer.backend == "nixl":
        env["SGLANG_DISAGGREGATION_NIXL_BACKEND"] = config.transfer.nixl_backend
    for var, sub in JIT_CACHE_ENV:
        env[var] = f"{paths.jit_cache}/{sub}"
    env["CUDA_CACHE_MAXSIZE"] = CUDA_CACHE_MAXSIZE
    if config.model.path.startswith("/"):
        env["HF_HUB_OFFLINE"] = "1"  # a local model: never reach for the hub at start
    env.update({k: env_str(v) for k, v in config.runtime.env.items()})
    env.update({k: env_str(v) for k, v in role_cfg.env.items()})
    return env


def _host_env(config: Config, machine: str, host: str) -> dict[str, str]:
    """What an engine on inventory host ``machine`` (at address ``host``) adds to its
    environment: the address it advertises, UCX's NICs, the host's own variables."""
    assert config.hosts is not None  # a machine is a key of hosts
    hc = config.hosts[machine]
    env = {"SGLANG_HOST_IP": host}  # what SGLang advertises to its peers (multi-homed hosts)
    if hc.ucx_net_devices:
        env["UCX_NET_DEVICES"] = hc.ucx_net_devices
    env.update({k: env_str(v) for k, v in hc.env.items()})
    return env


def _model_args(config: Config) -> tuple[str, ...]:
    """The engine's model flags: the path, the name it serves under, remote code."""
    model_args = ["--model-path", config.model.path]
    if config.model.served_name:
        model_args += ["--served-model-name", config.model.served_name]
    if config.model.trust_remote_code:
        model_args.append("--trust-remote-code")
    return tuple(model_args)


def engine_argv(
    e: EnginePlan, *, python: str | None = None, host: str | None = None,
    dist_init_addr: str | None = None, node_rank: str | None = None,
) -> tuple[str, ...]:
    """The engine's launch_server command line, composed from the plan's fields; a renderer
    that runs it elsewhere (a pod) overrides where it listens and meets its peers."""
    python = python or e.launcher[0]
    multi = ("--nnodes", str(e.nnodes), "--node-rank", node_rank or str(e.node_rank))
    return (
        python, *e.launcher[1:], *e.model_args,
        "--host", host or e.host,
        "--port", str(e.port),
        "--tp-size", str(e.tp),
        "--dist-init-addr", dist_init_addr or e.dist_init_addr,
        *(multi if e.nnodes > 1 else ()),
        "--disaggregation-mode", e.role,
        "--disaggregation-transfer-backend", e.transfer_backend,
        # prefill binds it; decode uses it for requests that carry bootstrap_port=null (fact 4)
        "--disaggregation-bootstrap-port", str(e.bootstrap_port),
        # /metrics on the engine's own port: sglang:* series, among them the PD failure
        # counters sglang:num_{bootstrap,transfer}_failed_reqs_total (sglang PR #7317) and the
        # sglang:kv_transfer_* histograms (PR #19009), python/sglang/srt/observability/
        # metrics_collector.py in 0.5.23
        *(("--enable-metrics",) if e.metrics else ()),
        *e.extra_args,
    )
