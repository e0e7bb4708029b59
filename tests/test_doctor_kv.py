"""`pdsvc doctor --kv`: real NIXL transfers between two processes started as the units are.

No GPU here, so the halves move host memory: the launcher, the environment and pinning, the
probe, the transport read from UCX, the judging and the report are what these prove. The GPU
figures (cuda_copy / cuda_ipc) come from benchmarks/kv_path.py on a GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pdsvc.cli.doctor import doctor
from pdsvc.cli.kit import load_plan
from pdsvc.doctor.host import Host
from pdsvc.doctor.kv import (
    Half,
    HalfResult,
    _check_pair,
    _failed,
    _judge,
    _parse_result,
    check_kv,
    choose_launcher,
    pairs,
    transports,
)
from pdsvc.doctor.kv_launch import (
    Launch,
    UnitSettingError,
    direct_launch,
    dropins,
    service_settings,
    systemd_launch,
    unit_exec_settings,
)
from pdsvc.doctor.probes import probe_source
from pdsvc.plan.build import KvCheck, Plan
from pdsvc.render.systemd import render_systemd

UCX = REPO / "tests" / "fixtures" / "ucx"
SEED_TOPOLOGY = REPO / "etc" / "seed-host.topology.json"
SMALL = {"kv_check_bytes": 4 << 20, "kv_check_blocks": 4}


def make_plan(tmp_path: Path, python: str, **sections: dict) -> Plan:
    cfg = {"model": {"path": "/srv/m"}, "runtime": {"python": python, "pinning": "off"},
           "transfer": dict(SMALL)}
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / "pdsvc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_plan(path, None, SEED_TOPOLOGY)


# ------------------------------------------------------------------ reading UCX's choice


def test_transport_of_host_memory_is_read_from_proto_info() -> None:
    assert transports((UCX / "proto-info-host-cma.txt").read_text()) == ["cma/memory"]


def test_every_lane_of_a_split_write_is_named() -> None:
    # "52% on tcp/lo and 48% on tcp/eth0": UCX_TLS=tcp, two interfaces
    assert transports((UCX / "proto-info-host-tcp.txt").read_text()) == ["tcp/lo", "tcp/eth0"]


def test_gpu_memory_on_an_h200_went_over_cuda_ipc() -> None:
    """Captured on an H200 (benchmarks/kv_path.py, GPU 0 → GPU 0): the agent's writes to
    itself (self cfg), host-memory control writes (cma/memory) and host→GPU emulation over
    tcp/lo are in the same output; only the GPU→GPU write between the agents is the path."""
    text = (UCX / "proto-info-h200-gpu0-gpu0.txt").read_text()
    assert transports(text, "cuda") == ["cuda_ipc/cuda"]
    assert transports(text, "host") == ["cma/memory"]


def test_only_the_largest_range_of_a_write_between_agents_counts() -> None:
    text = (
        "[1] [h:1:0]   | init self cfg#0 |\n"
        "[1] [h:1:0]   | remote memory write by ucp_put* from cuda/GPU0 to cuda/dev[0] |\n"
        "[1] [h:1:0]   | 0..inf | zero-copy | cuda_copy/cuda |\n"
        "[1] [h:1:0]   | init inter-node cfg#3 |\n"
        "[1] [h:1:0]   | active message by ucp_am_send* from host memory |\n"
        "[1] [h:1:0]   | 627..inf | multi-frag copy-in | tcp/eth0 |\n"
        "[1] [h:1:0]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[1] |\n"
        "[1] [h:1:0]   | Range | Description | Config |\n"
        "[1] [h:1:0]   | 0..8191 | short | rc_mlx5/mlx5_0:1 |\n"
        "[1] [h:1:0]   | 8192..inf | zero-copy | rc_mlx5/mlx5_0:1 |\n"
    )
    assert transports(text, "cuda") == ["rc_mlx5/mlx5_0:1"]


def test_nixl_refusing_ucx_tls_is_named_with_its_own_reason(seed_plan: Plan) -> None:
    """Captured on an H200: NIXL logs why before it raises a bare NIXL_ERR_BACKEND."""
    err = (UCX / "nixl-h200-ucx-tls-tcp.err").read_text()
    got = HalfResult(_parse_result(err), "", err, 1)
    assert "Invalid UCX_TLS=tcp for NIXL UCX backend" in got.error()
    row = _failed("kv", "the decode-side half", got, seed_plan.engines[1], "direct")
    assert row.status == "failed" and "at agent" in row.detail
    assert row.fix.startswith("UCX_TLS=tcp leaves out what this path needs")


def test_no_proto_info_names_no_transport() -> None:
    assert transports("plain output\n") == []


# ------------------------------------------------------------------ the units' own settings


def test_service_settings_join_continuations_and_skip_other_sections() -> None:
    text = "[Unit]\nUser=nobody\n[Service]\n# c\nUser=sglang\nExecStart=/bin/a \\\n    b\n"
    assert service_settings(text) == [("User", "sglang"), ("ExecStart", "/bin/a      b")]


def test_exec_settings_come_from_the_rendered_unit(tmp_path: Path) -> None:
    cfg = {"model": {"path": "/srv/m"}, "prefill": {"env": {"UCX_TLS": "rc,cuda_copy"}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    plan = load_plan(tmp_path / "c.yaml", None, SEED_TOPOLOGY)
    prefill = plan.engines[0]
    got = unit_exec_settings(plan, prefill, dropin_roots=[str(tmp_path / "none")])
    keys = {k for k, _ in got}
    assert ("User", "sglang") in got
    assert ("CPUAffinity", prefill.pinning.cpulist) in got
    assert ("NUMAMask", str(prefill.pinning.numa_node)) in got
    assert ('Environment', '"UCX_TLS=rc,cuda_copy"') in got
    assert ("Environment", '"CUDA_VISIBLE_DEVICES=0,1,2,3"') in got
    assert ("EnvironmentFile", "-/etc/dsv4/dsv4-prefill.env") in got
    # the sandboxing comes along: a drop-in that breaks the engine must break the probe
    assert {"ProtectSystem", "PrivateTmp", "RestrictAddressFamilies", "CapabilityBoundingSet",
            "LimitMEMLOCK", "NoNewPrivileges", "UMask"} <= keys
    # what is the service's own lifecycle (or would be made, or needs doctor's stdio) does not
    assert not keys & {"ExecStart", "Restart", "RestartSec", "Type", "LoadCredential",
                       "RuntimeDirectory", "StateDirectory", "CacheDirectory", "WatchdogSec",
                       "TimeoutStartSec", "KillMode", "SyslogIdentifier", "NotifyAccess"}


def test_a_literal_percent_arrives_as_one_and_a_specifier_is_refused(tmp_path: Path) -> None:
    """The unit file says %% for %; `systemd-run -p` expands nothing, so it must get %."""
    cfg = {"model": {"path": "/srv/m"}, "prefill": {"env": {"UCX_LOG_FILE": "/tmp/ucx.%p"}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    plan = load_plan(tmp_path / "c.yaml", None, SEED_TOPOLOGY)
    unit = next(f.content for f in render_systemd(plan, "x") if f.path == "dsv4-prefill.service")
    assert 'Environment="UCX_LOG_FILE=/tmp/ucx.%%p"' in unit
    got = unit_exec_settings(plan, plan.engines[0], dropin_roots=[])
    assert ("Environment", '"UCX_LOG_FILE=/tmp/ucx.%p"') in got
    etc = tmp_path / "etc"
    (etc / "dsv4-prefill.service.d").mkdir(parents=True)
    (etc / "dsv4-prefill.service.d" / "h.conf").write_text(
        "[Service]\nEnvironment=CACHE=%h/cache\n")
    with pytest.raises(UnitSettingError, match=r"h\.conf: Environment=: the specifier '%h'"):
        unit_exec_settings(plan, plan.engines[0], dropin_roots=[str(etc)])


def test_dropins_apply_by_name_and_the_more_specific_file_of_a_name_wins(
        tmp_path: Path) -> None:
    """systemd.unit(5): UNIT.d/, then its dashed prefixes, then TYPE.d/ — within a root the
    more specific directory wins a file name, and /etc wins over /run."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    for d, name, body in (
            (etc, "dsv4-.service.d/10-all.conf", "[Service]\nEnvironment=A=1\n"),
            (etc, "dsv4-.service.d/20-ucx.conf", "[Service]\nEnvironment=UCX_NET_DEVICES=all\n"),
            (etc, "dsv4-prefill.service.d/20-ucx.conf",
             "[Service]\nEnvironment=UCX_NET_DEVICES=mlx5_0:1\nRestart=no\n"),
            (run, "dsv4-prefill.service.d/20-ucx.conf",
             "[Service]\nEnvironment=UCX_NET_DEVICES=masked\n"),
            (run, "service.d/30-every-service.conf", "[Service]\nEnvironment=C=3\n"),
            (etc, "dsv4-decode.service.d/30-other.conf", "[Service]\nEnvironment=B=2\n")):
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(body)
    roots = [str(etc), str(run)]
    got_files = dropins("dsv4-prefill.service", roots)
    assert [str(p.relative_to(tmp_path)) for p in got_files] == [
        "etc/dsv4-.service.d/10-all.conf", "etc/dsv4-prefill.service.d/20-ucx.conf",
        "run/service.d/30-every-service.conf"]
    plan = load_plan(REPO / "etc" / "pdsvc.yaml", None, SEED_TOPOLOGY)
    got = unit_exec_settings(plan, plan.engines[0], roots)
    envs = [v for k, v in got if k == "Environment"]
    assert envs[-3:] == ["A=1", "UCX_NET_DEVICES=mlx5_0:1", "C=3"]
    assert ("Restart", "no") not in got


