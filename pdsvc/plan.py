"""Config + Topology -> Plan: every port, GPU, CPU, flag, path and env var, decided once.

Renderers (systemd, supervisord, …) and install.sh only *read* the plan; nothing downstream
derives a value of its own. The plan holds a tuple of engines — N prefill + M decode on one host
(one of each by default); several hosts would be a generalisation of the same shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Literal

from . import __version__, routers
from .errors import TopologyError
from .fromdict import from_dict
from .topology import Topology, format_cpulist

if TYPE_CHECKING:  # the plan only reads the validated config; importing it costs pydantic
    from .config import Config, DecodeConfig, Instance, PrefillConfig, RoleConfig

Role = Literal["prefill", "decode"]

#: SGLang takes ZMQ/NCCL ports dist_init_port+1 … +5+dp; keep each role's base this far apart.
DIST_INIT_SPAN = 100
#: The oldest systemd that knows every directive the units use: ProtectClock= (245).
SYSTEMD_MIN = 245
#: With `hosts`: how long the router keeps trying to register an engine of another host.
#: The topology of a plan without a host: a scheduler (Kubernetes) places the engines.
UNPLACED = "none: placed by the scheduler"

#: Every JIT/compile cache the engines use, as (env var, subdirectory of runtime.jit_cache)
#: (sglang/srt/environ.py and each library's own cache variable). SGLANG_DG_CACHE_DIR is
#: mirrored into DG_JIT_CACHE_DIR by SGLang at import, but DeepGEMM may read
#: DG_JIT_CACHE_DIR first, so both are set to the same directory.
JIT_CACHE_ENV: tuple[tuple[str, str], ...] = (
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
    ("DG_JIT_CACHE_DIR", "deep_gemm"),
    ("SGLANG_CACHE_DIR", "sglang"),
    ("SGLANG_JIT_CACHE_DIR", "sglang/jit"),
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),
    ("TILELANG_CACHE_DIR", "tilelang"),
    ("CUDA_CACHE_PATH", "nv-compute-cache"),
)
#: CUDA's PTX JIT cache defaults to 256 MiB on older drivers; 4 GiB is its documented maximum.
CUDA_CACHE_MAXSIZE = "4294967296"


@dataclass(frozen=True)
class Pinning:
    """Where a process may run. `numa_node is None` means no memory policy is set."""

    mode: Literal["numa", "strict", "off"]
    numa_node: int | None
    cpus: tuple[int, ...]
    policy: Literal["preferred", "bind"]
    why: str

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


@dataclass(frozen=True)
class EnginePlan:
    role: Role
    name: str  # systemd unit name without suffix, also SyslogIdentifier and JIT key
    gpus: tuple[int, ...]
    pci_bus_ids: tuple[str, ...]
    tp: int
    host: str
    port: int
    bootstrap_port: int
    dist_init_addr: str
    pinning: Pinning
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    health_url: str
    url: str
    restarts_with: tuple[str, ...] = ()  # units whose (re)start restarts this one
    peer_health: tuple[str, ...] = ()  # the same across hosts: their /health, watched
    machine: str = ""  # the inventory host it runs on ("": the one host, no inventory)
    nnodes: int = 1  # hosts the engine spans (TP across nodes)
    node_rank: int = 0  # this process's rank among them; rank 0 serves HTTP
    # the pieces argv is composed of (engine_argv), for renderers that place it elsewhere
    launcher: tuple[str, ...] = ()  # python -m module
    model_args: tuple[str, ...] = ()
    transfer_backend: str = ""
    extra_args: tuple[str, ...] = ()  # the role's `args`
    # membership and the pair canary (rank 0 only: the process that serves HTTP)
    router_url: str = ""  # the router as this engine reaches it (its /workers API)
    pairs: tuple[tuple[str, int, str], ...] = ()  # (prefill URL, bootstrap port, decode URL)

    @property
    def unit(self) -> str:
        return f"{self.name}.service"

    @property
    def dist_init_port(self) -> int:
        """The rendezvous port of dist_init_addr (HOST:PORT)."""
        return int(self.dist_init_addr.rpartition(":")[2])


@dataclass(frozen=True)
class RouterPlan:
    name: str
    python: str  # router.python, else runtime.python
    host: str
    port: int
    prometheus_host: str
    prometheus_port: int
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    url: str  # where clients send requests
    readiness_url: str
    generate_url: str
    liveness_url: str
    after: tuple[str, ...]
    machine: str = ""
    # the pieces argv is composed of (router_argv)
    launcher: tuple[str, ...] = ()
    prefills: tuple[tuple[str, int], ...] = ()  # (URL, bootstrap port)
    decodes: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # every flag after the workers
    package: str = "sglang-router"  # router.package (pdsvc/routers.py)

    @property
    def unit(self) -> str:
        return f"{self.name}.service"


@dataclass(frozen=True)
class HostPlan:
    """One machine of a deployment over several hosts, and what of the plan runs there."""

    name: str
    address: str
    topology_source: str
    topology_sha256: str  # of the topology file, "" when read from /sys (cache validity)
    units: tuple[str, ...]


@dataclass(frozen=True)
class Paths:
    supervisor: str  # the stdlib-only runtime (a directory Python runs) every unit's main process
    router_key: str  # the router's control-plane key (install.sh makes it; root:group 0640)
    run_dir: str  # RuntimeDirectory=: the runtime's restart policy and canary state
    env_dir: str  # optional per-unit EnvironmentFile= (secrets: root + service user only)
    state_dir: str  # StateDirectory=, the service user's HOME
    jit_cache: str
    cache_directory: str | None  # CacheDirectory= (relative to /var/cache) if jit_cache is there


@dataclass(frozen=True)
class LifecyclePlan:
    """config.lifecycle: the start, stop, restart, liveness and canary bounds of every unit."""

    start_timeout_secs: int
    stop_timeout_secs: int
    restart_secs: int
    restart_backoff_max_secs: int
    restart_reset_secs: int
    start_attempts: int
    gpu_wait_secs: int
    liveness_interval_secs: int
    liveness_timeout_secs: int
    liveness_failures: int
    canary_interval_secs: int
    canary_failures: int
    canary_timeout_secs: int
    canary_heal_attempts: int


@dataclass(frozen=True)
class SupervisordPlan:
    """config.supervisord: how the supervisord bundle runs the same plan."""

    numactl: str | None  # None: not installed (then nothing may be pinned)
    logs: Literal["stdout", "files"]
    log_dir: str
    run_dir: str  # holds the two below and supervisord's pid file
    drop_privileges: bool
    # resolved from run_dir: what the bundle, supervisorctl and `pdsvc status` all use
    control_socket: str  # [unix_http_server] file=
    state_dir: str  # the runtime's state (restart policy, canary), beside the socket


@dataclass(frozen=True)
class K8sPlan:
    """config.k8s: what the manifests need beyond the plan's engines and router."""

    namespace: str
    image: str
    router_image: str | None  # None: the engines' image
    python: str
    gpu_resource: str
    node_selector: dict[str, str]
    jit_cache_claim: str | None  # None: a hostPath at paths.jit_cache
    router_service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"]
    host_network: bool


