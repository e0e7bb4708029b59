"""The service managers pdsvc works through, one interface (base.ServiceManager) that both
commands use: `pdsvc status` reads each unit's state; `pdsvc apply` reads which run of a unit
it sees and restarts units. One class per manager: systemd.Systemd (`systemctl`) and
supervisord.Supervisord (its XML-RPC interface over the bundle's control socket), each with
its reading and its acting; both answer in systemd's words (ServiceState)."""

from __future__ import annotations

import click

from pdsvc.plan.build import Plan
from pdsvc.status.managers.base import Runner, ServiceManager, ServiceState
from pdsvc.status.managers.supervisord import (
    BAD_NAME,
    RPC_TIMEOUT,
    Supervisord,
    state_from_process_info,
)
from pdsvc.status.managers.systemd import (
    SYSTEMCTL_TIMEOUT,
    UNIT_PROPERTIES,
    Commands,
    Systemd,
    parse_show,
    state_from_show,
)

__all__ = [
    "BAD_NAME", "RPC_TIMEOUT", "SYSTEMCTL_TIMEOUT", "UNIT_PROPERTIES", "Commands", "Runner",
    "ServiceManager", "ServiceState", "Supervisord", "Systemd", "make_backend", "parse_show",
    "state_from_process_info", "state_from_show", "supervisord_for_plan",
]


def supervisord_for_plan(plan: Plan, socket_path: str | None = None, *,
                         timeout: float = RPC_TIMEOUT) -> Supervisord:
    """The bundle's supervisord: its socket ({supervisord.run_dir}/{name}-supervisord.sock)
    unless ``socket_path`` is given, and the bundle's program names."""
    # the renderer imports jinja2: only when this manager is used
    from pdsvc.render.supervisord import program_names, supervisord_name

    return Supervisord(socket_path or plan.supervisord.control_socket, program_names(plan),
                       target=plan.target, row=supervisord_name(plan), timeout=timeout)


def make_backend(plan: Plan, backend: str = "auto", *, systemctl: str = "systemctl",
                 socket_path: str | None = None) -> ServiceManager:
    """`--backend`: auto is the manager the config's `format` renders for — or supervisord
    when a control socket is given (only supervisord has one)."""
    if backend == "auto":
        backend = "supervisord" if plan.format == "supervisord" or socket_path else "systemd"
    if backend == "supervisord":
        return supervisord_for_plan(plan, socket_path)
    if socket_path:
        raise click.UsageError("--socket is supervisord's control socket; systemd has none "
                               "(use --backend supervisord, or drop --socket)")
    return Systemd(systemctl=systemctl)
