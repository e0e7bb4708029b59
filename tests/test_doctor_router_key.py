"""`pdsvc doctor --host NAME`, one host of several: the router takes this host's control-plane
key (an authenticated GET /workers answers 200), against a stand-in router over real HTTP."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from ports import free_port

from pdsvc.config.load import parse_config
from pdsvc.doctor.routerkey import check_router_key
from pdsvc.plan.build import build_plan
from pdsvc.topology import load_topology_file

SEED = REPO / "etc/seed-host.topology.json"
ROUTER_KEY = "0123456789abcdef" * 4


@pytest.fixture
def router() -> Iterator[int]:
    """A stand-in router's control plane on 127.0.0.1: GET /workers answers 200 to
    `Bearer ROUTER_KEY`, 401 to anything else (as --control-plane-api-keys makes it)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            good = self.headers.get("Authorization") == f"Bearer {ROUTER_KEY}"
            body = json.dumps({"workers": []} if good else {"error": "unauthorized"}).encode()
            self.send_response(200 if good else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def host_plan(tmp_path: Path, port: int, host: str, fmt: str = "systemd"):
    """HOST's view of four hosts whose router (on lb, 127.0.0.1) listens on PORT; the
    prefill spans gpu-a and gpu-c (gpu-c runs its rank 1 alone)."""
    cfg = yaml.safe_load((REPO / "etc/examples/three-hosts.yaml").read_text())
    cfg["hosts"] = {"lb": {"address": "127.0.0.1", "run": ["router"]},
                    "gpu-a": {"address": "127.0.0.2", "run": ["prefill"]},
                    "gpu-b": {"address": "127.0.0.3", "run": ["decode"]},
                    "gpu-c": {"address": "127.0.0.4", "run": ["prefill"]}}
    cfg["router"] = {"port": port, "control_plane_key": str(tmp_path / "router.key")}
    cfg["format"] = fmt
    text = yaml.safe_dump(cfg)
    plan = build_plan(parse_config(text, "c.yaml"), load_topology_file(SEED),
                      config_source="c.yaml", config_text=text)
    return plan.for_host(host)


def rows_for(tmp_path: Path, port: int, key: str | None, host: str = "gpu-a", **kw):
    if key is not None:
        (tmp_path / "router.key").write_text(key)
    plan = host_plan(tmp_path, port, host, **kw)
    return [(r.status, r.detail, r.fix) for r in check_router_key(plan)]


def test_the_routers_key_is_taken(router: int, tmp_path: Path) -> None:
    assert rows_for(tmp_path, router, ROUTER_KEY + "\n") == [
        ("ok", f"the router at http://127.0.0.1:{router} takes this host's key "
         "(GET /workers: 200)", None)]


def test_a_key_of_this_hosts_own_is_refused_with_the_copy_step(router: int,
                                                               tmp_path: Path) -> None:
    own = "f" * 64
    ((status, detail, fix),) = rows_for(tmp_path, router, own)
    assert status == "failed" and "refuses this host's key (HTTP 401" in detail
    assert fix == ("copy the key from the router's host: scp root@127.0.0.1:"
                   f"{tmp_path}/router.key router.key && sudo install.sh --bundle "
                   "BUNDLE/gpu-a --key-from router.key && rm router.key; then systemctl "
                   "restart dsv4-pd.target")
    assert own not in detail + fix  # never shown
    ((_, _, sv_fix),) = rows_for(tmp_path, router, own, fmt="supervisord")
    assert sv_fix == ("copy the key from the router's host: scp root@127.0.0.1:"
                      f"{tmp_path}/router.key router.key && install -D -m 0640 -o root -g "
                      f"sglang router.key {tmp_path}/router.key && rm router.key")


def test_a_missing_key_is_a_warning_a_malformed_one_fails(router: int, tmp_path: Path) -> None:
    ((status, detail, fix),) = rows_for(tmp_path, router, None)
    assert status == "warning" and detail.endswith(
        "router.key is missing: the engines here cannot register with the router until it is "
        "copied here")
    assert "--key-from router.key" in fix
    ((status, detail, fix),) = rows_for(tmp_path, router, None, host="lb")
    assert status == "warning" and detail.endswith("is not made yet (the router's "
                                                   "control-plane key)")
    assert fix == "install the bundle: sudo install.sh --bundle BUNDLE/lb"
    ((status, detail, _),) = rows_for(tmp_path, router, "two words")
    assert status == "failed" and "is not a control-plane key" in detail


def test_an_unreachable_router_is_a_warning(tmp_path: Path) -> None:
    port = free_port()  # nothing listens on it
    ((status, detail, fix),) = rows_for(tmp_path, port, ROUTER_KEY)
    assert status == "warning" and detail.startswith(
        f"cannot reach the router at http://127.0.0.1:{port} (")
    assert fix == "start dsv4-pd.target on lb, then run pdsvc doctor again"


def test_the_check_runs_where_a_unit_reads_the_key(tmp_path: Path) -> None:
    from pdsvc.doctor.checks import CHECKS
    from pdsvc.doctor.facts import Facts
    from pdsvc.doctor.host import Host

    (check,) = [c for c in CHECKS if c.name == "router key"]
    host = Host(sysfs_root=tmp_path)
    asked = {h: check.when(Facts(host, host_plan(tmp_path, 8000, h)))
             for h in ("lb", "gpu-a", "gpu-b", "gpu-c")}
    assert asked == {"lb": True, "gpu-a": True, "gpu-b": True, "gpu-c": False}
