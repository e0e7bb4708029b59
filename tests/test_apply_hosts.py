"""`pdsvc apply` over several hosts: one rollout over every host's units (HOST/UNIT), engines
one at a time across all hosts, the router's host last, and each host's command in that
order (--dry-run), each running only its own steps (--host)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from click.testing import CliRunner

from pdsvc.apply.bundles import read_bundle, recorded_config_sha, running_config
from pdsvc.apply.order import host_sequence, host_steps, plan
from pdsvc.cli.commands import main
from pdsvc.cli.kit import load_plan
from pdsvc.render.hosts_bundle import per_host
from pdsvc.render.systemd import render_systemd

REPO = Path(__file__).resolve().parent.parent
TOPO = REPO / "etc" / "seed-host.topology.json"

#: 2P2D over two GPU hosts (a prefill and a decode each) and a router host
HOSTS = """\
name: dsv4
model: {path: /srv/models/x}
transfer: {backend: mooncake}
hosts:
  lb: {address: 10.0.0.1, run: [router]}
  gpu-a: {address: 10.0.0.2, run: ["prefill[0]", "decode[0]"], ucx_net_devices: mlx5_0:1}
  gpu-b: {address: 10.0.0.3, run: ["prefill[1]", "decode[1]"], ucx_net_devices: mlx5_0:1}
prefill:
  - {gpus: [0, 1]%s}
  - {gpus: [0, 1]%s}
decode:
  - {gpus: [2, 3]%s}
  - {gpus: [2, 3]%s}
