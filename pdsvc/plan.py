"""Config + Topology -> Plan: every port, GPU, CPU, flag, path and env var, decided once.

Renderers (systemd, supervisord, …) and install.sh only *read* the plan; nothing downstream
derives a value of its own. The plan holds a tuple of engines — N prefill + M decode on one host
(one of each by default); several hosts would be a generalisation of the same shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from . import __version__
from .errors import TopologyError
from .topology import Topology, format_cpulist

if TYPE_CHECKING:  # the plan only reads the validated config; importing it costs pydantic
    from .config import Config, DecodeConfig, Instance, PrefillConfig, RoleConfig

Role = Literal["prefill", "decode"]

#: SGLang takes ZMQ/NCCL ports dist_init_port+1 … +5+dp; keep each role's base this far apart.
DIST_INIT_SPAN = 100
#: The oldest systemd that knows every directive the units use: ProtectClock= (245).
SYSTEMD_MIN = 245

#: Every JIT/compile cache the engines use, as (env var, subdirectory of runtime.jit_cache).
#: sglang-facts.md §2.4. SGLANG_DG_CACHE_DIR is mirrored into DG_JIT_CACHE_DIR by SGLang at
#: import, but DeepGEMM may read DG_JIT_CACHE_DIR first, so both are set to the same directory.
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

    @property
    def unit(self) -> str:
        return f"{self.name}.service"


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

    @property
    def unit(self) -> str:
        return f"{self.name}.service"


@dataclass(frozen=True)
class Paths:
    supervisor: str  # the stdlib-only supervise.py every unit runs as its main process
    env_dir: str  # optional per-unit EnvironmentFile= (secrets: root + service user only)
    state_dir: str  # StateDirectory=, the service user's HOME
    jit_cache: str
    cache_directory: str | None  # CacheDirectory= (relative to /var/cache) if jit_cache is there


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
    router: RouterPlan
    lifecycle: dict[str, int]
    protect_home: Literal["yes", "read-only"]
    read_write_paths: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())
    format: str = "systemd"  # the bundle `pdsvc render` writes by default
    supervisord: dict = field(default_factory=dict)  # config.supervisord, for that bundle

    @property
    def units(self) -> tuple[str, ...]:
        return (*(e.unit for e in self.engines), self.router.unit)

    @property
    def watchdog_secs(self) -> int:
        """Liveness bound: no successful probe for this long -> systemd kills and restarts."""
        lc = self.lifecycle
        return lc["liveness_interval_secs"] * lc["liveness_failures"] + lc["liveness_timeout_secs"]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["units"] = list(self.units)
        d["watchdog_secs"] = self.watchdog_secs
        for e in d["engines"]:
            e["pinning"]["cpulist"] = format_cpulist(e["pinning"]["cpus"])
            e["env"] = dict(e["env"])
        d["router"]["env"] = dict(d["router"]["env"])
        return d


def plan_from_dict(d: dict) -> Plan:
    """The inverse of Plan.to_dict() (used by the plan cache)."""
    def engine(e: dict) -> EnginePlan:
        pin = e["pinning"]
        return EnginePlan(
            role=e["role"], name=e["name"], gpus=tuple(e["gpus"]),
            pci_bus_ids=tuple(e["pci_bus_ids"]), tp=e["tp"], host=e["host"], port=e["port"],
            bootstrap_port=e["bootstrap_port"], dist_init_addr=e["dist_init_addr"],
            pinning=Pinning(pin["mode"], pin["numa_node"], tuple(pin["cpus"]), pin["policy"],
                            pin["why"]),
            env=tuple(e["env"].items()), argv=tuple(e["argv"]), health_url=e["health_url"],
            url=e["url"], restarts_with=tuple(e["restarts_with"]),
        )

    r = d["router"]
    router = RouterPlan(
        name=r["name"], python=r["python"], host=r["host"], port=r["port"],
        prometheus_host=r["prometheus_host"],
        prometheus_port=r["prometheus_port"], env=tuple(r["env"].items()), argv=tuple(r["argv"]),
        url=r["url"], readiness_url=r["readiness_url"], generate_url=r["generate_url"],
        liveness_url=r["liveness_url"], after=tuple(r["after"]),
    )
    return Plan(
        name=d["name"], target=d["target"], version=d["version"],
        config_source=d["config_source"], config_sha256=d["config_sha256"],
        topology_source=d["topology_source"], python=d["python"], user=d["user"],
        group=d["group"], transfer_backend=d["transfer_backend"], paths=Paths(**d["paths"]),
        engines=tuple(engine(e) for e in d["engines"]), router=router,
        lifecycle=dict(d["lifecycle"]), protect_home=d["protect_home"],
        read_write_paths=tuple(d["read_write_paths"]), warnings=tuple(d["warnings"]),
        format=d["format"], supervisord=dict(d["supervisord"]),
    )


# --------------------------------------------------------------------------- building


def build_plan(
    config: Config, topology: Topology, *, config_source: str, config_text: str
) -> Plan:
    """Resolve every concrete value; raise TopologyError when the host cannot run the config."""
    warnings: list[str] = []
    name = config.name
    if not topology.gpus:
        raise TopologyError(
            f"no NVIDIA GPU found ({topology.source})",
            hint="on a machine without the GPUs pass --topology FILE, written on the GPU host by "
            "`pdsvc topology --json > host.json` (the seed host's is etc/seed-host.topology.json)",
        )
    jit = config.runtime.jit_cache
    paths = Paths(
        supervisor=f"{config.runtime.libexec_dir}/{name}/supervise.py",
        env_dir=f"/etc/{name}",
        state_dir=f"/var/lib/{name}",
        jit_cache=jit,
        cache_directory=jit.removeprefix("/var/cache/") if jit.startswith("/var/cache/") else None,
    )
    host = "127.0.0.1"  # one host: engines listen on loopback only; the router faces clients
    prefills, decodes = config.instances("prefill"), config.instances("decode")
    prefill_units = tuple(f"{unit_name(name, p, len(prefills))}.service" for p in prefills)
    # a decode that does not find bootstrap_port in a request falls back to its own flag:
    # prefill[0]'s (the router sends each prefill's port with every request, sglang #5704)
    bootstrap_port = prefills[0].cfg.bootstrap_port
    engines = []
    for count, insts in ((len(prefills), prefills), (len(decodes), decodes)):
        for inst in insts:
            couple = inst.role == "decode" and inst.cfg.restart_with_prefill
            if couple == "auto":
                couple = config.transfer.backend == "nixl"
            engines.append(_engine(
                config, topology, inst.role, inst.cfg, key=inst.key,
                name=unit_name(name, inst, count), host=host, paths=paths,
                bootstrap_port=inst.cfg.bootstrap_port if inst.role == "prefill"
                else bootstrap_port,
                warnings=warnings,
                # NIXL: a decode holds transfer state per prefill (sglang #33789), so any
                # prefill's (re)start restarts it
                restarts_with=prefill_units if couple else (),
            ))
    router = _router(config, tuple(engines), name=f"{name}-router")
    under_home = [
        p for p in (config.runtime.python, config.model.path, jit, *config.runtime.read_write_paths)
        if p.startswith(("/home/", "/root/", "/root", "/run/user/"))
    ]
    return Plan(
        name=name,
        target=f"{name}-pd.target",
        version=__version__,
        config_source=config_source,
        config_sha256=hashlib.sha256(config_text.encode()).hexdigest(),
        topology_source=topology.source,
        python=config.runtime.python,
        user=config.runtime.user,
        group=config.runtime.group,
        transfer_backend=config.transfer.backend,
        paths=paths,
        engines=tuple(engines),
        router=router,
        lifecycle=config.lifecycle.model_dump(),
        protect_home="read-only" if under_home else "yes",
        read_write_paths=tuple(
            ([] if paths.cache_directory else [jit]) + list(config.runtime.read_write_paths)
        ),
        warnings=tuple(warnings),
        format=config.format,
        supervisord=config.supervisord.model_dump(),
    )


def unit_name(name: str, inst: Instance, count: int) -> str:
    """NAME-prefill for a role's only engine (a mapping or a one-item list), NAME-prefill-I for
    item I of several: stable across renders, readable in journalctl."""
    return f"{name}-{inst.role}" if count == 1 else f"{name}-{inst.role}-{inst.index}"


def _pinning(
    key: str, role: RoleConfig, topology: Topology, config: Config, warnings: list[str]
) -> tuple[Pinning, tuple[str, ...]]:
    """Resolve a role's NUMA node and CPUs from the GPUs it was given.

    The GPU/node checks run whatever runtime.pinning says: a contradiction in the config is an
    error even when nothing will be pinned.
    """
    noted: list[str] = []
    pinning, bus_ids = _resolve_node(key, role, topology, config, noted)
    if config.runtime.pinning == "off":
        why = "pinning off (runtime.pinning: off)"
        return Pinning("off", None, (), pinning.policy, why), bus_ids
    warnings += noted
    return pinning, bus_ids


def _resolve_node(
    key: str, role: RoleConfig, topology: Topology, config: Config, warnings: list[str]
) -> tuple[Pinning, tuple[str, ...]]:
    mode, policy = config.runtime.pinning, config.runtime.numa_policy
    gpus = []
    for index in role.gpus:
        gpu = topology.gpu(index)
        if gpu is None:
            have = format_cpulist([g.index for g in topology.gpus]) or "none"
            raise TopologyError(
                f"{key}.gpus: GPU {index} does not exist on this host (it has GPUs {have})",
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
            f"{key}.numa_node: node {wanted} does not exist on this host (it has nodes {existing})",
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
                f"{key}: GPUs {gpu_list} report NUMA node {node_id}, which has no CPUs on this host"
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
    topology: Topology,
    role: Role,
    role_cfg: PrefillConfig | DecodeConfig,
    *,
    key: str,
    name: str,
    host: str,
    paths: Paths,
    bootstrap_port: int,
    warnings: list[str],
    restarts_with: tuple[str, ...],
) -> EnginePlan:
    pinning, bus_ids = _pinning(key, role_cfg, topology, config, warnings)
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

    tp = role_cfg.tp or len(role_cfg.gpus)
    dist_init_addr = f"{host}:{role_cfg.dist_init_port}"
    argv: list[str] = [rt.python, "-m", rt.engine_module, "--model-path", config.model.path]
    if config.model.served_name:
        argv += ["--served-model-name", config.model.served_name]
    if config.model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += [
        "--host", host,
        "--port", str(role_cfg.port),
        "--tp-size", str(tp),
        "--dist-init-addr", dist_init_addr,
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", config.transfer.backend,
        # prefill binds it; decode uses it for requests that carry bootstrap_port=null (fact 4)
        "--disaggregation-bootstrap-port", str(bootstrap_port),
    ]
    argv += flag_args(role_cfg.args)
    url = f"http://{host}:{role_cfg.port}"
    return EnginePlan(
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
        argv=tuple(argv),
        health_url=f"{url}/health",
        url=url,
        restarts_with=restarts_with,
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


def _router(config: Config, engines: tuple[EnginePlan, ...], *, name: str) -> RouterPlan:
    rc, rt = config.router, config.runtime
    python = rc.python or rt.python
    argv: list[str] = [python, "-m", rt.router_module, "--pd-disaggregation"]
    for e in engines:
        if e.role == "prefill":
            # always with its port: a bare URL sends bootstrap_port=null (sglang-facts fact 4)
            argv += ["--prefill", e.url, str(e.bootstrap_port)]
    for e in engines:
        if e.role == "decode":
            argv += ["--decode", e.url]
    hc = rc.health_check
    argv += [
        "--host", rc.host,
        "--port", str(rc.port),
        "--policy", rc.policy,
        "--prometheus-host", rc.prometheus_host,
        "--prometheus-port", str(rc.prometheus_port),
        "--health-check-interval-secs", str(hc.interval_secs),
        "--health-check-timeout-secs", str(hc.timeout_secs),
        "--health-failure-threshold", str(hc.failure_threshold),
        "--health-success-threshold", str(hc.success_threshold),
        # the router starts after the engines are healthy; this only bounds a re-registration
        "--worker-startup-timeout-secs", str(config.lifecycle.start_timeout_secs),
    ]
    argv += flag_args(rc.args)
    local = "127.0.0.1" if rc.host in ("0.0.0.0", "::") else rc.host
    base = f"http://{local}:{rc.port}"
    env = {"PYTHONUNBUFFERED": "1", **{k: _env_str(v) for k, v in rc.env.items()}}
    return RouterPlan(
        name=name,
        python=python,
        host=rc.host,
        port=rc.port,
        prometheus_host=rc.prometheus_host,
        prometheus_port=rc.prometheus_port,
        env=tuple(env.items()),
        argv=tuple(argv),
        url=base,
        readiness_url=f"{base}/readiness",
        generate_url=f"{base}/generate",
        liveness_url=f"{base}/liveness",
        after=tuple(e.unit for e in engines),
    )

