"""`pdsvc render`: write the bundle (systemd, supervisord or k8s) from the plan, and print
what changed and the next step that works as printed."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import NoReturn

import click

from pdsvc.cli.kit import (
    DEFAULT_OUTPUT,
    EPILOG,
    canonical_command,
    config_option,
    emit_json,
    handle_errors,
    json_option,
    load_plan,
    sysfs_option,
    topology_option,
    warn_plan,
)
from pdsvc.plan.build import Plan
from pdsvc.render.bundle import Origin, diff_bundle, write_bundle
from pdsvc.render.hosts_bundle import per_host
from pdsvc.render.kit import INSTALLER_DIR, RUNTIME_DIR, File, key_fetch_command
from pdsvc.render.systemd import render_systemd


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
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
    command = canonical_command(config_path, sysfs_root, topology_file)
    files, output = _render_files(plan, fmt, command, output)
    if show_diff:
        _show_diff(files, output, fmt, as_json)
    if dry_run:
        _show_dry_run(files, output, fmt, as_json)
        return
    report = write_bundle(files, output, origin=Origin(fmt, config_path), force=force)
    step = next_step(fmt, plan, output)
    if as_json:
        emit_json("render", output=str(output), bundle=fmt, files=[
            {"path": path, "status": status} for path, status in report], next=step)
        return
    for line in report_lines(report, output):
        click.echo(line)
    click.echo(step)


def _render_files(plan: Plan, fmt: str, command: str,
                  output: Path | None) -> tuple[list[File], Path]:
    """The bundle's files in format ``fmt``, and the directory they go to (--output, else the
    format's default)."""
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
    return files, output


def _show_diff(files: list[File], output: Path, fmt: str, as_json: bool) -> NoReturn:
    """--diff: what the render would change in ``output``; exit 1 when anything, as diff."""
    diff = diff_bundle(files, output)
    if as_json:
        emit_json("render", output=str(output), bundle=fmt, changed=bool(diff), diff=diff)
    else:
        click.echo(diff or f"{output}: up to date", nl=not diff)
    sys.exit(1 if diff else 0)


def _show_dry_run(files: list[File], output: Path, fmt: str, as_json: bool) -> None:
    """--dry-run: each file the render would write, with its size and mode."""
    if as_json:
        emit_json("render", output=str(output), bundle=fmt, dry_run=True, files=[
            {"path": f.path, "status": "would write", "bytes": len(f.content),
             "mode": f"{f.mode:o}"} for f in files])
        return
    for f in files:
        click.echo(f"would write {output / f.path} ({len(f.content)} bytes, mode {f.mode:o})")


def report_lines(report: list[tuple[str, str]], output: Path) -> list[str]:
    """A line per file written or removed, but one per shipped package (runtime/, install/,
    HOST/runtime/, …): its modules are pdsvc/ship's, copied, so what counts is how many changed,
    e.g. `unchanged  units/runtime/ (19 files)`, `updated  units/runtime/ (3 of 19 files)`."""
    entries: list[tuple[str, str] | str] = []  # (path, status), or a shipped directory
    runtimes: dict[str, list[str]] = {}  # shipped directory -> its files' statuses
    for path, status in report:
        parts = Path(path).parts
        if len(parts) > 1 and parts[-2] in (RUNTIME_DIR, INSTALLER_DIR) and path.endswith(".py"):
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

