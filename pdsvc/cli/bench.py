"""`pdsvc bench`: the click command (thin: options → target, runs, gates → output)."""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import click

from pdsvc.bench import report
from pdsvc.bench.runner import RunResult, Slo
from pdsvc.bench.session import Session, state_dir_of
from pdsvc.bench.target import Load, Target, bench_argv, foreign, target_from_plan
from pdsvc.cli.kit import (
    config_option,
    handle_errors,
    json_option,
    load_host_plan_anyway,
    sysfs_option,
    topology_option,
)

BENCH_EPILOG = """\b
Examples:
  pdsvc bench --rate 4 --input-len 1024 --output-len 256     one load, one run
  pdsvc bench --rate 4 --repeat 3                            the same three times, with the spread
  pdsvc bench --slo ttft=2000,itl=50 --rate-range 0.5:32     the highest rate at which 99 % of
                                                             requests have TTFT ≤ 2 s, ITL ≤ 50 ms
  pdsvc bench --dry-run                                      print the bench_serving command only

\b
A run is reported as valid only when every gate holds: every successful request produced
tokens; at most --max-error-rate of requests failed; the engines' KV transfer and bootstrap
failure counters (/metrics, engines started with --enable-metrics) did not rise; no pair
canary failed. A gate that cannot be read is shown as "unchecked", never as passed.

\b
Exit codes: 0 every run valid (--slo: a rate found), 1 a gate failed (named) or no rate in
            --rate-range meets the SLO, 2 bad config or usage, 3 cannot run: the router
            does not serve this deployment (pass --url to load another) or bench_serving
            failed.
"""

EXIT_INVALID, EXIT_CANNOT = 1, 3


def parse_slo(ctx: click.Context | None, param: object, text: str | None) -> Slo | None:
    """``ttft=2000,itl=50`` (milliseconds; ``2s`` and ``50ms`` read too)."""
    if text is None:
        return None
    values: dict[str, float] = {}
    for part in text.split(","):
        key, _, raw = part.partition("=")
        m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s)?\s*", raw)
        if key.strip() not in ("ttft", "itl") or not m:
            raise click.BadParameter(f"{part!r}: expected ttft=MS,itl=MS (e.g. ttft=2000,itl=50)")
        values[key.strip()] = float(m[1]) * (1000 if m[2] == "s" else 1)
    if set(values) != {"ttft", "itl"}:
        raise click.BadParameter("give both ttft= and itl=")
    return Slo(values["ttft"], values["itl"])


def parse_range(ctx: click.Context | None, param: object, text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    try:
        a, b = float(lo), float(hi)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected LO:HI in requests/s, e.g. 0.5:32") from None
    if not 0 < a < b:
        raise click.BadParameter(f"{text!r}: need 0 < LO < HI")
    return a, b


def say(msg: str) -> None:
    click.echo(msg, err=True)


@click.command(epilog=BENCH_EPILOG)
@config_option
@sysfs_option
@topology_option
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=4.0,
              show_default=True, help="Requests per second (Poisson arrivals, as bench_serving "
              "sends them). Ignored with --slo.")
