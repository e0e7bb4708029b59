"""Every rendered engine command line is accepted by SGLang's own parser (sglang 0.5.23) and the
router line by its router.package's own parser (sglang-router 0.3.2 or smg 1.13.0) — the argv
systemd will exec, taken from the unit file, not from the plan. Needs the serve venv
(tests/support/make_serve_venv.sh)."""

from __future__ import annotations

from pathlib import Path

import argv_check
import pytest
from conftest import REPO

from pdsvc.cli.kit import load_plan
from pdsvc.render.systemd import render_systemd
from units import exec_words, launched_argv, parse_unit

#: each router.package's module -> the argv_check kind that runs that package's own parser
ROUTER_KINDS = {"sglang_router.launch_router": "router", "smg.launch_router": "smg"}

CASES = [REPO / "etc/pdsvc.yaml"] + [  # the systemd cases that render (no `## format:`)
    p for p in sorted((REPO / "tests/cases").glob("*.yaml"))
    if "assert-error" not in p.read_text() and "## format:" not in p.read_text()
]


def _host(case: Path, sysfs_hosts) -> dict:
    for line in case.read_text().splitlines():
        if line.startswith("## host:"):
            return {"sysfs": sysfs_hosts[line.split()[-1]]}
    return {"topology": REPO / "etc/seed-host.topology.json"}


@pytest.fixture(scope="module")
def checked(serve_python: Path, sysfs_hosts) -> list[tuple[str, str, list[str], dict]]:
    """(case, unit, argv, parser result) for every service of every renderable case."""
    items = []
    for case in CASES:
        src = _host(case, sysfs_hosts)
        plan = load_plan(case, src.get("sysfs"), src.get("topology"))
        routers = {r.unit for r in plan.routers}  # the front (HAProxy) is not the runtime's
        for f in render_systemd(plan, "test"):
            if f.path not in routers | {e.unit for e in plan.engines}:
                continue
            words = exec_words(parse_unit(f.content)["Service"]["ExecStart"][0])
            argv = launched_argv(words[words.index("--") + 1:])
            kind = ROUTER_KINDS[argv[2]] if f.path in routers else "sglang"
            items.append((case.stem, f.path, kind, argv))
    results = argv_check.run_checks(serve_python, [(kind, argv[3:]) for *_, kind, argv in items])
    return [(c, u, a, r) for (c, u, _, a), r in zip(items, results, strict=True)]


def test_every_rendered_command_line_parses(checked) -> None:
    bad = [(c, u, r["error"]) for c, u, _, r in checked if not r["ok"]]
    assert not bad, bad
    abbreviated = [(c, u, r["abbreviated"]) for c, u, _, r in checked if r.get("abbreviated")]
    assert not abbreviated, f"flags accepted only as abbreviations: {abbreviated}"


def test_parsed_values_are_the_plan(checked) -> None:
    by_unit = {(c, u): r["record"] for c, u, _, r in checked if c == "pdsvc"}
    p, d = by_unit[("pdsvc", "dsv4-prefill.service")], by_unit[("pdsvc", "dsv4-decode.service")]
    router = by_unit[("pdsvc", "dsv4-router.service")]
    assert (p["disaggregation_mode"], d["disaggregation_mode"]) == ("prefill", "decode")
    assert p["disaggregation_transfer_backend"] == d["disaggregation_transfer_backend"] == "nixl"
    assert p["disaggregation_bootstrap_port"] == d["disaggregation_bootstrap_port"] == 8998
    assert (p["tp_size"], d["tp_size"], p["port"], d["port"]) == (4, 4, 30000, 30001)
    assert (p["dist_init_addr"], d["dist_init_addr"]) == ("127.0.0.1:30335", "127.0.0.1:30435")
    assert d["cuda_graph_max_bs_decode"] == 32 and p["mem_fraction_static"] == 0.7
    assert router["pd_disaggregation"] is True
    # no workers on the command line: the engines register themselves (POST /workers)
    assert router["prefill_urls"] == [] and router["decode_urls"] == []
    assert (router["port"], router["prometheus_port"]) == (8000, 29000)


def test_smg_case_parses_with_smgs_own_parser(checked) -> None:
    """router.package: smg is checked by smg 1.13.0's parser, which takes its extra flags."""
    (record,) = [r["record"] for c, u, _, r in checked if c == "router-smg" and "router" in u]
    assert record["remove_unhealthy_workers"] is False  # --no-remove-unhealthy-workers
    assert record["health_check_port"] == 8001  # router.args, an smg-only flag
    assert record["prefill_urls"] == []  # the engines register themselves


