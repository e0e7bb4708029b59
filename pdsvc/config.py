"""The config schema (pydantic, strict) and its loader with file:line error messages.

The config says *what* the user wants; `plan.py` turns it into every concrete value. Cross-field
checks that need only the config live here; checks that need the host live in `plan.py`.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic import Strict as StrictType

from . import routers, yamlload
from .encode import check_account, check_path, check_text, one_line
from .errors import ConfigError
from .owned import (  # noqa: F401  (OWNED_ENV: re-exported, the config's owned names)
    OWNED_ENGINE_FLAGS,
    OWNED_ENV,
    OWNED_ROUTER_FLAGS,
    check_arg_values,
    check_env,
    check_flags,
    check_host,
    check_unicast,
)
from .plan import DIST_INIT_SPAN

#: Every string of the schema is one of these (encode.py: what every output can carry).
Text = Annotated[str, AfterValidator(check_text)]
AbsPath = Annotated[str, AfterValidator(check_path)]
Account = Annotated[str, AfterValidator(check_account)]
#: Integers are YAML integers: `port: true` or `gpus: [0, true]` is refused, not read as 1
#: (pydantic's lax mode would take a bool, a float or a numeric string), and so is `1e20`.
Int = Annotated[int, StrictType()]
Port = Annotated[int, StrictType(), Field(ge=1, le=65535)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=255)]
FlagName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=255)]
EnvValue = Text | Int | float | bool
ArgValue = Text | Int | float | bool | list[Text | Int | float]
#: Bounded by what systemd and a sane deployment accept (issue 11): a value systemd cannot
#: hold (`1e20`) would be ignored and its default would apply silently.
DAY, HOUR = 86400, 3600


HourSecs = Annotated[int, StrictType(), Field(ge=1, le=HOUR)]
DaySecs = Annotated[int, StrictType(), Field(ge=1, le=DAY)]
WeekSecs = Annotated[int, StrictType(), Field(ge=1, le=7 * DAY)]
Count100 = Annotated[int, StrictType(), Field(ge=1, le=100)]
Count1000 = Annotated[int, StrictType(), Field(ge=1, le=1000)]
TpSize = Annotated[int, StrictType(), Field(ge=1, le=4096)]
GpuIndex = Annotated[int, StrictType(), Field(ge=0, le=1023)]
Module = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=255)]

#: Ports of instance i of a role, when the config does not give them (i = 0 is also the
#: single-mapping default): HTTP ports interleave (prefill even, decode odd), each prefill gets
#: its own bootstrap port (sglang #20952), and the dist-init bases step by 200 so that every
#: base, prefill's and decode's, is 100 from the next and no other port falls in a base's span.
PREFILL_PORT, DECODE_PORT, PORT_STEP = 30000, 30001, 2
BOOTSTRAP_PORT = 8998
PREFILL_DIST_INIT, DECODE_DIST_INIT, DIST_INIT_STEP = 30335, 30435, 2 * DIST_INIT_SPAN

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class RoleConfig(Strict):
    gpus: list[GpuIndex] = Field(min_length=1, max_length=1024)
    numa_node: Literal["auto"] | int = Field(
        "auto", description="auto: the node of the role's GPUs, read from the host; or a node id."
    )
    port: Port
    tp: TpSize | None = Field(
        None, description="Default: len(gpus) × the number of hosts that run the engine."
    )
    dist_init_port: Port
    args: dict[FlagName, ArgValue] = Field(
        default_factory=dict,
        description="Extra launch_server flags, `flag-name: value` (true: bare flag).",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Env for this role only."
    )

    @field_validator("numa_node", mode="before")
    @classmethod
    def _numa(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1024):
            return v
        raise ValueError(f"must be 'auto' or a NUMA node number (0, 1, … 1023), got {v!r}")

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        return _no_repeats(v, "GPU ")

    @field_validator("args")
    @classmethod
    def _not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_arg_values(check_flags(v, OWNED_ENGINE_FLAGS, "launch_server"))

    @field_validator("env")
    @classmethod
    def _env_not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_env(v)


class PrefillConfig(RoleConfig):
    gpus: list[GpuIndex] = Field(
        [0, 1, 2, 3], min_length=1, max_length=1024,
        description="GPU indices (nvidia-smi / PCI bus order).",
    )
    port: Port = Field(PREFILL_PORT, description="HTTP port (bound on 127.0.0.1).")
    dist_init_port: Port = Field(
        PREFILL_DIST_INIT, description="--dist-init-addr port; base+1…+99 stay free for SGLang."
    )
    bootstrap_port: Port = Field(
        BOOTSTRAP_PORT,
        description="KV bootstrap server; the same value goes to decode and the router.",
    )


class DecodeConfig(RoleConfig):
    gpus: list[GpuIndex] = Field(
        [4, 5, 6, 7], min_length=1, max_length=1024,
        description="GPU indices (nvidia-smi / PCI bus order).",
    )
    port: Port = Field(DECODE_PORT, description="HTTP port (bound on 127.0.0.1).")
    dist_init_port: Port = Field(DECODE_DIST_INIT, description="≥100 from prefill's.")
    restart_with_prefill: Literal["auto"] | bool = Field(
        "auto",
        description="Restart decode whenever prefill restarts — any prefill, when there are "
        "several (auto: on for nixl, sglang #33789).",
    )


# List form: `prefill: [{gpus: …}, {gpus: …}]` runs one engine per item (xPyD on one host). An
# item takes the keys of the single mapping; it must name its GPUs, and the ports it leaves out
# are allocated from its index. Each item has its own args/env (no role-level defaults), and a
# decode item's restart_with_prefill couples it to *every* prefill: a decode holds transfer
# state per prefill (sglang #33789).


class PrefillInstance(PrefillConfig):
    """One item of `prefill:` in list form."""

    gpus: list[GpuIndex] = Field(
        min_length=1, max_length=1024,
        description="List form, `prefill: [{gpus: …}, …]`: one engine per item (units "
        "NAME-prefill-0, NAME-prefill-1, … when several), each with its own GPUs (required, "
        "disjoint), args and env; ports left out are allocated from the index i.",
    )
    port: Port | None = Field(None, description=f"Default: {PREFILL_PORT} + {PORT_STEP}×i.")
    dist_init_port: Port | None = Field(
        None, description=f"Default: {PREFILL_DIST_INIT} + {DIST_INIT_STEP}×i."
    )
    bootstrap_port: Port | None = Field(
        None,
        description=f"Default: {BOOTSTRAP_PORT} + i; one per prefill (sglang #20952). The router "
        "gets each with its URL; every decode's --disaggregation-bootstrap-port is prefill[0]'s.",
    )


class DecodeInstance(DecodeConfig):
    """One item of `decode:` in list form."""

    gpus: list[GpuIndex] = Field(
        min_length=1, max_length=1024,
        description="List form, `decode: [{gpus: …}, …]`: one engine per item (units "
        "NAME-decode-0, NAME-decode-1, … when several), each with its own GPUs (required, "
        "disjoint), args and env; ports left out are allocated from the index i.",
    )
    port: Port | None = Field(None, description=f"Default: {DECODE_PORT} + {PORT_STEP}×i.")
    dist_init_port: Port | None = Field(
        None, description=f"Default: {DECODE_DIST_INIT} + {DIST_INIT_STEP}×i."
    )
    restart_with_prefill: Literal["auto"] | bool = Field(
        "auto",
        description="Per decode instance: restart it whenever ANY prefill (re)starts "
        "(auto: on for nixl, sglang #33789).",
    )


def _form(value: Any) -> str:
    return "list" if isinstance(value, list) else "mapping"


#: A role is one mapping (one engine, units NAME-prefill / NAME-decode as before) or a list of
#: instances (NAME-prefill-0, NAME-prefill-1, … when there are several).
PrefillSpec = Annotated[
    Annotated[PrefillConfig, Tag("mapping")]
    | Annotated[list[PrefillInstance], Field(min_length=1), Tag("list")],
    Discriminator(_form),
]
DecodeSpec = Annotated[
    Annotated[DecodeConfig, Tag("mapping")]
    | Annotated[list[DecodeInstance], Field(min_length=1), Tag("list")],
    Discriminator(_form),
]
_FORM_TAGS = ("mapping", "list")


def model_forms(annotation: Any) -> tuple[Any, Any]:
    """(model of the mapping form, model of a list item) of a role field's annotation; either
    is None when the field has no such form (the config reference and error hints use it)."""
    mapping = item = None
    for member in typing.get_args(annotation) or (annotation,):
        while typing.get_origin(member) is Annotated:
            member = typing.get_args(member)[0]
        if typing.get_origin(member) is list:
            item = typing.get_args(member)[0]
        elif isinstance(member, type) and issubclass(member, BaseModel):
            mapping = member
    return mapping, item


class HealthCheckConfig(Strict):
    interval_secs: HourSecs = Field(
        5, description="Router health probe period (its default: 60).")
    timeout_secs: HourSecs = Field(5, description="Router health probe timeout.")
    failure_threshold: Count1000 = Field(
        2, description="Failed probes before a worker leaves rotation."
    )
    success_threshold: Count1000 = Field(
        1, description="Good probes before it returns."
    )


class RouterConfig(Strict):
    package: routers.PackageName = Field(
        routers.DEFAULT,
        description="Router package in router.python's venv: sglang-router (0.3.2) or its "
        "successor smg (1.13.0, `python -m smg.launch_router`). Picks the module (unless "
        "runtime.router_module is set) and the flags router.args may use.",
    )
    python: Text | None = Field(
        None,
        description="Interpreter with sglang-router (default: runtime.python). A venv without "
        "sglang starts the router ~3 s faster: launch_router imports mini_lb, which imports "
        "all of sglang when it is installed.",
    )
    host: Text = Field("0.0.0.0", description="Where clients reach the router.")
    port: Port = Field(8000, description="Client port (the router's own default, 30000, clashes).")
    prometheus_host: Text = Field("127.0.0.1", description="Metrics listener address.")
    prometheus_port: Port = Field(29000, description="Metrics port (always bound by the router).")
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two", "manual"] = Field(
        "cache_aware", description="--policy."
    )
    health_check: HealthCheckConfig = HealthCheckConfig()
    args: dict[FlagName, ArgValue] = Field(
        default_factory=dict, description="Extra launch_router flags, `flag-name: value`."
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Env for the router."
    )
    control_plane_key: AbsPath | None = Field(
        None, description="File with the key of the router's control plane (/workers), with "
        "which the engines register (default: /etc/NAME/router.key, made by install.sh).")

    @field_validator("python")
    @classmethod
    def _absolute_router_python(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r} (systemd runs no shell PATH)")
        return v

    @field_validator("host", "prometheus_host")
    @classmethod
    def _listen_address(cls, v: str) -> str:
        return check_host(v)

    @field_validator("args")
    @classmethod
    def _not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_arg_values(check_flags(v, OWNED_ROUTER_FLAGS, "launch_router"))

    @field_validator("args")
    @classmethod
    def _args_fit_package(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "package" in info.data:  # else package itself is the error reported
            routers.check_args(info.data["package"], v)
        return v

    @field_validator("env")
    @classmethod
    def _env_not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_env(v)


class LifecycleConfig(Strict):
    start_timeout_secs: DaySecs = Field(
        3600, description="Load + JIT + warmup budget per start (at most a day).")
    stop_timeout_secs: DaySecs = Field(
        180, description="Drain budget before the cgroup is killed.")
    restart_secs: HourSecs = Field(
        1, description="RestartSec=: the first restart's pause; the GPU idle check guards an "
        "early start, so this need not cover the GPU memory release (0.3 s on an H200).")
    restart_backoff_max_secs: HourSecs = Field(
        300, description="Crashes in a row double the pause, up to this.")
    restart_reset_secs: DaySecs = Field(
        600, description="Serving this long in a row forgives earlier crashes.")
    start_attempts: Count1000 = Field(
        3, description="Starts in a row that never become healthy before a unit gives up "
        "(exit 78, not restarted); stops and restarts of a healthy engine never count.")
    gpu_wait_secs: DaySecs = Field(
        600, description="At start, how long to wait (with progress) for busy GPUs to be freed.")
    liveness_interval_secs: HourSecs = Field(
        10, description="Health probe period once serving.")
    liveness_timeout_secs: HourSecs = Field(30, description="One probe's timeout.")
    liveness_failures: Count100 = Field(
        3, description="WatchdogSec = interval × failures + timeout: the hang-detection bound."
    )
    canary_interval_secs: HourSecs = Field(
        30, description="Pair canary period: a one-token PD request through each pair.")
    canary_failures: Count100 = Field(
        3, description="Failed canary rounds in a row (both engines healthy) before the stale "
        "side of the pair restarts itself.")
    canary_timeout_secs: HourSecs = Field(60, description="One canary request's timeout.")
    canary_heal_attempts: Annotated[int, StrictType(), Field(ge=0, le=100)] = Field(
        2, description="Heals in a row (within an hour) that do not bring a pair back before an "
        "engine stops restarting for it and only reports (0: the canary only reports).")


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
        return _no_repeats(v)

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


HostName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


class Config(Strict):
    name: Text = Field("dsv4", description="Prefix of every unit name.")
    format: Literal["systemd", "supervisord", "k8s"] = Field(
        "systemd",
        description="What `pdsvc render` writes by default (--format overrides): systemd units, "
        "a supervisord config for hosts and containers without systemd, or k8s manifests.",
    )
    model: ModelConfig
    runtime: RuntimeConfig = RuntimeConfig()
    transfer: TransferConfig = TransferConfig()
    prefill: PrefillSpec = PrefillConfig()
    decode: DecodeSpec = DecodeConfig()
    router: RouterConfig = RouterConfig()
    lifecycle: LifecycleConfig = LifecycleConfig()
    supervisord: SupervisordConfig = SupervisordConfig()
    k8s: K8sConfig = K8sConfig()
    hosts: dict[HostName, HostConfig] | None = Field(
        None,
        description="Several hosts: NAME → address, what runs there. `pdsvc render` then writes "
        "one bundle per host (units/NAME/) with its own target. Absent: everything on this "
        "host, engines on 127.0.0.1.",
    )

    @field_validator("hosts")
    @classmethod
    def _some_hosts(cls, v: dict | None) -> dict | None:
        if v is not None and not v:
            raise ValueError("must list at least one host (or leave `hosts` out for one host)")
        return v

    @field_validator("name")
    @classmethod
    def _unit_prefix(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}[a-z0-9]", v):
            raise ValueError(
                f"must be 2-32 lowercase letters, digits and dashes, starting with a letter, "
                f"got {v!r} (it names the units: NAME-prefill.service, …)"
            )
        return v

    def instances(self, role: Literal["prefill", "decode"]) -> tuple[Instance, ...]:
        """The role's engines, each with every port resolved (allocated from its index when
        the list form leaves one out)."""
        spec = self.prefill if role == "prefill" else self.decode
        if not isinstance(spec, list):
            return (Instance(role, None, (role,), spec),)
        out = []
        for i, item in enumerate(spec):
            if role == "prefill":
                wanted = {"port": PREFILL_PORT + PORT_STEP * i,
                          "dist_init_port": PREFILL_DIST_INIT + DIST_INIT_STEP * i,
                          "bootstrap_port": BOOTSTRAP_PORT + i}
            else:
                wanted = {"port": DECODE_PORT + PORT_STEP * i,
                          "dist_init_port": DECODE_DIST_INIT + DIST_INIT_STEP * i}
            allocated = {k: v for k, v in wanted.items() if getattr(item, k) is None}
            out.append(Instance(role, i, (role, i), item.model_copy(update=allocated),
                                frozenset(allocated)))
        return tuple(out)

    @property
    def engines(self) -> tuple[Instance, ...]:
        """Every engine instance: the prefills, then the decodes."""
        return self.instances("prefill") + self.instances("decode")

    def placement(self) -> dict[str, tuple[str, ...]]:
        """Where each engine (by key: `prefill`, `decode[1]`) and the `router` run: host names
        in the order of `hosts` (an engine's first host is its node-rank 0). Empty without
        `hosts`. References that name nothing are left out (cross_field_problems reports them)."""
        out: dict[str, list[str]] = {}
        if not self.hosts:
            return {}
        by_role = {role: self.instances(role) for role in ("prefill", "decode")}
        for host, hc in self.hosts.items():
            for ref in hc.run:
                for key in _expand_ref(ref, by_role):
                    out.setdefault(key, []).append(host)
        return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}



@dataclass(frozen=True)
class Instance:
    """One engine of the config: the role's single mapping, or item `index` of its list."""

    role: Literal["prefill", "decode"]
    index: int | None  # None: the role is one mapping
    loc: tuple  # the key path of its settings: ("prefill",) or ("prefill", 1)
    cfg: Any  # PrefillConfig | DecodeConfig with every port set
    allocated: frozenset[str] = frozenset()  # port keys allocated, not given

    @property
    def key(self) -> str:
        """How errors name it: `prefill` or `prefill[1]`."""
        return dotted(self.loc)


def _expand_ref(ref: str, by_role: dict[str, tuple[Instance, ...]]) -> list[str]:
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


def dotted(loc: tuple) -> str:
    """A key path as the user writes it: ('prefill', 1, 'gpus') -> 'prefill[1].gpus'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _no_repeats(items: list, what: str = "") -> list:
    dupes = sorted({x for x in items if items.count(x) > 1})
    if dupes:
        raise ValueError(f"{what}{dupes[0]} is listed twice")
    return items


# --------------------------------------------------------------------------- loading


def parse_config(text: str, source: str = "<config>") -> Config:
    """Validate YAML text against the schema; errors name the key, the line and the fix, on
    one line whatever the config holds (keys and values are shown escaped)."""
    source = one_line(source)
    # one parse: the node tree gives line numbers, the same tree gives the data
    data, node = yamlload.load(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of keys (name, model, …)")
    lines = _line_index(node)
    try:
        config = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(_describe(e.errors()[0], lines, source))) from None
    for loc, problem in cross_field_problems(config):
        line = _nearest_line(loc, lines)
        where = f"{source}:{line}" if line else source
        raise ConfigError(one_line(f"{where}: {dotted(loc)}: {problem}"))
    return config


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
    return problems


def _host_problems(config: Config) -> list[tuple[tuple, str]]:
    """`hosts`: every run item names something, every engine runs somewhere, the router once."""
    if not config.hosts:
        return []
    problems: list[tuple[tuple, str]] = []
    by_role = {role: config.instances(role) for role in ("prefill", "decode")}
    seen: dict[str, str] = {}
    for host, hc in config.hosts.items():
        if hc.address in seen:
            problems.append((("hosts", host, "address"), (
                f"{hc.address} is also hosts.{seen[hc.address]}.address; one address per host"
            )))
        seen.setdefault(hc.address, host)
    loopback = [h for h, hc in config.hosts.items() if ipaddress.ip_address(hc.address).is_loopback]
    if loopback and len(loopback) < len(config.hosts):  # all loopback: hosts of one machine
        problems.append((("hosts", loopback[0], "address"), (
            f"{config.hosts[loopback[0]].address} is a loopback address, which the other hosts "
            "cannot reach (the router and decode dial it); give the host's routable IP"
        )))
    for host, hc in config.hosts.items():
        for j, ref in enumerate(hc.run):
            if _expand_ref(ref, by_role):
                continue
            m = RUN_REF.match(ref)
            assert m is not None  # HostConfig checked the syntax
            role = m.group(1)
            spec = config.prefill if role == "prefill" else config.decode
            have = (f"{role} is one mapping; write `{role}`" if not isinstance(spec, list)
                    else f"{role} has items 0…{len(spec) - 1}")
            problems.append((("hosts", host, "run", j), f"{ref} names no engine: {have}"))
    placed = config.placement()
    for inst in config.engines:
        named = {(host, ref) for host, hc in config.hosts.items() for ref in hc.run
                 if inst.key in _expand_ref(ref, by_role)}
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
    if len(routers) != 1:
        problems.append((("hosts",), (
            "the router runs on no host; add `router` to one host's run" if not routers else
            f"the router is on {len(routers)} hosts ({', '.join(routers)}); run it on one"
        )))
    for host, hc in config.hosts.items():
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


def _port_problems(config: Config) -> list[tuple[tuple, str]]:
    """Every port the plan opens is distinct, and dist-init bases keep their port span free.
    A port allocated from an instance's index is named as such: giving it is the fix."""
    # the router's first: the port clients know; an engine's that clashes with it is named
    r = config.router  # a router port left out is its default, not allocated from an index
    ports: list[tuple[tuple, int, str]] = [
        (("router", key), getattr(r, key), "" if key in r.model_fields_set else
         f"router.{key} is its default") for key in ("port", "prometheus_port")]
    for inst in config.engines:
        for key in ("port", "bootstrap_port") if inst.role == "prefill" else ("port",):
            ports.append(_port_of(inst, key))
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


def _line_index(node: yaml.Node | None, path: tuple = ()) -> dict[tuple, int]:
    """Map each key path (as pydantic writes `loc`) to its 1-based line in the YAML text."""
    index: dict[tuple, int] = {}
    if node is None:
        return index
    index[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            index[path + (key,)] = key_node.start_mark.line + 1
            child = path + (key,)
            index.update({k: v for k, v in _line_index(value_node, child).items() if k != child})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            index.update(_line_index(item, path + (i,)))
    return index


def _describe(err: dict[str, Any], lines: dict[tuple, int], source: str) -> str:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _is_union_tag(p)))
    if len(loc) > 1 and loc[0] in ("prefill", "decode") and loc[1] in _FORM_TAGS:
        loc = loc[:1] + loc[2:]  # the role's form (one mapping or a list), not a key
    shown_key = dotted(loc) or "(top level)"
    line = _nearest_line(loc, lines)
    where = f"{source}:{line}" if line else source
    kind = err["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        valid = _valid_keys(parent)
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
        fix = f"did you mean '{dotted((*parent, close[0]))}'?" if close else (
            f"valid keys here: {', '.join(valid)}"
        )
        return f"{where}: unknown key '{shown_key}'; {fix}"
    if kind == "missing":
        return f"{where}: missing required key '{shown_key}'; add it (see etc/pdsvc.yaml)"
    msg = err["msg"]
    msg = re.sub(r"^Value error, ", "", msg)
    if kind == "model_type":  # pydantic names the model class, which the user never wrote
        msg = "must be a mapping of keys" + (
            " (one engine) or a list of them (one engine each)"
            if loc in (("prefill",), ("decode",)) else ""
        )
    given = err.get("input")
    shown = "" if isinstance(given, (dict, list)) or kind.startswith("value_error") else (
        f" (got {_short(repr(given))})"
    )
    return f"{where}: {shown_key}: {msg}{shown}"


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[:most] + "…"


def _is_union_tag(part: str) -> bool:
    # pydantic inserts the union member's type name into loc ("literal['auto']", "int", …)
    scalar = part in {"int", "str", "float", "bool"}
    return scalar or part.startswith(("literal[", "list[", "constrained-", "function-"))


def _nearest_line(loc: tuple, lines: dict[tuple, int]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _valid_keys(parent: tuple) -> list[str]:
    model: Any = Config
    for i, part in enumerate(parent):
        if isinstance(part, int):
            continue  # the list item's model was chosen at its key
        field = model.model_fields.get(str(part)) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        listed = i + 1 < len(parent) and isinstance(parent[i + 1], int)
        mapping, item = model_forms(field.annotation)
        model = item if listed else mapping
    return list(model.model_fields) if hasattr(model, "model_fields") else []
