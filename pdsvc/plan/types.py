"""The plan's data: frozen dataclasses of every concrete value a deployment is rendered from.

build.py builds a Plan from the config and the host topology; the renderers, doctor and
status only read one. to_dict() is the plan as JSON (`pdsvc plan --json`, the plan cache) and
plan_from_dict() its inverse (fromdict.py: driven by the field types).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import asdict, dataclass, replace
from typing import Literal

from pdsvc.plan.fromdict import from_dict
from pdsvc.topology import format_cpulist

Role = Literal["prefill", "decode"]

#: The topology of a plan without a host: a scheduler (Kubernetes) places the engines.
UNPLACED = "none: placed by the scheduler"


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
    metrics: bool = False  # --enable-metrics (metrics.engines)
    # membership and the pair canary (rank 0 only: the process that serves HTTP)
    router_urls: tuple[str, ...] = ()  # every router as this engine reaches it (/workers)
    pairs: tuple[tuple[str, int, str], ...] = ()  # (prefill URL, bootstrap port, decode URL)
    # the decodes of those pairs that restart with their prefills (restarts_with/peer_health):
    # the prefill heals such a pair, whichever side is stale
    followers: tuple[str, ...] = ()
    # the other serving engines of this role, and this one's place among them: its heal waits
    # for its turn and for one of them to be in the router (engines of a role heal one at a time)
    siblings: tuple[str, ...] = ()
    heal_turn: int = 0
    # with engines on several hosts: where this host's engine runtimes serve its heals and
    # cures of a heal cascade (ADDRESS:PORT, one port per host), and every other engine host's
    fleet_listen: str = ""
    fleet: tuple[str, ...] = ()

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


#: The front's HAProxy config as a file of the bundle (installed at FrontPlan.config_path).
FRONT_CONFIG = "front.cfg"


@dataclass(frozen=True)
class FrontPlan:
    """HAProxy in front of several routers (router.replicas ≥ 2): clients keep one address,
    each request goes to a router that answers (render/front.py writes its config)."""

    name: str  # NAME-front
    haproxy: str
    host: str  # where clients reach it: router.host:router.port
    port: int
    url: str
    config_path: str  # its haproxy.cfg, installed beside the env files
    socket: str  # its runtime API (stats socket, level admin): drain and ready a router
    backend: str
    servers: tuple[tuple[str, str], ...]  # (router name, ADDRESS:PORT), one per router
    check_interval_ms: int
    retries: int
    buffer_kib: int
    timeout_secs: int
    drain_secs: int
    prometheus_host: str  # HAProxy's own exporter (haproxy_* series)
    prometheus_port: int

    @property
    def unit(self) -> str:
        return f"{self.name}.service"


#: keepalived's config as a file of a router host's bundle (installed at VipPlan.config_path).
VIP_CONFIG = "vip.conf"


@dataclass(frozen=True)
class VipPlan:
    """keepalived on each router host (routers on several hosts, router.vip): the address
    clients use, held by one router host and moved by VRRP when it is lost (render/vip.py)."""

    name: str  # NAME-vip
    keepalived: str
    address: str
    interface: str
    vrrp_id: int
    advert_ms: int
    config_path: str  # its keepalived.conf, installed beside the env files
    members: tuple[tuple[str, str], ...]  # (router host, its address), in the order of hosts

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
    runtime: str  # the stdlib-only runtime (a directory Python runs): every unit's main process
    router_key: str  # the router's control-plane key (install.sh makes it; root:group 0640)
    run_dir: str  # RuntimeDirectory=: the runtime's restart policy and canary state
    env_dir: str  # optional per-unit EnvironmentFile= (secrets: root + service user only)
    state_dir: str  # StateDirectory=, the service user's HOME
    jit_cache: str
    cache_directory: str | None  # CacheDirectory= (relative to /var/cache) if jit_cache is there


@dataclass(frozen=True)
class KvCheck:
    """What `pdsvc doctor --kv` moves between each prefill and decode (transfer.kv_check_*)."""

    bytes: int = 256 << 20
    blocks: int = 64
    min_gbps: float | None = None


@dataclass(frozen=True)
class LifecyclePlan:
    """config.lifecycle: the start, stop, restart, liveness and canary bounds of every unit,
    and the port engine hosts share a heal cascade on."""

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
    cascade_port: int


@dataclass(frozen=True)
class MetricsPlan:
    """config.metrics: what the engines export and what the monitoring files say."""

    engines: bool
    textfile: bool
    node_exporter_port: int
    scrape_interval_secs: int
    ttft_p99_slo_secs: float
    restarts_per_hour: int


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
    routers: tuple[RouterPlan, ...]  # (): a host's view without the router
    lifecycle: LifecyclePlan
    protect_home: Literal["yes", "read-only"]
    read_write_paths: tuple[str, ...]
    warnings: tuple[str, ...]
    format: Literal["systemd", "supervisord", "k8s"]  # the bundle `pdsvc render` writes
    supervisord: SupervisordPlan  # for that bundle
    hosts: tuple[HostPlan, ...]  # several hosts; () for one (engines on loopback)
    k8s: K8sPlan  # for the manifests
    kv_check: KvCheck  # for `pdsvc doctor --kv`
    metrics: MetricsPlan = MetricsPlan(True, True, 9100, 15, 2.0, 3)
    # the inventory host the router runs on, also in a host's view without it: where the
    # router's control-plane key is made ("" on one host)
    router_machine: str = ""
    front: FrontPlan | None = None  # HAProxy, with several routers
    vip: VipPlan | None = None  # keepalived, with routers on several hosts

    @property
    def router(self) -> RouterPlan | None:
        """The first router (the only one unless router.replicas ≥ 2): its package, venv,
        key and machine are every router's."""
        return self.routers[0] if self.routers else None

    @property
    def client_url(self) -> str:
        """Where clients send requests: the moving address, the front's, else the router's."""
        if self.vip is not None and self.front is not None:
            return f"http://{self.vip.address}:{self.front.port}"
        if self.front is not None:
            return self.front.url
        return self.reachable_router().url

    @property
    def units(self) -> tuple[str, ...]:
        """Every unit once (an engine spanning hosts has one unit name on each of them)."""
        routers = (*(r.unit for r in self.routers),
                   *(x.unit for x in (self.front, self.vip) if x is not None))
        return tuple(dict.fromkeys((*(e.unit for e in self.engines), *routers)))

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
        """What runs on one host: its engines, its router (and the front and the moving
        address with it) if it is there, that host alone."""
        h = self.host(name)
        routers = tuple(r for r in self.routers if r.machine == name)
        return replace(self, engines=tuple(e for e in self.engines if e.machine == name),
                       routers=routers, hosts=(h,), topology_source=h.topology_source,
                       front=self.front if routers else None,
                       vip=self.vip if routers else None)

    @property
    def key_use(self) -> Literal["make", "copy", "none"]:
        """What this plan's host does with the router's control-plane key: ``make`` it (the
        router runs here; one key per deployment, made on its host only), ``copy`` it from the
        router's host (an engine here registers with it), or ``none`` (no unit here reads it:
        only ranks > 0 of engines spanning hosts)."""
        if self.router is not None and self.router.machine == self.router_machine:
            return "make"  # the first router's host (routers on several hosts: the others copy)
        return "copy" if self.router or any(e.router_urls for e in self.engines) else "none"

    def key_router_url(self) -> str:
        """The router whose key this host's units use, as they reach it: where its engines
        register first, else the first router (a router host that copies the key: routers on
        several hosts), else (the router alone here) its own URL."""
        for e in self.engines:
            if e.router_urls:
                return e.router_urls[0]
        if self.key_use == "copy" and self.front is not None:
            return f"http://{self.front.servers[0][1]}"
        assert self.router is not None
        return self.router.url

    def key_origin(self) -> tuple[str, str]:
        """(host name, address) of the (first) router's host, where a ``copy`` host gets the
        key (``key_router_url``'s address)."""
        return self.router_machine, urllib.parse.urlsplit(self.key_router_url()).hostname or ""

    @property
    def watchdog_secs(self) -> int:
        """Liveness bound: no successful probe for this long -> systemd kills and restarts."""
        lc = self.lifecycle
        return lc.liveness_interval_secs * lc.liveness_failures + lc.liveness_timeout_secs

    def to_dict(self) -> dict:
        d = asdict(self)
        d["units"] = list(self.units)
        d["watchdog_secs"] = self.watchdog_secs
        # derived, for readers of `pdsvc plan --json`: the first router as before several
        # (router.replicas), and where clients send requests (the front, else the router)
        d["router"] = d["routers"][0] if self.routers else None
        d["client_url"] = self.client_url if self.routers else None
        for e in d["engines"]:
            e["pinning"]["cpulist"] = format_cpulist(e["pinning"]["cpus"])
            e["env"] = dict(e["env"])
        for r in d["routers"]:
            r["env"] = dict(r["env"])
        return d


def plan_from_dict(d: dict) -> Plan:
    """The inverse of Plan.to_dict() (used by the plan cache), driven by the field types: a new
    field needs no edit here."""
    return from_dict(Plan, d)