@dataclass(frozen=True)
class Plan:
    name: str
    target: str
    version: str
    config_source: str
    config_sha256: str
    topology_source: str
    python: str
    user: str
    group: str
    transfer_backend: str
    paths: Paths
    engines: tuple[EnginePlan, ...]
    router: RouterPlan | None  # None: a host's view without the router
    lifecycle: LifecyclePlan
    protect_home: Literal["yes", "read-only"]
    read_write_paths: tuple[str, ...]
    warnings: tuple[str, ...]
    format: Literal["systemd", "supervisord", "k8s"]  # the bundle `pdsvc render` writes
    supervisord: SupervisordPlan  # for that bundle
    hosts: tuple[HostPlan, ...]  # several hosts; () for one (engines on loopback)
    k8s: K8sPlan  # for the manifests

    @property
    def units(self) -> tuple[str, ...]:
        """Every unit once (an engine spanning hosts has one unit name on each of them)."""
        router = (self.router.unit,) if self.router else ()
        return tuple(dict.fromkeys((*(e.unit for e in self.engines), *router)))

    @property
    def gate(self) -> str:
        """The oneshot the target Requires=: it fails when a unit of the target did not become
        active, so `systemctl start TARGET` exits non-zero (Wants= alone never fails)."""
        return f"{self.name}-pd-ready.service"

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        have = ", ".join(h.name for h in self.hosts) or "none: the config has no `hosts`"
        raise KeyError(f"no host {name!r} in the plan (hosts: {have})")

    def reachable_router(self) -> RouterPlan:
        """The router as another host reaches it: at its host's address when it listens on
        every address (its own URLs say 127.0.0.1, right on its host only)."""
        r = self.router
        assert r is not None  # the whole plan has its router
        if not self.hosts or r.host not in ("0.0.0.0", "::", ""):
            return r
        base = f"http://{self.host(r.machine).address}:{r.port}"
        return replace(r, url=base, readiness_url=f"{base}/readiness",
                       generate_url=f"{base}/generate", liveness_url=f"{base}/liveness")

    def for_host(self, name: str) -> Plan:
        """What runs on one host: its engines, the router if it is there, that host alone."""
        h = self.host(name)
        router = self.router if self.router and self.router.machine == name else None
        return replace(self, engines=tuple(e for e in self.engines if e.machine == name),
                       router=router, hosts=(h,), topology_source=h.topology_source)

    @property
    def watchdog_secs(self) -> int:
        """Liveness bound: no successful probe for this long -> systemd kills and restarts."""
        lc = self.lifecycle
        return lc.liveness_interval_secs * lc.liveness_failures + lc.liveness_timeout_secs

    def to_dict(self) -> dict:
        d = asdict(self)
        d["units"] = list(self.units)
        d["watchdog_secs"] = self.watchdog_secs
        for e in d["engines"]:
            e["pinning"]["cpulist"] = format_cpulist(e["pinning"]["cpus"])
            e["env"] = dict(e["env"])
        if d["router"]:
            d["router"]["env"] = dict(d["router"]["env"])
        return d


