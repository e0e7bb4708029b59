"""`pdsvc validate`: check the config and that its plan fits the host; write nothing."""

from __future__ import annotations

from pathlib import Path

import click

from pdsvc.cli.kit import (
    emit_json,
    load_plan,
    plan_command,
    warn_plan,
)


@plan_command()
def validate(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
             as_json: bool) -> None:
    """Check the config and that its plan fits the host; write nothing."""
    plan = load_plan(config_path, sysfs_root, topology_file)
    if as_json:
        emit_json("validate", ok=True, config=str(config_path),
                   topology=plan.topology_source, units=list(plan.units),
                   warnings=list(plan.warnings))
        return
    warn_plan(plan)
    click.echo(f"ok: {config_path} fits {plan.topology_source} ({len(plan.units)} units)")