def test_systemd_launch_runs_the_probe_as_a_transient_unit_with_them() -> None:
    plan = load_plan(REPO / "etc" / "pdsvc.yaml", None, SEED_TOPOLOGY)
    launch = systemd_launch(plan, plan.engines[1], ["m", "target"], "x.service", 90,
                            {"UCX_PROTO_INFO": "y"}, dropin_roots=[])
    argv = list(launch.argv)
    assert argv[:6] == ["systemd-run", "--quiet", "--collect", "--wait", "--pipe",
                        "--unit=x.service"]
    props = [argv[i + 1] for i, w in enumerate(argv) if w == "-p"]
    assert "User=sglang" in props and "RuntimeMaxSec=90" in props
    assert props.index("Environment=UCX_PROTO_INFO=y") > props.index(
        'Environment="CUDA_VISIBLE_DEVICES=4,5,6,7"')
    assert argv[argv.index("--") + 1:] == [plan.python, "-I", "-", "m", "target"]


def test_direct_launch_takes_the_plan_env_and_env_file_and_pins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "doctor's own, not the unit's")
    plan = make_plan(tmp_path, "/usr/bin/python3", runtime={"pinning": "numa"},
                     decode={"env": {"UCX_TLS": "sm"}})
    plan = replace(plan, paths=replace(plan.paths, env_dir=str(tmp_path / "etc")))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "dsv4-decode.env").write_text("# mine\nUCX_NET_DEVICES='eth1'\n")
    d = plan.engines[1]
    launch = direct_launch(plan, d, ["m", "target"], {"UCX_PROTO_INFO": "y"})
    assert launch.env["UCX_TLS"] == "sm" and launch.env["UCX_NET_DEVICES"] == "eth1"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert launch.env["UCX_PROTO_INFO"] == "y"
    assert launch.env["HOME"] == dict(d.env)["HOME"] != os.environ.get("HOME")
    assert list(launch.argv[-3:]) == ["--cpus", d.pinning.cpulist, "--memlock"]


