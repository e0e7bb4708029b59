"""A deployment over several hosts: `pdsvc render` writes one bundle per host (HOST/…, with
hosts.list beside them). The rollout is planned over every host's units at once, named
HOST/UNIT, so that capacity counts the pairs across hosts and the order is global: engines
one at a time across all hosts, the router's host last. Each host then runs its own steps
(`pdsvc apply --host HOST`), the hosts one after another in the order `host_order` gives:
no two engines are ever down at once, and the router host comes last.
"""

from __future__ import annotations

from pdsvc.apply.programs import CONF, program_units
from pdsvc.apply.units import Unit

HOSTS_LIST = "hosts.list"


def hosts_of(bundle: dict[str, str]) -> list[str]:
    """The hosts of a multi-host bundle, in hosts.list's order; [] for one host's bundle."""
    out = []
    for line in bundle.get(HOSTS_LIST, "").splitlines():
        if line and not line.startswith("#"):
            out.append(line.split("\t", 1)[0])
    return out


def sub_bundle(bundle: dict[str, str], host: str) -> dict[str, str]:
    """One host's bundle out of a multi-host one (its paths without HOST/)."""
    prefix = f"{host}/"
    return {p[len(prefix):]: t for p, t in bundle.items() if p.startswith(prefix)}


def _one_host(bundle: dict[str, str]) -> dict[str, Unit]:
    if CONF in bundle:
        return program_units(bundle[CONF])
    return {path: Unit.parse(path, text) for path, text in bundle.items()
            if "/" not in path and path.endswith((".service", ".target"))}


def _on_host(u: Unit, host: str) -> Unit:
    """The unit named HOST/UNIT, its PartOf= too (systemd couples units of one host only)."""
    directives = tuple((s, k, " ".join(f"{host}/{v}" for v in value.split()) if k == "PartOf"
                        else value) for s, k, value in u.directives)
    return Unit(f"{host}/{u.name}", directives, u.text)


def bundle_units(bundle: dict[str, str]) -> dict[str, Unit]:
    """Every unit (or supervisord program) of a bundle; HOST/UNIT for several hosts."""
    hosts = hosts_of(bundle)
    if not hosts:
        return _one_host(bundle)
    out: dict[str, Unit] = {}
    for host in hosts:
        for u in _one_host(sub_bundle(bundle, host)).values():
            out[f"{host}/{u.name}"] = _on_host(u, host)
    return out
