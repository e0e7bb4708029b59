"""`pdsvc tune`: the click command (thin: the space file and the config → candidates, checked;
--dry-run prints them; else the search (pdsvc/tune/search.py) on the running deployment
(pdsvc/tune/live.py), its results kept (store.py), its answer printed (report.py))."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from pdsvc.apply.bounds import DRAIN_SECS, STEP_SECS
from pdsvc.cli.kit import (
    DEFAULT_OUTPUT,
    canonical_command,
    config_option,
    handle_errors,
    host_topology,
    json_option,
    load_plan,
    read_config_text,
    sysfs_option,
    topology_option,
)
from pdsvc.cli.render import install_script
from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan
from pdsvc.profile.options import CannotProfile
from pdsvc.render.hosts_bundle import render_for
from pdsvc.status import runstate
from pdsvc.tune import profiled, report
from pdsvc.tune.check import (
    SETTLE_S,
    Checked,
    Checker,
    bisect_runs,
    engine_loads,
    total_seconds,
)
from pdsvc.tune.live import Live
from pdsvc.tune.search import Answer, Limits, Tuner
from pdsvc.tune.space import Space, candidates, parse_space
from pdsvc.tune.store import Measurement, Store, results_key, write_atomic

TUNE_PLAN_SCHEMA = "pdsvc-tune-plan/1"
PROFILE_PLAN = ("--profile: the baseline's decode captured once it is measured, the best's "
                "once the deployment ends on it, each as `sudo pdsvc profile` captures it (its "
                "own load at the workload's lengths until the batches are full, then the "
                "steps and the engines' trace writes): minutes more, not in the estimate")
#: how long tune waits for an engine that does not answer /health yet (one restarting)
OWNS_WAIT_S = 60.0
TUNE_EPILOG = """\b
Examples:
  pdsvc tune --dry-run                          the seed's space: etc/tune.yaml beside the config
  pdsvc tune --dry-run --space my-space.yaml    another one
  pdsvc tune --dry-run --max-time 7200          the candidates that fit in two hours
  sudo pdsvc tune                               measure them on the running deployment
  sudo pdsvc tune --keep-current                measure, and end on the current config
  sudo pdsvc tune --profile                     and the decode's breakdown of the
                                                baseline and of the answer side by side

\b
A candidate is refused (skipped, with the reason, nothing restarts) when the schema or the
pairing check refuses its config or its plan does not fit the host; one whose switch stops
serving (a pair-incompatible change on 1P1D) is skipped unless --allow-outage.

\b
Each candidate: written to RESULTS/KEY/configs/, switched to with the flow of pdsvc apply
(engine by engine, serving throughout), its pairs proven, then the SLO search of pdsvc
bench --slo. One that fails to start (or whose runs are invalid) is recorded with the
engine's own last error line, and the deployment goes back to the last good config first.
Ctrl-C, SIGTERM or a lost session (SIGHUP) end the running measurement and go back to the
last good config; what was measured is kept: the same command again measures only what is
missing (KEY: the space, the config and the host).

\b
Exit codes: 0 an answer (also "no candidate beats the current config") · 1 the baseline
            cannot be measured, or going back failed · 2 bad space, config or usage ·
            3 the plan does not fit the host, the router does not serve this config's
            deployment, or --profile not as root · 130 interrupted (back on the last good
            config). A --profile capture that fails is said in the answer; the exit code
            is the measurement's.
