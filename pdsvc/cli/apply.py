"""The `pdsvc apply` command: render the edited config, show the rollout, install, then restart
only what changed, one step at a time (pdsvc.apply)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from pdsvc.apply.bundles import (
    PREVIOUS,
    as_bundle,
    install,
    keep_previous,
    previous_files,
    previous_origin_config,
    read_bundle,
    running_config,
    save_applied,
)
from pdsvc.apply.execute import Bounds, Executor, StepFailed
from pdsvc.apply.host import LocalHost
from pdsvc.apply.hosts import bundle_units, hosts_of
from pdsvc.apply.order import host_steps
from pdsvc.apply.order import plan as plan_apply
from pdsvc.apply.rollout import Rollout, format_rollout
from pdsvc.apply.targets import (
    apply_command,
    format_hosts,
    host_commands,
    hosts_before,
    make_manager,
    manager_name,
    next_host,
)
from pdsvc.cli.kit import (
    DEFAULT_OUTPUT,
    canonical_command,
    config_option,
    handle_errors,
    json_option,
    load_plan,
    sysfs_option,
    topology_option,
    warn_plan,
)
from pdsvc.cli.render import install_script, per_host, shown
from pdsvc.errors import ConfigError, OutputError
from pdsvc.plan.build import Plan
from pdsvc.render.bundle import Origin, write_bundle
from pdsvc.render.kit import File
from pdsvc.render.systemd import render_systemd

APPLY_EPILOG = """\b
Exit codes: 0 applied, or nothing to do · 1 the install or a step failed (the rollout
            stopped there; the one command that goes back is printed) · 2 bad config or
            usage · 3 serving would stop and that was declined (or not confirmed: --yes)
"""

#: --drain-timeout's and --step-timeout's defaults
DRAIN_SECS, STEP_SECS = 60.0, 3600.0

#: Exit status when the operator declines (or cannot be asked about) an outage.
DECLINED = 3


def _say(text: str) -> None:
    click.echo(text, err=True)


def _rollback_command(output: Path, on_host: str | None = None) -> str:
    """The command that goes back; across hosts one per host, OUTPUT as given (the same path
    on every host, as each host's apply command has it)."""
    if on_host:
        return shlex.join(["sudo", "pdsvc", "apply", "--rollback", "--output", str(output),
                           "--host", on_host])
    return f"sudo pdsvc apply --rollback --output {shown(output)}"


def _going_back(output: Path, on_host: str | None, sequence: list) -> str:
    """The commands that go back: this host's; across hosts, then each host that ran its
    steps before this one, the latest first (each with its own copy of OUTPUT)."""
    if not on_host:
        return _rollback_command(output)
    return "; then ".join(f"on {h}: {_rollback_command(output, h)}"
                          for h in [on_host, *reversed(hosts_before(sequence, on_host))])


@click.command(epilog=APPLY_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_OUTPUT, show_default=True,
              help="The bundle directory: what was rendered and installed last, compared "
              "with the new render, which is written there.")
@sysfs_option
@topology_option
@click.option("--dry-run", is_flag=True, help="Print the plan of the rollout; change nothing.")
@json_option
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask before a step during which serving stops (for scripts).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=DRAIN_SECS,
              show_default=True, metavar="SECS", help="How long to wait for an engine's "
              "in-flight requests once it is out of the router (SGLang's own drain has no "
              "bound).")
@click.option("--step-timeout", type=click.FloatRange(min=1), default=STEP_SECS,
              show_default=True, metavar="SECS",
              help="How long a step may take from restart to serving (load, JIT, warmup).")
@click.option("--force", is_flag=True, help="Passed to the render and to install.sh: "
              "replace files edited in place.")
@click.option("--rollback", is_flag=True,
              help=f"Go back to the bundle and config kept in OUTPUT/{PREVIOUS}/ by the last "
              "apply, with the same steps.")
@click.option("--host", "on_host", metavar="HOST",
              help="A deployment over several hosts: run the steps of HOST (this machine) in "
              "the global order; --dry-run prints every host's command, in order.")
@click.option("--socket", metavar="PATH", help="supervisord's control socket (default: the "
              "bundle's, supervisord.run_dir/NAME-supervisord.sock).")
