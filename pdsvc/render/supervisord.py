"""Plan -> the supervisord bundle (pure): one supervisord.conf that runs prefill, decode and the
router of the SAME plan on hosts and containers without systemd, plus the runtime beside it.

What systemd gives the units and supervisord lacks is done by the runtime (every program's
command here too), behind options the units do not pass: readiness ordering (``--wait-for``),
the watchdog (``--watchdog-secs``: plan.watchdog_secs, the units' WatchdogSec=), the cgroup
(``--kill-tree``, ``--stop-timeout``) and PartOf= (its ``eventlistener`` mode). CPU and NUMA
pinning, which supervisord has none of, is numactl in front of the command.

Escaping is for supervisord's config reader, three parsers deep (supervisor 4.x, options.py):

1. Python's configparser with ``inline_comment_prefixes=(';', '#')``: a ``;`` or ``#`` after
   whitespace starts a comment anywhere on a line, even inside quotes; a value cannot hold a
   newline (an indented next line continues it, joined with one newline);
2. ``%`` expansion of every value (``%(here)s``, ``%(ENV_X)s``): a literal ``%`` is ``%%``;
3. ``command=`` is split by ``shlex.split`` (POSIX: quotes, and adjacent quoted parts join into
   one word), ``environment=`` by a non-POSIX ``shlex`` that knows no escapes and then strips
   every leading and trailing quote character off each value (datatypes.py).

A value that cannot survive all three is refused with a ConfigError naming it, never mangled.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pdsvc.encode import printable
from pdsvc.errors import ConfigError, OutputError
from pdsvc.plan.build import EnginePlan, Plan
from pdsvc.plan.runtime_argv import (
    engine_runtime_flags,
    liveness_flags,
    member_flags,
    peer_watch_flags,
    policy_flags,
    router_command,
    router_runtime_flags,
)
from pdsvc.render.kit import (
    POLL_INTERVAL,
    RUNTIME_DIR,
    File,
    header_lines,
    jinja_environment,
    key_fetch_command,
    runtime_files,
    systemd_only_front,
)
from pdsvc.render.monitoring import MONITORING_CUSTOMISE, monitoring_files
from pdsvc.ship.runtime.listener import LEAVE_EVENTS
from pdsvc.topology import format_cpulist

CONF = "supervisord.conf"
#: A program that exits sooner than this after its spawn counts as a failed start (supervisord
#: retries startretries times, then gives up: FATAL), and is STARTING until then. Readiness,
#: the busy-GPU wait and the failed-start count are the runtime's, so this only covers the
#: runtime's own immediate deaths (a missing interpreter, a usage error): short, so that a
#: stack that serves within seconds shows RUNNING too.
STARTSECS = 2
#: The runtime SIGKILLs a stopping engine's whole tree at lifecycle.stop_timeout_secs (the
#: units' TimeoutStopSec=); supervisord's own SIGKILL, which reaches only the process group,
#: comes this much later, as a backstop for a wedged runtime.
STOP_MARGIN_SECS = 15
#: The runtime's start-phase probe period, as in the systemd units.
#: sun_path holds 108 bytes, the last one a NUL.
MAX_SOCKET_PATH = 107
#: supervisord's own defaults for rotated log files, written out so they are visible.
LOG_MAXBYTES, LOG_BACKUPS = "50MB", "10"

_COMMENT_AFTER_SPACE = re.compile(r"\s[;#]")
#: With an [include] section, supervisord replaces this text in every value before expanding
#: `%` (options.py expand_here), even where it was written as `%%(here)s`.
_HERE = "%(here)s"


# --------------------------------------------------------------------------- escaping


def _refuse(subject: str, why: str, hint: str) -> ConfigError:
    return ConfigError(f"{subject} cannot be written into supervisord.conf: {why}", hint=hint)


def _refuse_here(subject: str, text: str, hint: str) -> None:
    if _HERE in text:
        raise _refuse(subject, f"supervisord replaces the text {_HERE} everywhere in a config "
                      "with an [include] section, even escaped", hint)


def sv_value(value: str, what: str, hint: str = "change it") -> str:
    """A plain option value (a path, a user name): ``%`` -> ``%%``; a newline, or a ``;``/``#``
    after whitespace (an inline comment to configparser), cannot be written: ConfigError."""
    subject = what if what.endswith("=") else f"{what} "
    if "\n" in value or "\r" in value:
        raise _refuse(f"{subject}{value!r}", "it holds a line break", hint)
    if _COMMENT_AFTER_SPACE.search(value):
        raise _refuse(f"{subject}{value!r}", "a ';' or '#' after a space starts a comment there",
                      hint)
    _refuse_here(f"{subject}{value!r}", value, hint)
    return value.replace("%", "%%")


def sv_word(word: str, what: str = "command word") -> str:
    """One ``command=`` word: POSIX-quoted for shlex.split, ``%`` -> ``%%``, and cut into
    adjacent quoted parts wherever a ``;``/``#`` follows whitespace, so that configparser never
    sees a comment (``'a '';b'`` is the one word ``a ;b``). Only a line break is refused."""
    if "\n" in word or "\r" in word:
        raise _refuse(f"{what} {word!r}", "it holds a line break",
                      "remove the line break (supervisord's command= is one logical line)")
    _refuse_here(f"{what} {word!r}", word, "change it")
    cuts = [m.start() + 1 for m in _COMMENT_AFTER_SPACE.finditer(word)]
    parts = [word[a:b] for a, b in zip([0, *cuts], [*cuts, len(word)], strict=True)]
    return "".join(shlex.quote(part) for part in parts).replace("%", "%%")


def sv_command(argv: Iterable[str], what: str = "command word") -> str:
    return " ".join(sv_word(word, what) for word in argv)


def sv_env(key: str, value: str, program: str) -> str:
    """``KEY="value"`` for ``environment=`` (supervisord's non-POSIX shlex: quotes, no escapes;
    each value is stripped of leading/trailing quote characters afterwards). Refused when no
    quoting survives: both quote kinds inside, a quote at either end, a line break, or a
    ``;``/``#`` after whitespace."""
    what = f"{program}: environment variable {key}="
    hint = ("change it in runtime.env / prefill.env / decode.env / router.env (or set it in "
            "a conf.d/*.conf override with supervisord's own syntax)")
    if value[:1] in ("'", '"') or value[-1:] in ("'", '"'):
        raise _refuse(f"{what}{value!r}", "supervisord strips quotes at either end of a value",
                      hint)
    if '"' in value and "'" in value:
        raise _refuse(f"{what}{value!r}", "it holds both quote characters and supervisord has "
                      "no escapes", hint)
    quote = "'" if '"' in value else '"'
    return f"{key}={quote}{sv_value(value, what, hint)}{quote}"


