"""Every check, in report order: a table of plain functions, each bound to the facts it reads
and run by one guarded loop (Homebrew's diagnostic.rb has its ``check_*`` methods; here a
check returns rows, and a crash in one is a row too)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from pdsvc.plan.build import Plan

from .facts import Facts
from .front import check_front
from .gpu_checks import (
    check_driver,
    check_gpu_memory,
    check_gpus,
    check_gpus_idle,
    check_idle_guard,
)
from .host import Host
from .limits import check_jit_cache, check_memlock, check_shm
from .network import check_network
from .placement import check_numa, check_topology
from .ports import check_ports
from .routerkey import check_router_key
from .rows import Row, guarded
from .systemd import check_systemd
from .venv import check_flags, check_python
from .vip import check_vip


def _always(f: Facts) -> bool:
    return True


def _planned(f: Facts) -> bool:
    return f.plan is not None


def _engines(f: Facts) -> bool:
    """The plan runs engines here (not only the router), so there are GPUs to check."""
    return f.plan is not None and bool(f.plan.engines)


def _gpu_host(f: Facts) -> bool:
    """Engines run here, or no plan could be made (the driver says why there are no GPUs)."""
    return f.plan is None or bool(f.plan.engines)


def _fronted(f: Facts) -> bool:
    """Several routers behind HAProxy run here."""
    return f.plan is not None and f.plan.front is not None


def _vip_host(f: Facts) -> bool:
    """A router host of routers on several hosts (router.vip): keepalived runs here."""
    return f.plan is not None and f.plan.vip is not None and f.plan.router is not None


def _key_reader(f: Facts) -> bool:
    """One host of several whose units read the router's control-plane key."""
    return f.plan is not None and bool(f.plan.hosts) and f.plan.key_use != "none"


@dataclass(frozen=True)
class Check:
    name: str  # the row name a crash of the check is reported under
    run: Callable[[Facts], list[Row]]
    when: Callable[[Facts], bool] = _always


CHECKS: tuple[Check, ...] = (
    Check("driver", lambda f: check_driver(f.host.proc_root, f.driver_version, f.gpus),
          _gpu_host),
    Check("gpus", lambda f: check_gpus(f.planned, f.driver_version, f.gpus), _planned),
    Check("gpus idle", lambda f: check_gpus_idle(f.planned, f.gpus), _engines),
    Check("gpu memory", lambda f: check_gpu_memory(f.planned, f.gpus), _engines),
    Check("gpus idle", lambda f: check_idle_guard(f.gpus), _engines),
    Check("topology", lambda f: check_topology(f.planned, f.topology, f.host.sysfs_root),
          _engines),
    Check("numa", lambda f: check_numa(f.planned, f.topology), _engines),
    Check("network", lambda f: check_network(f.planned, f.host.sysfs_root), _planned),
    Check("ports", lambda f: check_ports(f.planned, f.host.proc_root), _planned),
    Check("router key", lambda f: check_router_key(f.planned), _key_reader),
    Check("front", lambda f: check_front(f.planned), _fronted),
    Check("address", lambda f: check_vip(f.planned), _vip_host),
    Check("python", lambda f: check_python(f.planned, f.installed), _planned),
    Check("flags", lambda f: check_flags(f.planned, f.installed), _planned),
    Check("jit cache", lambda f: check_jit_cache(f.planned), _engines),
    Check("memlock", lambda f: check_memlock(f.host)),
    Check("/dev/shm", lambda f: check_shm(f.host)),
    Check("systemd", lambda f: check_systemd(f.plan, f.host)),
)


def run_checks(plan: Plan | None, host: Host) -> list[Row]:
    """Every check that applies to the plan (None: none could be made) on this host."""
    facts = Facts(host, plan)
    rows: list[Row] = []
    for check in CHECKS:
        if check.when(facts):
            rows += guarded(check.name, functools.partial(check.run, facts))
    return rows
