"""`pdsvc tune`: the click command (thin: the space file and the config → candidates, checked
→ a table or JSON). So far --dry-run only: measuring the candidates is the next step."""

from __future__ import annotations

import json
from pathlib import Path

import click
import yaml

from pdsvc.cli.kit import (
    EPILOG,
    config_option,
    handle_errors,
    host_topology,
    json_option,
    read_config_text,
    sysfs_option,
    topology_option,
)
from pdsvc.cli.render import per_host
from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan
from pdsvc.tune.check import Checked, bisect_runs, check, total_seconds
from pdsvc.tune.space import Space, candidates, parse_space

TUNE_SCHEMA = "pdsvc-tune-plan/1"
TUNE_EPILOG = """\b
Examples:
  pdsvc tune --dry-run                          the seed's space: etc/tune.yaml beside the config
  pdsvc tune --dry-run --space my-space.yaml    another one
  pdsvc tune --dry-run --max-time 7200          the candidates that fit in two hours

\b
A candidate is refused (skipped, with the reason, nothing restarts) when the schema or the
pairing check refuses its config or its plan does not fit the host; one whose switch stops
serving (a pair-incompatible change on 1P1D) is skipped unless --allow-outage.
""" + EPILOG


def bundle_of(plan: Plan) -> dict[str, str]:
    """The bundle `pdsvc apply` would install for a plan (its rollout is compared)."""
    if plan.format == "supervisord":
        from pdsvc.render.supervisord import render_supervisord
        files = per_host(plan, "pdsvc tune", lambda p: render_supervisord(p, "pdsvc tune"))
    else:
        from pdsvc.render.systemd import render_systemd
        files = per_host(plan, "pdsvc tune", lambda p: render_systemd(p, "pdsvc tune"))
    return {f.path: f.content for f in files}


def _duration(seconds: float) -> str:
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
@click.option("--dry-run", is_flag=True, help="List the candidates, each checked, and the "
              "estimated time; nothing restarts.")
@click.option("--allow-outage", is_flag=True, help="Measure candidates whose switch stops "
              "serving too.")
@click.option("--max-candidates", type=click.IntRange(min=1), default=None,
              help="Measure at most this many candidates besides the baseline (in order).")
@click.option("--max-time", "max_time", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Measure only the candidates that fit in this many seconds "
              "(the estimate), in order.")
@json_option
@handle_errors
def tune(config_path: Path, sysfs_root: Path | None, topology_file: Path | None,
         space_path: Path | None, dry_run: bool, allow_outage: bool,
         max_candidates: int | None, max_time: float | None, as_json: bool) -> None:
    """Find the config that serves the most at your SLO on this host: the candidates of a
    search space (levers of the config and the values to try), each checked against the
    schema and the pairing check before anything restarts, the baseline and the best measured
    three times. So far --dry-run: the candidates, their verdicts and the time it would take.
    """
    if not dry_run:
        raise click.UsageError("only --dry-run is built so far: it lists and checks the "
                               "candidates and estimates the time (measuring them is next)")
    path = space_path or config_path.parent / "tune.yaml"
    try:
        space_text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--space {path}: cannot read it ({e.strerror}); write one like "
                          "etc/tune.yaml") from None
    space = parse_space(space_text, str(path))
    text = read_config_text(config_path)
    base = yaml.safe_load(text) or {}
    found = candidates(space, base)
    checked = check(space, found, text, str(config_path),
                    host_topology(sysfs_root, topology_file), bundle_of)
    kept = _bounded(checked, space, allow_outage, max_candidates, max_time)
    if as_json:
        click.echo(json.dumps(_document(space, checked, kept), indent=1))
        return
    _print(space, checked, kept, allow_outage)


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
    return {"schema": TUNE_SCHEMA, "search": space.strategy, "why": space.strategy_why,
            "slo": {"ttft_ms": space.ttft_ms, "itl_ms": space.itl_ms, "share": space.share},
            "runs_per_search": bisect_runs(space),
            "candidates": [{"name": c.candidate.name,
                            "changes": {p: v for p, v in c.candidate.changes},
                            "verdict": c.verdict, "why": c.why, "restarts": list(c.restarts),
                            "measured": c.candidate.name in names, "seconds": c.seconds}
                           for c in checked],
            "estimated_seconds": total_seconds(space, kept)}


def _print(space: Space, checked: list[Checked], kept: list[Checked],
           allow_outage: bool) -> None:
    names = {c.candidate.name for c in kept}
    click.echo(f"search: {space.strategy} ({space.strategy_why})")
    click.echo(f"SLO: TTFT ≤ {space.ttft_ms:g} ms and ITL ≤ {space.itl_ms:g} ms for "
               f"{space.share:.0%} of requests; {space.input_len}/{space.output_len} tokens, "
               f"{space.num_prompts} prompts a run; rates {space.rate_low:g}..{space.rate_high:g}"
               f" req/s to {space.precision:.0%}: {bisect_runs(space)} runs a search")
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
    click.echo(f"{len(kept) - 1} of {len(checked) - 1} candidates to measure "
               f"({', '.join(skipped)}); estimated {_duration(total_seconds(space, kept))} "
               f"(engine load {space.engine_load_secs:g} s, from the space file)")