@handle_errors
def apply(config_path: Path, output: Path, sysfs_root: Path | None, topology_file: Path | None,
          dry_run: bool, as_json: bool, yes: bool, drain_timeout: float, step_timeout: float,
          force: bool, rollback: bool, on_host: str | None, socket: str | None) -> None:
    """Render the edited config, install it, and restart only what changed, in an order that
    keeps serving.

    \b
    The flow:
      1. render the config and compare it with the bundle in --output (the running one);
         for each unit, why it changes: its unit file, environment, argv, or the runtime
      2. print the plan: the steps, which pairs lose capacity in each, whether serving
         stops at any moment (--dry-run stops here; --json prints it as JSON)
      3. keep the running bundle and config in OUTPUT/.pdsvc-previous/, write the new
         bundle, install it with install.sh (a daemon-reload; nothing restarts yet)
      4. each step, one at a time, progress on stderr: the engine leaves the router, its
         in-flight requests finish (--drain-timeout), systemctl restart, then wait until it
         is healthy, registered again and its pairs' canary is good; the router goes last
    \b
    Changes old and new engines cannot pair across (--page-size, --kv-cache-dtype, the KV
    layout, the model, the transfer backend) never meet: with two or more engines of each
    role they roll as two halves (half A restarts out of the router while B serves, then
    the router switches from B to A, then B restarts and joins); with fewer, every pair
    they touch restarts in one step and serving stops. So does any step of a deployment
    with one engine of a role (1P1D), and a router restart; apply then asks first (--yes:
    do not ask). A failed step stops the rollout, leaves the rest as it was, and prints
    the one command that goes back.
    \b
    Example: raise decode's max running requests on a 2P2D stack
      $EDITOR etc/pdsvc.yaml          # decode: args: {max-running-requests: 64}
      pdsvc apply --dry-run           # 2 steps, one decode each; serving never stops
      sudo pdsvc apply                # and if a step fails:
      sudo pdsvc apply --rollback     # the previous bundle, the same way
    """
    if rollback:
        files, config_path = previous_files(output)
        if not files:
            raise ConfigError(f"{output / PREVIOUS}: no previous bundle kept here",
                              hint="apply keeps one when it installs a new bundle")
        if not config_path.is_file():
            raise ConfigError(f"{config_path}: the previous config was not kept (the bundle "
                              "came from `pdsvc render` and its config was edited since)",
                              hint="restore that config and run pdsvc apply -c IT")
        origin_config = previous_origin_config(output, config_path)
    else:
        plan = load_plan(config_path, sysfs_root, topology_file)
        if plan.format not in ("systemd", "supervisord"):
            raise ConfigError(f"{config_path}: format is {plan.format}; pdsvc apply rolls out "
                              "systemd and supervisord bundles",
                              hint="Kubernetes rolls its own: kubectl apply -k")
        warn_plan(plan)
        files = render_for(plan, canonical_command(config_path, sysfs_root, topology_file))
        origin_config = config_path
    old = read_bundle(output)
    if not bundle_units(old):
        raise ConfigError(f"{output}: no rendered bundle here to compare with",
                          hint="the first time: pdsvc render && sudo ./install.sh "
                          "--start; later: pdsvc apply")
    new = as_bundle(files)
    rollout = plan_apply(old, new)
    hosts = hosts_of(new)
    if on_host and on_host not in hosts:
        raise ConfigError(f"--host {on_host}: not a host of this deployment",
                          hint=f"one of: {', '.join(hosts)}" if hosts else "drop --host")
    same_files = {p: t for p, t in old.items() if p in new} == new and old.keys() <= new.keys()
    bounds = _bound_options(drain_timeout, step_timeout)
    base = apply_command(None if rollback else config_path, output, topology=topology_file,
                         sysfs_root=sysfs_root, options=bounds)
    sequence = host_commands(rollout, base) if hosts else []
    back = _going_back(output, on_host, sequence)
    if as_json:
        doc = {"format": "pdsvc-apply/1", "output": str(output), "dry_run": dry_run,
               "manager": manager_name(new), **rollout.to_dict()}
        if hosts:
            doc["hosts"] = [{"host": h, "steps": n, "command": c} for h, n, c in sequence]
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_rollout(rollout))
        for line in format_hosts(sequence):
            click.echo(line)
    if dry_run:
        return
    if hosts and not on_host:
        raise ConfigError(f"{config_path}: a deployment over several hosts: pdsvc apply runs "
                          "one host's steps where it runs (no remote execution)",
                          hint="run the commands above on each host, in that order "
                          "(--dry-run prints them)")
    if rollout.nothing_to_do and same_files:
        _say("pdsvc apply: nothing to do")
        return
    if rollout.outage and not yes:
        _confirm_outage(rollout)
    _install(files, output, config_path, origin_config, old, force, rollback, on_host,
             manager_name(new), back)
    units = bundle_units(new)
    host = LocalHost()
    mine = host_steps(rollout, on_host) if on_host else list(enumerate(rollout.steps, 1))
    executor = Executor(units, host, Bounds(drain_timeout, step_timeout), _say,
                        make_manager(new, on_host, host, output, socket))
    total = len(rollout.steps)
    if on_host:
        _say(f"pdsvc apply: on {on_host}: steps {', '.join(str(i) for i, _ in mine) or 'none'}"
             f" of {total}")
    executor.lease.start()  # renews every hold while apply runs (pdsvc/apply/lease.py)
    try:
        _run_steps(executor, mine, total, back)
    finally:  # never leave a hold behind: failed, interrupted (Ctrl-C) or done
        executor.lease.stop()
        released = executor.release_all()
        if released:
            _say(f"pdsvc apply: released the hold on {', '.join(released)}")
    if not rollback:
        save_applied(output, Path(config_path).read_bytes())
    done = f"steps {', '.join(str(i) for i, _ in mine) or 'none'} of {total}" if on_host \
        else f"{total} steps"
    _say(f"pdsvc apply: applied ({done}); the previous bundle is in "
         f"{shown(output / PREVIOUS)} (to go back: {back})")
    following = next_host(sequence, on_host) if on_host else None
    if following:
        host_, steps_, command = following
        _say(f"pdsvc apply: next, on {host_} (steps {', '.join(map(str, steps_))}): {command}")