# --------------------------------------------------------------------------- the bundle


def _numactl(plan: Plan, e: EnginePlan, numactl: str | None) -> list[str]:
    """numactl in front of the engine's command: the plan's CPUs (the units' CPUAffinity=) and
    memory policy (NUMAPolicy= + NUMAMask=). Nothing when the plan does not pin."""
    pin = e.pinning
    if pin.mode == "off" or not pin.cpus:
        return []
    if numactl is None:
        node = f" and NUMA node {pin.numa_node}" if pin.numa_node is not None else ""
        raise ConfigError(
            f"{plan.config_source}: supervisord.numactl is null but {e.role} is to be pinned to "
            f"CPUs {pin.cpulist}{node} (runtime.pinning: {pin.mode}), and supervisord cannot pin "
            "by itself",
            hint="install numactl and set supervisord.numactl to its path (e.g. "
            "/usr/bin/numactl), or set runtime.pinning: off",
        )
    words = [numactl, f"--physcpubind={pin.cpulist}"]
    if pin.numa_node is not None:
        policy = "--membind" if pin.policy == "bind" else "--preferred"
        words.append(f"{policy}={pin.numa_node}")
    return words


def _runtime_command(plan: Plan) -> list[str]:
    """The interpreter and the runtime beside this config (``%(here)s``: the bundle is used in
    place, so a container needs no install step)."""
    return [sv_word(plan.python, "runtime.python"), f"'%(here)s/{RUNTIME_DIR}'"]