"""


def _duration(seconds: float) -> str:
    """A duration as read: "1 h 05 min", "12 min", "40 s" (under a minute)."""
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


@click.command("tune", epilog=TUNE_EPILOG,
               context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@sysfs_option
@topology_option
@click.option("--space", "space_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="The search space (levers, SLO, workload). Default: tune.yaml "
              "beside the config (etc/tune.yaml for the seed).")
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_OUTPUT, show_default=True,
              help="The bundle directory of the running deployment (as pdsvc apply's).")
@click.option("--results", type=click.Path(file_okay=False, path_type=Path),
              default=Path("pdsvc-tune"), show_default=True,
              help="Where the measurements are kept (RESULTS/KEY/), and the answer.")
@click.option("--dry-run", is_flag=True, help="List the candidates, each checked, and the "
              "estimated time; nothing restarts.")
@click.option("--allow-outage", is_flag=True, help="Measure candidates whose switch stops "
              "serving too.")
@click.option("--keep-current", is_flag=True, help="End on the current config, whatever "
              "wins (the best is still written as a file).")
@click.option("--max-candidates", type=click.IntRange(min=1), default=None,
              help="Measure at most this many candidates besides the baseline (in order).")
@click.option("--max-time", "max_time", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Measure only the candidates that fit in this many seconds "
              "(the estimate; measuring: from the start of this run).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=DRAIN_SECS,
              show_default=True, metavar="SECS", help="As pdsvc apply's.")
@click.option("--step-timeout", type=click.FloatRange(min=1), default=STEP_SECS,
              show_default=True, metavar="SECS", help="As pdsvc apply's: how long a restarted "
              "engine may take to serve; past it the candidate has failed.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the units' runtimes keep their state (default: the plan's).")
@click.option("--profile", is_flag=True, help="Also capture the decode of the baseline and "
              "of the answer as `pdsvc profile` does, and put the breakdowns side by side: "
              "did the winning config move the bottleneck, or only the lever?")
@json_option
@handle_errors
def tune(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
         space_path: Path | None, output: Path, results: Path, dry_run: bool,
         allow_outage: bool, keep_current: bool, max_candidates: int | None,
         max_time: float | None, drain_timeout: float, step_timeout: float,
         state_dir: Path | None, profile: bool, as_json: bool) -> None:
    """Find the config that serves the most at your SLO on this host, measured on the
    running deployment while it serves: the candidates of a search space (levers of the
    config and the values to try), each checked against the schema and the pairing check
    before anything restarts, switched to engine by engine, measured by the SLO search; the
    baseline and the best three times (repeats confirm where the first ended), the best
    winning only when its lowest goodput is apart from the baseline's highest.
    """
    path = space_path or config_path.parent / "tune.yaml"
    try:
        space_text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--space {path}: cannot read it ({e.strerror}); write one like "
                          "etc/tune.yaml") from None
    space = parse_space(space_text, str(path))
    text = read_config_text(config_path)
    topology = host_topology(sysfs_root, topology_file)
    loaded = measured_load(load_plan(config_path, sysfs_root, topology_file), state_dir)
    if loaded is not None:  # the estimate from what this host's engines took, not a guess
        space = dataclasses.replace(space, engine_load_secs=loaded[1])
    command = canonical_command(config_path, sysfs_root, topology_file)
    checker = Checker(space, text, str(config_path), topology,
                      lambda p: {f.path: f.content for f in render_for(p, command)})
    checked = [checker.check(c) for c in candidates(space, checker.base_data)]
    if dry_run:
        kept = _bounded(checked, space, allow_outage, max_candidates, max_time)
        if as_json:
            click.echo(json.dumps(_document(space, checked, kept), indent=1))
            return
        _print(space, checked, kept, allow_outage, loaded)
        if profile:
            click.echo(PROFILE_PLAN)
        return
    if profile and os.geteuid() != 0:
        raise CannotProfile("--profile writes profile holds and reads the engines' traces: "
                            "run pdsvc tune as root",
                            hint=f"sudo {shlex.join(['pdsvc', *sys.argv[1:]])}")
    base_plan = load_plan(config_path, sysfs_root, topology_file)
    _refuse(base_plan, config_path)
    host = f"{socket.gethostname()} {topology.to_json()}"
    store = Store(results / results_key(space_text, text, host),
                  {"space": str(path), "config": str(config_path),
                   "host": socket.gethostname()})
    live = Live(space, output, config_path, lambda c: load_plan(c, sysfs_root, topology_file),
                lambda p: render_for(p, command), install_script(), sysfs_root, topology_file,
                drain_timeout, step_timeout, state_dir)
    limits = Limits(allow_outage, max_candidates, max_time, keep_current)
    click.echo(f"pdsvc tune: results in {store.directory} ({len(store.outcomes)} measured "
               "before)", err=True)
    with _signals_interrupt():
        answer = Tuner(space, checker, live, store, _say, limits,
                       profiler=live.profile if profile else None).run(checked)
    _answer(space, answer, store, checker, as_json, path, config_path)


def _say(line: str) -> None:
    """A progress line on stderr; none once stderr is gone (a lost session: EIO), so that the
    run still winds down: the capture waits for its trace, tune goes back."""
    with contextlib.suppress(OSError):
        click.echo(line, err=True)


def _refuse(plan: Plan, config_path: Path) -> None:
    """What tune cannot measure: a bundle pdsvc apply does not roll, several hosts, a router
    that does not serve this deployment."""
    from pdsvc.bench.target import foreign, target_from_plan
    from pdsvc.cli.bench import EXIT_CANNOT

    if plan.format not in ("systemd", "supervisord"):
        raise ConfigError(f"{config_path}: format is {plan.format}; pdsvc tune switches "
                          "systemd and supervisord deployments (as pdsvc apply)")
    if plan.hosts:
        raise ConfigError(f"{config_path}: a deployment over several hosts; pdsvc tune "
                          "switches one host's deployment",
                          hint="tune a one-host copy of it, then apply the answer per host")
    target = target_from_plan(plan)
    other = foreign(target)
    deadline = time.monotonic() + OWNS_WAIT_S
    if other is not None and other.engine_down:  # the router serves it: an engine restarts?
        _say(f"pdsvc tune: waiting up to {OWNS_WAIT_S:g} s: {other.why}")
        while other is not None and time.monotonic() < deadline:
            time.sleep(1)
            other = foreign(target)
    if other is not None:
        start = (f"systemctl start {plan.name}-pd.target" if plan.format == "systemd" else
                 "its supervisord")
        _say(f"pdsvc: error: not tuning: {other.why}; is the deployment of {config_path} "
             f"running? ({start})")
        raise SystemExit(EXIT_CANNOT)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a lost SSH session) end the search as Ctrl-C does: the running
    measurement dropped, the deployment back on the last good config. While it goes back,
    a second signal is said to wait, not obeyed."""
    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, _wait)
        signal.signal(signal.SIGTERM, _wait)
        signal.signal(signal.SIGHUP, _wait)
        raise KeyboardInterrupt

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s in old:
        signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _wait(signum: int, frame: object) -> None:
    _say("pdsvc tune: going back to the last good config; wait (it ends on its own)")