router: {policy: %s}
"""


def config(p: str = "", d: str = "", policy: str = "cache_aware") -> str:
    return HOSTS % (p, p, d, d, policy)


def bundle(tmp_path: Path, text: str, name: str) -> dict[str, str]:
    cfg = tmp_path / name
    cfg.write_text(text)
    pl = load_plan(cfg, None, TOPO)
    return {f.path: f.content for f in per_host(pl, "pdsvc render",
                                                lambda p: render_systemd(p, "pdsvc render"))}


def rollout(tmp_path: Path, new: str):
    return plan(bundle(tmp_path, config(), "old.yaml"), bundle(tmp_path, new, "new.yaml"))


def test_engines_roll_one_at_a_time_across_hosts_host_by_host_router_host_last(tmp_path):
    r = rollout(tmp_path, config(p=", env: {SGLANG_LOG_LEVEL: debug}",
                                 d=", env: {SGLANG_LOG_LEVEL: debug}", policy="round_robin"))
    assert [s.units for s in r.steps] == [
        ("gpu-a/dsv4-prefill-0.service",), ("gpu-a/dsv4-decode-0.service",),
        ("gpu-b/dsv4-prefill-1.service",), ("gpu-b/dsv4-decode-1.service",),
        ("lb/dsv4-router.service",)]
    # capacity counts the pairs across hosts: each engine is in 2 of the 4 pairs
    for s in r.steps[:4]:
        assert (len(s.pairs_down), s.pairs_left, s.serving_stops) == (2, 2, False)
    assert r.steps[-1].action == "restart router"
    assert host_sequence(r) == [("gpu-a", [1, 2]), ("gpu-b", [3, 4]), ("lb", [5])]
    assert [(i, s.units) for i, s in host_steps(r, "gpu-b")] == [
        (3, ("gpu-b/dsv4-prefill-1.service",)), (4, ("gpu-b/dsv4-decode-1.service",))]


def test_an_unchanged_host_has_no_steps(tmp_path):
    r = rollout(tmp_path, config(d=", args: {max-running-requests: 64}"))
    assert host_sequence(r) == [("gpu-a", [1]), ("gpu-b", [2])]
    assert host_steps(r, "lb") == []


def test_a_pair_incompatible_change_is_one_step_over_both_hosts(tmp_path):
    r = rollout(tmp_path, config(p=", args: {page-size: 64}", d=", args: {page-size: 64}"))
    [step] = r.steps
    assert step.action == "restart together" and step.serving_stops
    assert {u.split("/")[0] for u in step.units} == {"gpu-a", "gpu-b"}
    # each host restarts its part of it
    assert [len(s.units) for _, s in host_steps(r, "gpu-a")] == [2]


def rendered(tmp_path: Path) -> tuple[Path, Path]:
    cfg, out = tmp_path / "c.yaml", tmp_path / "out"
    cfg.write_text(config())
    res = CliRunner().invoke(main, ["render", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    return cfg, out


def test_dry_run_prints_the_global_order_with_hosts_and_each_hosts_command(tmp_path):
    cfg, out = rendered(tmp_path)
    cfg.write_text(config(d=", args: {max-running-requests: 64}", policy="round_robin"))
    args = ["apply", "-c", str(cfg), "--topology", str(TOPO), "-o", str(out), "--dry-run"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "1. restart gpu-a/dsv4-decode-0.service" in res.output
    assert "3. restart router lb/dsv4-router.service" in res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("  ") and " on " in ln]
    assert [ln.split(" (")[0].strip() for ln in lines] == ["1. on gpu-a", "2. on gpu-b",
                                                          "3. on lb"]
    assert lines[0].endswith("--host gpu-a") and "pdsvc apply -c" in lines[0]
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert [(h["host"], h["steps"]) for h in doc["hosts"]] == [
        ("gpu-a", [1]), ("gpu-b", [2]), ("lb", [3])]


def test_without_host_it_does_not_run_and_says_how(tmp_path):
    cfg, out = rendered(tmp_path)
    cfg.write_text(config(d=", args: {max-running-requests: 64}"))
    res = CliRunner().invoke(main, ["apply", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "run the commands above on each host, in that order" in res.output
    assert not (out / ".pdsvc-previous").exists()


def test_an_unknown_host_is_refused(tmp_path):
    cfg, out = rendered(tmp_path)
    res = CliRunner().invoke(main, ["apply", "-c", str(cfg), "--topology", str(TOPO),
                                    "-o", str(out), "--host", "gpu-z", "--dry-run"])
    assert res.exit_code == 2 and "gpu-z: not a host of this deployment" in res.output


def test_each_hosts_command_works_as_printed(tmp_path):
    """The command printed for a host renders as this one did (--topology: a router host has no
    GPUs to read) and keeps the bounds given; run as printed (with --dry-run), it plans the
    same, and names that host's steps."""
    cfg, out = rendered(tmp_path)
    cfg.write_text(config(d=", args: {max-running-requests: 64}"))
    args = ["apply", "-c", str(cfg), "--topology", str(TOPO), "-o", str(out), "--dry-run"]
    first = CliRunner().invoke(main, [*args, "--drain-timeout", "20"])
    assert first.exit_code == 0, first.output
    lines = [ln for ln in first.output.splitlines() if ln.startswith("  ") and " on " in ln]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line.split("): ", 1)[1])
        assert words[:3] == ["sudo", "pdsvc", "apply"] and "--topology" in words, words
        assert words[words.index("--drain-timeout") + 1] == "20", words
        assert "--step-timeout" not in words  # the default is not repeated
        again = CliRunner().invoke(main, [*words[2:], "--dry-run"])
        assert again.exit_code == 0, again.output
        assert [ln for ln in again.output.splitlines() if " on " in ln] == lines


def test_the_config_of_a_bundle_over_hosts_is_kept_for_the_way_back(tmp_path):
    """Each HOST/install.list records the config's digest: apply keeps the running config (the
    file the render recorded, unedited) in .pdsvc-previous/, so --rollback has it."""
    cfg, out = rendered(tmp_path)
    old = read_bundle(out)
    assert recorded_config_sha(old)
    assert running_config(out, old, tmp_path / "edited.yaml") == cfg.read_bytes()
    cfg.write_text(config(d=", args: {max-running-requests: 64}"))  # edited in place: gone
    assert running_config(out, old, cfg) is None