def _common_flags(plan: Plan, prefix_output: bool) -> list[str]:
    # with logs: stdout every program shares supervisord's stdout: tell their lines apart
    return ["--prefix-output"] * prefix_output + [
        *liveness_flags(plan),
        # one source: the systemd units' WatchdogSec= is this same plan.watchdog_secs
        "--watchdog-secs", str(plan.watchdog_secs),
        "--kill-tree",
        # a give-up (78) must come after startsecs to count as one: supervisord honours
        # exitcodes= only for a RUNNING process
        "--min-uptime", str(STARTSECS + 0.5),
        "--stop-timeout", str(plan.lifecycle.stop_timeout_secs),
        "--poll-interval", POLL_INTERVAL,
    ]


def _engine_program(plan: Plan, e: EnginePlan, prefix: bool) -> dict[str, Any]:
    pinning = _numactl(plan, e, plan.supervisord.numactl)
    # NIXL: a prefill on another host is watched (the restart listener is per host)
    flags = [*engine_runtime_flags(plan, e), *_common_flags(plan, prefix),
             *policy_flags(plan, plan.supervisord.state_dir),
             *member_flags(plan, e, "supervisord"),
             *peer_watch_flags(plan, e)]
    return {
        "name": e.name,
        "role": e.role,
        "pinning": e.pinning,
        "pinned": bool(pinning),
        "command": [
            " ".join([*(sv_word(w, "supervisord.numactl") for w in pinning),
                      *_runtime_command(plan),
                      "engine"]),
            sv_command(flags, f"{e.name} option"),
            "-- " + sv_command(e.argv, f"{e.name} command word"),
        ],
        "environment": [sv_env(k, v, e.name) for k, v in e.env],
    }


def _router_program(plan: Plan, prefix: bool) -> dict[str, Any]:
    r = plan.router
    assert r is not None
    flags = [*router_runtime_flags(plan, r), *_common_flags(plan, prefix),
             *policy_flags(plan, plan.supervisord.state_dir)]
    # the engines register themselves once healthy: the router starts at once, with no workers
    launch = router_command(plan, r, "supervisord")
    return {
        "name": r.name,
        "command": [
            " ".join([*_runtime_command(plan), "router"]),
            sv_command(flags, f"{r.name} option"),
            "-- " + " ".join([sv_word(r.python, "router.python"), f"'%(here)s/{RUNTIME_DIR}'",
                              sv_command(launch[2:], f"{r.name} command word")]),
        ],
        "environment": [sv_env(k, v, r.name) for k, v in r.env],
    }


def render_supervisord(plan: Plan, command: str) -> list[File]:
    """The supervisord bundle: ``supervisord.conf`` (prefill, decode, router, the restart
    listener, and the sections supervisorctl needs) and the runtime beside it.

    How it runs is the plan's ``supervisord`` section (config.supervisord). Raises ConfigError
    when the plan cannot be run this way: pinning without numactl, a value supervisord cannot
    represent, a control socket path too long for a unix socket.
    """
    systemd_only_front(plan, "supervisord")
    _check_socket(plan)
    conf = jinja_environment().get_template("supervisord/supervisord.conf.j2").render(
        **_conf_context(plan, command))
    where = f"run in place by {CONF} beside it (%(here)s/{RUNTIME_DIR})"
    return [File(CONF, conf), *runtime_files(plan, where),
            *monitoring_files(plan, header_lines(plan, command, MONITORING_CUSTOMISE))]


