"""The pdsvc command line. Thin: parse options, call the core, map errors to exit codes.

Exit codes: 0 ok · 1 could not write output · 2 bad config or usage · 3 the plan does not fit
the host's topology (or the topology is unknown).
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from pdsvc import __version__
from pdsvc.cli.kit import (
    DEFAULT_OUTPUT,
    EPILOG,
    config_option,
    handle_errors,
    json_option,
    load_plan,
    no_color,
    sysfs_option,
    topology_option,
    usage_error_line,
    warn_plan,
)
from pdsvc.errors import TopologyError
from pdsvc.plan.build import Plan
from pdsvc.plan.connections import connections
from pdsvc.render.bundle import Origin, diff_bundle, hosts_index, write_bundle
from pdsvc.render.systemd import RUNTIME_DIR, File, key_fetch_command, render_systemd
from pdsvc.topology import format_cpulist, read_sysfs


def _canonical_command(config: Path, sysfs_root: Path | None, topology: Path | None) -> str:
    """The render command written into each file's header (stable: output dir left out)."""
    words = ["pdsvc", "render", "--config", str(config)]
    if topology:
        words += ["--topology", str(topology)]
    elif sysfs_root:
        words += ["--sysfs-root", str(sysfs_root)]
    return shlex.join(words)


class _Commands(click.Group):
    """Commands that live in modules of their own are imported when they are run (or listed):
    doctor and status are most of pdsvc's code, and a render needs neither."""

    LAZY = {"doctor": ("pdsvc.cli.doctor", "doctor"), "status": ("pdsvc.cli.status", "status"),
            "bench": ("pdsvc.cli.bench", "bench"), "apply": ("pdsvc.cli.apply", "apply")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            module, attr = self.LAZY[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def main(self, *args: Any, standalone_mode: bool = True, **extra: Any) -> Any:
        """As click's, but every usage error is one line (click's own are three, with the
        usage and a "Try" line), and NO_COLOR turns colour off."""
        if no_color():
            extra.setdefault("color", False)
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **extra)
        try:
            rv = super().main(*args, standalone_mode=False, **extra)
        except click.ClickException as err:
            usage_error_line(err)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("pdsvc: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Commands, epilog=EPILOG, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pdsvc")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Run a prefill-decode disaggregated SGLang deployment as systemd services.

    \b
    One YAML file says what to run; pdsvc reads the host's real GPU/NUMA layout, resolves every
    GPU, CPU, port, flag and cache path into a plan, and renders systemd units for prefill,
    decode and the sglang-router under one target:

    \b
      pdsvc validate                     # check etc/pdsvc.yaml against this host
      pdsvc plan                         # what will run where, and the exact command lines
      pdsvc render && sudo ./install.sh  # write units/, install them
      systemctl start dsv4-pd.target     # returns once the stack serves
      journalctl -u dsv4-decode          # one engine's log
    """
    if ctx.invoked_subcommand is None:  # `pdsvc` alone: the help, and that is no error
        click.echo(ctx.get_help())
        ctx.exit(0)


@main.command(epilog=EPILOG)
@config_option
@click.option("--format", "fmt", type=click.Choice(["systemd", "supervisord", "k8s"]),
              default=None,
              help="systemd units (default; one bundle per host with `hosts:`), a supervisord "
              "config for hosts and containers without systemd, or Kubernetes manifests "
              "(kubectl apply -k). Default: the config's `format` key.")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Directory to write the bundle to [default: {DEFAULT_OUTPUT}/ for systemd, "
              f"{DEFAULT_OUTPUT}-supervisord/, {DEFAULT_OUTPUT}-k8s/].")
@sysfs_option
@topology_option
@click.option("--dry-run", is_flag=True,
              help="Print the files that would be written; write nothing.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Show what would change in --output (a unified diff); write nothing. "
              "Exit 0 when nothing would change, 1 when something would (as `diff`).")
@click.option("--force", is_flag=True,
              help="Replace files edited since pdsvc wrote them, or a bundle of another "
              "config or format in --output (what is lost is listed). Files pdsvc did not "
              "write are never replaced.")
@json_option
@handle_errors
def render(config_path: Path, fmt: str | None, output: Path | None, sysfs_root: Path | None,
           topology_file: Path | None, dry_run: bool, show_diff: bool, force: bool,
           as_json: bool) -> None:
    """Render the deployment into --output: systemd units (one bundle per host when the
    config has `hosts:`), a supervisord config, or Kubernetes manifests.

    Nothing is half-written: all files are staged first and renamed into place together; a
    bad config or a plan that does not fit the host writes nothing. One render at a time
    writes into a directory. Files in --output that pdsvc did not write are never
    overwritten; files edited since pdsvc wrote them, and a bundle of another config or
    format, only with --force.
    """
    if fmt is None:  # the config's `format`, from a plan that reads no host (plan cache: cheap)
        fmt = load_plan(config_path, None, None, scheduled=True).format
    # Kubernetes places the engines itself: no host is read, no host's settings apply
    plan = load_plan(config_path, sysfs_root, topology_file, scheduled=fmt == "k8s")
    if fmt == "k8s" and (sysfs_root or topology_file):
        click.secho("pdsvc: note: --format k8s reads no host topology (the scheduler places "
                    "the pods); --topology/--sysfs-root are ignored", fg="yellow", err=True)
    warn_plan(plan)
    command = _canonical_command(config_path, sysfs_root, topology_file)
    if fmt == "supervisord":
        from pdsvc.render.supervisord import check_bundle_dir, render_supervisord

        command += " --format supervisord"
        files = per_host(plan, command, lambda p: render_supervisord(p, command))
        output = output or Path(f"{DEFAULT_OUTPUT}-supervisord")
        check_bundle_dir(output)
    elif fmt == "k8s":
        from pdsvc.render.k8s import render_k8s

        command += " --format k8s"
        files = render_k8s(plan, command)
        output = output or Path(f"{DEFAULT_OUTPUT}-k8s")
    else:
        files = per_host(plan, command, lambda p: render_systemd(p, command))
        output = output or DEFAULT_OUTPUT
    if show_diff:
        diff = diff_bundle(files, output)
        if as_json:
            _emit_json("render", output=str(output), bundle=fmt, changed=bool(diff), diff=diff)
        else:
            click.echo(diff or f"{output}: up to date", nl=not diff)
        sys.exit(1 if diff else 0)
    if dry_run:
        if as_json:
            _emit_json("render", output=str(output), bundle=fmt, dry_run=True, files=[
                {"path": f.path, "status": "would write", "bytes": len(f.content),
                 "mode": f"{f.mode:o}"} for f in files])
            return
        for f in files:
            click.echo(f"would write {output / f.path} ({len(f.content)} bytes, mode {f.mode:o})")
        return
    report = write_bundle(files, output, origin=Origin(fmt, config_path), force=force)
    step = next_step(fmt, plan, output)
    if as_json:
        _emit_json("render", output=str(output), bundle=fmt, files=[
            {"path": path, "status": status} for path, status in report], next=step)
        return
    for line in report_lines(report, output):
        click.echo(line)
    click.echo(step)


def report_lines(report: list[tuple[str, str]], output: Path) -> list[str]:
    """A line per file written or removed, but one per runtime directory (runtime/,
    HOST/runtime/): its modules are the package's, copied, so what counts is how many changed,
    e.g. `unchanged  units/runtime/ (19 files)`, `updated  units/runtime/ (3 of 19 files)`."""
    entries: list[tuple[str, str] | str] = []  # (path, status), or a runtime directory
    runtimes: dict[str, list[str]] = {}  # runtime directory -> its files' statuses
    for path, status in report:
        parts = Path(path).parts
        if len(parts) > 1 and parts[-2] == RUNTIME_DIR and path.endswith(".py"):
            d = str(Path(path).parent)
            if d not in runtimes:
                runtimes[d] = []
                entries.append(d)
            runtimes[d].append(status)
        else:
            entries.append((path, status))
    lines = []
    for entry in entries:
        if isinstance(entry, tuple):
            lines.append(f"{entry[1]:>11}  {output / entry[0]}")
            continue
        statuses = runtimes[entry]
        kept = [s for s in statuses if s not in ("removed", "discarded")]  # the new bundle's
        for status in dict.fromkeys(statuses):
            n = statuses.count(status)
            if status == "unchanged" and n < len(kept):
                continue  # said by the other lines' "N of M"
            of = f"{n} of {len(kept)}" if status in kept and n < len(kept) else str(n)
            lines.append(f"{status:>11}  {output / entry}/ ({of} file{'s' * (of != '1')})")
    return lines


def _emit_json(command: str, **doc: Any) -> None:
    """A --json document, tagged with its schema as doctor's and topology's are."""
    click.echo(json.dumps({"format": f"pdsvc-{command}/1", **doc}, indent=2))


def install_script() -> Path | None:
    """The install.sh that comes with this pdsvc: the checkout's (pip install -e .), or the
    copy a package installs under PREFIX/share/pdsvc."""
    for script in (Path(__file__).resolve().parents[2] / "install.sh",
                   Path(sys.prefix) / "share" / "pdsvc" / "install.sh"):
        if script.is_file():
            return script
    return None


def shown(path: Path, *, command: bool = False) -> str:
    """A path as the user types it from where they stand: relative below the working
    directory (a command gets its `./`), else absolute; quoted for the shell."""
    absolute = Path(os.path.abspath(path))
    try:
        rel = absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return shlex.quote(str(absolute))
    if command and "/" not in rel:
        rel = f"./{rel}"
    return shlex.quote(rel)


def next_step(fmt: str, plan: Plan, output: Path) -> str:
    """The command to run next, as it works from the working directory: the bundle is where
    --output put it, and install.sh is named by its path and told the bundle (--bundle)
    unless that is the units/ beside it, which it installs by default."""
    if fmt == "supervisord":
        conf = output / ("HOST" if plan.hosts else "") / "supervisord.conf"
        on = "on each host: " if plan.hosts else ""
        key = (f"; the router's control-plane key is made on {plan.router_machine} and copied "
               "to the engine hosts" if plan.hosts else "")
        return f"next, {on}supervisord -c {shown(conf)}   (see its header{key})"
    if fmt == "k8s":
        return (f"next: kubectl apply -k {shown(output)}   (an engine on several hosts needs "
                "the LeaderWorkerSet controller)")
    script = install_script()
    run = f"sudo {shown(script, command=True)}" if script else "sudo PDSVC_SOURCE/install.sh"
    if plan.hosts:
        return hosts_next_step(plan, run, shown(output))
    beside = script is not None and os.path.realpath(output) == os.path.realpath(
        script.parent / "units")
    bundle = "" if beside else f" --bundle {shown(output)}"
    return f"next: {run}{bundle}   (then: systemctl start {plan.target})"


def hosts_next_step(plan: Plan, run: str, bundles: str) -> str:
    """Install on several hosts: the router's host first (its install.sh makes the
    control-plane key), then each engine host with that key (--key-from), then the hosts
    whose units read no key; then start."""
    by_use: dict[str, list[str]] = {"make": [], "copy": [], "none": []}
    for h in plan.hosts:
        by_use[plan.for_host(h.name).key_use].append(h.name)
    lines = [f"next, on {plan.router_machine} (it makes the router's control-plane key): "
             f"{run} --bundle {bundles}/{plan.router_machine}"]
    if by_use["copy"]:
        fetch = key_fetch_command(plan.for_host(by_use["copy"][0]))
        lines.append(f"then on {', '.join(by_use['copy'])} (HOST), with that key: {fetch} && "
                     f"{run} --bundle {bundles}/HOST --key-from router.key && rm router.key")
    if by_use["none"]:
        lines.append(f"on {', '.join(by_use['none'])} (no key used): "
                     f"{run} --bundle {bundles}/HOST")
    r, t = plan.router_machine, plan.target
    lines.append(f"then: on {r} systemctl start --no-block {t}; on each other host pdsvc doctor "
                 f"-c CONFIG --host HOST, then systemctl start --no-block {t}; on {r} systemctl "
                 f"start {t} (returns once the stack serves)")
    return "\n".join(lines)


def per_host(plan: Plan, command: str, render_one: Callable[[Plan], list[File]]) -> list[File]:
    """One bundle, or with `hosts:` one per host (HOST/…, each its own) plus hosts.list."""
    if not plan.hosts:
        return render_one(plan)
    files = [hosts_index(plan, command)]
    for h in plan.hosts:
        files += [replace(f, path=f"{h.name}/{f.path}") for f in render_one(plan.for_host(h.name))]
    return files


@main.command(epilog=EPILOG)
@config_option
@sysfs_option
@topology_option
@json_option
@handle_errors
def validate(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
             as_json: bool) -> None:
    """Check the config and that its plan fits the host; write nothing."""
    plan = load_plan(config_path, sysfs_root, topology_file)
    if as_json:
        _emit_json("validate", ok=True, config=str(config_path),
                   topology=plan.topology_source, units=list(plan.units),
                   warnings=list(plan.warnings))
        return
    warn_plan(plan)
    click.echo(f"ok: {config_path} fits {plan.topology_source} ({len(plan.units)} units)")


@main.command("plan", epilog=EPILOG)
@config_option
@sysfs_option
@topology_option
@json_option
@handle_errors
def plan_cmd(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
             as_json: bool) -> None:
    """Show the resolved plan: role, GPUs, NUMA node, CPUs, ports, cache dir, command lines."""
    plan = load_plan(config_path, sysfs_root, topology_file)
    if as_json:  # the plan's own `format` is its bundle's: the schema tag is `schema`
        click.echo(json.dumps({"schema": "pdsvc-plan/1", **plan.to_dict(),
                               "connections": [c.to_dict() for c in connections(plan)]},
                              indent=2))
        return
    warn_plan(plan)
    click.echo(f"{plan.target}  (config {plan.config_source}, topology {plan.topology_source})\n")
    hosted = bool(plan.hosts)
    rows = [("HOST",) * hosted + ("UNIT", "ROLE", "GPUS", "NUMA", "CPUS", "PORTS")]
    for e in plan.engines:
        numa = "-" if e.pinning.numa_node is None else str(e.pinning.numa_node)
        ports = f"http {e.port}, dist-init {e.dist_init_port}"
        if e.role == "prefill":
            ports += f", bootstrap {e.bootstrap_port}"
        if e.nnodes > 1:
            ports += f" (node {e.node_rank} of {e.nnodes})"
        where = (f"{e.machine} {e.host}",) * hosted
        rows.append((*where, e.unit, e.role, format_cpulist(e.gpus), numa,
                     e.pinning.cpulist or "-", ports))
    r = plan.router
    assert r is not None  # the whole plan always has its router
    rows.append(((f"{r.machine} {plan.host(r.machine).address}",) if hosted else ())
                 + (r.unit, "router", "-", "-", "-",
                    f"http {r.port} on {r.host}, metrics {r.prometheus_port}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"\nJIT cache (shared by the engines{' of a host' * hosted}): "
               f"{plan.paths.jit_cache}")
    click.echo(f"Service user: {plan.user}:{plan.group}   "
               f"Requests: {plan.reachable_router().url}/v1/chat/completions")
    for e in plan.engines:
        on = f" on {e.machine}" if hosted else ""
        click.echo(f"\n{e.unit}{on}: pinned to {e.pinning.why}")
        click.echo("  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in e.env
                                   if k.startswith(("CUDA_VISIBLE", "SGLANG_DISAGG"))))
        click.echo("  " + shlex.join(e.argv))
    click.echo(f"\n{r.unit}:\n  {shlex.join(r.argv)}")
    if hosted:
        click.echo("\nConnections between hosts (open them in host firewalls):")
        for c in connections(plan):
            click.echo(f"  {c.source:<10} -> {c.target:<22} {c.why}")


@main.command(epilog=EPILOG)
@sysfs_option
@json_option
@handle_errors
def topology(sysfs_root: Path | None, as_json: bool) -> None:
    """Show the host's NVIDIA GPUs and NUMA nodes as pdsvc reads them.

    The --json output is what `--topology FILE` reads: run `pdsvc topology --json > host.json`
    on the GPU host to render for it elsewhere.
    """
    topo = read_sysfs(sysfs_root or Path("/sys"))
    if not topo.gpus:  # with --json too: a file of no GPU would only fail later
        raise TopologyError(f"no NVIDIA GPU found ({topo.source})",
                            hint="run it on the GPU host")
    if as_json:
        click.echo(topo.to_json(), nl=False)
        return
    click.echo(f"{len(topo.gpus)} GPUs, {len(topo.nodes)} NUMA nodes ({topo.source})")
    for g in topo.gpus:
        node = "unknown (-1)" if g.numa_node is None else str(g.numa_node)
        click.echo(f"  GPU {g.index}  {g.pci_bus_id}  node {node}  "
                   f"local CPUs {format_cpulist(g.local_cpus) or '-'}")
    for n in topo.nodes:
        click.echo(f"  node {n.id}  CPUs {format_cpulist(n.cpus) or '-'}")


__all__ = ["main"]


if __name__ == "__main__":
    main()
