"""Several hosts: the inventory (`hosts:`), per-host plans and bundles, TP across nodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pdsvc.cli.commands import main
from pdsvc.config.load import parse_config
from pdsvc.errors import ConfigError, TopologyError
from pdsvc.plan.build import build_plan
from pdsvc.topology import load_topology_file

SEED_TOPOLOGY = REPO / "etc/seed-host.topology.json"
SEED = ["--topology", str(SEED_TOPOLOGY)]
THREE = REPO / "etc/examples/three-hosts.yaml"


def plan_of(text: str, host_topologies: dict | None = None):
    config = parse_config(text, "c.yaml")
    return build_plan(config, load_topology_file(SEED_TOPOLOGY), config_source="c.yaml",
                      config_text=text, host_topologies=host_topologies)


def three_hosts(**changes) -> dict:
    cfg = yaml.safe_load(THREE.read_text())
    cfg.update(changes)
    return cfg


def test_three_hosts_plan_routes_over_the_hosts_addresses() -> None:
    plan = plan_of(THREE.read_text())
    prefill, decode = plan.engines
    assert (prefill.machine, prefill.host, decode.machine, decode.host) == (
        "gpu-a", "10.0.0.2", "gpu-b", "10.0.0.3")
    # the bootstrap server binds --host: a loopback bind would be unreachable from gpu-b
    argv = list(prefill.argv)
    assert argv[argv.index("--host") + 1] == "10.0.0.2"
    assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.2:30335"
    env = dict(decode.env)
    assert env["SGLANG_HOST_IP"] == "10.0.0.3" and env["UCX_NET_DEVICES"] == "mlx5_0:1"
    r = plan.router
    assert r.machine == "lb"
    # the router's workers, as it reaches them (the k8s manifests list them; units register)
    assert r.prefills == (("http://10.0.0.2:30000", 8998),)
    assert r.decodes == ("http://10.0.0.3:30001",)
    assert "--prefill" not in r.argv and "--decode" not in r.argv
    # membership: each engine registers itself with the router, at the router host's address,
    # as the router reaches it, so no registration timeout can drop a late remote engine
    assert (prefill.router_urls, prefill.url) == (("http://10.0.0.1:8000",), "http://10.0.0.2:30000")
    assert decode.pairs == prefill.pairs == (
        ("http://10.0.0.2:30000", 8998, "http://10.0.0.3:30001"),)
    # NIXL coupling across hosts: not PartOf= (one host only) but a watch of prefill's /health
    assert decode.restarts_with == () and decode.peer_health == ("http://10.0.0.2:30000/health",)
    assert prefill.peer_health == ()
    assert [(h.name, h.units) for h in plan.hosts] == [
        ("lb", ("dsv4-router.service",)), ("gpu-a", ("dsv4-prefill.service",)),
        ("gpu-b", ("dsv4-decode.service",))]


def test_for_host_is_what_runs_there() -> None:
    plan = plan_of(THREE.read_text())
    lb, a = plan.for_host("lb"), plan.for_host("gpu-a")
    assert lb.engines == () and lb.router is not None and lb.units == ("dsv4-router.service",)
    assert a.router is None and [e.name for e in a.engines] == ["dsv4-prefill"]
    with pytest.raises(KeyError, match="no host 'nope'"):
        plan.for_host("nope")


def test_render_writes_one_bundle_per_host(runner, tmp_path: Path) -> None:
    out = tmp_path / "units"
    result = runner.invoke(main, ["render", "-c", str(THREE), *SEED, "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    assert sorted(p.name for p in out.iterdir() if p.name[0] != ".") == [
        "gpu-a", "gpu-b", "hosts.list", "lb"]
    assert sorted(p.name for p in (out / "lb").iterdir()) == [
        "dsv4-pd-ready.service", "dsv4-pd.target", "dsv4-router.service", "install",
        "install.list", "monitoring", "runtime", "sysusers.d", "tmpfiles.d",
    ]  # monitoring/: this host's targets (the router, node_exporter); install/: the installer
    assert "dsv4-prefill.service" in (out / "gpu-a/dsv4-pd.target").read_text()
    decode = (out / "gpu-b/dsv4-decode.service").read_text()
    assert "--restart-with http://10.0.0.2:30000/health --peer-down-probes 3 --" in decode
    assert "--router http://10.0.0.1:8000 --role decode --advertise http://10.0.0.3:30001" \
        in decode
    router = (out / "lb/dsv4-router.service").read_text()
    assert "Wants=dsv4" not in router and "After=network-online.target" in router
    lst = (out / "lb/install.list").read_text()
    assert "dsv4-router.env" in lst and "dsv4-prefill" not in lst
    assert "dsv4-router" not in (out / "gpu-b/install.list").read_text()
    index = (out / "hosts.list").read_text()
    assert "gpu-a\t10.0.0.2\tdsv4-prefill.service" in index
    assert "sudo ./install.sh --bundle" in result.output


def test_a_host_leaving_the_inventory_takes_its_bundle_but_not_user_files(
    runner, tmp_path: Path
) -> None:
    out = tmp_path / "units"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(THREE.read_text())
    assert runner.invoke(main, ["render", "-c", str(cfg), *SEED, "-o", str(out)]).exit_code == 0
    (out / "gpu-b" / "notes.txt").write_text("mine")
    two = three_hosts()
    two["hosts"]["gpu-a"]["run"] = ["prefill", "decode"]
    two["decode"]["gpus"] = [4, 5, 6, 7]
    del two["hosts"]["gpu-b"]
    cfg.write_text(yaml.safe_dump(two))
    result = runner.invoke(main, ["render", "-c", str(cfg), *SEED, "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    assert "removed  " in result.output and "gpu-b/dsv4-decode.service" in result.output
    assert sorted(p.name for p in (out / "gpu-b").iterdir()) == ["notes.txt"]
    # back to one host: the host directories go, the flat bundle comes back
    cfg.write_text(yaml.safe_dump({k: v for k, v in two.items() if k != "hosts"}))
    result = runner.invoke(main, ["render", "-c", str(cfg), *SEED, "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    assert not (out / "gpu-a").exists() and not (out / "lb").exists()
    assert (out / "dsv4-decode.service").is_file() and (out / "gpu-b/notes.txt").is_file()


def test_an_engine_listed_on_two_hosts_spans_them() -> None:
    cfg = three_hosts()
    cfg["hosts"]["gpu-c"] = {"address": "10.0.0.4", "run": ["prefill"]}
    cfg["prefill"] = {"gpus": [0, 1, 2, 3]}  # per host: TP8 over two hosts
    plan = plan_of(yaml.safe_dump(cfg))
    ranks = [e for e in plan.engines if e.role == "prefill"]
    assert [(e.machine, e.node_rank, e.nnodes, e.tp) for e in ranks] == [
        ("gpu-a", 0, 2, 8), ("gpu-c", 1, 2, 8)]
    for e in ranks:
        argv = list(e.argv)
        assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.2:30335"  # rank 0's
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(e.node_rank)
        assert argv[argv.index("--host") + 1] == dict(e.env)["SGLANG_HOST_IP"]
        assert e.health_url == "http://10.0.0.2:30000/health"  # only rank 0 serves HTTP
    assert plan.units.count("dsv4-prefill.service") == 1
    assert len(plan.router.prefills) == 1  # the router knows rank 0 only
    assert [(e.name, e.node_rank, bool(e.router_urls)) for e in ranks] == [
        ("dsv4-prefill", 0, True), ("dsv4-prefill", 1, False)]  # rank 0 registers


@pytest.mark.parametrize("change, message", [
    ({"gpu-a": {"address": "gpu-a.example", "run": ["prefill"]}},
     "hosts.gpu-a.address: must be an IPv4 address"),
    ({"gpu-a": {"address": "0.0.0.0", "run": ["prefill"]}}, "must be the host's own IP"),
    ({"gpu-b": {"address": "10.0.0.2", "run": ["decode"]}},
     "hosts.gpu-b.address: 10.0.0.2 is also hosts.gpu-a.address; one address per host"),
    ({"gpu-a": {"address": "127.0.0.1", "run": ["prefill"]}},
     "hosts.gpu-a.address: 127.0.0.1 is a loopback address, which the other hosts cannot "
     "reach"),
    ({"gpu-a": {"address": "10.0.0.2", "run": ["prefil"]}},
     "'prefil' is not something to run"),
    ({"gpu-a": {"address": "10.0.0.2", "run": ["prefill[1]"]}},
     "hosts.gpu-a.run[0]: prefill[1] names no engine: prefill is one mapping; write `prefill`"),
    ({"gpu-a": {"address": "10.0.0.2", "run": ["decode"]}},
     "prefill runs on no host; add `prefill`"),
    ({"gpu-a": {"address": "10.0.0.2", "run": ["prefill", "router"]}},
     "router.vip.address: the router is on 2 hosts (lb, gpu-a) and clients need one "
     "address: set router.vip.address"),
    ({"gpu-a": {"address": "10.0.0.2", "run": ["prefill"], "ucx_net_devices": "eth1",
                "env": {"SGLANG_HOST_IP": "1.2.3.4"}}},
     "SGLANG_HOST_IP is set by pdsvc from hosts.NAME.address"),
])
def test_inventory_errors_name_the_key(change: dict, message: str) -> None:
    cfg = three_hosts()
    cfg["hosts"].update(change)
    with pytest.raises(ConfigError, match=None) as err:
        plan_of(yaml.safe_dump(cfg, sort_keys=False))
    assert message in str(err.value)


def test_gpus_are_per_host_but_shared_on_one() -> None:
    cfg = three_hosts()
    plan_of(yaml.safe_dump(cfg))  # prefill and decode both on GPUs 0-3, on different hosts
    cfg["hosts"]["gpu-a"]["run"] = ["prefill", "decode"]
    del cfg["hosts"]["gpu-b"]
    with pytest.raises(ConfigError, match="decode.gpus: GPU 0 is also in prefill.gpus"):
        plan_of(yaml.safe_dump(cfg))


def test_spanning_tp_must_count_every_hosts_gpus() -> None:
    cfg = three_hosts()
    cfg["hosts"]["gpu-c"] = {"address": "10.0.0.4", "run": ["decode"]}
    cfg["decode"]["tp"] = 4
    with pytest.raises(ConfigError, match=r"decode.tp: tp is 4 but 4 GPUs are listed on each "
                       r"of its 2 hosts; .* make it 8"):
        plan_of(yaml.safe_dump(cfg))


def test_ucx_net_devices_in_one_place_only() -> None:
    cfg = three_hosts()
    cfg["decode"]["env"] = {"UCX_NET_DEVICES": "eth0"}
    with pytest.raises(ConfigError, match="hosts.gpu-b.ucx_net_devices: decode or "
                       "hosts.gpu-b.env also sets UCX_NET_DEVICES"):
        plan_of(yaml.safe_dump(cfg))
    cfg = three_hosts()
    cfg["hosts"]["gpu-b"]["env"] = {"UCX_NET_DEVICES": "eth0"}
    with pytest.raises(ConfigError, match="also sets UCX_NET_DEVICES; set it in one place"):
        plan_of(yaml.safe_dump(cfg))


def test_a_hosts_own_topology_file_is_used_and_named(tmp_path: Path) -> None:
    small = json.loads(SEED_TOPOLOGY.read_text())
    small["gpus"] = small["gpus"][:2]
    (tmp_path / "gpu-b.json").write_text(json.dumps(small))
    cfg = three_hosts()
    cfg["hosts"]["gpu-b"]["topology"] = "gpu-b.json"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    from pdsvc.cli.kit import load_plan

    with pytest.raises(TopologyError, match="decode.gpus: GPU 2 does not exist on host gpu-b"):
        load_plan(path, None, SEED_TOPOLOGY)
    small["gpus"] = json.loads(SEED_TOPOLOGY.read_text())["gpus"][:4]
    (tmp_path / "gpu-b.json").write_text(json.dumps(small))  # the cache must see the change
    plan = load_plan(path, None, SEED_TOPOLOGY)
    assert plan.host("gpu-b").topology_source == f"file:{tmp_path / 'gpu-b.json'}"


def test_no_unused_ucx_warning_on_the_router_host() -> None:
    cfg = three_hosts()
    del cfg["hosts"]["gpu-a"]["ucx_net_devices"]
    warnings = plan_of(yaml.safe_dump(cfg)).warnings
    assert [w for w in warnings if "ucx_net_devices" in w] == [
        "hosts.gpu-a.ucx_net_devices is not set: NIXL's UCX may move KV over the wrong NIC "
        "across hosts (sglang #28737); set it (e.g. mlx5_0:1 or eth1)"]


def test_supervisord_bundles_one_per_host(runner, tmp_path: Path) -> None:
    out = tmp_path / "s"
    result = runner.invoke(main, ["render", "-c", str(THREE), *SEED, "-o", str(out),
                                  "--format", "supervisord"])
    assert result.exit_code == 0, result.output + result.stderr
    assert sorted(p.name for p in out.iterdir() if p.name[0] != ".") == [
        "gpu-a", "gpu-b", "hosts.list", "lb"]
    assert f"on each host: supervisord -c {out}/HOST/supervisord.conf" in result.output
    lb, b = ((out / h / "supervisord.conf").read_text() for h in ("lb", "gpu-b"))
    # each program a group of its own: no [group:] section on any host
    assert "[program:dsv4-router]" in lb and "[program:dsv4-prefill]" not in lb
    assert "[program:dsv4-decode]" in b and "[program:dsv4-router]" not in b
    assert "[group:" not in lb + b
    assert "Host gpu-b of several: its engines only" in b
    # NIXL coupling across hosts: the decode's runtime watches gpu-a's prefill
    assert "--restart-with http://10.0.0.2:30000/health --peer-down-probes 3" in b
    # nothing to restart on this host itself: its listener only takes a decode whose runtime
    # died out of the router on lb
    assert "--restart-with dsv4-" not in b
    assert "events=PROCESS_STATE_EXITED,PROCESS_STATE_BACKOFF\n" in b
    assert "--leave dsv4-decode=http://10.0.0.3:30001 --router http://10.0.0.1:8000" in b


def test_install_sh_takes_one_hosts_bundle_and_explains_the_layout(
    runner, tmp_path: Path
) -> None:
    import subprocess

    out = tmp_path / "units"
    assert runner.invoke(main, ["render", "-c", str(THREE), *SEED, "-o", str(out)]).exit_code == 0
    dest = tmp_path / "dest"

    def install(bundle: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(REPO / "install.sh"), "--bundle", str(bundle),
                               "--config", str(THREE)], env={"DESTDIR": str(dest),
                              "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                              capture_output=True, text=True, timeout=60)

    whole = install(out)
    assert whole.returncode == 1
    assert f"{out} holds one bundle per host (lb, gpu-a, gpu-b): on each host run install.sh " \
           f"--bundle {out}/HOST" in whole.stderr
    one = install(out / "gpu-a")
    assert one.returncode == 0, one.stderr
    units = dest / "etc/systemd/system"
    assert sorted(p.name for p in units.iterdir() if p.is_file()) == [
        "dsv4-pd-ready.service", "dsv4-pd.target", "dsv4-prefill.service"]


def test_coupling_is_per_host_partof_plus_a_watch_of_the_remote_prefills() -> None:
    cfg = three_hosts()
    cfg["prefill"] = [{"gpus": [0, 1]}, {"gpus": [2, 3]}]
    cfg["hosts"]["gpu-a"]["run"] = ["prefill[0]"]
    cfg["hosts"]["gpu-b"]["run"] = ["prefill[1]", "decode"]
    cfg["decode"]["gpus"] = [4, 5, 6, 7]
    # auto couples to a single prefill only: with two, one prefill's restart must not take
    # the decode, and the other prefill's pair with it, down
    decode = next(e for e in plan_of(yaml.safe_dump(cfg)).engines if e.role == "decode")
    assert decode.restarts_with == () and decode.peer_health == ()
    cfg["decode"]["restart_with_prefill"] = True  # asked for: coupled to every prefill
    plan = plan_of(yaml.safe_dump(cfg))
    decode = next(e for e in plan.engines if e.role == "decode")
    assert decode.restarts_with == ("dsv4-prefill-1.service",)  # same host: PartOf=
    assert decode.peer_health == ("http://10.0.0.2:30000/health",)  # gpu-a's: watched
    cfg["decode"]["restart_with_prefill"] = False
    decode = next(e for e in plan_of(yaml.safe_dump(cfg)).engines if e.role == "decode")
    assert decode.restarts_with == () and decode.peer_health == ()


def test_plan_lists_the_connections_between_hosts(runner, tmp_path: Path) -> None:
    cfg = three_hosts()
    cfg["hosts"]["gpu-c"] = {"address": "10.0.0.4", "run": ["prefill"]}  # prefill spans a, c
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    result = runner.invoke(main, ["plan", "-c", str(path), *SEED])
    assert result.exit_code == 0, result.stderr
    lines = result.output.split("Connections between hosts (open them in host firewalls):\n")[1]
    rows = [line.split(None, 3)[:3] for line in lines.splitlines()]
    assert rows == [  # by destination host and port (tests/test_connections.py: all of it)
        ["gpu-a", "->", "10.0.0.1:8000"], ["gpu-b", "->", "10.0.0.1:8000"],  # POST /workers
        ["gpu-b", "->", "10.0.0.2:8997"],  # heal cascade: not gpu-c, which serves no engine
        ["gpu-b", "->", "10.0.0.2:8998"],  # the host part the router hands decode, verbatim
        ["lb", "->", "10.0.0.2:30000"],
        ["gpu-b", "->", "10.0.0.2:30000"],  # decode's pair canary
        ["gpu-b", "->", "10.0.0.2:30000"],  # decode's watch of its prefill
        ["gpu-c", "->", "10.0.0.2:30000"],  # rank 1's readiness is rank 0's /health
        ["gpu-c", "->", "10.0.0.2:30335"],  # rank 1 -> rank 0's dist-init
        ["gpu-a", "->", "10.0.0.3:8997"],
        ["lb", "->", "10.0.0.3:30001"],
        ["gpu-a", "->", "10.0.0.3:30001"],  # prefill's pair canary
    ]
    single = runner.invoke(main, ["plan", "-c", str(REPO / "etc/pdsvc.yaml"), *SEED])
    assert "Connections between hosts" not in single.output


def test_a_render_never_reaches_outside_its_output_directory(runner, tmp_path: Path) -> None:
    """hosts.list names the host directories a later render may clean: a crafted entry (..)
    or a host directory that is a symlink must not let it delete or write elsewhere."""
    out = tmp_path / "units"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(THREE.read_text())
    render = ["render", "-c", str(cfg), *SEED, "-o", str(out)]
    assert runner.invoke(main, render).exit_code == 0
    keep = tmp_path / "keep-me.service"
    keep.write_text((out / "lb" / "dsv4-router.service").read_text())  # pdsvc-marked
    with (out / "hosts.list").open("a") as fh:
        fh.write("..\t10.0.0.9\tx\n")
    assert runner.invoke(main, render).exit_code == 1  # hosts.list was edited: refused …
    assert runner.invoke(main, [*render, "--force"]).exit_code == 0  # … unless forced
    assert keep.exists()
    elsewhere = tmp_path / "installed"
    elsewhere.mkdir()
    other = elsewhere / "other-stack.service"
    other.write_text(keep.read_text())
    shutil.rmtree(out / "gpu-b")
    (out / "gpu-b").symlink_to(elsewhere)
    result = runner.invoke(main, render)
    assert result.exit_code == 1 and "refusing to write through it" in result.stderr
    assert other.exists() and sorted(p.name for p in elsewhere.iterdir()) == [
        "other-stack.service"]


def test_an_engine_spans_hosts_only_when_named_alike() -> None:
    cfg = three_hosts()
    cfg["prefill"] = [{"gpus": [0, 1]}, {"gpus": [2, 3]}]
    cfg["hosts"]["gpu-a"]["run"] = ["prefill"]  # both items...
    cfg["hosts"]["gpu-c"] = {"address": "10.0.0.4", "run": ["prefill[1]"]}  # ...and one again
    with pytest.raises(ConfigError, match=r"prefill\[1\] is named on several hosts in "
                       r"different ways: gpu-a \(as `prefill`\), gpu-c \(as `prefill\[1\]`\)"):
        plan_of(yaml.safe_dump(cfg))
    cfg["hosts"]["gpu-a"]["run"] = ["prefill[0]", "prefill[1]"]  # alike: prefill[1] spans
    plan = plan_of(yaml.safe_dump(cfg))
    assert [(e.name, e.machine, e.node_rank) for e in plan.engines if e.role == "prefill"] == [
        ("dsv4-prefill-0", "gpu-a", 0), ("dsv4-prefill-1", "gpu-a", 0),
        ("dsv4-prefill-1", "gpu-c", 1)]


def test_a_missing_host_topology_file_names_its_key(tmp_path: Path) -> None:
    from pdsvc.cli.kit import load_plan

    cfg = three_hosts()
    cfg["hosts"]["gpu-b"]["topology"] = "nope.json"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(TopologyError, match=r"hosts.gpu-b.topology: .*nope.json: topology "
                       "file not found"):
        load_plan(path, None, SEED_TOPOLOGY)


# ---------------------------------------------------------------- one router key per deployment

def _four_hosts(tmp_path: Path) -> Path:
    """three-hosts.yaml plus gpu-c, which runs only the prefill's rank 1 (no key read there)."""
    cfg = three_hosts()
    cfg["hosts"]["gpu-c"] = {"address": "10.0.0.4", "run": ["prefill"]}
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_the_key_is_made_on_the_router_host_only_in_every_format(runner, tmp_path: Path) -> None:
    config = _four_hosts(tmp_path)
    for fmt in ("systemd", "supervisord"):
        out = tmp_path / fmt
        result = runner.invoke(main, ["render", "-c", str(config), *SEED, "-o", str(out),
                                      "--format", fmt])
        assert result.exit_code == 0, result.output + result.stderr
    lists = {h: (tmp_path / "systemd" / h / "install.list").read_text()
             for h in ("lb", "gpu-a", "gpu-b", "gpu-c")}
    assert "\nsecret\t/etc/dsv4/router.key\tmake\t0640\troot:sglang\n" in lists["lb"]
    for h in ("gpu-a", "gpu-b"):  # install.sh copies it (--key-from), never makes one
        assert "\nsecret\t/etc/dsv4/router.key\tcopy\t0640\troot:sglang\n" in lists[h]
        assert "\nkeyhost\tlb\t10.0.0.1\n" in lists[h]
    assert "secret\t" not in lists["gpu-c"] and "keyhost" not in lists["gpu-c"]
    assert "LoadCredential" not in (tmp_path / "systemd/gpu-c/dsv4-prefill.service").read_text()
    conf = {h: (tmp_path / "supervisord" / h / "supervisord.conf").read_text()
            for h in ("lb", "gpu-a", "gpu-b", "gpu-c")}
    assert "/dev/urandom" in conf["lb"]
    for h in ("gpu-a", "gpu-b"):
        assert "/dev/urandom" not in conf[h]
        assert ("scp root@10.0.0.1:/etc/dsv4/router.key router.key && install -D -m 0640 -o "
                "root -g sglang router.key /etc/dsv4/router.key && rm router.key") in conf[h]
    assert "router.key" not in conf["gpu-c"]  # its rank 1 registers nowhere


