"""`pdsvc plan`'s connection list is what the rendered units do.

The expected list is read back from the bundles alone (ExecStart= of each systemd unit, command=
of each supervisord program, hosts.list for the addresses), with the runtime's own rules for what
each flag dials (pdsvc/ship/runtime: membership.py, canary.py, lifecycle's --restart-with and
--health-url), and compared with the plan's list row by row: a connection the units make and
the firewall list lacks fails here.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from sdsyntax import exec_argv, sections
from svconf import SupervisordConf

from pdsvc.cli.commands import main

THREE = REPO / "etc/examples/three-hosts.yaml"
SEED = ["--topology", str(REPO / "etc/seed-host.topology.json")]


def _2p2d() -> dict:
    """2P2D over four hosts: a prefill and a decode on each GPU host (local pairs and pairs
    across hosts), one decode spanning two hosts (ranks), the router alone."""
    cfg = yaml.safe_load(THREE.read_text())
    cfg["hosts"] = {
        "lb": {"address": "10.0.0.1", "run": ["router"]},
        "gpu-a": {"address": "10.0.0.2", "run": ["prefill[0]", "decode[0]"]},
        "gpu-b": {"address": "10.0.0.3", "run": ["prefill[1]", "decode[1]"]},
        "gpu-c": {"address": "10.0.0.4", "run": ["decode[1]"]},
    }
    cfg["prefill"] = [{"gpus": [0, 1]}, {"gpus": [0, 1]}]
    cfg["decode"] = [{"gpus": [2, 3]}, {"gpus": [2, 3]}]
    return cfg


CASES = {"three-hosts": yaml.safe_load(THREE.read_text()), "2p2d-four-hosts": _2p2d()}


def hostport(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def options(words: list[str]) -> dict[str, list[list[str]]]:
    """--flag -> the words after each of its occurrences, up to the next --flag."""
    out: dict[str, list[list[str]]] = {}
    current: list[str] | None = None
    for w in words:
        if w.startswith("--"):
            current = []
            out.setdefault(w, []).append(current)
        elif current is not None:
            current.append(w)
    return out


def dialled(argv: list[str]) -> set[tuple[str, str]]:
    """(ADDRESS:PORT, purpose) an engine unit's processes dial, read from its command line
    alone: the runtime's flags before `--`, SGLang's after."""
    cut = argv.index("--")
    rt, engine = options(argv[:cut]), options(argv[cut + 1:])
    out: set[tuple[str, str]] = set()
    (health,) = rt["--health-url"]
    out.add((hostport(health[0]), "rank ready"))  # its own /health, or rank 0's
    for (router,) in rt.get("--router", []):
        out.add((hostport(router), "membership"))  # membership.py: /workers
    me = rt["--advertise"][0][0] if "--advertise" in rt else None
    for prefill, port, decode in rt.get("--pair", []):
        peer = decode if prefill == me else prefill
        out |= {(hostport(peer), "canary"), (hostport(prefill), "canary"),
                (hostport(decode), "canary")}  # canary.py: peer /health, /generate to both
        if decode == me:  # the decode dials the bootstrap host the request names
            out.add((f"{urllib.parse.urlsplit(prefill).hostname}:{port}", "bootstrap"))
    for (url,) in rt.get("--restart-with", []):
        out.add((hostport(url), "peer watch"))
    for (there,) in rt.get("--fleet", []):  # cascade.py: another engine host's heals, cures
        out.add((there, "cascade"))
    rank = engine.get("--node-rank", [["0"]])[0][0]
    if rank != "0":
        out.add((engine["--dist-init-addr"][0][0], "dist-init"))
    return out


def from_units(bundle: Path, fmt: str) -> set[tuple[str, str, str]]:
    """(source host, ADDRESS:PORT, purpose) of every connection between hosts the bundle's
    units make."""
    address = {}
    for line in (bundle / "hosts.list").read_text().splitlines():
        if line and not line.startswith("#"):
            host, addr, _units = line.split("\t")
            address[host] = addr
    engines: dict[str, list[list[str]]] = {h: [] for h in address}
    router_host = None
    for host in address:
        if fmt == "systemd":
            for unit in sorted((bundle / host).glob("*.service")):
                (start,) = sections(unit.read_text())["Service"].get("ExecStart", [None])
                if start is None:
                    continue
                argv = exec_argv(start)
                if argv[2] == "router":
                    router_host = host
                elif argv[2] == "engine":
                    engines[host].append(argv)
        else:
            conf = SupervisordConf((bundle / host / "supervisord.conf").read_text(),
                                   str(bundle / host))
            for section in conf.sections():
                if section.startswith("program:"):
                    argv = conf.command(section)
                    argv = argv[argv.index("engine") - 2:] if "engine" in argv else argv
                    if "router" in argv[:4]:
                        router_host = host
                    elif argv[2] == "engine":
                        engines[host].append(argv)
    assert router_host is not None
    out = set()
    for host, argvs in engines.items():
        for argv in argvs:
            for target, purpose in dialled(argv):
                out.add((host, target, purpose))
            rt = options(argv[:argv.index("--")])
            for (url,) in rt.get("--advertise", []):  # the router dials what it is told
                out.add((router_host, hostport(url), "serving"))
    return {c for c in out if c[1].rpartition(":")[0] != address[c[0]]}


@pytest.mark.parametrize("fmt", ["systemd", "supervisord"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plans_connections_are_what_the_units_do(runner, tmp_path: Path, case: str,
                                                     fmt: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CASES[case], sort_keys=False))
    where = ["-c", str(config), *SEED]
    render = runner.invoke(main, ["render", *where, "--format", fmt, "-o", str(tmp_path / "b")])
    assert render.exit_code == 0, render.output + render.stderr
    plan = runner.invoke(main, ["plan", *where, "--json"])
    assert plan.exit_code == 0, plan.stderr
    listed = [(c["source"], c["target"], c["purpose"])
              for c in json.loads(plan.output)["connections"]]
    assert len(listed) == len(set(listed))  # one row per (source, target, purpose)
    assert sorted(listed) == sorted(from_units(tmp_path / "b", fmt))


def test_three_hosts_firewall_list_reads_as_the_issue_asks(runner) -> None:
    """The rows a firewall between lb, gpu-a and gpu-b must let through (sources first):
    registration with the router and the pair canary included."""
    result = runner.invoke(main, ["plan", "-c", str(THREE), *SEED])
    assert result.exit_code == 0, result.stderr
    rows = result.output.split("Connections between hosts (open them in host firewalls):\n")[1]
    got = [tuple(line.split(None, 3)[:3:2]) for line in rows.splitlines()]
    assert got == [
        ("gpu-a", "10.0.0.1:8000"), ("gpu-b", "10.0.0.1:8000"),  # POST /workers
        ("gpu-b", "10.0.0.2:8997"),  # a heal cascade's heals and cures, between engine hosts
        ("gpu-b", "10.0.0.2:8998"),  # the KV bootstrap the router hands decode
        ("lb", "10.0.0.2:30000"),  # requests and the router's health checks
        ("gpu-b", "10.0.0.2:30000"),  # decode's canary to its prefill
        ("gpu-b", "10.0.0.2:30000"),  # decode's --restart-with watch
        ("gpu-a", "10.0.0.3:8997"),
        ("lb", "10.0.0.3:30001"),
        ("gpu-a", "10.0.0.3:30001"),  # prefill's canary to its decode
    ]
