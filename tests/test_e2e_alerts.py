"""The rendered monitoring, proven with real parts: Debian's Prometheus scrapes the
stand-in stack under a real systemd (nspawn container, real install.sh, real sglang-router,
stand-in engines) through the bundle's own monitoring/NAME-prometheus.yml and
monitoring/NAME-rules.yml, and Debian's node_exporter serves the runtimes' textfiles
(RUN_DIR/metrics) with only its textfile collector, as a user that is neither root nor the
service's (so the directory and file modes the runtime writes are what is tested).

A fault the stack cannot heal — the model path is gone, the engine crashes and every start
after fails until it gives up (exit 78) — makes PdsvcEngineGaveUp fire (Prometheus'
/api/v1/alerts), naming the unit and the command that shows more; once the model is back and
the target started again, the alert resolves.

Only one config value differs from a shipped config: metrics.scrape_interval_secs is 1, so
the rendered prometheus.yml (scrape and evaluation interval) is used as it is; the rules and
their `for:` are as rendered.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from nspawn import nspawn_available
from stack import Stack, curl

pytestmark = pytest.mark.e2e

PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROM_URL = "http://127.0.0.1:9090"
#: the most either runs, whatever happens to the test (systemd.service(5): RuntimeMaxSec=)
LIFETIME_S = 600


def real_monitoring() -> str | None:
    for tool in (PROMETHEUS, NODE_EXPORTER):
        if not Path(tool).exists():
            return (f"{tool} not found: apt-get install --no-install-recommends prometheus "
                    "prometheus-node-exporter")
    return None


def systemd_run(s: Stack, unit: str, *argv: str, props: tuple[str, ...] = ()) -> None:
    """A transient service in the container (systemd-run(1)): inside the stack's network
    namespace, killed with the container at the latest, never running past LIFETIME_S.
    DynamicUser=yes (systemd.exec(5)): a user that is neither root nor in the service's group,
    as Debian runs both (User=prometheus; the container's volatile /etc lacks that user)."""
    cmd = ["systemd-run", f"--unit={unit}", "--property=DynamicUser=yes",
           f"--property=RuntimeMaxSec={LIFETIME_S}"]
    cmd += [f"--property={p}" for p in props]
    s.c.run([*cmd, *argv], timeout=30)


def api(s: Stack, path: str) -> dict:
    code, body = curl(s.c, PROM_URL + path, timeout=5)
    assert code == 200, (path, code, body)
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    return doc["data"]


def query(s: Stack, promql: str) -> list[dict]:
    return api(s, "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))["result"]


def gave_up_alerts(s: Stack) -> dict[str, dict]:
    """unit -> PdsvcEngineGaveUp alert of /api/v1/alerts (pending or firing)."""
    return {a["labels"]["unit"]: a for a in api(s, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == "PdsvcEngineGaveUp"}


def rule_state(s: Stack, name: str) -> str:
    states = [r["state"] for g in api(s, "/api/v1/rules")["groups"] for r in g["rules"]
              if r.get("name") == name]
    assert len(states) == 1, states
    return states[0]


@pytest.fixture
def monitored(serve_python: Path, tmp_path: Path) -> Iterator[Stack]:
    require(nspawn_available())
    require(real_monitoring())
    s = Stack.up(tmp_path, serve_python.parent.parent, start=False,
                 **{"metrics.scrape_interval_secs": 1})
    try:
        systemd_run(s, "e2e-node-exporter", NODE_EXPORTER,
                    "--collector.disable-defaults", "--collector.textfile",
                    "--collector.textfile.directory=/run/e2e/metrics",
                    "--web.listen-address=127.0.0.1:9100")
        systemd_run(s, "e2e-prometheus", PROMETHEUS,
                    "--config.file=/srv/e2e/units/monitoring/e2e-prometheus.yml",
                    "--storage.tsdb.path=/run/e2e-prometheus",
                    "--web.listen-address=127.0.0.1:9090",
                    props=("RuntimeDirectory=e2e-prometheus",))
        yield s
    finally:
        try:
            s.c.run(["systemctl", "stop", "e2e-prometheus", "e2e-node-exporter"],
                    check=False, timeout=60)
        finally:
            s.down()


def diagnostics(s: Stack) -> str:
    out = []
    for unit in ("e2e-prometheus", "e2e-node-exporter", *s.units):
        out.append(f"--- {unit}:\n" + "\n".join(s.c.journal(unit).splitlines()[-20:]))
    out.append(s.c.run(["ls", "-la", "/run/e2e", "/run/e2e/metrics"], check=False).stdout)
    code, body = curl(s.c, PROM_URL + "/api/v1/alerts", timeout=5)
    return "\n".join([*out, f"/api/v1/alerts: {code} {body}"])


def test_engine_that_gave_up_fires_its_alert_and_it_resolves_once_fixed(
        monitored: Stack) -> None:
    try:
        scenario(monitored)
    except AssertionError:
        print(diagnostics(monitored))
        raise


def scenario(s: Stack) -> None:
    prefill, decode = s.unit("prefill"), s.unit("decode")
    s.start()
    s.wait_serving(60)

    # every rendered target answers: the engines' and the router's ports, and node_exporter
    # serving the runtimes' textfiles (readable by its user as the runtime writes them)
    def all_up() -> dict[str, str]:
        targets = api(s, "/api/v1/targets")["activeTargets"]
        health = {f"{t['labels']['job']} {t['scrapeUrl']}": t["health"] for t in targets}
        return health if health and set(health.values()) == {"up"} else {}

    health = s.c.wait_for(all_up, 60, interval=0.5, what="every rendered target is up")
    assert {k.split()[0] for k in health} == {"pdsvc-engines", "pdsvc-router", "pdsvc-node"}
    q = f'pdsvc_unit_up{{unit="{prefill}", role="prefill", deployment="e2e"}}'
    series = s.c.wait_for(lambda: query(s, q), 30, interval=0.5,
                          what="the prefill's textfile series in Prometheus")
    assert [(r["metric"]["job"], r["value"][1]) for r in series] == [("pdsvc-node", "1")]
    # the textfile's own labels are kept (honor_labels), not renamed to exported_*
    assert not [k for k in series[0]["metric"] if k.startswith("exported_")], series
    errors = query(s, "node_textfile_scrape_error")
    assert [r["value"][1] for r in errors] == ["0"], errors
    assert gave_up_alerts(s) == {} and rule_state(s, "PdsvcEngineGaveUp") == "inactive"

    # the fault: the model goes away and the prefill's engine dies; every start after fails
    model = s.work / "model"
    model.rmdir()
    fault = time.monotonic()
    s.c.run(["kill", "-9", str(s.engine_pid("prefill"))])

    def firing() -> dict[str, dict]:
        alerts = gave_up_alerts(s)
        return alerts if alerts.get(prefill, {}).get("state") == "firing" else {}

    alerts = s.c.wait_for(firing, 120, interval=0.5, what="PdsvcEngineGaveUp fires")
    to_firing = time.monotonic() - fault
    assert s.prop(prefill, "ActiveState") == "failed"
    assert s.prop(prefill, "ExecMainStatus") == "78"
    alert = alerts[prefill]
    assert alert["labels"]["deployment"] == "e2e" and alert["labels"]["role"] == "prefill"
    assert alert["labels"]["severity"] == "page"
    assert alert["annotations"]["summary"] == f"{prefill} gave up (exit 78) and is not restarted"
    what = alert["annotations"]["description"]
    assert f"journalctl -u {prefill} -n 100" in what and f"systemctl start {prefill}" in what
    assert "pdsvc status -c " in what
    # the decode restarts with its prefill (PartOf=) and lacks the model as well
    s.c.wait_for(lambda: gave_up_alerts(s).get(decode, {}).get("state") == "firing", 60,
                 interval=0.5, what="PdsvcEngineGaveUp fires for the decode too")

    # the fix, as the alert says: the cause (the model is back), then start
    model.mkdir()
    model.chmod(0o755)
    fix = time.monotonic()
    s.start()
    started = time.monotonic() - fix
    s.c.wait_for(lambda: gave_up_alerts(s) == {}, 60, interval=0.5,
                 what="PdsvcEngineGaveUp resolves")
    to_resolved = time.monotonic() - fix
    assert rule_state(s, "PdsvcEngineGaveUp") == "inactive"
    assert s.serves()
    print(f"\nBENCH PdsvcEngineGaveUp: model gone + engine killed -> firing {to_firing:.1f} s; "
          f"model back + systemctl start ({started:.1f} s) -> resolved {to_resolved:.1f} s "
          f"(scrape/evaluation interval 1 s)")