def _install(tmp_path: Path, bundle: Path, *args: str):
    import subprocess

    return subprocess.run(["bash", str(REPO / "install.sh"), "--bundle", str(bundle), *args],
                          env={"DESTDIR": str(tmp_path / "dest"),
                               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_install_sh_key_from_installs_the_router_hosts_key(runner, tmp_path: Path) -> None:
    config = _four_hosts(tmp_path)
    out = tmp_path / "units"
    assert runner.invoke(main, ["render", "-c", str(config), *SEED, "-o", str(out)]).exit_code == 0
    key = tmp_path / "router.key"
    dest_key = tmp_path / "dest/etc/dsv4/router.key"
    # without it: said, with the line that fetches it and the install that takes it
    first = _install(tmp_path, out / "gpu-a")
    assert first.returncode == 0, first.stderr
    assert not dest_key.exists()
    assert ("scp root@10.0.0.1:/etc/dsv4/router.key router.key && sudo "
            f"{REPO / 'install.sh'} --bundle {out / 'gpu-a'} --key-from router.key "
            "&& rm router.key") in " ".join(first.stderr.split())
    # a malformed key is refused before anything changes
    for bad in ("", "two words here and more\n", "abc:def0123456789abcdef\n", "0123456789abcdef\n"
                "0123456789abcdef\n", "short\n"):
        key.write_text(bad)
        r = _install(tmp_path, out / "gpu-b", "--key-from", str(key))
        assert r.returncode == 1 and "is not a control-plane key" in r.stderr, (bad, r.stderr)
        assert bad not in r.stderr or not bad.strip()  # never echoed
    assert not (tmp_path / "dest/etc/systemd/system/dsv4-decode.service").exists()
    token = "0123456789abcdef" * 4
    key.write_text(token + "\n")
    r = _install(tmp_path, out / "gpu-a", "--key-from", str(key))
    assert r.returncode == 0, r.stderr
    assert dest_key.read_text() == token + "\n" and dest_key.stat().st_mode & 0o777 == 0o640
    assert f"created       {dest_key} (the router host's key, from {key})" in r.stdout
    assert token not in r.stdout + r.stderr
    again = _install(tmp_path, out / "gpu-a", "--key-from", str(key))
    assert f"unchanged     {dest_key} (the router host's key)" in again.stdout
    manifest = (tmp_path / "dest/var/lib/pdsvc/dsv4.manifest").read_text()
    assert "secret\t/etc/dsv4/router.key\tcopied\n" in manifest  # --uninstall removes it
    # the router's host makes its own; a host whose units read none takes none
    lb = _install(tmp_path, out / "lb", "--key-from", str(key))
    assert lb.returncode == 1 and "the router runs on this host" in lb.stderr
    c = _install(tmp_path, out / "gpu-c", "--key-from", str(key))
    assert c.returncode == 1 and "no unit of this host reads" in c.stderr
    plain = _install(tmp_path, out / "gpu-c")
    said = plain.stdout + plain.stderr
    assert plain.returncode == 0 and "router.key" not in said and "control-plane" not in said