def _bound_options(drain_timeout: float, step_timeout: float) -> tuple[str, ...]:
    """The bounds given on this command line that each host's command repeats (defaults are
    left out)."""
    out: list[str] = []
    for flag, value, default in (("--drain-timeout", drain_timeout, DRAIN_SECS),
                                 ("--step-timeout", step_timeout, STEP_SECS)):
        if value != default:
            out += [flag, f"{value:g}"]
    return tuple(out)


def _run_steps(executor: Executor, mine: list, total: int, back: str) -> None:
    for i, step in mine:
        _say(f"pdsvc apply: step {i}/{total}: {step.action} {', '.join(step.units)}"
             + (f" (with {', '.join(step.takes)})" if step.takes else ""))
        try:
            secs = executor.run_step(step)
        except StepFailed as e:
            left = [u for _, s in mine if _ > i for u in s.units]
            _say(f"pdsvc apply: step {i}/{total} failed: {e}")
            if left:
                _say(f"pdsvc apply: stopped; not restarted (still the previous definition): "
                     f"{', '.join(left)}")
            _say(f"pdsvc apply: to go back: {back}")
            sys.exit(1)
        _say(f"pdsvc apply: step {i}/{total} done in {secs:.1f} s")


def render_for(plan: Plan, command: str) -> list[File]:
    """The bundle `pdsvc render` writes for this plan (one per host with `hosts:`)."""
    if plan.format == "supervisord":
        from pdsvc.render.supervisord import render_supervisord
        return per_host(plan, command, lambda p: render_supervisord(p, command))
    return per_host(plan, command, lambda p: render_systemd(p, command))


def _confirm_outage(rollout: Rollout) -> None:
    steps = ", ".join(f"{rollout.steps.index(s) + 1} ({s.action} {', '.join(s.units)})"
                      for s in rollout.outage)
    _say(f"pdsvc apply: serving stops during step {steps}: requests fail until the engines "
         "are loaded again (their load time) or the router is back")
    if not sys.stdin.isatty():
        _say("pdsvc apply: not confirmed (no terminal): pass --yes to accept the outage")
        sys.exit(DECLINED)
    if not click.confirm("Go ahead?", default=False, err=True):
        _say("pdsvc apply: declined; nothing changed")
        sys.exit(DECLINED)


def _install(files: list[File], output: Path, config: Path, origin: Path,
             old: dict[str, str], force: bool, rollback: bool, on_host: str | None,
             manager: str, back: str) -> None:
    """Keep the running bundle, write the new one (recorded as `origin`'s), install it (no
    restart): install.sh for systemd (this host's bundle of several); a supervisord bundle
    runs where it lies, and its supervisord re-reads it at each step."""
    script = install_script()
    if script is None and manager == "systemd":
        raise OutputError("install.sh not found beside pdsvc", hint="run from a pdsvc checkout")
    previous_config = running_config(output, old, config) if not rollback else None
    if rollback:  # the config the bundle comes back with: becomes the applied one first
        save_applied(output, config.read_bytes())
        config = output / ".pdsvc-applied.yaml"
    else:
        keep_previous(output, previous_config)
        if previous_config is None:
            _say(f"pdsvc apply: note: the config of the running bundle is not kept (edited "
                 f"since it was rendered): --rollback will need it in "
                 f"{shown(output / PREVIOUS)}/config.yaml")
    # a rollback's bundle comes from another config file than the one its record names
    write_bundle(files, output, origin=Origin(manager, origin), force=force or rollback)
    if manager != "systemd" or script is None:
        _say(f"pdsvc apply: wrote {shown(output)}; supervisord re-reads it at each step")
        return
    bundle = output / on_host if on_host else output
    _say(f"pdsvc apply: installing {shown(bundle)} "
         f"({shlex.join([str(script), '--bundle', str(bundle)])})")
    rc, lines = install(script, bundle, config, force=force)
    for line in lines:
        _say(f"  {line}")
    if rc != 0:
        _say(f"pdsvc apply: install.sh failed ({rc}); no unit was restarted. To go back: "
             f"{back}")
        sys.exit(1)
