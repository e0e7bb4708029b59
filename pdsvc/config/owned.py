"""What pdsvc derives itself and a config may not reach around: launch_server and
launch_router flags in `args` (also by argparse abbreviation, or smuggled in as a value), env
vars in `env`, and addresses that cannot be what they claim.

Both parsers are Python argparse with allow_abbrev on (its default): `--por 1` is `--port 1`
when `por` is a prefix of one long option only, and `--disable-radix-cache --port=31337` is two
options. https://docs.python.org/3/library/argparse.html#allow-abbrev and #prefix-matching
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pdsvc.sglang import JIT_CACHE_ENV

#: launch_server flags pdsvc derives from the plan; setting them in `args` would contradict it.
OWNED_ENGINE_FLAGS = {
    "model-path": "model.path",
    "model": "model.path",
    "served-model-name": "model.served_name",
    "trust-remote-code": "model.trust_remote_code",
    "host": "hosts.NAME.address (engines bind 127.0.0.1 without hosts)",
    "nnodes": "hosts (an engine listed on several hosts spans them)",
    "node-rank": "hosts (the order of the hosts that run the engine)",
    "port": "<role>.port",
    "tp": "<role>.tp",
    "tp-size": "<role>.tp",
    "tensor-parallel-size": "<role>.tp",
    "dist-init-addr": "<role>.dist_init_port",
    "nccl-init-addr": "<role>.dist_init_port",
    "disaggregation-mode": "the role (prefill/decode)",
    "disaggregation-transfer-backend": "transfer.backend",
    "disaggregation-bootstrap-port": "prefill.bootstrap_port",
    "base-gpu-id": "<role>.gpus (CUDA_VISIBLE_DEVICES)",
    "enable-metrics": "metrics.engines",
}
#: router flags pdsvc derives from the plan.
OWNED_ROUTER_FLAGS = {
    "pd-disaggregation": "(always on)",
    "prefill": "prefill",
    "decode": "decode",
    "host": "router.host",
    "port": "router.port",
    "policy": "router.policy",
    "prometheus-port": "router.prometheus_port",
    "prometheus-host": "router.prometheus_host",
    "health-check-interval-secs": "router.health_check.interval_secs",
    "health-check-timeout-secs": "router.health_check.timeout_secs",
    "health-failure-threshold": "router.health_check.failure_threshold",
    "health-success-threshold": "router.health_check.success_threshold",
    "worker-startup-timeout-secs": "lifecycle.start_timeout_secs",
    "retry-max-retries": "router.retry.attempts",
    "retry-initial-backoff-ms": "router.retry.initial_backoff_ms",
    "retry-max-backoff-ms": "router.retry.max_backoff_ms",
    "retry-backoff-multiplier": "router.retry (the pause doubles)",
    "disable-retries": "router.retry.attempts: 1",
    "disable-circuit-breaker": "router.circuit_breaker",
    "control-plane-api-keys": "router.control_plane_key (a file; engines register with it)",
}
#: environment variables pdsvc owns: the plan sets them, a user value would contradict it.
OWNED_ENV = {
    "CUDA_VISIBLE_DEVICES": "<role>.gpus",
    "CUDA_DEVICE_ORDER": "(always PCI_BUS_ID, so indices match nvidia-smi)",
    "SGLANG_DISAGGREGATION_NIXL_BACKEND": "transfer.nixl_backend",
    "SGLANG_HOST_IP": "hosts.NAME.address",
    **{var: f"runtime.jit_cache ({sub}/ below it, shared by every engine)"
       for var, sub in JIT_CACHE_ENV},
}
#: ... and the ones it derives from no key: they cannot be set at all.
DERIVED_ENV = {
    "HOME": "the units' StateDirectory= /var/lib/NAME, the service user's home",
}
#: Variables pdsvc sets by default that a config may override (documented in docs/escaping.md):
#: the default is a choice, not a fact of the plan.
ENV_OVERRIDES = {
    "CUDA_CACHE_MAXSIZE": "the PTX JIT cache's size (pdsvc: 4 GiB, CUDA's maximum)",
    "HF_HUB_OFFLINE": "pdsvc sets 1 for a local model.path",
    "PYTHONUNBUFFERED": "pdsvc sets 1 so that log lines arrive at once",
}
#: argparse reads a word starting with '-' as an option unless it looks like a negative number
#: (Lib/argparse.py, _negative_number_matcher).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")


def check_flags(args: dict[str, Any], owned: dict[str, str], parser: str, *,
                by: str = "from", fix: str = "set that instead") -> dict[str, Any]:
    """Refuse a flag in `args` that the plan derives (`owned`: flag -> what it comes from,
    read after `by`), also when it is only a prefix of one: argparse would expand it
    (ambiguous prefixes too: which one the parser picks is its business, neither may be set
    here). `fix`: what to do instead."""
    for flag in args:
        if flag in owned:
            raise ValueError(f"--{flag} is set by pdsvc {by} {owned[flag]}; {fix}")
        longer = sorted(f for f in owned if f.startswith(flag))
        if longer:
            raise ValueError(
                f"--{flag} is an abbreviation of --{longer[0]}, which pdsvc sets {by} "
                f"{owned[longer[0]]} ({parser}'s argparse expands a prefix of a flag); {fix}, "
                "or write the flag in full if you meant another one")
    return args


def check_arg_values(args: dict[str, Any]) -> dict[str, Any]:
    """Refuse an `args` value that the parser would read as a flag of its own: a string that
    starts with '-' (`disable-radix-cache: "--port=31337"`, `[info, --tp-size, "8"]`), unless
    it is a negative number, which argparse takes as a value."""
    for flag, value in args.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item.startswith("-") and not _NEGATIVE_NUMBER.match(item):
                shown = item if len(item) <= 40 else item[:40] + "…"
                raise ValueError(
                    f"the value {shown!r} of --{flag} starts with '-', so the parser would read "
                    "it as a flag of its own, not as the value; no flag pdsvc passes takes such "
                    "a value")
    return args


def check_env(env: dict[str, Any]) -> dict[str, Any]:
    for key, value in env.items():
        if key in OWNED_ENV:
            raise ValueError(f"{key} is set by pdsvc from {OWNED_ENV[key]}; set that instead")
        if key in DERIVED_ENV:
            raise ValueError(
                f"{key} is set by pdsvc to {DERIVED_ENV[key]}; remove it (of what pdsvc sets, "
                f"env may override only {', '.join(sorted(ENV_OVERRIDES))})")
        if key == "SGLANG_SET_CPU_AFFINITY" and str(value).lower() not in ("0", "false", ""):
            raise ValueError(
                "SGLANG_SET_CPU_AFFINITY overrides the unit's NUMA pinning (it spreads ranks over "
                "all sockets); remove it and let pdsvc pin"
            )
    return env


def check_unicast(ip: ipaddress.IPv4Address) -> str:
    """A host's own address: one that can be dialled (RFC 1112 multicast, RFC 919 broadcast
    and the reserved 240.0.0.0/4 cannot)."""
    if ip.is_multicast:
        raise ValueError(f"must be a unicast address, not the multicast address {ip}")
    if ip.is_reserved:  # 240.0.0.0/4, 255.255.255.255 among them
        what = "the broadcast" if ip == ipaddress.IPv4Address("255.255.255.255") else "a reserved"
        raise ValueError(f"must be a unicast address, not {what} address {ip}")
    return str(ip)


def check_host(value: str) -> str:
    """Where the router listens: an IPv4 address (0.0.0.0: every address), `::`, or a DNS
    name. It is part of URLs (http://HOST:PORT), so nothing else may be in it."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if isinstance(ip, ipaddress.IPv6Address) and not ip.is_unspecified:
        raise ValueError(f"must be an IPv4 address, '::' or a host name, got {value!r} (IPv6 "
                         "addresses are not supported yet: they need brackets in URLs)")
    if isinstance(ip, ipaddress.IPv4Address):
        return value if ip.is_unspecified else check_unicast(ip)
    if ip is not None:
        return value
    if (len(value) > 253 or not _HOSTNAME.fullmatch(value)
            or re.fullmatch(r"[0-9.]+", value)):
        shown = value if len(value) <= 60 else value[:60] + "…"
        raise ValueError(f"must be an IPv4 address, '::' or a host name (letters, digits, '-' "
                         f"and '.'), got {shown!r}")
    return value