def plan_from_dict(d: dict) -> Plan:
    """The inverse of Plan.to_dict() (used by the plan cache), driven by the field types: a new
    field needs no edit here."""
    return from_dict(Plan, d)


# --------------------------------------------------------------------------- building


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
    host_topologies = host_topologies or {}
    jit = config.runtime.jit_cache
    paths = Paths(
        supervisor=f"{config.runtime.libexec_dir}/{name}/runtime",
        env_dir=f"/etc/{name}",
        router_key=config.router.control_plane_key or f"/etc/{name}/router.key",
        run_dir=f"/run/{name}",
        state_dir=f"/var/lib/{name}",
        jit_cache=jit,
        cache_directory=jit.removeprefix("/var/cache/") if jit.startswith("/var/cache/") else None,
    )
    placement = config.placement()  # {} on one host: engines listen on loopback only

    def address(machine: str) -> str:
        return config.hosts[machine].address if config.hosts and machine else "127.0.0.1"

    def layout(machine: str) -> Topology | None:
        if topology is None or (only_host and machine != only_host):
            return None  # placed by a scheduler, or another host's to check
        topo = host_topologies[machine][0] if machine in host_topologies else topology
        if not topo.gpus:
            where = f"for host {machine} " if machine else ""
            raise TopologyError(
                f"no NVIDIA GPU found {where}({topo.source})",
                hint=(f"set hosts.{machine}.topology to the file `pdsvc topology --json` "
                      "writes on that host") if machine else (
                    "that file lists no GPU: write it on the GPU host with `pdsvc topology "
                    "--json > host.json`" if topo.source.startswith("file:") else
                    "on a machine without the GPUs pass --topology FILE, written on the GPU "
                    "host by `pdsvc topology --json > host.json` (the seed host's is "
                    "etc/seed-host.topology.json)"),
            )
        return topo

    prefills, decodes = config.instances("prefill"), config.instances("decode")
    machines = {i.key: placement.get(i.key, ("",)) for i in (*prefills, *decodes)}
    prefill_units = {  # per host: the prefill units there (PartOf= reaches no further)
        m: tuple(f"{unit_name(name, p, len(prefills))}.service" for p in prefills
                 if m in machines[p.key])
        for m in {m for ms in machines.values() for m in ms}
    }
    # a decode that does not find bootstrap_port in a request falls back to its own flag:
    # prefill[0]'s (the router sends each prefill's port with every request, sglang #5704)
    bootstrap_port = prefills[0].cfg.bootstrap_port
    engines = []
    for count, insts in ((len(prefills), prefills), (len(decodes), decodes)):
        for inst in insts:
            couple = inst.role == "decode" and inst.cfg.restart_with_prefill
            if couple == "auto":
                couple = config.transfer.backend == "nixl"
            where = machines[inst.key]
            for rank, machine in enumerate(where):
                restarts_with = prefill_units[machine] if couple else ()
                # PartOf= stops at the host: a prefill elsewhere is watched by supervise.py
                remote = () if not couple else tuple(
                    f"http://{address(machines[p.key][0])}:{p.cfg.port}/health"
                    for p in prefills if machine not in machines[p.key]
                )
                engines.append(_engine(
                    config, layout(machine), inst.role, inst.cfg, key=inst.key,
                    name=unit_name(name, inst, count), host=address(machine),
                    leader=address(where[0]), nnodes=len(where), node_rank=rank,
                    machine=machine, paths=paths,
                    bootstrap_port=inst.cfg.bootstrap_port if inst.role == "prefill"
                    else bootstrap_port,
                    warnings=warnings,
                    # NIXL: any prefill's (re)start restarts the decode
                    restarts_with=restarts_with,
                    peer_health=remote,
                ))
    router_machine = placement.get("router", ("",))[0]
    router = _router(config, tuple(engines), name=f"{name}-router", machine=router_machine)
    hosts: list[HostPlan] = []
    for hname, hc in (config.hosts or {}).items():
        topo, sha = host_topologies.get(hname, (topology, ""))
        units = [e.unit for e in engines if e.machine == hname]
        units += [router.unit] if router.machine == hname else []
        hosts.append(HostPlan(hname, hc.address, topo.source if topo else UNPLACED, sha,
                              tuple(dict.fromkeys(units))))
        if config.transfer.backend == "nixl" and hc.ucx_net_devices is None and any(
            e.machine == hname for e in engines
        ):
            warnings.append(
                f"hosts.{hname}.ucx_net_devices is not set: NIXL's UCX may move KV over the "
                f"wrong NIC across hosts (sglang #28737); set it (e.g. mlx5_0:1 or eth1)"
            )
    under_home = [
        p for p in (config.runtime.python, config.model.path, jit, *config.runtime.read_write_paths)
        if p.startswith(("/home/", "/root/", "/root", "/run/user/"))
    ]
    sv_run_dir = config.supervisord.run_dir.rstrip("/")
    return _members(Plan(
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
        paths=paths,
        engines=tuple(engines),
        router=router,
        lifecycle=LifecyclePlan(**config.lifecycle.model_dump()),
        protect_home="read-only" if under_home else "yes",
        read_write_paths=tuple(
            ([] if paths.cache_directory else [jit]) + list(config.runtime.read_write_paths)
        ),
        warnings=tuple(warnings),
        format=config.format,
        supervisord=SupervisordPlan(
            **config.supervisord.model_dump(),
            control_socket=f"{sv_run_dir}/{name}-supervisord.sock",
            state_dir=f"{sv_run_dir}/{name}",
        ),
        hosts=tuple(hosts),
        k8s=K8sPlan(**config.k8s.model_dump()),
    ))


