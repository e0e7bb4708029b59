"""The pdsvc command line: the click group. Each command is a module of its own in pdsvc/cli/
(render, validate, plan, topology, doctor, status, bench, apply); the options and loaders they
share are pdsvc/cli/kit.py. Thin: parse options, call the core, map errors to exit codes.

Exit codes: 0 ok · 1 could not write output · 2 bad config or usage · 3 the plan does not fit
the host's topology (or the topology is unknown).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import click

from pdsvc import __version__
from pdsvc.cli.kit import (
    EPILOG,
    no_color,
    usage_error_line,
)


class _Commands(click.Group):
    """Each command lives in a module of its own (pdsvc/cli/NAME.py), imported when it is run
    or listed: doctor and status are most of pdsvc's code, and a render needs neither."""

    LAZY = {name: (f"pdsvc.cli.{module}", attr) for name, module, attr in (
        ("apply", "apply", "apply"), ("bench", "bench", "bench"), ("doctor", "doctor", "doctor"),
        ("plan", "plan", "plan_cmd"), ("profile", "profile", "profile"),
        ("render", "render", "render"),
        ("status", "status", "status"), ("topology", "topology", "topology"),
        ("tune", "tune", "tune"), ("validate", "validate", "validate"))}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            module, attr = self.LAZY[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        """As click's, but every usage error is one line (click's own are three, with the
        usage and a "Try" line), and NO_COLOR turns colour off."""
        if no_color():
            extra.setdefault("color", False)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
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


__all__ = ["main"]


if __name__ == "__main__":
    main()
