"""How doctor starts one half of the KV-path check *as its engine's unit* starts: the same
interpreter, user, CPUs, memory policy, environment and device policy.

* ``systemd``: a transient unit (systemd-run(1)) given the execution settings of the rendered
  unit itself, then those of the installed drop-ins (``systemctl edit`` is where an operator
  adds a UCX_NET_DEVICES= or a DevicePolicy=), so there is no second copy of them to drift.
* ``direct``: a child of doctor with the plan's environment and the env file, pinned to the
  plan's CPUs by the probe itself (no memory policy: that needs systemd or numactl). For
  hosts without systemd as PID 1 (the supervisord bundle, a container) and for non-root runs.

Either way the probe's source goes in on stdin (``python -I -``): the service user need not be
able to read pdsvc's own install, and ProtectHome= may hide it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..plan import EnginePlan, Plan
from ..render import render_systemd

#: The [Service] settings that decide how a process sees the host (systemd.exec(5),
#: systemd.resource-control(5)): who it runs as, where, with what environment and devices.
#: Restart=, timeouts, ExecStart=, credentials and the state directories are the unit's own.
EXEC_KEYS = frozenset({
    "User", "Group", "SupplementaryGroups", "Environment", "EnvironmentFile",
    "UnsetEnvironment", "CPUAffinity", "NUMAPolicy", "NUMAMask", "AllowedCPUs",
    "AllowedMemoryNodes", "LimitMEMLOCK", "LimitNOFILE", "DevicePolicy", "DeviceAllow",
    "PrivateDevices", "PrivateNetwork", "PrivateTmp", "ProtectSystem", "ProtectHome",
    "NoNewPrivileges", "RestrictAddressFamilies", "CapabilityBoundingSet", "UMask",
    "SystemCallArchitectures", "RestrictNamespaces", "LockPersonality",
})

#: systemd's search path for drop-ins an operator writes (systemd.unit(5)), in the order
#: they apply.
DROPIN_ROOTS = ("/etc/systemd/system", "/run/systemd/system")


@dataclass(frozen=True)
class Launch:
    """One half, ready to start: argv (the probe's source is fed on stdin) and environment."""

    argv: tuple[str, ...]
    env: dict[str, str]
    how: str  # "systemd" | "direct", for the report

    def describe(self) -> str:
        return shlex.join(self.argv)


def unit_lines(text: str) -> Iterator[tuple[str, str, str]]:
    """(section, key, value) of each setting of a unit file, in order, with backslash
    continuations joined and comments skipped (systemd.syntax(7))."""
    section, pending = "", ""
    for raw in text.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        elif "=" in stripped:
            key, _, value = stripped.partition("=")
            yield section, key.strip(), value.strip()


def service_settings(text: str) -> list[tuple[str, str]]:
    """The (key, value) lines of a unit file's [Service] section, in order."""
    return [(k, v) for section, k, v in unit_lines(text) if section == "Service"]


def dropins(unit: str, roots: Iterable[str] = DROPIN_ROOTS) -> list[Path]:
    """The installed drop-ins of ``unit``: UNIT.d/*.conf and those of its dashed prefixes
    (``dsv4-.service.d`` applies to every dsv4-… unit), sorted by file name as systemd does."""
    stem, _, suffix = unit.rpartition(".")
    parts = stem.split("-")
    names = [f"{'-'.join(parts[:i])}-.{suffix}.d" for i in range(1, len(parts))] + [f"{unit}.d"]
    found: dict[str, Path] = {}
    for root in roots:
        for name in names:
            d = Path(root) / name
            if d.is_dir():
                for f in sorted(d.glob("*.conf")):
                    found.setdefault(f.name, f)
    return [found[n] for n in sorted(found)]


def unit_exec_settings(plan: Plan, e: EnginePlan, dropin_roots: Iterable[str] = DROPIN_ROOTS,
                       ) -> list[tuple[str, str]]:
    """The execution settings ``e``'s unit runs with: its rendered [Service] lines, then the
    installed drop-ins' (later lines of a list setting add to it, as in the unit)."""
    text = next(f.content for f in render_systemd(plan, "pdsvc doctor --kv") if f.path == e.unit)
    settings = service_settings(text)
    for f in dropins(e.unit, dropin_roots):
        settings += service_settings(f.read_text(errors="replace"))
    return [(k, v) for k, v in settings if k in EXEC_KEYS]


def systemd_launch(plan: Plan, e: EnginePlan, probe_args: Sequence[str], unit: str,
                   bound_secs: int, extra_env: dict[str, str],
                   dropin_roots: Iterable[str] = DROPIN_ROOTS) -> Launch:
    """systemd-run --wait --pipe: a transient service with the unit's settings; stdin, stdout
    and stderr are doctor's pipes. RuntimeMaxSec= bounds it should doctor be killed."""
    props = [f"{k}={v}" for k, v in unit_exec_settings(plan, e, dropin_roots)]
    props += [f"Environment={k}={v}" for k, v in extra_env.items()]
    props += [f"RuntimeMaxSec={bound_secs}"]
    argv = ["systemd-run", "--quiet", "--collect", "--wait", "--pipe", f"--unit={unit}",
            *(w for p in props for w in ("-p", p)),
            "--", plan.python, "-I", "-", *probe_args]
    return Launch(tuple(argv), dict(os.environ), "systemd")


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile= (systemd.exec(5)): comments and blanks skipped,
    one level of matching quotes removed. Missing or unreadable: nothing (the unit's `-`)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def direct_launch(plan: Plan, e: EnginePlan, probe_args: Sequence[str],
                  extra_env: dict[str, str]) -> Launch:
    """A child of doctor: the plan's environment for ``e`` and its env file over a bare one,
    pinned by the probe to the plan's CPUs."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    env.update(dict(e.env))
    env.update(read_env_file(Path(plan.paths.env_dir) / f"{e.name}.env"))
    env.update(extra_env)
    pin = ["--cpus", e.pinning.cpulist] if e.pinning.mode != "off" and e.pinning.cpus else []
    return Launch((plan.python, "-I", "-", *probe_args, *pin), env, "direct")
