"""The `pdsvc status` command: load the host's plan, collect and judge (pdsvc.status),
print text, JSON or Prometheus text, once or every few seconds."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from time import sleep

import click

from pdsvc.cli.kit import (
    config_option,
    handle_errors,
    host_option,
    json_option,
    load_host_plan_anyway,
    sysfs_option,
    topology_option,
)
from pdsvc.status import runstate
from pdsvc.status.collect import collect
from pdsvc.status.format import format_text, report_dict
from pdsvc.status.managers import make_backend

CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase the screen
STATUS_EPILOG = """\b
Exit codes: 0 serving (every unit active, router /readiness 200), 1 not serving,
            2 bad config or usage. A plan that does not fit the host's topology (a GPU
            fell off the bus) is one more finding: the units are shown all the same.
"""
BACKENDS = ("auto", "systemd", "supervisord")


def watch(interval: float, frame: Callable[[], tuple[str, int]], *, clear: bool) -> int:
    """Print a frame every `interval` seconds until Ctrl-C; the exit code of the last one."""
    code = 1
    try:
        while True:
            text, code = frame()
            if clear:  # only on a terminal: piped frames stay a readable log
                click.echo(CLEAR_SCREEN, nl=False, color=True)  # color: keep the escape
            click.echo(text)
            sleep(interval)  # looked up at call time: the tests replace it
    except KeyboardInterrupt:
        return code


@click.command(epilog=STATUS_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@sysfs_option
@topology_option
@json_option
@click.option("--watch", "watch_secs", type=click.FloatRange(min=0.1), is_flag=False,
              flag_value=2.0, default=None, metavar="[SECONDS]",
              help="Refresh every SECONDS (default 2) until Ctrl-C.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="The service manager to ask: systemd (the units) or supervisord (the "
              "supervisord bundle); auto: the one the config's `format` renders for.")
@click.option("--systemctl", "systemctl", default="systemctl", show_default=True, metavar="PATH",
              help="The systemctl to ask.")
@click.option("--socket", "socket_path", default=None, metavar="PATH",
              help="supervisord's control socket (implies --backend supervisord under auto). "
              "Default: {supervisord.run_dir}/{name}-supervisord.sock, as the bundle has it.")
@click.option("--metrics", "as_metrics", is_flag=True,
              help="Print pdsvc's own state as Prometheus text instead (the pdsvc_* series "
              "the runtimes write for node_exporter, from the same state files).")
@host_option
@handle_errors
def status(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
           as_json: bool, watch_secs: float | None, backend: str, systemctl: str,
           socket_path: str | None, host_name: str | None, as_metrics: bool = False) -> None:
    """Show whether the stack serves: each unit's state, uptime and restarts, each engine's
    /health, the router's /readiness and its view of the workers, the URL to send requests to,
    and a verdict (`serving` / `not serving: why`).

    With --json the same facts as one JSON document (one line per frame with --watch).

    Under supervisord the first row is the supervisord that runs the bundle, NAME-supervisord,
    with how many of its programs run (there is no target), and RESTARTS is `-`: supervisord
    does not count restarts.
    """
    whole, plan, misfit = load_host_plan_anyway(config_path, sysfs_root, topology_file,
                                                host_name)
    findings = (f"the plan does not fit this host: {misfit}",) if misfit else ()
    manager = make_backend(plan, backend, systemctl=systemctl, socket_path=socket_path)
    hostname = socket.gethostname()

    def frame() -> tuple[str, int]:
        report = collect(plan, manager, hostname=hostname, whole=whole, findings=findings)
        code = 0 if report.serving else 1
        if as_metrics:
            up = {v.state.unit: v.state.state == "active" for v in report.units}
            where = runstate.state_dir(plan, manager.name)
            return runstate.metrics_text(plan, where, up, time.time()).rstrip("\n"), code
        if as_json:
            doc = report_dict(report)
            return json.dumps(doc) if watch_secs else json.dumps(doc, indent=2), code
        text = format_text(report)
        if watch_secs:
            stamp = time.strftime("%H:%M:%S")
            text = f"{stamp}  every {watch_secs:g}s, Ctrl-C stops\n{text}\n"
        return text, code

    if watch_secs is None:
        text, code = frame()
        click.echo(text)
    else:
        code = watch(watch_secs, frame, clear=sys.stdout.isatty())
    sys.exit(code)


if __name__ == "__main__":  # `python -m pdsvc.cli.status …`: the command alone (no render deps)
    status()
