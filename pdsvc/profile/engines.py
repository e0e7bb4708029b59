"""Which engines a `pdsvc profile` run captures, from the plan: the role's engines on this host
(or the one named), each asked directly at its own URL with its own key; the ones on other
hosts are named with the command to run there."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan
from pdsvc.plan.types import EnginePlan


@dataclass(frozen=True)
class Engine:
    """One engine as pdsvc profile asks it."""

    name: str  # its unit (program) name
    role: str
    url: str  # http://HOST:PORT, rank 0: the process that serves HTTP
    tp: int  # one trace per TP rank
    key: str | None  # the admin key, else the API key of its argv (the profiler's auth)
    metrics: bool  # --enable-metrics: /metrics tells the batch and the tok/s
    machine: str  # its inventory host ("": one host)

    @property
    def unit(self) -> str:
        return f"{self.name}.service"


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def engine_of(e: EnginePlan) -> Engine:
    """SGLang's profiler routes are ADMIN_OPTIONAL (srt/utils/auth.py decide_request_auth):
    the admin key when the engine has one, else its API key, else none."""
    key = _flag(e.extra_args, "--admin-api-key") or _flag(e.extra_args, "--api-key")
    return Engine(e.name, e.role, e.url, e.tp, key, e.metrics, e.machine)


def select(whole: Plan, here: Plan, role: str, name: str | None
           ) -> tuple[list[Engine], list[str]]:
    """(the engines of ``role`` this host runs that the run captures, one line per other host
    with engines of the role: what to run there). ConfigError for a name that is not an
    engine of the role, or a role with no engine at all."""
    serving = [e for e in whole.engines if e.node_rank == 0 and e.role == role]
    if name is not None:
        serving = [e for e in serving if e.name == name]
        if not serving:
            names = ", ".join(e.name for e in whole.engines if e.node_rank == 0) or "none"
            raise ConfigError(f"--engine {name}: not a {role} engine of {whole.config_source}",
                              hint=f"its engines: {names}")
    if not serving:
        raise ConfigError(f"--role {role}: {whole.config_source} has no {role} engine")
    mine = {e.name for e in here.engines}
    local = [engine_of(e) for e in serving if e.name in mine]
    elsewhere: dict[str, list[str]] = {}
    for e in serving:
        if e.name not in mine:
            elsewhere.setdefault(e.machine, []).append(e.name)
    lines = []
    for machine, theirs in elsewhere.items():
        host = next((h for h in whole.hosts if h.name == machine), None)
        where = f"{machine} ({host.address})" if host else machine
        argv = ["sudo", "pdsvc", "profile", "--role", role, "--host", machine]
        if name is not None:
            argv += ["--engine", name]
        lines.append(f"{', '.join(theirs)} run on host {where}: there, run "
                     f"`{shlex.join(argv)}`")
    return local, lines


def trace_root(plan: Plan, run: str) -> Path:
    """Where a run's traces go: the units' StateDirectory= (the service user's HOME, which
    the engines may write under ProtectSystem=strict and root reads), not the engine's /tmp,
    which PrivateTmp= hides from every other process."""
    return Path(plan.paths.state_dir) / "profiles" / run
