"""The `pdsvc apply` command: render the edited config (or take the kept previous bundle for
--rollback) and hand it to the rollout's flow (pdsvc/apply/flow.py), which shows the plan,
installs, then restarts only what changed, one step at a time."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pdsvc.apply.bounds import DRAIN_SECS, STEP_SECS
from pdsvc.apply.bundles import PREVIOUS, previous_files, previous_origin_config
from pdsvc.apply.events import ApplyEvent, words
from pdsvc.apply.flow import Options, Source, apply_rollout
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
from pdsvc.cli.render import install_script, shown
from pdsvc.errors import ConfigError
from pdsvc.render.hosts_bundle import render_for

APPLY_EPILOG = """\b
Exit codes: 0 applied, or nothing to do · 1 the install or a step failed (the rollout
            stopped there; the one command that goes back is printed) · 2 bad config or
            usage · 3 serving would stop and that was declined (or not confirmed: --yes)
"""


class _Terminal:
    """The flow's Frontend: the plan on stdout, progress on stderr, questions on a terminal."""

    def echo(self, text: str) -> None:
        click.echo(text)

    def say(self, text: str) -> None:
        click.echo(text, err=True)

    def event(self, e: ApplyEvent) -> None:
        self.say(f"pdsvc apply: {words(e)}")

    def confirm(self, question: str) -> bool | None:
        if not sys.stdin.isatty():
            return None
        return click.confirm(question, default=False, err=True)

    def shown(self, path: Path) -> str:
        return shown(path)

    def installer(self) -> Path | None:
        return install_script()


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
        source = _previous(output)
    else:
        plan = load_plan(config_path, sysfs_root, topology_file)
        if plan.format not in ("systemd", "supervisord"):
            raise ConfigError(f"{config_path}: format is {plan.format}; pdsvc apply rolls out "
                              "systemd and supervisord bundles",
                              hint="Kubernetes rolls its own: kubectl apply -k")
        warn_plan(plan)
        files = render_for(plan, canonical_command(config_path, sysfs_root, topology_file))
        source = Source(files, config_path, config_path)
    options = Options(output, sysfs_root=sysfs_root, topology=topology_file, dry_run=dry_run,
                      as_json=as_json, yes=yes, drain_secs=drain_timeout, step_secs=step_timeout,
                      force=force, rollback=rollback, on_host=on_host, socket=socket)
    code = apply_rollout(options, source, _Terminal())
    if code:
        sys.exit(code)


def _previous(output: Path) -> Source:
    """The bundle and config the last apply kept in OUTPUT/.pdsvc-previous/ (--rollback)."""
    files, config_path = previous_files(output)
    if not files:
        raise ConfigError(f"{output / PREVIOUS}: no previous bundle kept here",
                          hint="apply keeps one when it installs a new bundle")
    if not config_path.is_file():
        raise ConfigError(f"{config_path}: the previous config was not kept (the bundle "
                          "came from `pdsvc render` and its config was edited since)",
                          hint="restore that config and run pdsvc apply -c IT")
    return Source(files, config_path, previous_origin_config(output, config_path))

