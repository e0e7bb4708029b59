"""How doctor starts one half of the KV-path check *as its engine's unit* starts: the same
interpreter, user, CPUs, memory policy, environment and device policy.

* ``systemd``: a transient unit (systemd-run(1)) given the execution settings of the rendered
  unit itself, then those of the installed drop-ins (``systemctl edit`` is where an operator
  adds a UCX_NET_DEVICES= or a DevicePolicy=), so there is no second copy of them to drift.
* ``direct``: a child of doctor with the plan's environment and the env file, pinned to the
  plan's CPUs by the probe itself, its locked-memory limit raised to the hard one (no memory
  policy, no sandboxing: those need systemd). For
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

from pdsvc.plan.build import EnginePlan, Plan
from pdsvc.render.systemd import render_systemd

#: [Service] settings that are the service's own lifecycle, not how its process sees the host
#: (systemd.service(5), systemd.kill(5)): a transient unit running the probe keeps its own.
#: Everything else — User=, CPUAffinity=, NUMAPolicy=, Environment=, DevicePolicy=,
#: SystemCallFilter=, the sandboxing (systemd.exec(5), systemd.resource-control(5)) — is
#: passed on, so a drop-in that breaks the engine breaks the probe too.
LIFECYCLE_KEYS = frozenset({
    "Type", "ExitType", "RemainAfterExit", "GuessMainPID", "PIDFile", "BusName",
    "ExecCondition", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop",
    "ExecStopPost", "Restart", "RestartSec", "RestartSteps", "RestartMaxDelaySec",
    "RestartPreventExitStatus", "RestartForceExitStatus", "RestartMode", "SuccessExitStatus",
    "TimeoutSec", "TimeoutStartSec", "TimeoutStopSec", "TimeoutAbortSec",
    "TimeoutStartFailureMode", "TimeoutStopFailureMode", "RuntimeMaxSec",
    "RuntimeRandomizedExtraSec", "WatchdogSec", "NotifyAccess", "Sockets",
    "FileDescriptorStoreMax", "FileDescriptorStorePreserve", "USBFunctionDescriptors",
    "USBFunctionStrings", "OOMPolicy", "KillMode", "KillSignal", "RestartKillSignal",
    "FinalKillSignal", "SendSIGKILL", "SendSIGHUP", "WatchdogSignal",
    # --pipe gives the probe doctor's own stdin/stdout/stderr
    "StandardInput", "StandardOutput", "StandardError", "SyslogIdentifier", "SyslogFacility",
    "SyslogLevel", "SyslogLevelPrefix", "LogLevelMax", "LogExtraFields",
    # the credential and directories belong to the unit (and would be made or removed)
    "LoadCredential", "LoadCredentialEncrypted", "SetCredential", "SetCredentialEncrypted",
    "ImportCredential", "StateDirectory", "StateDirectoryMode", "CacheDirectory",
    "CacheDirectoryMode", "RuntimeDirectory", "RuntimeDirectoryMode",
    "RuntimeDirectoryPreserve", "LogsDirectory", "LogsDirectoryMode",
    "ConfigurationDirectory", "ConfigurationDirectoryMode",
})

#: Where systemd looks for drop-ins, the first winning over a later one of the same file name
#: (systemd.unit(5); `systemctl set-property` writes system.control).
DROPIN_ROOTS = ("/etc/systemd/system.control", "/run/systemd/system.control",
                "/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                "/usr/lib/systemd/system")


class UnitSettingError(ValueError):
    """A setting the probe cannot be given as the unit has it (a specifier to expand)."""


@dataclass(frozen=True)
class Launch:
    """One half, ready to start: argv (the probe's source is fed on stdin) and environment."""

    argv: tuple[str, ...]
    env: dict[str, str]
    how: str  # "systemd" | "direct", for the report
    unit: str | None = None  # the transient unit (systemd): stopped with it, not only its client

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
    """The installed drop-ins of ``unit``, applied in file-name order: UNIT.d/*.conf, those of
    its dashed prefixes (``dsv4-.service.d`` applies to every dsv4-… unit) and of its type
    (``service.d``). Of two files of one name, the one in the earlier root wins, and within a
    root the one in the more specific directory (systemd's src/shared/dropin.c)."""
    stem, _, suffix = unit.rpartition(".")
    parts = stem.split("-")
    prefixes = [f"{'-'.join(parts[:i])}-.{suffix}.d" for i in range(len(parts) - 1, 0, -1)]
    names = [f"{unit}.d", *prefixes, f"{suffix}.d"]
    found: dict[str, Path] = {}
    for root in roots:
        for name in names:
            d = Path(root) / name
            if d.is_dir():
                for f in sorted(d.glob("*.conf")):
                    found.setdefault(f.name, f)
    return [found[n] for n in sorted(found)]


def unspecified(value: str, where: str) -> str:
    """A unit-file value as `systemd-run -p` must be given it: there no specifier is expanded,
    so ``%%`` (a literal %) becomes ``%``, and any other specifier is refused."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "%":
            if value[i + 1:i + 2] != "%":
                raise UnitSettingError(f"{where}: the specifier {value[i:i + 2]!r} in {value!r} "
                                       "is expanded by systemd in a unit file only")
            i += 1
        out.append(value[i])
        i += 1
    return "".join(out)


def unit_exec_settings(plan: Plan, e: EnginePlan, dropin_roots: Iterable[str] = DROPIN_ROOTS,
                       ) -> list[tuple[str, str]]:
    """The settings ``e``'s unit runs its process with: its rendered [Service] lines, then the
    installed drop-ins' (later lines of a list setting add to it, as in the unit), less the
    service's own lifecycle; values as `systemd-run -p` takes them."""
    text = next(f.content for f in render_systemd(plan, "pdsvc doctor --kv", monitoring=False)
                if f.path == e.unit)
    sources = [(e.unit, service_settings(text))]
    sources += [(str(f), service_settings(f.read_text(errors="replace")))
                for f in dropins(e.unit, dropin_roots)]
    return [(k, unspecified(v, f"{where}: {k}=")) for where, settings in sources
            for k, v in settings if k not in LIFECYCLE_KEYS]


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
    return Launch(tuple(argv), dict(os.environ), "systemd", unit)


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
    return Launch((plan.python, "-I", "-", *probe_args, *pin, "--memlock"), env, "direct")