def _answer(space: Space, answer: Answer, store: Store, checker: Checker, as_json: bool,
            space_path: Path, config_path: Path) -> None:
    """The table or JSON on stdout, the plot and the best config written."""
    measured: dict[str, list[Measurement]] = {}
    for o in store.outcomes:
        measured.setdefault(o.name, []).append(o)
    for outs in measured.values():
        outs.sort(key=lambda o: o.repeat)
    best_path = store.directory / "best.yaml"
    write_atomic(best_path, report.best_config_text(
        checker.config_text, answer, space, space_path=space_path, config_path=config_path,
        host=socket.gethostname(), best_text=checker.text_of(answer.best)))
    plot_path = report.plot(space, answer, measured, store.directory / "tune.png")
    if as_json:
        doc = report.document(space, answer, measured, results=store.directory,
                              best_config=best_path, plot_path=plot_path)
        if answer.profiles:
            doc["profiles"] = profiled.document(answer.profiles, answer.unprofiled)
        click.echo(json.dumps(doc, indent=1))
        return
    for line in report.table(answer, measured):
        click.echo(line)
    click.echo(f"search: {answer.how}")
    click.echo(f"answer: {answer.verdict}")
    running = answer.running.name if answer.running else "?"
    for line in profiled.table(answer.profiles, answer.unprofiled):
        click.echo(line)
    click.echo(f"running now: {running}; best config: {best_path}")
    click.echo(f"plot: {plot_path}" if plot_path else
               "plot: not drawn (pip install 'pdsvc[plot]' for matplotlib)")
    if answer.wins and answer.running == answer.best:
        click.echo(f"to keep it as your config: cp {best_path} {config_path}")
    elif answer.wins:
        click.echo(f"to run it: pdsvc apply -c {best_path}")


def _bounded(checked: list[Checked], space: Space, allow_outage: bool, max_candidates: int | None,
             max_time: float | None) -> list[Checked]:
    """The candidates that would be measured: the baseline, then each `measure` one (and
    `outage` with --allow-outage), within --max-candidates and --max-time, in order."""
    kept = [checked[0]]
    for c in checked[1:]:
        if c.verdict == "refused" or (c.verdict == "outage" and not allow_outage):
            continue
        if max_candidates is not None and len(kept) > max_candidates:
            break
        if max_time is not None and total_seconds(space, [*kept, c]) > max_time:
            break
        kept.append(c)
    return kept


