"""What changed between the running bundle and the new one (pure): per unit, its action
(restart, start, remove, reload) and each reason (the engine's or router's argv, the
runtime's options, the environment, other directives, the runtime's code, a config file the
unit reads), and the pair settings whose change keeps an old and a new engine from pairing.
rollout.py orders the steps from these."""

from __future__ import annotations

from dataclasses import dataclass

from pdsvc.apply.units import Unit, flag_values
from pdsvc.plan.types import FRONT_CONFIG, VIP_CONFIG
from pdsvc.sglang import PAIR_ENV, PAIR_FLAGS

#: The shipped runtime's files in a bundle; a change there restarts every unit that runs it.
RUNTIME_PREFIX = "runtime/"
ROLE_ORDER = {"prefill": 0, "decode": 1, "router": 2, "front": 3, "vip": 4}


@dataclass(frozen=True)
class Reason:
    kind: str  # unit | env | argv | runtime | config (the front's)
    detail: str


@dataclass(frozen=True)
class Change:
    unit: str
    role: str  # prefill | decode | router | front | vip | "" (the target, the gate)
    action: str  # restart | start | remove | reload
    reasons: tuple[Reason, ...]
    pair_breaking: tuple[str, ...] = ()  # the pair settings that change (PAIR_FLAGS/ENV)


def _shorten(value: str, most: int = 48) -> str:
    return value if len(value) <= most else value[:most - 1] + "…"


def _dict_diff(old: dict[str, tuple[str, ...]] | dict[str, str],
               new: dict[str, tuple[str, ...]] | dict[str, str]) -> list[str]:
    """`KEY: old -> new` for each key whose value differs ('unset' where absent)."""
    out = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a != b:
            def say(v: object) -> str:
                if v is None:
                    return "unset"
                return _shorten(" ".join(v) if isinstance(v, tuple) else str(v))
            out.append(f"{key}: {say(a)} -> {say(b)}")
    return out


def classify(old: Unit, new: Unit) -> tuple[Reason, ...]:
    """Why a unit present in both bundles changed: the engine's (or router's) argv, the
    runtime's options, the environment, other directives. () when only comments differ."""
    reasons: list[Reason] = []
    for what, a, b in (("", old.engine_argv, new.engine_argv),
                       ("runtime ", old.runtime_argv, new.runtime_argv)):
        diff = _dict_diff(flag_values(a), flag_values(b))
        reasons += [Reason("argv", what + d) for d in diff]
        if a != b and not diff:
            reasons.append(Reason("argv", f"{what or 'engine '}command line"))
    reasons += [Reason("env", d) for d in _dict_diff(old.env, new.env)]
    if old.values("EnvironmentFile") != new.values("EnvironmentFile"):
        reasons.append(Reason("env", "EnvironmentFile="))
    rest = {"ExecStart", "Environment", "EnvironmentFile"}
    keys = sorted({k for _, k, _ in old.directives + new.directives} - rest)
    changed = [k for k in keys if old.values(k) != new.values(k)]
    if changed:
        reasons.append(Reason("unit", ", ".join(f"{k}=" for k in changed)))
    return tuple(reasons)


def pair_settings(unit: Unit) -> dict[str, str | None]:
    """The settings a decode checks of a prefill when they connect, as the engine gets them."""
    flags = flag_values(unit.engine_argv)
    env = unit.env
    out: dict[str, str | None] = {}
    for flag, default in PAIR_FLAGS.items():
        out[flag] = flags[flag][-1] if flag in flags else default
    for var, default in PAIR_ENV.items():
        out[var] = env.get(var, default)
    return out


def _changes(old_units: dict[str, Unit], new_units: dict[str, Unit],
             runtime_changed: int) -> list[Change]:
    changes: list[Change] = []
    for name in sorted(old_units.keys() | new_units.keys(),
                       key=lambda n: (ROLE_ORDER.get((new_units.get(n) or old_units[n]).role, 3),
                                      n)):
        old, new = old_units.get(name), new_units.get(name)
        if new is None:
            assert old is not None
            changes.append(Change(name, old.role, "remove", (
                Reason("unit", "no longer in the bundle: the installer stops and removes it"),)))
            continue
        if old is None:
            action = "start" if new.kind != "other" else "reload"
            changes.append(Change(name, new.role, action, (Reason("unit", "new unit"),)))
            continue
        reasons = list(classify(old, new))
        if runtime_changed and new.kind != "other":
            reasons.append(Reason("runtime", f"the runtime's code ({runtime_changed} files)"))
        if not reasons:
            continue
        if new.kind == "other":
            changes.append(Change(name, new.role, "reload", tuple(reasons)))
            continue
        if new.kind == "front":  # `systemctl reload`: new workers on the same socket
            changes.append(Change(name, new.role, "restart", tuple(reasons)))
            continue
        breaking: tuple[str, ...] = ()
        if new.kind == "engine":
            a, b = pair_settings(old), pair_settings(new)
            breaking = tuple(f"{k}: {a[k] or 'unset'} -> {b[k] or 'unset'}"
                             for k in a if a[k] != b[k])
        changes.append(Change(name, new.role, "restart", tuple(reasons), breaking))
    return changes


#: the config files of the bundle that a unit reads, and the kind of unit that reads each
CONFIG_FILES = {FRONT_CONFIG: "front", VIP_CONFIG: "vip"}


def _config_files(old: dict[str, str], new: dict[str, str], new_units: dict[str, Unit],
                  changes: list[Change]) -> list[Change]:
    """The front's HAProxy config and keepalived's are files of the bundle (HOST/FILE across
    hosts), not units: a change of one alone is a change of the unit on that host that reads
    it (the front reloads, keepalived restarts), named as such."""
    def settings(text: str) -> list[str]:  # its header (the config's sha256) is no change
        return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]

    changed = {c.unit for c in changes}
    out: list[Change] = []
    for path in sorted(new.keys() & old.keys()):
        host, _, base = path.rpartition("/")
        kind = CONFIG_FILES.get(base)
        if kind is None or settings(old[path]) == settings(new[path]):
            continue
        out += [Change(name, u.role, "restart", (Reason("config", f"{base} changed"),))
                for name, u in new_units.items()
                if u.kind == kind and name.rpartition("/")[0] == host and name not in changed]
    return out


def bundle_changes(old: dict[str, str], new: dict[str, str], old_units: dict[str, Unit],
                   new_units: dict[str, Unit]) -> list[Change]:
    """Every change from the running bundle ``old`` to ``new`` (path in the bundle -> text;
    their units: hosts.bundle_units), in role order: the units', then those of the config
    files a unit reads."""
    runtime = {p for p in old.keys() | new.keys() if p.startswith(RUNTIME_PREFIX)}
    runtime_changed = sum(old.get(p) != new.get(p) for p in runtime)
    changes = _changes(old_units, new_units, runtime_changed)
    return changes + _config_files(old, new, new_units, changes)
