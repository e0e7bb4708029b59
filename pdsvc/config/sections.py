"""The config's other sections: model, runtime, transfer, lifecycle, the supervisord
bundle, the k8s manifests and the inventory of hosts (and what a host's `run` may name);
the router's, with its front and address, are router.py's.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator
from pydantic import Strict as StrictType

from pdsvc.config.fields import (
    AbsPath,
    Account,
    Count100,
    Count1000,
    DaySecs,
    EnvName,
    EnvValue,
    HourSecs,
    Module,
    Port,
    Strict,
    Text,
    no_repeats,
    runtime_flag,
)
from pdsvc.config.owned import (
    check_env,
    check_unicast,
)
from pdsvc.config.roles import Instance


class ModelConfig(Strict):
    path: Text = Field(description="Local directory of the model weights (or a hub id).")
    served_name: Text | None = Field(None, description="Name on /v1/models (same on P and D).")
    trust_remote_code: bool = Field(True, description="Pass --trust-remote-code (DeepSeek: yes).")


class RuntimeConfig(Strict):
    python: Text = Field("/opt/sglang/venv/bin/python", description="Interpreter with sglang.")
    engine_module: Module = Field("sglang.launch_server", description="Module run for each engine.")
    router_module: Module = Field(
        "sglang_router.launch_router", description="Module for the router.")
    user: Account = Field("sglang", description="Service user of every unit (one JIT cache owner).")
    group: Account = Field("sglang", description="Its group; install.sh creates both.")
    jit_cache: AbsPath = Field("/var/cache/pdsvc/jit", description="JIT cache shared by P and D.")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Env for every engine (e.g. SGLANG_DSV4_FP4_EXPERTS)."
    )
    pinning: Literal["numa", "strict", "off"] = Field(
        "numa",
        description="numa: CPUAffinity+NUMAPolicy; strict: also cgroup AllowedCPUs/MemoryNodes.",
    )
    numa_policy: Literal["preferred", "bind"] = Field(
        "preferred", description="NUMAPolicy=: bind fails allocations when the node is full."
    )
    libexec_dir: AbsPath = Field(
        "/usr/local/lib/pdsvc",
        description="Where install.sh puts the runtime (NAME/runtime/ below it); "
        "use e.g. /opt/pdsvc on hosts with a read-only /usr.",
    )
    read_write_paths: list[AbsPath] = Field(
        default_factory=list, description="Extra writable paths under ProtectSystem=strict."
    )

    @field_validator("env")
    @classmethod
    def _env_not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_env(v)

    @field_validator("pinning", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @field_validator("python")
    @classmethod
    def _absolute_python(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r} (systemd runs no shell PATH)")
        return v

    @field_validator("jit_cache")
    @classmethod
    def _cache_directory(cls, v: str) -> str:
        # under /var/cache it is CacheDirectory=, where systemd 254+ reads `a:b` as "a, and a
        # symlink b to it" and keeps backslashes for a second, C-style unescaping pass
        # (systemd.exec(5)); older ones take both literally: no encoding means the same to both
        bad = [c for c in ':\\"' if c in v] if v.startswith("/var/cache/") else []
        if bad:
            raise ValueError(f"must not hold {bad[0]!r} under /var/cache, got {v!r}: it becomes "
                             "CacheDirectory=, which systemd 254+ reads differently from older "
                             "ones there (':' names a symlink, '\\' escapes)")
        return v


class TransferConfig(Strict):
    backend: Literal["nixl", "mooncake"] = Field(
        "nixl", description="KV transfer; passed to both roles (SGLang defaults to mooncake)."
    )
    nixl_backend: str = Field(
        "UCX", pattern=r"^[A-Z0-9_]+$",
        description="SGLANG_DISAGGREGATION_NIXL_BACKEND (UCX, LIBFABRIC, …).",
    )
    kv_check_bytes: Annotated[int, StrictType(), Field(ge=1 << 20, le=1 << 36)] = Field(
        256 << 20, description="`pdsvc doctor --kv`: bytes a pair moves per write, about one "
        "8k-token chunk of DeepSeek's MLA KV cache (61 layers × 576 B a token in FP8).",
    )
    kv_check_blocks: Annotated[int, StrictType(), Field(ge=1, le=65536)] = Field(
        64, description="`pdsvc doctor --kv`: the blocks those bytes are cut into, one NIXL "
        "descriptor each, as the KV cache's pages are.",
    )
    kv_check_min_gbps: Annotated[float, StrictType(), Field(gt=0, le=100000)] | None = Field(
        None, description="`pdsvc doctor --kv`: warn when a pair moves KV slower (GB/s). "
        "null: no floor (TCP on one host is warned of anyway).",
    )

    @model_validator(mode="after")
    def _blocks_fit(self) -> TransferConfig:
        if self.kv_check_bytes % self.kv_check_blocks:
            raise ValueError(f"kv_check_bytes ({self.kv_check_bytes}) must be a multiple of "
                             f"kv_check_blocks ({self.kv_check_blocks})")
        return self


class LifecycleConfig(Strict):
    start_timeout_secs: Annotated[DaySecs, runtime_flag("--start-timeout")] = Field(
        3600, description="Load + JIT + warmup budget per start (at most a day).")
    stop_timeout_secs: Annotated[DaySecs, runtime_flag("--stop-timeout")] = Field(
        180, description="Drain budget before the cgroup is killed.")
    restart_secs: Annotated[HourSecs, runtime_flag("--restart-delay")] = Field(
        1, description="RestartSec=: the first restart's pause; the GPU idle check guards an "
        "early start, so this need not cover the GPU memory release (0.3 s on an H200).")
    restart_backoff_max_secs: Annotated[HourSecs, runtime_flag("--restart-max-delay")] = Field(
        300, description="Crashes in a row double the pause, up to this.")
    restart_reset_secs: Annotated[DaySecs, runtime_flag("--restart-reset")] = Field(
        600, description="Serving this long in a row forgives earlier crashes.")
    start_attempts: Annotated[Count1000, runtime_flag("--start-attempts")] = Field(
        3, description="Starts in a row that never become healthy before a unit gives up "
        "(exit 78, not restarted); stops and restarts of a healthy engine never count.")
    gpu_wait_secs: Annotated[DaySecs, runtime_flag("--gpu-wait")] = Field(
        600, description="At start, how long to wait (with progress) for busy GPUs to be freed.")
    liveness_interval_secs: Annotated[HourSecs, runtime_flag("--liveness-interval")] = Field(
        10, description="Health probe period once serving.")
    liveness_timeout_secs: Annotated[HourSecs, runtime_flag("--liveness-timeout")] = Field(
        30, description="One probe's timeout.")
    liveness_failures: Annotated[Count100, runtime_flag("--peer-down-probes")] = Field(
        3, description="WatchdogSec = interval × failures + timeout: the hang-detection bound."
    )
    canary_interval_secs: Annotated[HourSecs, runtime_flag("--canary-interval")] = Field(
        30, description="Pair canary period while rounds are good: a one-token PD request "
        "through each pair. A round also runs once an engine is ready, whenever a peer's port "
        "opens again, and every second after a bad round.")
    canary_failures: Annotated[Count100, runtime_flag("--canary-failures")] = Field(
        3, description="Failed canary rounds in a row (both engines healthy) before the pair "
        "is healed: by its prefill when the decode restarts with it, else by its stale side.")
    canary_timeout_secs: Annotated[HourSecs, runtime_flag("--canary-timeout")] = Field(
        60, description="One canary request's timeout.")
    canary_heal_attempts: Annotated[
        int, StrictType(), Field(le=100), runtime_flag("--canary-heals")] = Field(
        2, description="Heals in a row (within an hour) that do not bring a pair back before an "
        "engine heals only every 5 minutes, with the reason in its status; a stop of the unit "
        "starts afresh (0: the canary only reports).")
    cascade_port: Port = Field(
        8997, description="Where each engine host's runtimes serve that host's heals and cures "
        "of a heal cascade to the other engine hosts (HTTP, keyed with the router's "
        "control-plane key): one port per host, at hosts.NAME.address. Used only when the "
        "engines run on several hosts; open it between them.")


class MetricsConfig(Strict):
    engines: bool = Field(
        True, description="Pass --enable-metrics: each engine serves Prometheus text on its own "
        "port's /metrics (sglang:* names, incl. the PD transfer and bootstrap failure counters).")
    textfile: bool = Field(
        True, description="The runtime writes pdsvc's own state (up, ready, restarts, gave-up, "
        "pair canary) as NAME.prom into RUN_DIR/metrics, for node_exporter's textfile collector.")
    node_exporter_port: Port = Field(
        9100, description="Where each host's node_exporter (reading that directory) listens; the "
        "rendered scrape config points there.")
    scrape_interval_secs: HourSecs = Field(15, description="Scrape interval in prometheus.yml.")
    ttft_p99_slo_secs: Annotated[float, Field(gt=0, le=3600)] = Field(
        2.0, description="Alert PdsvcTTFTAboveSLO when the decodes' p99 time to first token "
        "over 5 min is above this.")
    restarts_per_hour: Count1000 = Field(
        3, description="Alert PdsvcRestartsHigh when a unit starts again after a crash, failed "
        "start or kill more often than this within an hour.")


class SupervisordConfig(Strict):
    """The supervisord bundle (`pdsvc render --format supervisord`): hosts and containers
    without systemd. The plan is the same; only how it is run differs."""

    numactl: Text | None = Field(
        "/usr/bin/numactl",
        description="numactl that pins each engine to its plan's CPUs and NUMA node "
        "(supervisord has no pinning of its own); null: not installed, then runtime.pinning "
        "must be off.",
    )
    logs: Literal["stdout", "files"] = Field(
        "stdout",
        description="stdout: every program's output on supervisord's stdout (containers); "
        "files: LOG_DIR/PROGRAM.log, rotated at 50 MB.",
    )
    log_dir: AbsPath = Field(
        "/var/log/pdsvc", description="For logs: files; must exist, writable by supervisord."
    )
    run_dir: AbsPath = Field(
        "/run",
        description="Holds supervisord's control socket and pid file (NAME-supervisord.sock, "
        ".pid); must exist (e.g. /tmp in a container without root).",
    )
    drop_privileges: bool = Field(
        True,
        description="Run the engines and router as runtime.user (supervisord started as root "
        "or as that user); false: as whoever starts supervisord (a container without that user).",
    )

    @field_validator("numactl", mode="before")
    @classmethod
    def _yaml_false(cls, v: Any) -> Any:
        return None if v is False else v  # `numactl: off` / `no` reads as false in YAML 1.1

    @field_validator("numactl")
    @classmethod
    def _absolute_numactl(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must be an absolute path or null, got {v!r}")
        return v



#: What a host's `run` list may name: the router, a role (every engine of it), or one item of a
#: role's list form.
RUN_REF = re.compile(r"^(router|prefill|decode)(?:\[(\d+)\])?$")


class HostConfig(Strict):
    """One machine of a deployment over several hosts (`hosts:`)."""

    address: Text = Field(
        description="The host's routable IP: engines bind it (--host, and the bootstrap server "
        "with it), it is their SGLANG_HOST_IP, and the router and decode reach them there.",
    )
    run: list[Text] = Field(
        min_length=1,
        description="What runs here: `router`, `prefill`/`decode` (every engine of the role), "
        "`prefill[I]`/`decode[I]` (item I of the list form). An engine on several hosts spans "
        "them: --nnodes, --node-rank in the order of `hosts`, --dist-init-addr on the first.",
    )
    topology: Text | None = Field(
        None,
        description="The host's `pdsvc topology --json` file (relative to the config's "
        "directory); default: the layout pdsvc reads where it runs (/sys or --topology).",
    )
    ucx_net_devices: Annotated[str, StringConstraints(
        pattern=r"^[A-Za-z0-9_.:,-]+$", max_length=1024)] | None = Field(
        None,
        description="UCX_NET_DEVICES for this host's engines: the NIC NIXL moves KV over "
        "(e.g. mlx5_0:1 or eth1). Unset across hosts: warned, UCX may pick the wrong NIC.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Env for this host's engines."
    )

    @field_validator("address")
    @classmethod
    def _ip(cls, v: str) -> str:
        try:
            ip = ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(
                f"must be an IPv4 address, got {v!r} (SGLang binds it and advertises it as "
                "SGLANG_HOST_IP, which a DNS name cannot be; IPv6 is not supported yet)"
            ) from None
        if ip.is_unspecified:
            raise ValueError(f"must be the host's own IP, not {v} (decode and router dial it)")
        return check_unicast(ip)

    @field_validator("run")
    @classmethod
    def _refs(cls, v: list[str]) -> list[str]:
        for ref in v:
            m = RUN_REF.match(ref)
            if not m or (m.group(1) == "router" and m.group(2) is not None):
                raise ValueError(
                    f"{ref!r} is not something to run; use router, prefill, decode, "
                    "prefill[I] or decode[I]"
                )
        return no_repeats(v)

    @field_validator("env")
    @classmethod
    def _env_not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_env(v)

    @field_validator("topology", "ucx_net_devices", mode="before")
    @classmethod
    def _no_empty(cls, v: Any) -> Any:
        if v == "":
            raise ValueError("must not be empty; leave the key out instead")
        return v


class K8sConfig(Strict):
    """Kubernetes manifests of the same deployment (`pdsvc render --format k8s`): one
    Deployment per engine (a LeaderWorkerSet when it spans hosts), a Service for each, the
    router's Deployment and Service. Pinning is the kubelet's (topology manager) there."""

    namespace: str = Field("default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                           description="Namespace of every object; part of the URLs the router "
                           "and decode dial (SERVICE.NAMESPACE.svc).")
    image: Text = Field("lmsysorg/sglang:latest",
                       description="Engine image with sglang and nixl; pin a tag or digest.")
    router_image: Text | None = Field(None, description="Router image (default: image).")
    python: Text = Field("python3", description="The interpreter inside the images.")
    gpu_resource: Text = Field("nvidia.com/gpu", description="Extended resource of one GPU.")
    node_selector: dict[Text, Text] = Field(
        default_factory=dict, description="nodeSelector of the engine pods (e.g. GPU type)."
    )
    jit_cache_claim: Text | None = Field(
        None,
        description="A ReadWriteMany PVC for the JIT cache (shared by every engine pod); "
        "default: a hostPath at runtime.jit_cache, shared by the pods of a node.",
    )
    router_service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="How clients reach the router's Service."
    )
    host_network: bool = Field(
        False, description="hostNetwork for engine pods (RDMA NICs without a CNI for them)."
    )


def expand_ref(ref: str, by_role: dict[str, tuple[Instance, ...]]) -> list[str]:
    """The engine keys a `run` item names ([] when it names none)."""
    m = RUN_REF.match(ref)
    if not m:
        return []
    role, index = m.group(1), m.group(2)
    if role == "router":
        return ["router"]
    insts = by_role[role]
    if index is None:
        return [i.key for i in insts]
    return [i.key for i in insts if i.index == int(index)]