def _document(space: Space, checked: list[Checked], kept: list[Checked]) -> dict:
    names = {c.candidate.name for c in kept}
    return {"schema": TUNE_PLAN_SCHEMA, "search": space.strategy, "why": space.strategy_why,
            "slo": {"ttft_ms": space.ttft_ms, "itl_ms": space.itl_ms, "share": space.share},
            "runs_per_search": bisect_runs(space),
            "candidates": [{"name": c.candidate.name,
                            "changes": {p: v for p, v in c.candidate.changes},
                            "verdict": c.verdict, "why": c.why, "restarts": list(c.restarts),
                            "measured": c.candidate.name in names, "seconds": c.seconds}
                           for c in checked],
            "estimated_seconds": total_seconds(space, kept),
            "engine_loads": engine_loads(kept)}


def measured_load(plan: Plan, state_dir: Path | None) -> tuple[str, float] | None:
    """The slowest engine's load at its last start that served (its runtime's restart
    state), as (unit, seconds); None when no engine of the plan has one here (not running
    on this host, or never served)."""
    directory = state_dir or runstate.state_dir(
        plan, "supervisord" if plan.format == "supervisord" else "systemd")
    if not directory.is_dir():
        return None
    engines = {f"{e.name}.service" for e in plan.engines}
    took = [(r.unit, r.loaded_s) for r in runstate.unit_runs(plan, directory)
            if r.unit in engines and r.loaded_s is not None]
    return max(took, key=lambda x: x[1] or 0.0) if took else None


def _print(space: Space, checked: list[Checked], kept: list[Checked],
           allow_outage: bool, loaded: tuple[str, float] | None = None) -> None:
    names = {c.candidate.name for c in kept}
    click.echo(f"search: {space.strategy} ({space.strategy_why})")
    click.echo(f"SLO: TTFT ≤ {space.ttft_ms:g} ms and ITL ≤ {space.itl_ms:g} ms for "
               f"{space.share:.0%} of requests; {space.input_len}/{space.output_len} tokens, "
               f"{space.num_prompts} prompts a run; rates {space.rate_low:g}..{space.rate_high:g}"
               f" req/s to {space.precision:.0%}: {bisect_runs(space)} runs a search; a "
               "candidate is raced first at the rate to beat (one run if it loses there)")
    width = max(len(c.candidate.describe()) for c in checked)
    click.echo(f"  {'name':<9} {'changes':<{width}}  {'verdict':<9} restarts  est.")
    for c in checked:
        verdict = c.verdict if c.candidate.name in names or c.verdict not in (
            "measure", "outage" if allow_outage else "") else "cut"
        est = _duration(c.seconds) if c.candidate.name in names else "-"
        click.echo(f"  {c.candidate.name:<9} {c.candidate.describe():<{width}}  {verdict:<9} "
                   f"{len(c.restarts):>8}  {est}")
        if c.why:
            click.echo(f"  {'':<9} {c.why}")
    refused = sum(c.verdict == "refused" for c in checked)
    outage = sum(c.verdict == "outage" for c in checked)
    wanted = ("measure", "outage") if allow_outage else ("measure",)
    cut = sum(c.verdict in wanted and c.candidate.name not in names for c in checked)
    skipped = [f"{refused} refused",
               f"{outage} stop serving" + (" (measured: --allow-outage)" * allow_outage)]
    if cut:
        skipped.append(f"{cut} cut by --max-candidates/--max-time")
    loads = engine_loads(kept)
    click.echo(f"{len(kept) - 1} of {len(checked) - 1} candidates to measure "
               f"({', '.join(skipped)}); estimated {_duration(total_seconds(space, kept))}, "
               f"{_duration(loads * space.engine_load_secs)} of it {loads} engine loads "
               f"one after another ({space.engine_load_secs:.0f} s each, "
               + (f"measured: {loaded[0]}'s last start, the slowest)" if loaded
                  else "from the space file: no engine of this config has served here yet)"))
    if outage and not allow_outage:
        more = [c for c in checked if c.verdict != "refused"]
        click.echo(f"with --allow-outage: {len(more) - 1} to measure, estimated "
                   f"{_duration(total_seconds(space, more))}; each of the {outage} that stop "
                   f"serving is an outage of about one engine load "
                   f"({_duration(space.engine_load_secs + SETTLE_S)})")