def _members(plan: Plan) -> Plan:
    """Each serving engine's router (where it registers itself) and the prefill x decode pairs
    it is part of (its canary's pairs): every prefill with every decode, as the router pairs
    them. Ranks > 0 of an engine spanning hosts serve no HTTP: neither."""
    serving = [e for e in plan.engines if e.node_rank == 0]
    pairs = [(p.url, p.bootstrap_port, d.url) for p in serving if p.role == "prefill"
             for d in serving if d.role == "decode"]
    reach = plan.reachable_router().url
    return replace(plan, engines=tuple(
        e if e.node_rank else replace(
            e, router_url=reach, pairs=tuple(x for x in pairs if e.url in (x[0], x[2])))
        for e in plan.engines))


def unit_name(name: str, inst: Instance, count: int) -> str:
    """NAME-prefill for a role's only engine (a mapping or a one-item list), NAME-prefill-I for
    item I of several: stable across renders, readable in journalctl."""
    return f"{name}-{inst.role}" if count == 1 else f"{name}-{inst.role}-{inst.index}"


def _pinning(
    key: str, role: RoleConfig, topology: Topology | None, config: Config, warnings: list[str],
    where: str = "this host",
) -> tuple[Pinning, tuple[str, ...]]:
    """Resolve a role's NUMA node and CPUs from the GPUs it was given.

    The GPU/node checks run whatever runtime.pinning says: a contradiction in the config is an
    error even when nothing will be pinned.
    """
    if topology is None:
        return Pinning("off", None, (), config.runtime.numa_policy, UNPLACED), ()
    noted: list[str] = []
    pinning, bus_ids = _resolve_node(key, role, topology, config, noted, where)
    if config.runtime.pinning == "off":
        why = "pinning off (runtime.pinning: off)"
        return Pinning("off", None, (), pinning.policy, why), bus_ids
    warnings += noted
    return pinning, bus_ids


