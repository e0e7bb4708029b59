"""Config -> the routers' part of the plan: the router, or several behind HAProxy's front
(router.replicas on one host; one per router host behind keepalived's moving address,
router.vip), each one's command line. build.py composes it with the engines'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from pdsvc import routers
from pdsvc.plan.flags import env_str, flag_args
from pdsvc.plan.types import (
    FRONT_CONFIG,
    VIP_CONFIG,
    EnginePlan,
    FrontPlan,
    Paths,
    RouterPlan,
    VipPlan,
)

if TYPE_CHECKING:  # the plan only reads the validated config; importing it costs pydantic
    from pdsvc.config.schema import Config


def routers_of(config: Config, engines: tuple[EnginePlan, ...], *,
               machines: tuple[str, ...], address: Callable[[str], str]
               ) -> tuple[RouterPlan, ...]:
    """The router, or several behind the front: with router.replicas ≥ 2 NAME-router-I on
    127.0.0.1:replica_port+I, its metrics on prometheus_port+I; with routers on several hosts
    (router.vip) NAME-router-I on the I-th router host's address:replica_port."""
    rc, name = config.router, f"{config.name}-router"
    machine = machines[0]
    if len(machines) > 1:
        return tuple(_router(config, engines, name=f"{name}-{i}", machine=m,
                             host=address(m), port=rc.replica_port,
                             prometheus_port=rc.prometheus_port) for i, m in enumerate(machines))
    if rc.replicas == 1:
        return (_router(config, engines, name=name, machine=machine, host=rc.host,
                        port=rc.port, prometheus_port=rc.prometheus_port),)
    return tuple(_router(config, engines, name=f"{name}-{i}", machine=machine,
                         host="127.0.0.1", port=rc.replica_port + i,
                         prometheus_port=rc.prometheus_port + i) for i in range(rc.replicas))


def front_of(config: Config, paths: Paths,
           routers: tuple[RouterPlan, ...]) -> FrontPlan | None:
    """HAProxy on router.host:router.port in front of several routers; None for one."""
    if len(routers) < 2:
        return None
    rc, fc, front = config.router, config.router.front, f"{config.name}-front"
    return FrontPlan(
        name=front, haproxy=fc.haproxy, host=rc.host, port=rc.port,
        url=_local_base(rc.host, rc.port), config_path=f"{paths.env_dir}/{FRONT_CONFIG}",
        # in its RuntimeDirectory= (NAME-front, the unit's name)
        socket=f"/run/{front}/admin.sock", backend="routers",
        servers=tuple((r.name, f"{r.host}:{r.port}") for r in routers),
        check_interval_ms=fc.check_interval_ms, retries=fc.retries, buffer_kib=fc.buffer_kib,
        timeout_secs=fc.timeout_secs, drain_secs=fc.drain_secs,
        prometheus_host=rc.prometheus_host, prometheus_port=fc.prometheus_port)


def vip_of(config: Config, paths: Paths, address: Callable[[str], str],
           routers: tuple[RouterPlan, ...]) -> VipPlan | None:
    """keepalived on each router host when routers run on several (router.vip.address)."""
    vc = config.router.vip
    if vc.address is None or len(routers) < 2:
        return None
    assert vc.interface is not None  # config checks: needed with the address
    return VipPlan(
        name=f"{config.name}-vip", keepalived=vc.keepalived, address=vc.address,
        interface=vc.interface, vrrp_id=vc.vrrp_id, advert_ms=vc.advert_ms,
        config_path=f"{paths.env_dir}/{VIP_CONFIG}",
        members=tuple((r.machine, address(r.machine)) for r in routers))


def _local_base(host: str, port: int) -> str:
    """http://ADDRESS:PORT of a listener as this host reaches it (loopback for a wildcard)."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


def _router_options(config: Config, host: str, port: int, prometheus_port: int) -> list[str]:
    """Every launch_router flag after the workers: where it listens, its policy, health
    checks, retries and the package's own, then router.args."""
    rc = config.router
    hc = rc.health_check
    options = [
        "--host", host,
        "--port", str(port),
        "--policy", rc.policy,
        "--prometheus-host", rc.prometheus_host,
        "--prometheus-port", str(prometheus_port),
        "--health-check-interval-secs", str(hc.interval_secs),
        "--health-check-timeout-secs", str(hc.timeout_secs),
        "--health-failure-threshold", str(hc.failure_threshold),
        "--health-success-threshold", str(hc.success_threshold),
        # engines register themselves once healthy (POST /workers), so this only bounds the
        # router's own add-worker workflow; a worker listed at start (the k8s manifests) that is
        # not up within it is dropped for good by router 0.3.2
        "--worker-startup-timeout-secs", str(config.lifecycle.start_timeout_secs),
    ]
    options += routers.resilience_options(
        rc.retry.attempts, rc.retry.initial_backoff_ms, rc.retry.max_backoff_ms,
        rc.circuit_breaker)
    pkg = routers.package(rc.package)
    options += [*pkg.options, *flag_args(rc.args)]
    return options


def _router(
    config: Config, engines: tuple[EnginePlan, ...], *, name: str, machine: str, host: str,
    port: int, prometheus_port: int,
) -> RouterPlan:
    rc, rt = config.router, config.runtime
    python = rc.python or rt.python
    engines = tuple(e for e in engines if e.node_rank == 0)  # the ones serving HTTP
    pkg = routers.package(rc.package)
    options = _router_options(config, host, port, prometheus_port)
    # an explicit runtime.router_module (a wrapper, say) wins over the package's module
    module = rt.router_module if "router_module" in rt.model_fields_set else pkg.module
    base = _local_base(host, port)
    env = {"PYTHONUNBUFFERED": "1", **{k: env_str(v) for k, v in rc.env.items()}}
    router = RouterPlan(
        name=name,
        python=python,
        host=host,
        port=port,
        prometheus_host=rc.prometheus_host,
        prometheus_port=prometheus_port,
        env=tuple(env.items()),
        argv=(),
        url=base,
        readiness_url=f"{base}/readiness",
        generate_url=f"{base}/generate",
        liveness_url=f"{base}/liveness",
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