def _check_socket(plan: Plan) -> None:
    """ConfigError when the control socket's path is too long for a unix socket."""
    socket = plan.supervisord.control_socket
    if len(socket.encode()) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"{plan.config_source}: supervisord.run_dir: the control socket {socket} is longer "
            f"than a unix socket path may be ({MAX_SOCKET_PATH} bytes)",
            hint="choose a shorter supervisord.run_dir",
        )


def _listener(plan: Plan) -> dict[str, Any] | None:
    """The event listener: it restarts a coupled decode with its prefill (PartOf=), and takes
    an engine whose runtime died out of every router (ExecStopPost=); None when it has
    neither to do."""
    program_of = {e.unit: e.name for e in plan.engines}
    couples = [(e.name, program_of[u]) for e in plan.engines for u in e.restarts_with
               if u in program_of]
    leaves = [(e.name, e.url) for e in plan.engines if e.router_urls]
    if not couples and not leaves:
        return None
    name = f"{plan.name}-events"
    flags = ["eventlistener", "--name", name]
    for dependent, trigger in couples:
        # a program alone in its group is named by itself (runtime/listener.py namespec)
        flags += ["--restart-with", f"{dependent}={trigger}"]
    for program, url in leaves:
        flags += ["--leave", f"{program}={url}"]
    routers = dict.fromkeys(u for e in plan.engines for u in e.router_urls)
    for url in routers:
        flags += ["--router", url]
    if leaves:  # the file itself: the listener runs as supervisord's user (root or the service's)
        flags += ["--control-plane-key", plan.paths.router_key]
    events = ["PROCESS_STATE_STARTING"] * bool(couples) + list(LEAVE_EVENTS) * bool(leaves)
    return {
        "name": name,
        "couples": couples,
        "leaves": leaves,
        "events": ",".join(events),
        "command": [" ".join([*_runtime_command(plan), sv_command(flags)])],
    }


def _prepare_command(plan: Plan) -> str:
    """The command that makes the directories the programs write, owned by the service user."""
    s = plan.supervisord
    prepare = [plan.paths.jit_cache, plan.paths.state_dir, s.state_dir] + (
        [s.log_dir] if s.logs == "files" else [])
    return shlex.join(["install", "-d", "-m", "0750", "-o", plan.user, "-g", plan.group,
                       *prepare])


def _conf_context(plan: Plan, command: str) -> dict[str, Any]:
    """What supervisord.conf.j2 renders: the programs, the listener and every setting, each
    value checked to be one supervisord can hold."""
    s = plan.supervisord
    prefix = s.logs == "stdout"
    engines = [_engine_program(plan, e, prefix) for e in plan.engines]
    router = _router_program(plan, prefix) if plan.router else None
    listener = _listener(plan)
    log_dir = sv_value(s.log_dir, "supervisord.log_dir")
    strict = [e for e in plan.engines if e.pinning.mode == "strict" and e.pinning.cpus]
    lc = plan.lifecycle
    return {
        "plan": plan,
        "header": header_lines(
            plan, command,
            customise="Customise without editing: put overrides in conf.d/*.conf beside this "
            f"file (read last; e.g. [program:{plan.name}-decode] with the options to change).",
        ),
        "socket": sv_value(s.control_socket, "supervisord.run_dir"),
        "pidfile": sv_value(f"{s.run_dir.rstrip('/')}/{plan.name}-supervisord.pid",
                            "supervisord.run_dir"),
        "files_logs": s.logs == "files",
        "log_dir": log_dir,
        "user": sv_value(plan.user, "runtime.user") if s.drop_privileges else None,
        "engines": engines,
        "router": router,
        # the program the header's supervisorctl lines name: a decode where there is one
        "example": next((e["name"] for e in reversed(engines)), router and router["name"]),
        "listener": listener,
        "strict": strict,
        "startsecs": STARTSECS,
        # quick deaths of the runtime itself (it waits for health, busy GPUs, the JIT lock);
        # the engine's failed starts are the runtime's to count (it exits 78 to give up)
        "startretries": max(0, lc.start_attempts - 1),
        "stopwaitsecs": lc.stop_timeout_secs + STOP_MARGIN_SECS,
        "stop_margin": STOP_MARGIN_SECS,
        "log_maxbytes": LOG_MAXBYTES,
        "log_backups": LOG_BACKUPS,
        "prepare": _prepare_command(plan),
        "keygen": keygen_command(plan),
        "keycopy": key_copy_command(plan) if plan.key_use == "copy" else "",
        "cpuset_cpus": _union_cpus(strict),
        "cpuset_mems": ",".join(sorted({str(e.pinning.numa_node) for e in strict
                                        if e.pinning.numa_node is not None})),
    }


