"""The bundle `pdsvc render` writes for a plan, as Files, whoever asks for it (`pdsvc render`,
`pdsvc apply` comparing with the running one, `pdsvc tune` for each candidate): the systemd
units or the supervisord config, and with `hosts:` one bundle per host (HOST/…) plus the
index that lists them (bundle.HOSTS_INDEX)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pdsvc.plan.build import Plan
from pdsvc.render.bundle import hosts_index
from pdsvc.render.kit import File
from pdsvc.render.systemd import render_systemd


def per_host(plan: Plan, command: str, render_one: Callable[[Plan], list[File]]) -> list[File]:
    """One bundle, or with `hosts:` one per host (HOST/…, each its own) plus hosts.list."""
    if not plan.hosts:
        return render_one(plan)
    files = [hosts_index(plan, command)]
    for h in plan.hosts:
        files += [replace(f, path=f"{h.name}/{f.path}") for f in render_one(plan.for_host(h.name))]
    return files


def render_for(plan: Plan, command: str) -> list[File]:
    """The bundle `pdsvc render` writes for this plan (one per host with `hosts:`)."""
    if plan.format == "supervisord":
        from pdsvc.render.supervisord import render_supervisord
        return per_host(plan, command, lambda p: render_supervisord(p, command))
    return per_host(plan, command, lambda p: render_systemd(p, command))
