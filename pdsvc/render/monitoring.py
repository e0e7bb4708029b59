"""Plan -> the monitoring files of a bundle (pure): a Prometheus scrape config for this
bundle's targets, alert rules, and a Grafana dashboard.

What is scraped, and the names the rules use (checked against the pinned versions' code):

* each engine's own port, ``/metrics``, with ``--enable-metrics`` (SGLang 0.5.23,
  python/sglang/srt/observability/metrics_collector.py): ``sglang:num_transfer_failed_reqs_total``
  and ``sglang:num_bootstrap_failed_reqs_total`` (counted by disaggregation/prefill.py and
  decode.py, sglang PR #7317), ``sglang:kv_transfer_latency_ms`` and the other
  ``sglang:kv_transfer_*`` histograms (PR #19009), ``sglang:time_to_first_token_seconds``
  (TokenizerMetricsCollector; on a decode it spans prefill, the KV transfer and the first
  token), ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``.
  Reports of PD metrics that stay zero or empty: sglang #16832, #21167;
* the router's ``--prometheus-port``: ``smg_worker_health{worker=URL}`` (1 healthy, 0 not),
  exported by sglang-router 0.3.2 and smg 1.13 alike (smg ``src/observability/metrics.rs``,
  ``set_worker_health``), and ``smg_http_requests_total``;
* each host's node_exporter, whose textfile collector reads the runtimes' ``NAME.prom``
  (pdsvc/ship/runtime/metrics.py: ``pdsvc_*``).

Every target carries ``deployment`` (and the engines' ``role``/``unit``) as target labels, so
one Prometheus can watch several deployments.
"""

from __future__ import annotations

import json
import re

from pdsvc.plan.build import Plan
from pdsvc.plan.runtime_argv import metrics_dir
from pdsvc.render.kit import File

DIR = "monitoring"
MONITORING_CUSTOMISE = ("Customise without editing: copy the jobs and rules into your own "
                        "Prometheus config, or change the config's `metrics` keys and render.")
ROLE_FAILURES = {
    "PdsvcKVTransferFailuresRising": (
        "sglang:num_transfer_failed_reqs_total", "KV transfers are failing",
        "requests whose KV cache transfer between prefill and decode failed"),
    "PdsvcBootstrapFailuresRising": (
        "sglang:num_bootstrap_failed_reqs_total", "KV bootstrap is failing",
        "requests whose decode could not bootstrap with the prefill (the bootstrap server)"),
}


def _q(value: str) -> str:
    """A YAML scalar: JSON's double-quoted string is valid YAML 1.2 (and 1.1 for BMP text)."""
    return json.dumps(value, ensure_ascii=False)


def _address(host: str, fallback: str = "127.0.0.1") -> str:
    return fallback if host in ("0.0.0.0", "::", "") else host


def scrape_targets(plan: Plan) -> list[tuple[str, str, dict[str, str]]]:
    """(job, host:port, target labels) of every target of this plan (one host's bundle: that
    host's engines, its router if there, its node_exporter)."""
    out = []
    base = {"deployment": plan.name}
    for e in plan.engines:
        if e.node_rank != 0 or not e.metrics:  # only rank 0 serves HTTP
            continue
        out.append(("pdsvc-engines", f"{_address(e.host)}:{e.port}",
                    {**base, "role": e.role, "unit": e.unit}))
    if plan.front is not None:  # HAProxy's own exporter: each router's state in the front
        f = plan.front
        out.append(("pdsvc-front", f"{_address(f.prometheus_host)}:{f.prometheus_port}",
                    {**base, "role": "front", "unit": f.unit}))
    for r in plan.routers:
        host = _address(r.prometheus_host, plan.hosts[0].address if plan.hosts else "127.0.0.1")
        out.append(("pdsvc-router", f"{host}:{r.prometheus_port}",
                    {**base, "role": "router", "unit": r.unit}))
    if plan.metrics.textfile:
        hosts = [h.address for h in plan.hosts] or ["127.0.0.1"]
        for h in hosts:
            out.append(("pdsvc-node", f"{h}:{plan.metrics.node_exporter_port}", dict(base)))
    return out