@click.option("--input-len", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Prompt tokens per request (random token ids of the model's tokenizer).")
@click.option("--output-len", type=click.IntRange(min=1), default=256, show_default=True,
              help="Generated tokens per request (EOS ignored, so exactly this many).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=200, show_default=True,
              help="Requests per run. With --slo, ≥ 99 % of fewer than 100 requests is every "
              "one of them, and under Poisson arrivals a rate just past the capacity is told "
              "apart only once a run queues enough requests: a few hundred (docs/bench.md).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run the same load N times and show the spread (mean ± stdev, min, max).")
@click.option("--slo", metavar="ttft=MS,itl=MS", default=None, callback=parse_slo,
              help="Search the highest rate at which ≥ 99 % of requests have TTFT and mean "
              "inter-token latency within these (goodput), by bisection over --rate-range.")
@click.option("--rate-range", default="0.5:64", show_default=True, metavar="LO:HI",
              callback=parse_range,
              help="With --slo: the rates searched (requests/s).")
@click.option("--precision", type=click.FloatRange(min=0.01, max=1), default=0.05,
              show_default=True, help="With --slo: stop when the bracket is this narrow "
              "(0.05: within 5 %).")
@click.option("--max-error-rate", type=click.FloatRange(min=0, max=1), default=0.01,
              show_default=True, help="Gate: the share of failed requests a valid run allows.")
@click.option("--url", default=None, metavar="URL",
              help="Load this endpoint instead of the config's router (a deployment pdsvc "
              "does not own: its engines and canary are not watched).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the units' runtimes keep their state (NAME.canary.json; default: "
              "the plan's RuntimeDirectory=).")
@click.option("--output-dir", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=Path("pdsvc-bench"), show_default=True,
              help="bench_serving's result files and logs, and the plot.")
@click.option("--dry-run", is_flag=True, help="Print the bench_serving command(s); run nothing.")
@json_option
@handle_errors
def bench(config_path: Path, sysfs_root: Path | None, topology_file: Path | None, rate: float,
          input_len: int, output_len: int, num_prompts: int, repeat: int,
          slo: Slo | None, rate_range: tuple[float, float], precision: float, max_error_rate: float,
          url: str | None, state_dir: Path | None, output_dir: Path, dry_run: bool,
          as_json: bool) -> None:
    """Load the running deployment through its router with SGLang's own
    sglang.bench_serving, and report TTFT/ITL only when the results are valid.

    Everything comes from the config: the router's URL, the served model name, the tokenizer
    (model.path, read locally: nothing is downloaded), the interpreter (runtime.python) and
    the engines whose failure counters and pair canaries are watched. Progress goes to
    stderr; the table (or --json) to stdout.
    """
    lo, hi = rate_range
    plan, _, _ = load_host_plan_anyway(config_path, sysfs_root, topology_file, None)
    target = target_from_plan(plan, url)
    loads = [Load(rate, input_len, output_len, num_prompts, seed=i + 1) for i in range(repeat)]
    if dry_run:
        first = Load(((lo * hi) ** 0.5) if slo else rate, input_len, output_len, num_prompts)
        _print_commands(target, [first] if slo else loads, output_dir)
        if slo:
            click.echo(f"# then --request-rate by bisection over {lo:g}..{hi:g} req/s "
                       f"to within {precision:.0%}")
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    if url is None:
        _refuse_foreign(target, config_path)
    _warn(target, slo, num_prompts)
    runner = Session(target, output_dir, slo, max_error_rate, plan,
                     state_dir_of(plan, target, state_dir), say)
    best: float | None = None
    if slo:
        best = runner.search(lo, hi, precision, Load(lo, input_len, output_len, num_prompts))
    else:
        for load in loads:
            runner.one(load)
    runs = runner.runs
    plot_path = (report.plot(runs, output_dir / "latency-vs-rate.png", slo, best)
                 if runs else None)
    code, reason = _verdict(runs, slo, best, rate_range)
    if as_json:
        slo_doc = None if slo is None else {**asdict(slo), "rate": best, "range": [lo, hi]}
        target_doc = {"url": target.url, "model": target.served_name,
                      "tokenizer": target.model_path, "engines": [u for _, u in target.engines]}
        mode = "slo" if slo else ("repeat" if repeat > 1 else "fixed")
        click.echo(json.dumps(report.document(target_doc, runs, mode=mode, slo=slo_doc,
                                              plot_path=plot_path, valid=code == 0,
                                              reason=reason), indent=1))
    else:
        _print_table(runs, spread=repeat > 1 and not slo, plot_path=plot_path)
        click.echo(("ok: " if code == 0 else "FAILED: ") + reason)
    sys.exit(code)


def _print_commands(target: Target, loads: list[Load], output_dir: Path) -> None:
    """--dry-run: the bench_serving command line of each run."""
    for i, load in enumerate(loads, 1):
        click.echo(shlex.join(bench_argv(target, load, str(output_dir / f"run-{i:02d}.jsonl"))))


def _refuse_foreign(target: Target, config_path: Path) -> None:
    """Exit (EXIT_CANNOT) when the plan's URL answers as another deployment than the config's."""
    other = foreign(target)
    if other is not None:
        say(f"pdsvc: error: not loading {target.url}: {other.why}; this is not the deployment "
            f"of {config_path} (pass --url URL to load another endpoint)")
        sys.exit(EXIT_CANNOT)


def _warn(target: Target, slo: Slo | None, num_prompts: int) -> None:
    """What the operator should know before the load starts."""
    if slo and num_prompts < 100:
        say(f"pdsvc bench: note: --num-prompts {num_prompts}: ≥ 99 % of fewer than 100 "
            "requests is all of them (the search finds where the slowest request meets the "
            "SLO); use a few hundred to find the capacity")
    say(f"pdsvc bench: warning: this loads {target.url}, the production traffic path "
        "(router → prefill → decode): live requests there will queue behind the benchmark")


def _verdict(runs: list[RunResult], slo: Slo | None, best: float | None,
             rate_range: tuple[float, float]) -> tuple[int, str]:
    """The exit code and the reason for it: every run valid, or the first that is not (with
    --slo, the rate found or that none was)."""
    lo, hi = rate_range
    invalid = [r for r in runs if r.error or any(
        g.name != "errors" or not slo for g in r.failed_gates())]
    code, reason = 0, "every run valid"
    if any(r.error for r in runs):
        code, reason = EXIT_CANNOT, runs[-1].error if runs[-1].error else "bench_serving failed"
    elif invalid:
        r = invalid[0]
        code = EXIT_INVALID
        reason = (f"run at {r.load.rate:g} req/s is not valid: "
                  + "; ".join(f"gate {g.name} failed: {g.detail}" for g in r.failed_gates()))
    elif slo and best is None:
        code, reason = EXIT_INVALID, f"no rate in {lo:g}..{hi:g} req/s meets the SLO"
    elif slo:
        reason = (f"highest rate meeting the SLO: {best:.3g} req/s"
                  + (f" (≥ {hi:g}: raise --rate-range)" if best == hi else ""))
    return code, reason


def _print_table(runs: list[RunResult], *, spread: bool, plot_path: str | None) -> None:
    """The runs' table on stdout, the spread of repeated runs, gates left unchecked, the plot."""
    for line in report.table(runs):
        click.echo(line)
    if spread:
        click.echo("spread:")
        for line in report.spread_lines(runs):
            click.echo(line)
    unchecked = sorted({g.name for r in runs for g in r.gates if g.result == "unchecked"})
    if unchecked:
        click.echo(f"unchecked gates: {', '.join(unchecked)} (see stderr)")
    click.echo(f"plot: {plot_path}" if plot_path else
               "plot: not drawn (pip install 'pdsvc[plot]' for matplotlib)")
