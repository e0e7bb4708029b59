"""The monitoring files of a bundle, checked by Prometheus' own promtool (Debian's `prometheus`
package; .ci/run installs it): the scrape config loads, the rules parse, and each alert fires
on series that show its fault and stays silent on series that do not (`promtool test rules`).
The runtime's textfile passes `promtool check metrics`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, require

from pdsvc.cli.kit import load_plan
from pdsvc.render.monitoring import alert_rules
from pdsvc.render.supervisord import render_supervisord
from pdsvc.render.systemd import render_systemd

SEED = REPO / "etc/seed-host.topology.json"


@pytest.fixture(scope="module")
def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        require("promtool not found (apt-get install --no-install-recommends prometheus)")
    return str(tool)


def _write(files, out: Path) -> Path:
    for f in files:
        if f.path.startswith("monitoring/"):
            (out / f.path).parent.mkdir(parents=True, exist_ok=True)
            (out / f.path).write_text(f.content)
    return out / "monitoring"


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("config,render", [
    ("etc/pdsvc.yaml", render_systemd),
    ("etc/pdsvc.yaml", render_supervisord),
    ("etc/examples/2p1d.yaml", render_systemd),
])
def test_rendered_config_and_rules_pass_promtool(promtool, tmp_path, config, render) -> None:
    plan = load_plan(REPO / config, None, SEED)
    mon = _write(render(plan, "test"), tmp_path)
    done = _run(promtool, "check", "config", "dsv4-prometheus.yml", cwd=mon)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "rule files found" in done.stdout
    done = _run(promtool, "check", "rules", "dsv4-rules.yml", cwd=mon)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_target_carries_the_deployment_and_every_engine_its_unit() -> None:
    plan = load_plan(REPO / "etc/examples/2p1d.yaml", None, SEED)
    text = next(f.content for f in render_systemd(plan, "t")
                if f.path.endswith("prometheus.yml"))
    for e in plan.engines:
        assert f'"{e.host}:{e.port}"' in text and f'unit: "{e.unit}"' in text
    assert '"127.0.0.1:29000"' in text and '"127.0.0.1:9100"' in text


def test_every_alert_names_a_command_and_what_to_do() -> None:
    plan = load_plan(REPO / "etc/pdsvc.yaml", None, SEED)
    rules = alert_rules(plan)
    names = {r["alert"] for r in rules}
    assert names >= {"PdsvcPairFailingBeyondHealBudget", "PdsvcEngineGaveUp", "PdsvcRestartsHigh",
                     "PdsvcKVTransferFailuresRising", "PdsvcBootstrapFailuresRising",
                     "PdsvcNoHealthyWorker", "PdsvcTTFTAboveSLO"}
    for r in rules:
        assert "pdsvc status" in r["description"] and "Do:" in r["description"], r["alert"]
        assert "journalctl -u" in r["description"], r["alert"]


# ---------------------------------------------------------------- promtool test rules
U = 'deployment="dsv4",role="prefill",unit="dsv4-prefill.service"'
D = 'deployment="dsv4",role="decode",unit="dsv4-decode.service"'
PAIR = 'pair="http://127.0.0.1:30000 -> http://127.0.0.1:30001"'


def _alert(name: str, at: str, labels: list[dict] | None) -> dict:
    return {"eval_time": at, "alertname": name,
            "exp_alerts": [{"exp_labels": lab} for lab in (labels or [])]}


def _cases() -> list[dict]:
    """Series in promtool's expanding notation (`a+bxN`), one test group per alert: the fault,
    and the same deployment without it."""
    unit = {"deployment": "dsv4", "role": "prefill", "unit": "dsv4-prefill.service"}
    pair = {**unit, "pair": "http://127.0.0.1:30000 -> http://127.0.0.1:30001"}
    return [
        {  # a failing pair past its heal budget pages; one within its budget does not
            "interval": "30s",
            "input_series": [
                {"series": f'pdsvc_pair_state{{{U},{PAIR},state="failing"}}', "values": "1x20"},
                {"series": f"pdsvc_unit_heals_in_a_row{{{U}}}", "values": "0x4 2x16"},
                {"series": f"pdsvc_unit_heal_budget{{{U}}}", "values": "2x20"},
            ],
            "alert_rule_test": [
                _alert("PdsvcPairFailingBeyondHealBudget", "2m", None),
                _alert("PdsvcPairFailingBeyondHealBudget", "6m",
                       [{**pair, "severity": "page"}]),
            ],
        },
        {  # gave up: at once; serving: never
            "interval": "15s",
            "input_series": [
                {"series": f"pdsvc_unit_gave_up{{{U}}}", "values": "0x3 1x4"},
                {"series": f"pdsvc_unit_gave_up{{{D}}}", "values": "0x7"},
            ],
            "alert_rule_test": [
                _alert("PdsvcEngineGaveUp", "30s", None),
                _alert("PdsvcEngineGaveUp", "1m30s", [{**unit, "severity": "page"}]),
            ],
        },
        {  # 5 crash restarts within the hour (> 3); the decode's operator stops do not count
            "interval": "5m",
            "input_series": [
                {"series": f'pdsvc_unit_starts_total{{{U},cause="crash"}}',
                 "values": "0 0 1 2 3 4 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5"},
                {"series": f'pdsvc_unit_starts_total{{{D},cause="stop"}}',
                 "values": "0+2x26"},
            ],
            "alert_rule_test": [
                _alert("PdsvcRestartsHigh", "10m", None),
                _alert("PdsvcRestartsHigh", "40m", [{**unit, "severity": "warn"}]),
                _alert("PdsvcRestartsHigh", "2h10m", None),
            ],
        },
        {  # transfer failures rising on the decode for 5 min; flat bootstrap failures silent
            "interval": "1m",
            "input_series": [
                {"series": f'sglang:num_transfer_failed_reqs_total{{{D},engine_type="decode"}}',
                 "values": "0 0 0+3x15"},
                {"series": f'sglang:num_bootstrap_failed_reqs_total{{{D},engine_type="decode"}}',
                 "values": "7x16"},
            ],
            "alert_rule_test": [
                _alert("PdsvcKVTransferFailuresRising", "3m", None),
                _alert("PdsvcKVTransferFailuresRising", "12m", [
                    {"deployment": "dsv4", "role": "decode", "unit": "dsv4-decode.service",
                     "severity": "page"}]),
                _alert("PdsvcBootstrapFailuresRising", "12m", None),
            ],
        },
        {  # bootstrap failures rising on the decode
            "interval": "1m",
            "input_series": [
                {"series": f'sglang:num_bootstrap_failed_reqs_total{{{D},engine_type="decode"}}',
                 "values": "0+1x16"},
            ],
            "alert_rule_test": [
                _alert("PdsvcBootstrapFailuresRising", "12m", [
                    {"deployment": "dsv4", "role": "decode", "unit": "dsv4-decode.service",
                     "severity": "page"}]),
            ],
        },
        {  # the router's prefill goes unhealthy; its decode stays healthy
            "interval": "15s",
            "input_series": [
                {"series": 'smg_worker_health{deployment="dsv4",role="router",'
                 'unit="dsv4-router.service",worker="http://127.0.0.1:30000"}',
                 "values": "1x4 0x12"},
                {"series": 'smg_worker_health{deployment="dsv4",role="router",'
                 'unit="dsv4-router.service",worker="http://127.0.0.1:30001"}',
                 "values": "1x16"},
            ],
            "alert_rule_test": [
                _alert("PdsvcNoHealthyWorker", "45s", None),
                _alert("PdsvcNoHealthyWorker", "3m", [
                    {"deployment": "dsv4", "role": "prefill", "severity": "page"}]),
            ],
        },
        {  # two routers (router.replicas): router-1 loses its decode, router-0 keeps it; the
            # alert fires for the one that lists none (a sum over both would not)
            "interval": "15s",
            "input_series": [
                *({"series": f'smg_worker_health{{deployment="dsv4",role="router",'
                   f'instance="127.0.0.1:{port}",worker="http://127.0.0.1:{engine}"}}',
                   "values": values} for port, engine, values in (
                       ("29000", 30001, "1x16"), ("29001", 30001, "1x4 0x12"),
                       ("29000", 30000, "1x16"), ("29001", 30000, "1x16"))),
            ],
            "alert_rule_test": [
                _alert("PdsvcNoHealthyWorker", "45s", None),
                _alert("PdsvcNoHealthyWorker", "3m", [
                    {"deployment": "dsv4", "role": "decode", "severity": "page"}]),
            ],
        },
        {  # TTFT: every first token in the 2.5-5 s bucket (p99 > 2 s) vs all under 0.5 s
            "interval": "1m",
            "input_series": [
                *({"series": f'sglang:time_to_first_token_seconds_bucket{{{D},le="{le}"}}',
                   "values": f"0+{rate}x20"}
                  for le, rate in (("0.5", 0), ("2.5", 0), ("5", 10), ("+Inf", 10))),
                *({"series": 'sglang:time_to_first_token_seconds_bucket{deployment="other",'
                   f'role="decode",unit="x.service",le="{le}"}}', "values": "0+10x20"}
                  for le in ("0.5", "2.5", "5", "+Inf")),
            ],
            "alert_rule_test": [
                _alert("PdsvcTTFTAboveSLO", "4m", None),
                _alert("PdsvcTTFTAboveSLO", "15m", [
                    {"deployment": "dsv4", "severity": "warn"}]),
            ],
        },
        {  # a duty of the decode's runtime raised (a series of this run at all); the
            # prefill's runtime has none
            "interval": "15s",
            "input_series": [
                {"series": f'pdsvc_unit_duty_failures_total{{{D},duty="membership"}}',
                 "values": "_x3 1 1 2x4"},
            ],
            "alert_rule_test": [
                _alert("PdsvcDutyFailed", "30s", None),
                _alert("PdsvcDutyFailed", "1m", [
                    {"deployment": "dsv4", "role": "decode", "unit": "dsv4-decode.service",
                     "duty": "membership", "severity": "warn"}]),
            ],
        },
        {  # an engine nobody can scrape
            "interval": "30s",
            "input_series": [
                {"series": f'up{{job="pdsvc-engines",{D},instance="127.0.0.1:30001"}}',
                 "values": "1 1 0x10"},
                {"series": f'up{{job="pdsvc-engines",{U},instance="127.0.0.1:30000"}}',
                 "values": "1x12"},
            ],
            "alert_rule_test": [
                _alert("PdsvcEngineUnreachable", "1m", None),
                _alert("PdsvcEngineUnreachable", "4m", [
                    {"job": "pdsvc-engines", "deployment": "dsv4", "role": "decode",
                     "unit": "dsv4-decode.service", "instance": "127.0.0.1:30001",
                     "severity": "warn"}]),
            ],
        },
    ]


def _annotated(cases: list[dict], plan) -> list[dict]:
    """The expected alerts with their annotations: the rule's, labels filled in (promtool
    compares annotations too)."""
    rules = alert_rules(plan)
    for case in cases:
        for t in case["alert_rule_test"]:
            for exp in t["exp_alerts"]:
                rule = next(r for r in rules if r["alert"] == t["alertname"] and all(
                    exp["exp_labels"].get(k) == v for k, v in r.get("labels", {}).items()))
                notes = {k: rule[k] for k in ("summary", "description")}
                for k, v in exp["exp_labels"].items():
                    notes = {n: text.replace(f"{{{{ $labels.{k} }}}}", v)
                             for n, text in notes.items()}
                assert "{{" not in "".join(notes.values()), notes
                exp["exp_annotations"] = notes
    return cases


def test_each_alert_fires_on_its_fault_and_not_without(promtool, tmp_path) -> None:
    plan = load_plan(REPO / "etc/pdsvc.yaml", None, SEED)
    mon = _write(render_systemd(plan, "test"), tmp_path)
    tests = {"rule_files": ["dsv4-rules.yml"], "evaluation_interval": "15s",
             "tests": _annotated(_cases(), plan)}
    (mon / "tests.yml").write_text(json.dumps(tests, indent=1))  # JSON is YAML
    done = _run(promtool, "test", "rules", "tests.yml", cwd=mon)
    assert done.returncode == 0, done.stdout + done.stderr
    covered = {t["alertname"] for c in _cases() for t in c["alert_rule_test"]}
    assert covered == {r["alert"] for r in alert_rules(plan)}


def test_the_fronts_alerts_fire_on_a_router_out_of_rotation(promtool, tmp_path) -> None:
    """router.replicas: 2: HAProxy's exporter is scraped (pdsvc-front), one router out of
    rotation for 2 min warns (not the seconds of a rolling restart), none in it pages."""
    plan = load_plan(REPO / "tests/cases/router-replicas.yaml", None, SEED)
    mon = _write(render_systemd(plan, "test"), tmp_path)
    text = (mon / "dsv4-prometheus.yml").read_text()
    assert '"pdsvc-front"' in text and '"127.0.0.1:29100"' in text
    assert _run(promtool, "check", "config", "dsv4-prometheus.yml", cwd=mon).returncode == 0
    front = {"deployment": "dsv4", "role": "front", "unit": "dsv4-front.service"}

    def status(server: str, state: str, values: str) -> dict:
        labels = ",".join(f'{k}="{v}"' for k, v in {**front, "proxy": "routers",
                                                     "server": server, "state": state}.items())
        return {"series": f"haproxy_server_status{{{labels}}}", "values": values}

    cases = [
        {  # router-1 drained for 20 s (a rolling restart): silent; router-0 DOWN for 3 min
            "interval": "15s",
            "input_series": [
                status("dsv4-router-0", "UP", "1x2 0x14"), status("dsv4-router-0", "DOWN",
                                                                  "0x2 1x14"),
                status("dsv4-router-1", "UP", "1x4 0x1 1x10"),
                status("dsv4-router-1", "DRAIN", "0x4 1x1 0x10"),
            ],
            "alert_rule_test": [
                _alert("PdsvcRouterOutOfFront", "90s", None),
                _alert("PdsvcRouterOutOfFront", "3m", [
                    {**front, "proxy": "routers", "server": "dsv4-router-0", "state": "UP",
                     "severity": "warn"}]),
                _alert("PdsvcNoRouterInFront", "3m", None),
            ],
        },
        {  # both out: the front refuses everything
            "interval": "15s",
            "input_series": [status("dsv4-router-0", "UP", "0x10"),
                             status("dsv4-router-1", "UP", "0x10")],
            "alert_rule_test": [
                _alert("PdsvcNoRouterInFront", "2m", [
                    {"deployment": "dsv4", "severity": "page"}]),
            ],
        },
    ]
    tests = {"rule_files": ["dsv4-rules.yml"], "evaluation_interval": "15s",
             "tests": _annotated(cases, plan)}
    (mon / "tests.yml").write_text(json.dumps(tests, indent=1))
    done = _run(promtool, "test", "rules", "tests.yml", cwd=mon)
    assert done.returncode == 0, done.stdout + done.stderr