def scrape_config(plan: Plan, header: list[str], rules: str) -> str:
    """prometheus.yml: usable as is (`prometheus --config.file=...`), or its jobs pasted into
    an existing config's scrape_configs."""
    m = plan.metrics
    lines = [f"# {h}" for h in header] + [
        "# The jobs are the fragment to merge into an existing prometheus.yml; node_exporter must",
        f"# run with --collector.textfile.directory={metrics_dir('RUN_DIR')} (docs/metrics.md).",
        "global:",
        f"  scrape_interval: {m.scrape_interval_secs}s",
        f"  evaluation_interval: {m.scrape_interval_secs}s",
        "rule_files:",
        f"  - {_q(rules)}",
        "scrape_configs:",
    ]
    jobs: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for job, target, labels in scrape_targets(plan):
        jobs.setdefault(job, []).append((target, labels))
    for job, targets in jobs.items():
        lines += [f"  - job_name: {_q(job)}", "    metrics_path: /metrics"]
        if job == "pdsvc-node":
            # the textfile's series carry their own deployment/role/unit labels: keep them,
            # not exported_* copies (prometheus.io docs, scrape_config: honor_labels)
            lines += ["    honor_labels: true"]
        lines += ["    static_configs:"]
        for target, labels in targets:
            lines += [f"      - targets: [{_q(target)}]", "        labels:"]
            lines += [f"          {k}: {_q(v)}" for k, v in labels.items()]
    return "\n".join(lines) + "\n"


def _alternation(urls: list[str]) -> str:
    """A regex matching exactly these URLs, as a PromQL string's content (Go escapes: a
    regex backslash is written twice)."""
    return "|".join(re.escape(u) for u in urls).replace("\\", "\\\\")


def alert_rules(plan: Plan) -> list[dict]:
    """The alerts: each with a summary, what shows more, and what to do."""
    return [*_unit_alerts(plan), _duty_alert(plan), _ttft_alert(plan), *_role_failure_alerts(plan),
            *_no_worker_alerts(plan), _unreachable_alert(plan), *_front_alerts(plan)]


def _selector(plan: Plan) -> str:
    """The label matcher of the deployment's series."""
    return f'deployment="{plan.name}"'


def _status_command(plan: Plan) -> str:
    """The command an alert's description points to for more."""
    return f"pdsvc status -c {plan.config_source}"


def _unit_alerts(plan: Plan) -> list[dict]:
    """What the runtimes' own metrics say of a unit: a pair past its heal budget, a unit that
    gave up, restarts above the hourly bound."""
    m, sel, status = plan.metrics, _selector(plan), _status_command(plan)
    return [
        {
            "alert": "PdsvcPairFailingBeyondHealBudget",
            "expr": (f'max by (deployment, role, unit, pair) (pdsvc_pair_state{{{sel}, '
                     f'state="failing"}} == 1 and on (deployment, unit) '
                     f'(pdsvc_unit_heals_in_a_row{{{sel}}} >= pdsvc_unit_heal_budget{{{sel}}}))'),
            "for": "2m",
            "severity": "page",
            "summary": "pair {{ $labels.pair }} keeps failing after its heal budget",
            "description": (
                "The pair canary of {{ $labels.unit }} finds the pair failing while both "
                "engines answer /health, and the heals it was allowed did not bring it back; "
                "it now heals only every 5 minutes. More: `" + status + "` (pair matrix), "
                "`journalctl -u {{ $labels.unit }} | grep 'pair canary'`. Do: check the KV "
                "path (`pdsvc doctor --kv`), then restart the pair's units "
                "(`systemctl restart " + plan.target + "`), which also resets the budget."),
        },
        {
            "alert": "PdsvcEngineGaveUp",
            "expr": f"pdsvc_unit_gave_up{{{sel}}} == 1",
            "for": "0m",
            "severity": "page",
            "summary": "{{ $labels.unit }} gave up (exit 78) and is not restarted",
            "description": (
                "Its starts in a row never became healthy (a missing model, a flag SGLang "
                "rejects, OOM at load). More: `" + status + "` (the reason), `journalctl -u "
                "{{ $labels.unit }} -n 100`. Do: fix the cause, then `systemctl start "
                "{{ $labels.unit }}` (supervisord: `supervisorctl start`)."),
        },
        {
            "alert": "PdsvcRestartsHigh",
            "expr": (f"sum by (deployment, role, unit) (increase(pdsvc_unit_starts_total"
                     f'{{{sel}, cause=~"crash|failed-start|killed"}}[1h])) > '
                     f"{m.restarts_per_hour}"),
            "for": "0m",
            "severity": "warn",
            "summary": "{{ $labels.unit }} restarted more than " + str(m.restarts_per_hour)
                       + " times in an hour after crashes or failed starts",
            "description": (
                "More than metrics.restarts_per_hour (" + str(m.restarts_per_hour) + ") "
                "restarts after a crash, a failed start or a kill. More: `" + status + "`, "
                "`journalctl -u {{ $labels.unit }} --since -1h | grep -E 'crash|exited|"
                "killed'`. Do: find the crash in the journal (OOM, NCCL, a hung probe)."),
        },
    ]