def test_auto_takes_systemd_only_as_root_on_a_systemd_host(tmp_path: Path) -> None:
    booted = Host(systemd_run_dir=tmp_path)
    assert choose_launcher(Host(systemd_run_dir=tmp_path / "no"), "auto") == "direct"
    assert choose_launcher(booted, "direct") == "direct"
    expect = "systemd" if os.geteuid() == 0 and os.path.exists("/usr/bin/systemd-run") \
        else "direct"
    assert choose_launcher(booted, "auto") == expect


def test_pairs_are_every_prefill_with_every_decode(tmp_path: Path) -> None:
    plan = load_plan(REPO / "etc" / "examples" / "2p1d.yaml", None, SEED_TOPOLOGY)
    got = [(p.name, d.name) for p, d in pairs(plan)]
    prefills = [e.name for e in plan.engines if e.role == "prefill" and e.node_rank == 0]
    decodes = [e.name for e in plan.engines if e.role == "decode" and e.node_rank == 0]
    assert got == [(p, d) for p in prefills for d in decodes] and len(got) >= 2


# ------------------------------------------------------------------ judging


def _result(**kw: object) -> HalfResult:
    r = {"ok": True, "intact": True, "gbps": 40.0, "cold_gbps": 10.0, "bytes": 4 << 20,
         "blocks": 4, "kind": "VRAM", "where": "GPU 0", "peer_where": "GPU 4", "env": {}}
    r.update(kw)
    return HalfResult(r, "", "", 0)