def test_each_router_parser_refuses_the_others_flag(serve_python: Path) -> None:
    """The data in pdsvc/routers.py matches the parsers: 0.3.2 refuses an smg-only flag, smg
    refuses 0.3.2's --mini-lb, so router.args is checked against the right one."""
    pd = ["--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998",
          "--decode", "http://127.0.0.1:30001"]
    old, new, new_mini = argv_check.run_checks(serve_python, [
        ("router", [*pd, "--health-check-port", "8001"]),
        ("smg", [*pd, "--health-check-port", "8001"]),
        ("smg", [*pd, "--mini-lb"]),
    ])
    assert not old["ok"] and "unrecognized arguments: --health-check-port" in old["error"]
    assert new["ok"], new["error"]
    assert not new_mini["ok"] and "unrecognized arguments: --mini-lb" in new_mini["error"]


def test_the_check_rejects_a_typo(serve_python: Path) -> None:
    """The parser check can fail: a misspelt choice is refused with SGLang's own message."""
    (res,) = argv_check.run_checks(serve_python, [("sglang", ["--model-path", "/m",
                                                              "--disaggregation-mode", "prefil"])])
    assert not res["ok"] and "invalid choice: 'prefil'" in res["error"]


def test_several_hosts_and_k8s_command_lines_parse(serve_python: Path, tmp_path: Path) -> None:
    """The per-host units of an engine spanning two hosts, and the k8s containers' commands
    (as Kubernetes expands them), through the same parsers."""
    import yaml

    from pdsvc.render.k8s import render_k8s

    cfg = yaml.safe_load((REPO / "etc/examples/three-hosts.yaml").read_text())
    cfg["hosts"]["gpu-c"] = {"address": "10.0.0.4", "run": ["prefill"]}  # prefill: TP8 on 2
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    plan = load_plan(path, None, REPO / "etc/seed-host.topology.json")
    items: list[tuple[str, str, list[str]]] = []
    for h in plan.hosts:
        for f in render_systemd(plan.for_host(h.name), "test"):
            if f.path.endswith(".service") and not f.path.endswith("-pd-ready.service"):
                words = exec_words(parse_unit(f.content)["Service"]["ExecStart"][0])
                argv = launched_argv(words[words.index("--") + 1:])
                kind = ROUTER_KINDS[argv[2]] if f.path.endswith("-router.service") else "sglang"
                items.append((f"{h.name}/{f.path}", kind, argv))
    for f in render_k8s(plan, "test"):
        for doc in yaml.safe_load_all(f.content):
            spec = doc.get("spec", {})
            pods = [spec.get("template", {}).get("spec")] + [
                spec.get("leaderWorkerTemplate", {}).get(t, {}).get("spec")
                for t in ("leaderTemplate", "workerTemplate")]
            for i, pod in enumerate(p for p in pods if p):
                for c in pod["containers"]:
                    words = [w.replace("$(LWS_LEADER_ADDRESS)", "10.9.9.9")
                             .replace("$(LWS_WORKER_INDEX)", str(i)).replace("$$", "$")
                             for w in c["command"]]
                    items.append((f"k8s/{f.path}/{c['name']}/{i}",
                                  ROUTER_KINDS[words[2]] if c["name"] == "router" else "sglang",
                                  words))
    results = argv_check.run_checks(serve_python, [(k, argv[3:]) for _, k, argv in items])
    bad = [(name, r["error"]) for (name, *_), r in zip(items, results, strict=True)
           if not r["ok"] or r.get("abbreviated")]
    assert not bad, bad
    parsed = {name: r["record"] for (name, *_), r in zip(items, results, strict=True)}
    a, c = parsed["gpu-a/dsv4-prefill.service"], parsed["gpu-c/dsv4-prefill.service"]
    assert (a["nnodes"], a["node_rank"], c["nnodes"], c["node_rank"]) == (2, 0, 2, 1)
    assert a["dist_init_addr"] == c["dist_init_addr"] == "10.0.0.2:30335"
    assert (a["host"], c["host"], a["tp_size"]) == ("10.0.0.2", "10.0.0.4", 8)
    router = parsed["lb/dsv4-router.service"]
    assert router["prefill_urls"] == [] and router["decode_urls"] == []
    lws = parsed["k8s/dsv4-prefill.yaml/prefill/1"]  # the worker template, rank 1
    assert (lws["dist_init_addr"], lws["node_rank"], lws["host"]) == ("10.9.9.9:30335", 1,
                                                                     "0.0.0.0")
    assert parsed["k8s/dsv4-router.yaml/router/0"]["prefill_urls"] == [
        ["http://dsv4-prefill.default.svc:30000", 8998]]
