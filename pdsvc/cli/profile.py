"""`pdsvc profile`: the click command (thin: options -> ProfileOptions -> profile/run.py ->
the table, --json, --plot)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from pdsvc.cli.kit import (
    config_option,
    handle_errors,
    host_option,
    json_option,
    load_host_plan,
    sysfs_option,
    topology_option,
)
from pdsvc.profile import capture, report
from pdsvc.profile.engines import select
from pdsvc.profile.load import Background, load_of
from pdsvc.profile.options import MAX_WRITE_TIMEOUT_S, CannotProfile, ProfileOptions
from pdsvc.profile.result import ProfileRun
from pdsvc.profile.run import Run, on_this_host, profile_running
from pdsvc.ship.runtime.hold import hold_path
from pdsvc.ship.runtime.timings import PROFILE_HOLD_MAX_S

D = {f.name: f.default for f in fields(ProfileOptions)}

PROFILE_EPILOG = f"""\b
Examples:
  sudo pdsvc profile                         the decode engines, {D['steps']} steps, under a
                                             load that fills their batches
  sudo pdsvc profile --role both             prefill, then decode
  sudo pdsvc profile --engine dsv4-decode-1  one engine
  sudo pdsvc profile --no-load               live traffic only, no load of pdsvc's
  pdsvc profile --dry-run                    what it would run, hold and ask; nothing runs