@pytest.fixture(scope="module")
def seed_plan() -> Plan:
    return load_plan(REPO / "etc" / "pdsvc.yaml", None, SEED_TOPOLOGY)


def test_bytes_that_arrive_wrong_fail(seed_plan: Plan) -> None:
    row = _judge(seed_plan, "kv", seed_plan.engines[0], _result(intact=False, first_bad_block=3),
                 True, "direct", True)
    assert row.status == "failed" and "block 3" in row.detail


def test_a_rate_under_the_floor_warns_with_its_key(seed_plan: Plan) -> None:
    plan = replace(seed_plan, kv_check=KvCheck(4 << 20, 4, 100.0))
    row = _judge(plan, "kv", plan.engines[0], _result(gbps=40.0), True, "direct", True)
    assert row.status == "warning" and "kv_check_min_gbps" in row.fix
    row = _judge(plan, "kv", plan.engines[0], _result(gbps=400.0), True, "direct", True)
    assert row.status == "ok" and "400.0 GB/s" in row.detail


def test_halves_that_saw_no_gpu_on_a_gpu_host_name_the_device_policy(seed_plan: Plan) -> None:
    row = _judge(seed_plan, "kv", seed_plan.engines[0], _result(kind="DRAM"), True, "systemd",
                 True)
    assert row.status == "warning" and "DevicePolicy" in row.fix
    row = _judge(seed_plan, "kv", seed_plan.engines[0], _result(kind="DRAM"), True, "systemd",
                 False)
    assert row.status == "ok"


def test_gpu_kv_over_tcp_between_hosts_names_the_nic(seed_plan: Plan) -> None:
    ucx = ("[1] [h:1:0]   | pdsvc-kv-initiator inter-node cfg#2 |\n"
           "[1] [h:1:0]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to "
           "cuda/dev[1] |\n"
           "[1] [h:1:0]   | 0..inf | software emulation | tcp/eth0 |\n")
    tcp = HalfResult(_result().result, ucx, "", 0)
    row = _judge(seed_plan, "kv", seed_plan.engines[0], tcp, False, "systemd", True)
    assert row.status == "warning" and "ucx_net_devices" in row.fix


# ------------------------------------------------------------------ real NIXL, host memory


@pytest.fixture(scope="module")
def nixl_python(serve_python: Path) -> str:
    probe = subprocess.run([str(serve_python), "-c", "import nixl._api"], capture_output=True,
                           text=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"the serve venv has no nixl (tests/support/make_serve_venv.sh): "
                    f"{probe.stderr.strip()[-200:]}")
    return str(serve_python)


def test_a_pair_moves_its_blocks_intact(tmp_path: Path, nixl_python: str) -> None:
    plan = make_plan(tmp_path, nixl_python)
    [row] = check_kv(plan, plan, Host(), "direct", gpus_here=False)
    assert row.status == "ok", row
    assert row.check == "kv dsv4-prefill→dsv4-decode"
    assert "intact" in row.detail and "4 MiB in 4 blocks" in row.detail
    assert "over " in row.detail and "/" in row.detail.split(" over ")[1]  # a transport named


