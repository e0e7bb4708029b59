"""Is a run's result valid? Each gate passes, fails (naming why) or cannot be checked (saying
why): a gate that cannot be checked is reported as such, never as passed.

* ``tokens``: every request that succeeded produced at least one token (srt-slurm #429: a
  benchmark "succeeded" with ``Total generated tokens: 0`` while every KV transfer failed;
  sglang #9585: TTFT 0 ms on PD — a request whose first chunk carried no text);
* ``errors``: the share of failed requests is at most the bound;
* ``kv-transfer``: the engines' ``sglang:num_transfer_failed_reqs_total`` and
  ``sglang:num_bootstrap_failed_reqs_total`` (sglang PR #7317; /metrics with
  ``--enable-metrics``) did not rise during the run;
* ``canary``: no pair canary (pdsvc's runtime, NAME.canary.json) was failing during the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pdsvc.plan.build import Plan
from pdsvc.ship.runtime.canary import PairHealth
from pdsvc.status import runstate
from pdsvc.status.collect import http_get

FAILURE_COUNTERS = ("sglang:num_transfer_failed_reqs_total",
                    "sglang:num_bootstrap_failed_reqs_total")


@dataclass(frozen=True)
class Gate:
    name: str
    result: Literal["pass", "fail", "unchecked"]
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "result": self.result, "detail": self.detail}


def parse_counters(text: str, names: tuple[str, ...] = FAILURE_COUNTERS) -> dict[str, float]:
    """The sum over every label set of each named metric in a Prometheus text page."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name in names:
            try:
                found[name] = found.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return found


Counters = dict[str, dict[str, float] | str]  # engine -> counters, or why they are unknown


def read_counters(engines: tuple[tuple[str, str], ...], timeout: float = 3.0) -> Counters:
    out: Counters = {}
    for name, url in engines:
        probe = http_get(f"{url}/metrics", timeout=timeout)
        if not probe.ok:
            out[name] = f"/metrics {probe.summary()}"
            continue
        counters = parse_counters(probe.body)
        out[name] = counters if counters else "/metrics has no KV failure counters"
    return out


def kv_gate(before: Counters, after: Counters) -> Gate:
    if not before:
        return Gate("kv-transfer", "unchecked", "no engines to watch (--url)")
    rose, unknown = [], []
    for engine, now in after.items():
        then = before.get(engine)
        if isinstance(now, str) or not isinstance(then, dict):
            unknown.append(f"{engine}: {now if isinstance(now, str) else then}")
            continue
        for name in FAILURE_COUNTERS:
            if name in now and now[name] > then.get(name, now[name]):
                rose.append(f"{engine} {name.removeprefix('sglang:')} +{now[name] - then[name]:g}")
    if rose:
        return Gate("kv-transfer", "fail", "failure counters rose: " + ", ".join(rose))
    if len(unknown) == len(after):
        return Gate("kv-transfer", "unchecked", "; ".join(unknown)
                    + " (start the engines with --enable-metrics)")
    return Gate("kv-transfer", "pass", "no KV transfer or bootstrap failure"
                + (f" (not read: {'; '.join(unknown)})" if unknown else ""))


def read_pairs(plan: Plan | None, state_dir: Path | None) -> list[runstate.PairView]:
    if plan is None or state_dir is None:
        return []
    return runstate.pair_views(plan, state_dir)


def canary_gate(pairs: list[runstate.PairView], started: float) -> Gate:
    """Failing at the end, or failing since a moment during the run."""
    if not pairs or all(p.state is PairHealth.UNKNOWN for p in pairs):
        return Gate("canary", "unchecked", "no pair canary state (no NAME.canary.json where "
                    "the units' runtimes keep it; see --state-dir)")
    bad = [f"{p.prefill} -> {p.decode}: " + (
        f"{p.last_error or p.state}" if p.state is PairHealth.FAILING
        else f"re-proven {(p.since or started) - started:.0f} s into the run")
        for p in pairs if p.state is PairHealth.FAILING
        or (p.state is PairHealth.OK and p.since and p.since > started)]
    if bad:
        return Gate("canary", "fail", "pair canary failed during the run: " + "; ".join(bad))
    return Gate("canary", "pass", f"{len(pairs)} pair(s) ok")


def token_gate(zero: int, ok: int) -> Gate:
    if ok == 0:
        return Gate("tokens", "fail", "no request succeeded")
    if zero:
        return Gate("tokens", "fail", f"{zero} of {ok} successful requests produced zero tokens")
    return Gate("tokens", "pass", f"every one of {ok} successful requests produced tokens")


def error_gate(failed: int, total: int, bound: float) -> Gate:
    rate = failed / total if total else 1.0
    verdict: Literal["pass", "fail"] = "fail" if rate > bound else "pass"
    return Gate("errors", verdict, f"{failed} of {total} requests failed ({rate:.1%}; "
                f"bound {bound:.1%})")


def summary(gates: list[Gate]) -> dict[str, Any]:
    return {"valid": all(g.result != "fail" for g in gates),
            "failed": [g.name for g in gates if g.result == "fail"],
            "unchecked": [g.name for g in gates if g.result == "unchecked"]}