def _resolve_node(
    key: str, role: RoleConfig, topology: Topology, config: Config, warnings: list[str],
    where: str,
) -> tuple[Pinning, tuple[str, ...]]:
    mode, policy = config.runtime.pinning, config.runtime.numa_policy
    gpus = []
    for index in role.gpus:
        gpu = topology.gpu(index)
        if gpu is None:
            have = format_cpulist([g.index for g in topology.gpus]) or "none"
            raise TopologyError(
                f"{key}.gpus: GPU {index} does not exist on {where} (it has GPUs {have})",
                hint=f"pick GPUs from {have} ({topology.source})",
            )
        gpus.append(gpu)
    bus_ids = tuple(g.pci_bus_id for g in gpus)
    node_ids = {g.numa_node for g in gpus if g.numa_node is not None}
    if len(node_ids) > 1:
        by_node = sorted(gpus, key=lambda g: (g.numa_node is None, g.numa_node, g.index))
        a = next(g for g in by_node if g.numa_node == max(node_ids))
        b = next(g for g in by_node if g.numa_node == min(node_ids))
        raise TopologyError(
            f"{key}.gpus cross NUMA nodes: GPU {a.index} is on node {a.numa_node}, "
            f"GPU {b.index} on node {b.numa_node}",
            hint="give the role GPUs of one node (see `pdsvc topology`)",
        )
    existing = ", ".join(str(n.id) for n in topology.nodes) or "none"
    wanted = role.numa_node
    if wanted != "auto" and topology.node(wanted) is None:
        raise TopologyError(
            f"{key}.numa_node: node {wanted} does not exist on {where} (it has nodes {existing})",
            hint="set numa_node: auto",
        )
    gpu_list = format_cpulist(role.gpus)
    if node_ids:
        (node_id,) = node_ids
        if wanted != "auto" and wanted != node_id:
            raise TopologyError(
                f"{key}.numa_node is {wanted} but GPUs {gpu_list} are on node {node_id}",
                hint=f"set numa_node: auto (or {node_id})",
            )
        node = topology.node(node_id)
        if node is None or not node.cpus:
            raise TopologyError(
                f"{key}: GPUs {gpu_list} report NUMA node {node_id}, which has no CPUs on {where}"
            )
        if len(node_ids) == 1 and any(g.numa_node is None for g in gpus):
            warnings.append(
                f"{key}: some GPUs report numa_node -1; using node {node_id} of the others"
            )
        why = f"node {node_id} of GPUs {gpu_list}" if wanted == "auto" else f"numa_node {node_id}"
        return Pinning(mode, node_id, node.cpus, policy, why), bus_ids
    # Every GPU says numa_node = -1: the kernel does not know (VMs). Never guess silently.
    if wanted != "auto":
        node = topology.node(wanted)
        assert node is not None
        warnings.append(
            f"{key}: GPUs {gpu_list} report numa_node -1 (unknown); pinning to node {wanted} "
            f"as configured"
        )
        return Pinning(mode, wanted, node.cpus, policy, f"numa_node {wanted} (configured)"), bus_ids
    if len(topology.nodes) == 1:
        node = topology.nodes[0]
        warnings.append(
            f"{key}: GPUs {gpu_list} report numa_node -1 (unknown, common on VMs); the host has "
            f"one NUMA node ({node.id}), so the role runs on its CPUs {format_cpulist(node.cpus)}"
        )
        why = f"only NUMA node {node.id} (GPU numa_node unknown)"
        return Pinning(mode, node.id, node.cpus, policy, why), bus_ids
    local = tuple(sorted({c for g in gpus for c in g.local_cpus}))
    if local:
        warnings.append(
            f"{key}: GPUs {gpu_list} report numa_node -1 (unknown) on a host with "
            f"{len(topology.nodes)} nodes; CPUs pinned to their local_cpulist "
            f"{format_cpulist(local)} with no memory policy — set {key}.numa_node to pin memory"
        )
        return Pinning(mode, None, local, policy, "GPU local_cpulist (NUMA unknown)"), bus_ids
    warnings.append(
        f"{key}: GPUs {gpu_list} have no known NUMA node or local CPUs; not pinned — set "
        f"{key}.numa_node"
    )
    return Pinning("off", None, (), policy, "unknown topology: not pinned"), bus_ids


