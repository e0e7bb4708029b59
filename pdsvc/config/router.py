"""The config's router section: the router (its package, policy, replicas, key), its health
checks and retries, the front (HAProxy) before several replicas, and the address (VIP) that
keepalived moves between router hosts.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, ValidationInfo, field_validator
from pydantic import Strict as StrictType

from pdsvc import routers
from pdsvc.config.fields import (
    AbsPath,
    ArgValue,
    Count100,
    Count1000,
    EnvName,
    EnvValue,
    FlagName,
    HourSecs,
    PlainPath,
    Port,
    Strict,
    Text,
)
from pdsvc.config.owned import (
    OWNED_ROUTER_FLAGS,
    check_arg_values,
    check_env,
    check_flags,
    check_host,
    check_unicast,
)


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


class RetryConfig(Strict):
    """What a request that failed on a dead or dying engine gets: another try, on a pair the
    router selects afresh."""

    attempts: Count100 = Field(
        6, description="Tries per request, the first included (--retry-max-retries counts "
        "tries). 1: no retry. A try that fails with 408, 429, 5xx or a connection error is "
        "retried on a pair selected afresh, both sides; a stream only before its headers.")
    initial_backoff_ms: Annotated[int, StrictType(), Field(ge=1, le=60000)] = Field(
        200, description="Pause before the 2nd try; each later pause doubles, up to "
        "max_backoff_ms. The defaults span 6 s: past a dead engine's deregistration by its "
        "runtime (at once) and the router's own health check (interval × failures).")
    max_backoff_ms: Annotated[int, StrictType(), Field(ge=1, le=600000)] = Field(
        3000, description="Longest pause between two tries.")


class FrontConfig(Strict):
    """HAProxy in front of the routers when router.replicas ≥ 2 (haproxy(1), Debian's package):
    it listens on router.host:router.port and sends each request to a router that answers."""

    haproxy: AbsPath = Field("/usr/sbin/haproxy", description="The haproxy binary (Debian: "
                             "`apt install haproxy`; its own haproxy.service can stay off).")
    check_interval_ms: Annotated[int, StrictType(), Field(ge=100, le=60000)] = Field(
        500, description="Health check of each router (GET /readiness: 503 while it lists no "
        "healthy prefill and decode) every this long; 2 failed in a row take it out, 1 good "
        "one puts it back. A refused connection or a 503 is retried on the other router at "
        "once, whatever the check says.")
    retries: Annotated[int, StrictType(), Field(ge=1, le=10)] = Field(
        3, description="Tries on another router for a request whose router refused, reset "
        "or closed it without a response (`retry-on conn-failure empty-response`, "
        "`option redispatch`). A response already begun (a stream) is never retried.")
    buffer_kib: Annotated[int, StrictType(), Field(ge=16, le=16384)] = Field(
        256, description="HAProxy's tune.bufsize: a request is sent again after an empty "
        "response only when it fits (256 KiB: a prompt of ~50k tokens); two such buffers per "
        "request in flight (256 in flight: 128 MiB).")
    timeout_secs: HourSecs = Field(
        3600, description="Longest request, client and server side (a long generation).")
    drain_secs: HourSecs = Field(
        60, description="A router unit's stop waits this long at most for the requests it "
        "is serving to finish, after the front stopped sending it new ones.")
    prometheus_port: Port = Field(
        29100, description="HAProxy's own Prometheus exporter (haproxy_* series: each "
        "router's state and requests), on router.prometheus_host; scraped as pdsvc-front.")


class VipConfig(Strict):
    """The address clients use when routers run on two or more hosts (`hosts.NAME.run:
    [router]` on each): keepalived(8), Debian's package, holds it on one router host and moves
    it by VRRP (RFC 5798, unicast between the router hosts) when that host is lost."""

    address: Text | None = Field(
        None, description="The moving IPv4 address (clients send to address:router.port). "
        "Unset: routers on one host only. Must be free on the router hosts' network.")
    interface: Annotated[str, StringConstraints(
        pattern=r"^[A-Za-z0-9_.@-]{1,15}$")] | None = Field(
        None, description="The NIC that holds the address on every router host (`ip -br "
        "link`: eth0, enp1s0 …); needed with address.")
    vrrp_id: Annotated[int, StrictType(), Field(ge=1, le=255)] = Field(
        51, description="VRRP's virtual_router_id: unique among the VRRP groups of that "
        "network.")
    advert_ms: Annotated[int, StrictType(), Field(ge=50, le=10000, multiple_of=10)] = Field(
        500, description="VRRPv3 advertisement interval. A backup takes the address over "
        "after 3 missed ones (~1.6 s at 500 ms).")
    keepalived: AbsPath = Field("/usr/sbin/keepalived", description="The keepalived binary "
                                "(Debian: `apt install keepalived`; its own keepalived.service "
                                "can stay off).")

    @field_validator("address")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            ip = ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"must be an IPv4 address, got {v!r} (keepalived adds it to "
                             "router.vip.interface)") from None
        if ip.is_unspecified or ip.is_loopback:
            raise ValueError(f"must be an address the clients reach, not {v}")
        return check_unicast(ip)


class RouterConfig(Strict):
    package: routers.PackageName = Field(
        routers.DEFAULT,
        description="Router package in router.python's venv: sglang-router (0.3.2) or its "
        "successor smg (1.13.0, `python -m smg.launch_router`). Picks the module (unless "
        "runtime.router_module is set) and the flags router.args may use.",
    )
    python: Text | None = Field(
        None,
        description="Interpreter with sglang-router (default: runtime.python). sglang in the "
        "same venv costs the router nothing: pdsvc's launcher keeps launch_router's mini_lb "
        "from importing it (unless --mini-lb).",
    )
    host: Text = Field("0.0.0.0", description="Where clients reach the router.")
    port: Port = Field(8000, description="Client port (the router's own default, 30000, clashes).")
    prometheus_host: Text = Field("127.0.0.1", description="Metrics listener address.")
    prometheus_port: Port = Field(29000, description="Metrics port (always bound by the router).")
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two", "manual"] = Field(
        "cache_aware", description="--policy."
    )
    replicas: Annotated[int, StrictType(), Field(ge=1, le=8)] = Field(
        1, description="Router processes. 1: the router listens on host:port itself. 2 or "
        "more: router I listens on 127.0.0.1:replica_port+I (metrics on prometheus_port+I), "
        "every engine registers with each, and HAProxy (router.front) listens on host:port "
        "in front of them: a router's restart, crash or upgrade fails no request. With "
        "`hosts`: 1, and `router` in the run of two or more hosts (router.vip).")
    replica_port: Port = Field(
        8100, description="With replicas ≥ 2: the first router's own port (loopback). With "
        "routers on several hosts: each one's port, on its host's address.")
    front: FrontConfig = FrontConfig()
    vip: VipConfig = VipConfig()
    health_check: HealthCheckConfig = HealthCheckConfig()
    retry: RetryConfig = RetryConfig()
    circuit_breaker: bool = Field(
        False, description="The router's circuit breaker (--disable-circuit-breaker when "
        "false). Both router generations charge a failed PD try to the prefill AND the decode "
        "it went to, so one dead engine opens the breaker of its healthy partners too, for "
        "60 s after it is back (sglang-router's pd_router.rs).")
    args: dict[FlagName, ArgValue] = Field(
        default_factory=dict, description="Extra launch_router flags, `flag-name: value`."
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Env for the router."
    )
    control_plane_key: PlainPath | None = Field(
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
            pkg = routers.package(info.data["package"])
            check_flags(v, pkg.owned, f"{pkg.name}'s launch_router", by=f"for {pkg.name}",
                        fix="remove it")
            routers.check_args(pkg.name, v)
        return v

    @field_validator("env")
    @classmethod
    def _env_not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_env(v)