def test_ucx_tls_tcp_on_one_host_warns_and_names_ucx_tls(tmp_path: Path,
                                                         nixl_python: str) -> None:
    plan = make_plan(tmp_path, nixl_python, prefill={"env": {"UCX_TLS": "tcp"}},
                     decode={"env": {"UCX_TLS": "tcp"}})
    [row] = check_kv(plan, plan, Host(), "direct", gpus_here=False)
    assert row.status == "warning", row
    assert "tcp/" in row.detail and "TCP between two processes of one host" in row.detail
    assert row.fix.startswith("UCX_TLS=tcp ")


def test_a_wrong_ucx_net_devices_fails_and_names_it(tmp_path: Path, nixl_python: str) -> None:
    plan = make_plan(tmp_path, nixl_python, prefill={"env": {"UCX_NET_DEVICES": "bogus0"}})
    [row] = check_kv(plan, plan, Host(), "direct", gpus_here=False)
    assert row.status == "failed", row
    assert "NIXL_ERR_BACKEND" in row.detail
    assert row.fix.startswith("UCX_NET_DEVICES=bogus0 names no usable device")
    assert "prefill.env" in row.fix


def test_the_probe_pins_itself_and_reports_what_it_ran_with(nixl_python: str) -> None:
    """The initiator against a port nobody serves: it fails at connect, but first pins itself
    and says which CPUs and UCX settings it had."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    env = {"PATH": os.environ["PATH"], "UCX_LOG_LEVEL": "error"}
    proc = subprocess.run(
        [nixl_python, "-I", "-", "m", "initiator", "--pair", "p-to-d", "--target",
         "http://127.0.0.1:9",
         "--bytes", str(1 << 20), "--blocks", "1", "--timeout", "1", "--cpus", str(cpu)],
        input=probe_source("kvpath.py"), capture_output=True, text=True, env=env, timeout=60)
    result = json.loads(proc.stderr.rsplit("pdsvc-doctor-result ", 1)[1])
    assert proc.returncode == 1
    assert result["stage"] == "connect" and result["cpus"] == [cpu]
    assert result["env"] == {"UCX_LOG_LEVEL": "error"}
    bad = subprocess.run(
        [nixl_python, "-I", "-", "m", "initiator", "--pair", "p-to-d", "--bytes",
         str(1 << 20), "--blocks", "1",
         "--cpus", "100000"], input=probe_source("kvpath.py"), capture_output=True, text=True,
        env=env, timeout=60)
    assert json.loads(bad.stderr.rsplit("pdsvc-doctor-result ", 1)[1])["stage"] == "pin"


def hosts_config(tmp_path: Path, python: str, hosts: dict, **roles: object) -> Path:
    topo = tmp_path / "topo.json"
    topo.write_text(SEED_TOPOLOGY.read_text())
    cfg = {"model": {"path": "/srv/m"}, "runtime": {"python": python, "pinning": "off"},
           "transfer": dict(SMALL),
           "hosts": {name: {"address": addr, "topology": str(topo), "run": run,
                            "ucx_net_devices": "lo"} for name, (addr, run) in hosts.items()},
           **roles}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_hosts(path: Path, names: list[str], peer_wait: float = 120) -> dict[str, list]:
    """`pdsvc doctor --kv --host NAME` on each host at once (threads stand in for hosts)."""
    whole = load_plan(path, None, None, scheduled=True)
    rows: dict[str, list] = {}

    def side(name: str) -> None:
        here = load_plan(path, None, None, only_host=name).for_host(name)
        rows[name] = check_kv(whole, here, Host(), "direct", gpus_here=False,
                              peer_wait=peer_wait)

    threads = [threading.Thread(target=side, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return rows


def test_across_hosts_each_host_runs_its_half(tmp_path: Path, nixl_python: str) -> None:
    """Two inventory hosts on two loopback addresses: the decode's host serves the target on
    the decode's address and port, the prefill's host writes to it; run at once, they pair."""
    path = hosts_config(tmp_path, nixl_python, {"a": ("127.0.0.2", ["prefill", "router"]),
                                                "b": ("127.0.0.3", ["decode"])},
                        prefill={"gpus": [0]}, decode={"gpus": [0]})
    rows = run_hosts(path, ["b", "a"])
    [a], [b] = rows["a"], rows["b"]
    assert a.status == "ok" and "intact" in a.detail and "GB/s" in a.detail, a
    assert b.status == "ok" and "received from dsv4-prefill's host" in b.detail, b


def test_two_prefill_hosts_take_turns_at_one_decode(tmp_path: Path, nixl_python: str) -> None:
    """2P1D over three hosts: both prefill hosts reach for the same decode address and port;
    the decode's host serves one pair at a time, in plan order, and each initiator waits for
    its own pair (another's target answers 409), so each row is the pair it names."""
    path = hosts_config(tmp_path, nixl_python,
                        {"a": ("127.0.0.2", ["prefill[0]", "router"]),
                         "c": ("127.0.0.4", ["prefill[1]"]), "b": ("127.0.0.3", ["decode"])},
                        prefill=[{"gpus": [0]}, {"gpus": [1]}], decode={"gpus": [0]})
    rows = run_hosts(path, ["c", "b", "a"])  # the second pair's prefill host starts first
    [a], [c] = rows["a"], rows["c"]
    assert [r.check for r in rows["b"]] == ["kv dsv4-prefill-0→dsv4-decode",
                                           "kv dsv4-prefill-1→dsv4-decode"]
    assert all(r.status == "ok" for r in rows["b"]), rows["b"]
    assert a.check == "kv dsv4-prefill-0→dsv4-decode" and a.status == "ok", a
    assert c.check == "kv dsv4-prefill-1→dsv4-decode" and c.status == "ok", c


def test_a_decode_host_alone_gives_up_on_its_peer_within_the_bound(
        tmp_path: Path, nixl_python: str) -> None:
    path = hosts_config(tmp_path, nixl_python, {"a": ("127.0.0.2", ["prefill", "router"]),
                                                "b": ("127.0.0.3", ["decode"])},
                        prefill={"gpus": [0]}, decode={"gpus": [0]})
    [b] = run_hosts(path, ["b"], peer_wait=3)["b"]
    assert b.status == "failed" and "no prefill-side half came in 3 s" in b.detail, b
    assert "on the prefill's host" in b.fix


def test_a_unit_setting_systemd_run_cannot_take_is_a_row(seed_plan: Plan) -> None:
    def launch(e, args, extra):  # noqa: ANN001, ANN202
        raise UnitSettingError("x.conf: Environment=: the specifier '%h' …")

    row = _check_pair(seed_plan, *seed_plan.engines[:2], True, True, launch, "systemd", False,
                      None, 5)
    assert row.status == "failed" and "cannot be started as its unit" in row.detail
    assert "--kv-as direct" in row.fix


def test_a_half_that_hangs_is_killed_at_the_bound(tmp_path: Path) -> None:
    launch = Launch(("sh", "-c", "cat >/dev/null; echo started >&2; sleep 600"),
                    {"PATH": os.environ["PATH"]}, "direct")
    half = Half(launch, tmp_path, "hang")
    got = half.finish(1)
    assert got.returncode is None and got.error() == "timed out"
    assert half.proc.poll() is not None  # gone, with its process group


def test_doctor_kv_adds_a_row_per_pair_to_the_report(tmp_path: Path, nixl_python: str,
                                                     runner) -> None:  # noqa: ANN001
    cfg = {"model": {"path": "/srv/m"}, "runtime": {"python": nixl_python, "pinning": "off"},
           "transfer": {**SMALL, "kv_check_min_gbps": 100000}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    result = runner.invoke(doctor, ["-c", str(tmp_path / "c.yaml"), "--topology",
                                    str(SEED_TOPOLOGY), "--kv", "--kv-as", "direct", "--json"])
    report = json.loads(result.stdout)  # progress goes to stderr, the JSON stays whole
    assert "pdsvc doctor: kv dsv4-prefill→dsv4-decode: both halves (direct), 4 MiB…" in \
        result.stderr
    [kv] = [c for c in report["checks"] if c["check"].startswith("kv ")]
    assert kv["status"] == "warning" and "under transfer.kv_check_min_gbps" in kv["detail"]