def _duty_alert(plan: Plan) -> dict:
    """A duty of a unit's runtime that raised in this run."""
    sel, status = _selector(plan), _status_command(plan)
    return {
        # the counter is of this run (emptied at its start, runtime/duties.py), so a
        # series at all is a failure: increase() would miss the first, a series born at 1
        "alert": "PdsvcDutyFailed",
        "expr": f"pdsvc_unit_duty_failures_total{{{sel}}} > 0",
        "for": "0m",
        "severity": "warn",
        "summary": "{{ $labels.unit }}: its runtime's {{ $labels.duty }} duty raised",
        "description": (
            "An exception the runtime did not expect, in one of its threads: said in the "
            "journal with its traceback, then the duty went on or the runtime ended "
            "(exit 71) and was restarted, by the policy of runtime/duties.py. More: `"
            + status + "` (the duty and its last words), `journalctl -u "
            "{{ $labels.unit }} | grep 'duty {{ $labels.duty }} failed'`. Do: report "
            "the traceback (a bug of pdsvc's runtime); `systemctl restart "
            "{{ $labels.unit }}` starts the duty afresh."),
    }


def _ttft_alert(plan: Plan) -> dict:
    """The decodes' TTFT p99 above the SLO."""
    m, sel, status = plan.metrics, _selector(plan), _status_command(plan)
    return {
        "alert": "PdsvcTTFTAboveSLO",
        "expr": (f"histogram_quantile(0.99, sum by (deployment, le) (rate("
                 f'sglang:time_to_first_token_seconds_bucket{{{sel}, role="decode"}}[5m])))'
                 f" > {m.ttft_p99_slo_secs:g}"),
        "for": "5m",
        "severity": "warn",
        "summary": f"TTFT p99 is above the SLO of {m.ttft_p99_slo_secs:g} s",
        "description": (
            "The decodes' p99 time to first token over 5 minutes (prefill + KV transfer "
            "+ first token). More: `" + status + "`, `journalctl -u "
            + " -u ".join(e.unit for e in plan.engines if e.node_rank == 0)
            + " --since -15min`, the dashboard's queue and KV "
            "transfer panels (sglang:num_queue_reqs, sglang:kv_transfer_latency_ms). Do: "
            "look for a queue building on the prefill (add a prefill) or slow transfers "
            "(`pdsvc doctor --kv`)."),
    }


def _role_failure_alerts(plan: Plan) -> list[dict]:
    """Rising bootstrap or transfer failures on an engine, one alert per counter."""
    sel, status = _selector(plan), _status_command(plan)
    rules: list[dict] = []
    for name, (metric, summary, what) in ROLE_FAILURES.items():
        rules.append({
            "alert": name,
            "expr": f"sum by (deployment, role, unit) (rate({metric}{{{sel}}}[5m])) > 0",
            "for": "5m",
            "severity": "page",
            "summary": f"{summary} on {{{{ $labels.unit }}}}",
            "description": (
                f"Rising for 5 minutes: {what} ({metric}). More: `"
                + status + "` (pair canary), `journalctl -u {{ $labels.unit }} | grep -i "
                "'transfer\\|bootstrap'`. Do: `pdsvc doctor --kv` for the KV path (NIC, "
                "UCX_NET_DEVICES); a stale pair heals itself, else restart "
                + plan.target + "."),
        })
    return rules


