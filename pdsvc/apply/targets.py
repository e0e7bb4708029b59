"""Where apply's steps go: the service manager that restarts units on this host, and, for
several hosts, the command each host runs, in the global order (pdsvc runs no remote
command itself)."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from pdsvc.apply.bounds import RPC_TIMEOUT_S, SHOW_TIMEOUT_S
from pdsvc.apply.host import Host
from pdsvc.apply.hosts import sub_bundle
from pdsvc.apply.order import host_sequence
from pdsvc.apply.programs import CONF
from pdsvc.apply.rollout import Rollout
from pdsvc.status.managers import ServiceManager, Supervisord, Systemd


def manager_name(bundle: dict[str, str]) -> str:
    return "supervisord" if CONF in bundle or any(
        p.endswith("/" + CONF) for p in bundle) else "systemd"


def control_socket(conf: str) -> str:
    """[unix_http_server] file= of a supervisord.conf (the path supervisorctl talks to)."""
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"), strict=False)
    parser.read_string(conf)
    return parser.get("unix_http_server", "file", fallback="")


def make_manager(bundle: dict[str, str], on_host: str | None, host: Host, output: Path,
                 socket: str | None) -> ServiceManager:
    """The service manager of this host's bundle: systemctl through `host`, or the bundle's
    supervisord (its control socket, or `socket`)."""
    if manager_name(bundle) == "systemd":
        return Systemd(host, timeout=SHOW_TIMEOUT_S)
    mine = sub_bundle(bundle, on_host) if on_host else bundle
    path = socket or control_socket(mine.get(CONF, ""))
    conf = output / on_host / CONF if on_host else output / CONF
    return Supervisord(path, timeout=RPC_TIMEOUT_S, conf=str(conf))


def apply_command(config: Path | None, output: Path, *, topology: Path | None = None,
                  sysfs_root: Path | None = None, options: tuple[str, ...] = ()) -> str:
    """The command each host runs (before its --host): the same render as this one (the
    config, --topology or --sysfs-root: a host without GPUs renders the others' units from
    it), the same bundle directory and the options given here (`options`: the bounds);
    without `config`, --rollback (the previous bundle kept in OUTPUT)."""
    words = ["sudo", "pdsvc", "apply"]
    words += ["-c", str(config)] if config is not None else ["--rollback"]
    words += ["-o", str(output)]
    if config is not None and topology is not None:
        words += ["--topology", str(topology)]
    elif config is not None and sysfs_root is not None:
        words += ["--sysfs-root", str(sysfs_root)]
    return shlex.join([*words, *options])


def host_commands(r: Rollout, base: str) -> list[tuple[str, list[int], str]]:
    """(host, its global step numbers, the command it runs) in the order the hosts run."""
    return [(h, steps, f"{base} --host {shlex.quote(h)}")
            for h, steps in host_sequence(r)]


def hosts_before(sequence: list[tuple[str, list[int], str]], host: str) -> list[str]:
    """The hosts that run their steps before `host` ([] when it has none)."""
    names = [h for h, _, _ in sequence]
    return names[:names.index(host)] if host in names else []


def next_host(sequence: list[tuple[str, list[int], str]], host: str
              ) -> tuple[str, list[int], str] | None:
    """The host that runs its steps after `host`, with its steps and command; None."""
    names = [h for h, _, _ in sequence]
    i = names.index(host) + 1 if host in names else len(names)
    return sequence[i] if i < len(names) else None


def format_hosts(sequence: list[tuple[str, list[int], str]]) -> list[str]:
    if not sequence:
        return []
    lines = ["hosts, one after another (each host's command waits until its steps serve; "
             "run the next only then; pdsvc runs no remote command: ssh, or your tool):"]
    for n, (host, steps, command) in enumerate(sequence, 1):
        lines.append(f"  {n}. on {host} (steps {', '.join(map(str, steps))}): {command}")
    return lines