def _env_str(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


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
    pinning, bus_ids = _pinning(key, role_cfg, topology, config, warnings, where)
    rt = config.runtime
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
    env.update({k: _env_str(v) for k, v in rt.env.items()})
    env.update({k: _env_str(v) for k, v in role_cfg.env.items()})
    if machine and topology is not None:  # scheduled (k8s): no host of the inventory is used
        hc = config.hosts[machine]
        env["SGLANG_HOST_IP"] = host  # what SGLang advertises to its peers (multi-homed hosts)
        if hc.ucx_net_devices:
            env["UCX_NET_DEVICES"] = hc.ucx_net_devices
        env.update({k: _env_str(v) for k, v in hc.env.items()})

    tp = role_cfg.tp or len(role_cfg.gpus) * nnodes
    # one role's rank 0 is every rank's rendezvous (SGLang's --dist-init-addr: each engine's
    # own torch.distributed rendezvous, per role, not shared)
    dist_init_addr = f"{leader}:{role_cfg.dist_init_port}"
    model_args = ["--model-path", config.model.path]
    if config.model.served_name:
        model_args += ["--served-model-name", config.model.served_name]
    if config.model.trust_remote_code:
        model_args.append("--trust-remote-code")
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
        model_args=tuple(model_args),
        transfer_backend=config.transfer.backend,
        extra_args=tuple(flag_args(role_cfg.args)),
    )
    return replace(plan, argv=engine_argv(plan))


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
        *e.extra_args,
    )