def _no_worker_alerts(plan: Plan) -> list[dict]:
    """A role a router has no healthy worker of, one alert per role: with several routers
    (router.replicas), the one that lists the fewest decides (`sum by (instance)`: each
    router's own count; a router that lost the engines fails the requests sent to it)."""
    d, sel, status = plan.name, _selector(plan), _status_command(plan)
    rules: list[dict] = []
    r = plan.router
    if r is not None:
        for role in ("prefill", "decode"):
            urls = [e.url for e in plan.engines if e.role == role and e.node_rank == 0]
            if not urls:
                continue
            rules.append({
                "alert": "PdsvcNoHealthyWorker",
                "expr": ("(min(sum by (instance) (smg_worker_health{"
                         f'{sel}, worker=~"{_alternation(urls)}"}})) or vector(0)) < 1'),
                "for": "1m",
                "severity": "page",
                "labels": {"role": role, "deployment": d},
                "summary": f"a router has no healthy {role} worker",
                "description": (
                    f"smg_worker_health is 0 (or absent) for every {role} engine a router "
                    "knows: no request sent to it can be served. More: `" + status
                    + f"`, `journalctl -u {r.unit}` and the engines' journals "
                    f"(`journalctl -u '{plan.name}-{role}*'`)"
                    ". Do: start or fix those units; they register with the router themselves "
                    "once healthy."),
            })
    return rules


def _front_alerts(plan: Plan) -> list[dict]:
    """With the front (router.replicas ≥ 2): a router out of its rotation for long (a rolling
    restart takes it out for seconds), and none in it (every request gets HAProxy's 503).
    HAProxy's exporter gives each server one series per state, the current one at 1."""
    f = plan.front
    if f is None:
        return []
    sel, status = _selector(plan), _status_command(plan)
    up = f'haproxy_server_status{{{sel}, proxy="{f.backend}", state="UP"}}'
    return [{
        "alert": "PdsvcRouterOutOfFront",
        "expr": f"{up} == 0",
        "for": "2m",
        "severity": "warn",
        "summary": "{{ $labels.server }} is out of the front's rotation",
        "description": (
            "HAProxy has not sent requests to this router for 2 min (DOWN: its /liveness "
            "check fails; DRAIN or MAINT: its unit took it out and did not put it back). "
            "The other routers serve. More: `" + status + "`, `journalctl -u "
            "{{ $labels.server }}`. Do: fix or restart that router's unit; it returns to the "
            "front once it serves."),
    }, {
        "alert": "PdsvcNoRouterInFront",
        "expr": f"(sum({up}) or vector(0)) < 1",
        "for": "1m",
        "severity": "page",
        "labels": {"deployment": plan.name},
        "summary": "the front has no router in rotation",
        "description": (
            f"HAProxy ({f.unit}) sends no request to any router: every client request gets "
            "its 503. More: `" + status + f"`, `journalctl -u {f.unit}`. Do: start or fix the "
            f"router units ({', '.join(r.unit for r in plan.routers)})."),
    }]


def _unreachable_alert(plan: Plan) -> dict:
    """An engine Prometheus cannot scrape."""
    sel, status = _selector(plan), _status_command(plan)
    return {
        "alert": "PdsvcEngineUnreachable",
        "expr": f'up{{job="pdsvc-engines", {sel}}} == 0',
        "for": "2m",
        "severity": "warn",
        "summary": "{{ $labels.unit }} does not answer /metrics",
        "description": (
            "Prometheus cannot scrape the engine's port: it is down, starting or hung. More: `"
            + status + "`, `systemctl status {{ $labels.unit }}`. Do: see why in `journalctl "
            "-u {{ $labels.unit }}`; a unit that gave up also raises PdsvcEngineGaveUp."),
    }


def rules_file(plan: Plan, header: list[str]) -> str:
    lines = [f"# {h}" for h in header] + ["groups:", f"  - name: {_q('pdsvc-' + plan.name)}",
                                          "    rules:"]
    for rule in alert_rules(plan):
        labels = {"severity": rule["severity"], **rule.get("labels", {})}
        lines += [f"      - alert: {rule['alert']}", f"        expr: {_q(rule['expr'])}",
                  f"        for: {rule['for']}", "        labels:"]
        lines += [f"          {k}: {_q(v)}" for k, v in labels.items()]
        lines += ["        annotations:", f"          summary: {_q(rule['summary'])}",
                  f"          description: {_q(rule['description'])}"]
    return "\n".join(lines) + "\n"


def monitoring_files(plan: Plan, header: list[str]) -> list[File]:
    """monitoring/prometheus.yml, monitoring/pdsvc-rules.yml, monitoring/pdsvc-dashboard.json."""
    from pdsvc.render.dashboard import dashboard_json

    rules = f"{plan.name}-rules.yml"
    return [File(f"{DIR}/{plan.name}-prometheus.yml", scrape_config(plan, header, rules)),
            File(f"{DIR}/{rules}", rules_file(plan, header)),
            File(f"{DIR}/{plan.name}-dashboard.json", dashboard_json(plan, header))]
