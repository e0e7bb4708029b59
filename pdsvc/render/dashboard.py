"""Plan -> a Grafana dashboard of the deployment, built with grafana-foundation-sdk (Grafana's
maintained builders, https://github.com/grafana/grafana-foundation-sdk), not hand-written
JSON. Every query reads series that monitoring.py's scrape config collects, filtered on the
deployment label; the data source is a variable, so the JSON imports into any Grafana."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from pdsvc.plan.build import Plan

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

#: (row, [(title, unit, [(expr, legend)])]); DEP is replaced by the deployment selector
PANELS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("pdsvc: units and pairs", [
        ("Ready units", "short", [("pdsvc_unit_ready{DEP}", "{{unit}}")]),
        ("Starts by cause (1h)", "short", [
            ("sum by (unit, cause) (increase(pdsvc_unit_starts_total{DEP}[1h]))",
             "{{unit}} {{cause}}")]),
        ("Pairs failing", "short", [
            ('max by (pair) (pdsvc_pair_state{DEP, state="failing"})', "{{pair}}")]),
        ("Heals in a row vs budget", "short", [
            ("pdsvc_unit_heals_in_a_row{DEP}", "{{unit}} heals"),
            ("pdsvc_unit_heal_budget{DEP}", "{{unit}} budget")]),
    ]),
    ("SGLang engines", [
        ("TTFT p50 / p99 (decode)", "s", [
            ('histogram_quantile(0.5, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket'
             '{DEP, role="decode"}[5m])))', "p50"),
            ('histogram_quantile(0.99, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket'
             '{DEP, role="decode"}[5m])))', "p99")]),
        ("Running / queued requests", "short", [
            ("sglang:num_running_reqs{DEP}", "{{unit}} running"),
            ("sglang:num_queue_reqs{DEP}", "{{unit}} queued")]),
        ("KV transfer / bootstrap failures", "reqps", [
            ("sum by (unit) (rate(sglang:num_transfer_failed_reqs_total{DEP}[5m]))",
             "{{unit}} transfer"),
            ("sum by (unit) (rate(sglang:num_bootstrap_failed_reqs_total{DEP}[5m]))",
             "{{unit}} bootstrap")]),
        ("KV transfer latency p99", "ms", [
            ("histogram_quantile(0.99, sum by (unit, le) (rate("
             "sglang:kv_transfer_latency_ms_bucket{DEP}[5m])))", "{{unit}}")]),
    ]),
    ("Router", [
        ("Worker health", "short", [("smg_worker_health{DEP}", "{{worker}}")]),
        ("Requests", "reqps", [("sum(rate(smg_http_requests_total{DEP}[5m]))", "requests")]),
    ]),
]


def _query(expr: str, legend: str, ref: str, dep: str) -> prometheus.Dataquery:
    expr = expr.replace("{DEP}", "{" + dep + "}").replace("{DEP, ", "{" + dep + ", ")
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def build(plan: Plan, header: list[str]) -> dashboard.Dashboard:
    dep = f'deployment="{plan.name}"'
    board = (dashboard.Dashboard(f"pdsvc {plan.name}: prefill-decode deployment")
             .uid(f"pdsvc-{plan.name}"[:40]).tags(["pdsvc", "sglang"])
             .description(" ".join(header))  # provenance, first in the file (sorted keys)
             .refresh("30s").time("now-1h", "now")
             .with_variable(dashboard.DatasourceVariable("datasource").type("prometheus")))
    for row, panels in PANELS:
        board = board.with_row(dashboard.Row(row))
        for title, unit, queries in panels:
            kind = stat.Panel() if title == "Ready units" else timeseries.Panel()
            panel = kind.title(title).unit(unit).datasource(DS).height(8).span(12)
            for i, (expr, legend) in enumerate(queries):
                panel = panel.with_target(_query(expr, legend, chr(ord("A") + i), dep))
            board = board.with_panel(panel)
    return board


def dashboard_json(plan: Plan, header: list[str]) -> str:
    return json.dumps(build(plan, header).build(), cls=JSONEncoder, indent=2, sort_keys=True,
                      ensure_ascii=False) + "\n"