def flag_args(args: dict) -> list[str]:
    """`{flag: value}` -> argv: true -> bare flag, false -> omitted, list -> several values."""
    out: list[str] = []
    for flag, value in args.items():
        if value is False:
            continue
        out.append(f"--{flag}")
        if value is True:
            continue
        out += [_env_str(v) for v in value] if isinstance(value, list) else [_env_str(value)]
    return out


def _router(
    config: Config, engines: tuple[EnginePlan, ...], *, name: str, machine: str
) -> RouterPlan:
    rc, rt = config.router, config.runtime
    python = rc.python or rt.python
    engines = tuple(e for e in engines if e.node_rank == 0)  # the ones serving HTTP
    hc = rc.health_check
    options = [
        "--host", rc.host,
        "--port", str(rc.port),
        "--policy", rc.policy,
        "--prometheus-host", rc.prometheus_host,
        "--prometheus-port", str(rc.prometheus_port),
        "--health-check-interval-secs", str(hc.interval_secs),
        "--health-check-timeout-secs", str(hc.timeout_secs),
        "--health-failure-threshold", str(hc.failure_threshold),
        "--health-success-threshold", str(hc.success_threshold),
        # engines register themselves once healthy (POST /workers), so this only bounds the
        # router's own add-worker workflow; a worker listed at start (the k8s manifests) that is
        # not up within it is dropped for good by router 0.3.2
        "--worker-startup-timeout-secs", str(config.lifecycle.start_timeout_secs),
    ]
    pkg = routers.package(rc.package)
    options += [*pkg.options, *flag_args(rc.args)]
    # an explicit runtime.router_module (a wrapper, say) wins over the package's module
    module = rt.router_module if "router_module" in rt.model_fields_set else pkg.module
    local = "127.0.0.1" if rc.host in ("0.0.0.0", "::") else rc.host
    base = f"http://{local}:{rc.port}"
    env = {"PYTHONUNBUFFERED": "1", **{k: _env_str(v) for k, v in rc.env.items()}}
    router = RouterPlan(
        name=name,
        python=python,
        host=rc.host,
        port=rc.port,
        prometheus_host=rc.prometheus_host,
        prometheus_port=rc.prometheus_port,
        env=tuple(env.items()),
        argv=(),
        url=base,
        readiness_url=f"{base}/readiness",
        generate_url=f"{base}/generate",
        liveness_url=f"{base}/liveness",
        # systemd orders units of one host only; remote engines are waited for by the router's
        # own readiness gate (a ready prefill/decode pair, then one generation)
        after=tuple(e.unit for e in engines if e.machine == machine),
        machine=machine,
        launcher=(python, "-m", module),
        # always with its port: a bare URL sends bootstrap_port=null (sglang-router's PD
        # request takes bootstrap_port from the CLI, src/routers/http/pd_router.rs)
        prefills=tuple((e.url, e.bootstrap_port) for e in engines if e.role == "prefill"),
        decodes=tuple(e.url for e in engines if e.role == "decode"),
        options=tuple(options),
        package=pkg.name,
    )
    # the router as units run it has no workers on its command line: the engines register
    # themselves once healthy (POST /workers); the k8s manifests list them (router_pod_argv)
    return replace(router, argv=router_argv(router, prefills=(), decodes=()))


def router_argv(
    r: RouterPlan, *, python: str | None = None,
    prefills: tuple[tuple[str, int], ...] | None = None, decodes: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """The router's command line from the plan's fields; a renderer that places the workers
    elsewhere (Services) gives their URLs."""
    argv = [python or r.launcher[0], *r.launcher[1:], "--pd-disaggregation"]
    for url, port in r.prefills if prefills is None else prefills:
        argv += ["--prefill", url, str(port)]
    for url in r.decodes if decodes is None else decodes:
        argv += ["--decode", url]
    return (*argv, *r.options)

