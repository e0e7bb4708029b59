"""What every pdsvc command shares: options (defined once), error handling, plan loading.

Commands live in commands.py and in the modules of their own (doctor.py, status.py, …); each
imports its options from here, so an option means the same thing everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from pdsvc.errors import ConfigError, PdsvcError, TopologyError
from pdsvc.plan import cache as plancache
from pdsvc.plan.build import Plan, build_plan
from pdsvc.topology import Topology, load_topology_file, read_sysfs

DEFAULT_CONFIG = Path("etc/pdsvc.yaml")
DEFAULT_OUTPUT = Path("units")

EPILOG = """\b
Exit codes: 0 ok, 1 output not written (render --diff: differences),
            2 bad config or usage, 3 the plan does not fit the host (or no GPU found).
"""


def no_color() -> bool:
    """NO_COLOR (no-color.org): set and not empty, pdsvc writes no colour."""
    return bool(os.environ.get("NO_COLOR"))


def error_line(message: str) -> None:
    """One error, one line on stderr (red on a terminal unless NO_COLOR)."""
    line = " ".join(message.split("\n"))
    click.secho(f"pdsvc: error: {line}", fg="red", err=True)


def _fail(err: PdsvcError) -> None:
    error_line(str(err))
    sys.exit(err.exit_code)


def usage_error_line(err: click.ClickException) -> None:
    """click's usage errors (usage line, "Try …" line, "Error: …" line) as one line, like
    every other error of pdsvc: what is wrong, and where the help is."""
    ctx = getattr(err, "ctx", None)
    where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
    error_line(" ".join(err.format_message().split()) + where)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every PdsvcError into one red line on stderr and its exit code; never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PdsvcError as err:
            _fail(err)
        except KeyboardInterrupt:
            click.echo("pdsvc: interrupted", err=True)
            sys.exit(130)

    return wrapper


# Options shared by several commands are defined once (pip-tools style).
config_option = click.option(
    "--config", "-c", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG, show_default=True,
    help="The deployment config (YAML). Unknown keys are errors.",
)
sysfs_option = click.option(
    "--sysfs-root", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Read GPUs/NUMA from this /sys-like tree instead of /sys (DIR/bus/pci/devices/…).",
)
topology_option = click.option(
    "--topology", "topology_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the host layout from a file written by `pdsvc topology --json` on the GPU host "
    "(render on a laptop for the GPU host). etc/seed-host.topology.json is the seed host's.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def plan_command(name: str | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """A command that reads the config and the host's topology and answers in text or --json
    (validate, plan): its options and its error handling, said once."""
    def wrap(fn: Callable[..., Any]) -> click.Command:
        for option in (handle_errors, json_option, topology_option, sysfs_option,
                       config_option):
            fn = option(fn)
        return click.command(name, epilog=EPILOG,
                             context_settings={"help_option_names": ["-h", "--help"]})(fn)
    return wrap
host_option = click.option(
    "--host", "host_name", metavar="NAME", default=None,
    help="With `hosts:` in the config: which host this is, so only its units are checked. "
    "Default: the host whose address is on this machine.",
)


def host_topology(sysfs_root: Path | None, topology_file: Path | None) -> Topology:
    if sysfs_root and topology_file:
        raise click.UsageError("give --sysfs-root or --topology, not both")
    if topology_file:
        return load_topology_file(topology_file)
    return read_sysfs(sysfs_root or Path("/sys"))


def read_config_text(path: Path) -> str:
    """The config file's text, or a one-line ConfigError saying what is wrong with the path
    (or that it is not UTF-8)."""
    from pdsvc.config.yamlload import decode_config

    try:
        return decode_config(path.read_bytes(), str(path))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: config file not found", hint="pass --config PATH (see etc/pdsvc.yaml)"
        ) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from None


def load_plan(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
              *, scheduled: bool = False, only_host: str | None = None) -> Plan:
    """Config + host topology -> Plan. A plan already built from the same config text,
    topology and pdsvc code is read back from the plan cache instead (no pydantic import:
    that is most of a render's time); anything else goes through full validation.
    ``scheduled``: no host is read (Kubernetes places the engines; nothing is pinned).
    ``only_host``: of an inventory, only that host's engines are laid on the topology read
    here (doctor/status on one host; the others' GPUs are theirs to check)."""
    text = read_config_text(config_path)
    topology = None if scheduled else host_topology(sysfs_root, topology_file)
    key = plancache.key(str(config_path), text, topology, only_host or "")
    plan = plancache.get(key)
    if plan is not None and all(
        _sha256(Path(h.topology_source.removeprefix("file:"))) == h.topology_sha256
        for h in plan.hosts if h.topology_sha256
    ):
        return plan
    from pdsvc.config.load import parse_config  # pydantic: only when the plan must be built

    config = parse_config(text, str(config_path))
    host_topologies = {}
    for name, hc in (config.hosts or {}).items():
        if hc.topology is not None and not scheduled:
            path = config_path.parent / hc.topology
            try:
                host_topologies[name] = (load_topology_file(path), _sha256(path))
            except TopologyError as err:
                raise TopologyError(f"hosts.{name}.topology: {err.message}",
                                    hint=err.hint) from None
    plan = build_plan(config, topology, config_source=str(config_path), config_text=text,
                      host_topologies=host_topologies, only_host=only_host)
    plancache.put(key, plan)
    return plan


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""  # unreadable: never equal to a recorded checksum, so the plan is rebuilt


def load_host_plan(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
                   host_name: str | None) -> tuple[Plan, Plan]:
    """(the whole plan, what runs on this host) for doctor and status. With `hosts`, the host
    is the named one or the one whose address this machine has, and only its engines are
    laid on this machine's topology: a router-only host needs no GPU, and GPU 4 of another
    host is not looked for here."""
    whole = load_plan(config_path, sysfs_root, topology_file, scheduled=True)  # reads no host
    if not whole.hosts:
        if host_name:
            raise ConfigError(f"--host {host_name}: {whole.config_source} has no `hosts`",
                              hint="leave --host out")
        plan = load_plan(config_path, sysfs_root, topology_file)
        return plan, plan
    name = _host_name(whole, host_name)
    whole = load_plan(config_path, sysfs_root, topology_file, only_host=name)
    return whole, whole.for_host(name)


def load_host_plan_anyway(config_path: Path, sysfs_root: Path | None,
                          topology_file: Path | None, host_name: str | None,
                          ) -> tuple[Plan, Plan, TopologyError | None]:
    """load_host_plan for status: a plan that does not fit this host's topology (a GPU fell
    off the bus) still names every unit and URL, so it is laid on no host instead, and why it
    does not fit comes back as a finding, not as the end of the command."""
    try:
        return (*load_host_plan(config_path, sysfs_root, topology_file, host_name), None)
    except TopologyError as err:
        whole = load_plan(config_path, sysfs_root, topology_file, scheduled=True)
        if not whole.hosts:
            return whole, whole, err
        return whole, whole.for_host(_host_name(whole, host_name)), err


def _host_name(plan: Plan, host_name: str | None) -> str:
    """The named host of the inventory, or the one whose address this machine has."""
    names = ", ".join(h.name for h in plan.hosts)
    if host_name is None:
        local = [h.name for h in plan.hosts if _is_local(h.address)]
        if len(local) != 1:
            why = (f"several hosts' addresses are on this machine ({', '.join(local)})" if local
                   else "no host of `hosts` has an address on this machine")
            raise ConfigError(f"{plan.config_source}: {why}", hint=f"pass --host NAME ({names})")
        host_name = local[0]
    if host_name not in {h.name for h in plan.hosts}:
        raise ConfigError(f"--host {host_name}: no such host in {plan.config_source}",
                          hint=f"one of {names}")
    return host_name


def _is_local(address: str) -> bool:
    """Whether this machine has `address` (binding to it works only then)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def warn_plan(plan: Plan) -> None:
    for w in plan.warnings:
        click.secho(f"pdsvc: warning: {w}", fg="yellow", err=True)


def canonical_command(config: Path, sysfs_root: Path | None, topology: Path | None) -> str:
    """The render command written into each file's header (stable: output dir left out)."""
    words = ["pdsvc", "render", "--config", str(config)]
    if topology:
        words += ["--topology", str(topology)]
    elif sysfs_root:
        words += ["--sysfs-root", str(sysfs_root)]
    return shlex.join(words)


def emit_json(command: str, **doc: Any) -> None:
    """A --json document, tagged with its schema as doctor's and topology's are."""
    click.echo(json.dumps({"format": f"pdsvc-{command}/1", **doc}, indent=2))