#: What supervisord does with its config's directory (%(here)s), read back exactly only when
#: the directory's path holds none of these (supervisor/options.py): `expand_here` pastes it
#: into every value, which is then %-expanded; the runtime's word `'%(here)s/runtime'` is then
#: split by shlex, where a `'` ends the quoted word; and [include] globs conf.d/*.conf below it.
_HERE_BREAKERS = {
    "%": "supervisord %-expands every value after pasting the directory into it",
    "'": "it ends the quoted '%(here)s/runtime' word of every command (shlex)",
    **dict.fromkeys("*?[", "supervisord finds conf.d/*.conf overrides below it with glob, "
                    "where it is a wildcard"),
}


def check_bundle_dir(output: Path) -> None:
    """Refuse an output directory that supervisord cannot read back as %(here)s (above)."""
    where = str(output.absolute())
    for c, why in _HERE_BREAKERS.items():
        if c in where:
            raise OutputError(
                f"{printable(str(output))}: a supervisord bundle cannot live in a path with "
                f"{c!r}: {why}", hint="render into another directory (--output DIR)")


def keygen_command(plan: Plan) -> str:
    """The shell line that makes the control-plane key once (install.sh's ensure_secret), in
    its directory (mkdir -p: an existing one keeps its mode)."""
    key, q = plan.paths.router_key, shlex.quote
    return (f"[ -s {q(key)} ] || {{ mkdir -p {q(posixpath.dirname(key))} && (umask 077 && "
            f"od -An -vtx1 -N32 /dev/urandom | tr -d ' \\n' > {q(key)}) && "
            f"chgrp {q(plan.group)} {q(key)} && chmod 0640 {q(key)}; }}")


def key_copy_command(plan: Plan) -> str:
    """The shell line that installs the router host's control-plane key on an engine host
    (what install.sh --key-from does for systemd): copied over ssh, root:GROUP 0640."""
    key, q = plan.paths.router_key, shlex.quote
    return (f"{key_fetch_command(plan)} && install -D -m 0640 -o root -g {q(plan.group)} "
            f"router.key {q(key)} && rm router.key")


def _union_cpus(engines: list[EnginePlan]) -> str:
    return format_cpulist(sorted({c for e in engines for c in e.pinning.cpus}))


def supervisord_name(plan: Plan) -> str:
    """The name `pdsvc status` gives the supervisord that runs the bundle (the row in place of
    the systemd target), as its socket and pid file are named."""
    return f"{plan.name}-supervisord"


def program_names(plan: Plan) -> Mapping[str, str]:
    """{systemd unit: supervisorctl name} of the bundle's programs — keyed by unit, so N
    prefill + M decode engines each keep their own. Each program is a group of its own (no
    [group:] section): supervisord names such a group, and the process in it, after the
    program (supervisor 4.3.0 options.py process_groups_from_parser, "homogeneous" groups),
    and supervisorctl's bare `NAME` means group NAME, process NAME (options.py split_namespec).
    Why alone: supervisord reads a changed definition only by re-creating the whole group
    (supervisorctl.py do_update; options.py ProcessGroupConfig.__eq__), so a shared group
    would restart every engine for one engine's change (docs/apply.md)."""
    names = {e.unit: e.name for e in plan.engines}
    if plan.router:
        names[plan.router.unit] = plan.router.name
    return names