\b
What it does: drives SGLang's bench_serving through the router (as `pdsvc bench`) until
every batch is full (the engine's /metrics say how it knows), measures each engine's tok/s,
puts the engines under a profile hold (their runtimes do not judge them hung and the routers
do not health-check them while they freeze to write their traces; no request fails), asks
each engine directly for N steps of GPU activity, waits for one whole trace per TP rank
under STATE_DIR/profiles/RUN/, then prints where the GPU time goes, per role, and how fast
the role could go if its top kernel or group were faster.

\b
Exit codes: 0 the breakdown; 1 a capture failed (an engine refused it, a trace not whole
            within --write-timeout, a trace without GPU activity); 2 bad config or usage
            (no engine of the role on this host); 3 cannot run (not root, the router or an
            engine does not answer, a runtime that does not take the hold, another profile
            or an apply in the way); 130 interrupted (no engine left profiling or held).
"""


@contextmanager
def stops_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP (a lost terminal) end the run as Ctrl-C does: cleanly."""
    def interrupt(signo: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def say(msg: str) -> None:
    """A progress line on stderr; none once stderr is gone (a terminal hung up: EIO), so
    that a lost session still winds the run down."""
    with suppress(OSError):
        click.echo(msg, err=True)


def _roles(ctx: click.Context | None, param: object, value: str) -> tuple[str, ...]:
    return ("prefill", "decode") if value == "both" else (value,)


def _activities(ctx: click.Context | None, param: object, value: str) -> tuple[str, ...]:
    got = tuple(a.strip().upper() for a in value.split(",") if a.strip())
    if not got or set(got) - {"GPU", "CPU"}:
        raise click.BadParameter(f"{value!r}: GPU, CPU or GPU,CPU")
    return got


@click.command(epilog=PROFILE_EPILOG)
@config_option
@sysfs_option
@topology_option
@host_option
@click.option("--role", "roles", type=click.Choice(["decode", "prefill", "both"]),
              default="decode", show_default=True, callback=_roles,
              help="Which role's engines (both: prefill, then decode, one after the other: "
              "SGLang's profiler must see the two apart).")
@click.option("--engine", default=None, metavar="NAME",
              help="One engine of the role (its unit name, e.g. dsv4-decode-1); default: "
              "every engine of the role on this host, at once.")
@click.option("--steps", type=click.IntRange(1, 1000), default=D["steps"], show_default=True,
              help="Forward steps each engine records.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Requests in flight [default: what the decodes' batches hold: each one's "
              "max_running_requests or CUDA-graph batch, smallest, summed].")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Poisson arrivals at this rate (req/s) instead of a concurrency.")
@click.option("--input-len", type=click.IntRange(min=1), default=D["input_len"],
              show_default=True, help="Prompt tokens per request.")
@click.option("--output-len", type=click.IntRange(min=1), default=D["output_len"],
              show_default=True, help="Generated tokens per request.")
@click.option("--no-load", is_flag=True,
              help="Drive no load: capture whatever traffic the deployment serves.")
@click.option("--activities", default="GPU", show_default=True, callback=_activities,
              help="What each engine records: GPU (kernels, copies), CPU (Python ops; "
              "larger traces, a longer freeze).")
@click.option("--by-stage", is_flag=True,
              help="SGLang's profile_by_stage: count only the engine's own stage's steps (a "
              "PD decode's placeholder batches not). Refused under speculative decoding, where "
              "its window never ends; an armed by-stage capture cannot be cancelled.")
@click.option("--warmup-timeout", type=click.FloatRange(min=1), default=D["warmup_timeout"],
              show_default=True, help="Seconds for the batches to fill under the load.")
@click.option("--measure-secs", type=click.FloatRange(min=0.5), default=D["measure_secs"],
              show_default=True, help="Seconds the tok/s is measured over, before the capture.")
@click.option("--write-timeout", type=click.FloatRange(min=1, max=MAX_WRITE_TIMEOUT_S),
              default=D["write_timeout"], show_default=True,
              help="Seconds for every rank's trace to be whole once asked (the engine is "
              "frozen while it writes, under its hold; a runtime honours a hold "
              f"{PROFILE_HOLD_MAX_S:g} s at most).")
@click.option("--top", type=click.IntRange(min=1), default=D["top"], show_default=True,
              help="Kernels each role's table shows (--json holds them all).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also draw each role's top kernels to this PNG.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The runtimes' state directory (holds and their answers) [default: the "
              "plan's RuntimeDirectory=, or supervisord.state_dir].")
@click.option("--dry-run", is_flag=True, help="Print what would run; contact nothing.")
@json_option
@handle_errors
def profile(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
            host_name: str | None, roles: tuple[str, ...], engine: str | None, steps: int,
            concurrency: int | None, rate: float | None, input_len: int, output_len: int,
            no_load: bool, activities: tuple[str, ...], by_stage: bool, warmup_timeout: float,
            measure_secs: float, write_timeout: float, top: int, plot_path: Path | None,
            state_dir: Path | None, dry_run: bool, as_json: bool) -> None:
    """Where each role's GPU time goes on the running deployment, and how far a faster
    kernel could take it: a capture of N forward steps per engine, its traces kept, a
    breakdown printed (table, or --json)."""
    if concurrency is not None and rate is not None:
        raise click.UsageError("give --concurrency or --rate, not both")
    opts = ProfileOptions(roles, engine, steps, activities, by_stage, not no_load, concurrency,
                          rate, input_len, output_len, warmup_timeout, measure_secs,
                          write_timeout, top)
    whole, here = load_host_plan(config_path, sysfs_root, topology_file, host_name)
    run = on_this_host(whole, here, opts, say, state_dir)
    if dry_run:
        _dry_run(run)
        return
    if os.geteuid() != 0:
        raise CannotProfile(f"pdsvc profile writes holds into {run.state_dir} and reads the traces "
                            f"under {run.root.parent}: run it as root",
                            hint=f"sudo {shlex.join(['pdsvc', *sys.argv[1:]])}")
    with stops_as_interrupts():
        result = profile_running(run)
    _report(result, opts.top, plot_path, as_json, run.root)


def _report(result: ProfileRun, top: int, plot_path: Path | None, as_json: bool,
            root: Path) -> None:
    doc = report.document(result)
    drawn = report.plot(result, plot_path) if plot_path is not None else None
    if plot_path is not None and drawn is None:
        say("pdsvc profile: --plot: not drawn (pip install 'pdsvc[plot]' for matplotlib)")
    if as_json:
        click.echo(json.dumps({**doc, "plot": drawn}, indent=1))
        return
    for line in report.table(result, top):
        click.echo(line)
    click.echo(f"the breakdown as JSON: {root / 'profile.json'}" +
               (f"; the plot: {drawn}" if drawn else ""))


def _dry_run(run: Run) -> None:
    """What a run would load, hold and ask, from the plan alone (nothing is contacted)."""
    opts = run.opts
    for role in opts.roles:
        local, lines = select(run.whole, run.here, role, opts.engine)
        for line in lines:
            click.echo(f"# {line}")
        run.roles.update({role: local} if local else {})
    if opts.load:
        load = Background(run.target(), load_of(opts, run.concurrency()),
                          run.root / "bench_serving.log")
        click.echo(f"load: {load.command}")
    else:
        click.echo("load: none (--no-load): the live traffic")
    for role, engines in run.roles.items():
        for e in engines:
            body = capture.start_body(opts, str(run.root / e.name), run.run, opts.by_stage)
            click.echo(f"{role} {e.name} ({e.url}, TP{e.tp}):")
            click.echo(f"  hold: {hold_path(run.state_dir, e.name)} (profile {run.run}: "
                       "renewed every 5 s while the run lasts; its runtime honours it "
                       f"{PROFILE_HOLD_MAX_S:g} s at most)")
            click.echo(f"  POST {e.url}/start_profile {json.dumps(body)}")
            stage = f"-{'EXTEND' if role == 'prefill' else 'DECODE'}" if opts.by_stage else ""
            click.echo(f"  traces: {run.root / e.name}/pdsvc-{run.run}-TP-N{stage}"
                       f".trace.json.gz, N = 0..{e.tp - 1}")
