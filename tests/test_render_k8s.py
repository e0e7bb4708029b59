"""The Kubernetes bundle (pdsvc/render/k8s.py): the plan's deployment as manifests that the API
server would accept (strict schemas, offline: tests/support/k8s_schema.py), and that say what
the systemd units say — same commands, ports, env and lifecycle bounds, from the same plan.
What the manifests say for a given config (pod settings, volumes, probes, Services, the
LeaderWorkerSet of a spanning engine, the router's pod) is in tests/cases/k8s-*.yaml
(tests/test_cases.py); here are the properties of every bundle and the refusals."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from k8s_schema import validate
from k8sdocs import command_of, container_env

from pdsvc.cli.kit import load_plan
from pdsvc.errors import ConfigError
from pdsvc.plan.build import EnginePlan, Plan, engine_argv, plan_from_dict, router_argv
from pdsvc.render.bundle import write_bundle
from pdsvc.render.k8s import (
    CUSTOMISE,
    KUSTOMIZATION,
    render_k8s,
)
from pdsvc.render.kit import MARKER

TOPOLOGY = REPO / "etc/seed-host.topology.json"
SEED = REPO / "etc/pdsvc.yaml"
TWO_P_ONE_D = REPO / "etc/examples/2p1d.yaml"
THREE = REPO / "etc/examples/three-hosts.yaml"
COMMAND = "pdsvc render --format k8s"
Docs = dict[str, list[dict[str, Any]]]


# --------------------------------------------------------------------------- helpers


def plan_of(path: Path) -> Plan:
    return load_plan(path, None, None, scheduled=True)


def write_config(tmp_path: Path, base: Path, filename: str = "c.yaml", **changes: Any) -> Path:
    """``base`` with top-level keys replaced (a dict value is merged one level deep)."""
    cfg = yaml.safe_load(base.read_text())
    for key, value in changes.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def spanning(tmp_path: Path, **changes: Any) -> Path:
    """three-hosts.yaml with a host gpu-c that also runs prefill: prefill spans gpu-a and
    gpu-c (TP 8, nnodes 2)."""
    hosts = yaml.safe_load(THREE.read_text())["hosts"]
    hosts["gpu-c"] = {"address": "10.0.0.4", "run": ["prefill"]}
    return write_config(tmp_path, THREE, "span.yaml", hosts=hosts, **changes)


def docs_of(plan: Plan) -> Docs:
    """Every rendered workload file, parsed: {file: [documents]} (kustomization.yaml apart)."""
    return {f.path: list(yaml.safe_load_all(f.content)) for f in render_k8s(plan, COMMAND)
            if f.path != KUSTOMIZATION}


def find(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    hits = [d for ds in docs.values() for d in ds
            if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def pod_specs(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"pod"} for a Deployment, {"leader", "worker"} for a LeaderWorkerSet."""
    if workload["kind"] == "Deployment":
        return {"pod": workload["spec"]["template"]["spec"]}
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return {"leader": lwt["leaderTemplate"]["spec"], "worker": lwt["workerTemplate"]["spec"]}


def engine_workload(docs: Docs, e: EnginePlan) -> dict[str, Any]:
    (workload,) = [d for d in docs[f"{e.name}.yaml"] if d["kind"] != "Service"]
    return workload


def leaders(plan: Plan) -> list[EnginePlan]:
    return [e for e in plan.engines if e.node_rank == 0]


def pod_argv_expected(plan: Plan, e: EnginePlan) -> tuple[str, ...]:
    """engine_argv with the pod's overrides, built here independently of the renderer."""
    port = e.dist_init_addr.rpartition(":")[2]
    if e.nnodes > 1:
        return engine_argv(e, python=plan.k8s.python, host="0.0.0.0",
                           dist_init_addr=f"$(LWS_LEADER_ADDRESS):{port}",
                           node_rank="$(LWS_WORKER_INDEX)")
    return engine_argv(e, python=plan.k8s.python, host="0.0.0.0",
                       dist_init_addr=f"127.0.0.1:{port}")


CONFIGS = {"seed": SEED, "2p1d": TWO_P_ONE_D, "three-hosts": THREE,
           "escaping": REPO / "tests/cases/escaping.yaml"}


@pytest.fixture(params=[*CONFIGS, "spanning"])
def any_plan(request: pytest.FixtureRequest, tmp_path: Path) -> Plan:
    if request.param == "spanning":
        return plan_of(spanning(tmp_path))
    return plan_of(CONFIGS[request.param])


# --------------------------------------------------------------------------- the bundle


def test_every_document_passes_the_strict_schemas(any_plan: Plan) -> None:
    docs = docs_of(any_plan)
    assert docs
    for path, ds in docs.items():
        for doc in ds:
            assert validate(doc, "1.30") == [], f"{path}: {doc['kind']}"


def test_seed_bundle_layout() -> None:
    files = render_k8s(plan_of(SEED), COMMAND)
    assert [f.path for f in files] == [
        "dsv4-prefill.yaml", "dsv4-decode.yaml", "dsv4-router.yaml", KUSTOMIZATION]
    docs = docs_of(plan_of(SEED))
    assert {p: [(d["kind"], d["metadata"]["name"]) for d in ds] for p, ds in docs.items()} == {
        "dsv4-prefill.yaml": [("Deployment", "dsv4-prefill"), ("Service", "dsv4-prefill")],
        "dsv4-decode.yaml": [("Deployment", "dsv4-decode"), ("Service", "dsv4-decode")],
        "dsv4-router.yaml": [("Deployment", "dsv4-router"), ("Service", "dsv4-router")],
    }


def test_kustomization_lists_every_file(any_plan: Plan) -> None:
    files = render_k8s(any_plan, COMMAND)
    kust = yaml.safe_load(next(f.content for f in files if f.path == KUSTOMIZATION))
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kust["kind"] == "Kustomization"
    assert kust["resources"] == [f.path for f in files if f.path != KUSTOMIZATION]


def test_every_file_carries_the_provenance_header(any_plan: Plan) -> None:
    for f in render_k8s(any_plan, COMMAND):
        assert f.content.startswith(f"# {MARKER} ")
        assert MARKER in f.content.encode()[:1024].decode(errors="ignore")
        assert f"# Command: {COMMAND}\n" in f.content
        assert f"# {CUSTOMISE}\n" in f.content


def test_output_is_deterministic(tmp_path: Path) -> None:
    plan = plan_of(spanning(tmp_path))
    first = render_k8s(plan, COMMAND)
    assert render_k8s(plan, COMMAND) == first
    # the plan cache's round trip renders the same bytes
    assert render_k8s(plan_from_dict(plan.to_dict()), COMMAND) == first


def test_write_bundle_rewrites_its_own_files(tmp_path: Path) -> None:
    files = render_k8s(plan_of(SEED), COMMAND)
    out = tmp_path / "k8s"
    write_bundle(files, out)
    assert {s for _, s in write_bundle(files, out)} == {"unchanged"}


# --------------------------------------------------------------------------- engines


def test_engine_command_is_engine_argv_with_the_pod_overrides(any_plan: Plan) -> None:
    docs = docs_of(any_plan)
    for e in leaders(any_plan):
        for where, spec in pod_specs(engine_workload(docs, e)).items():
            (container,) = spec["containers"]
            assert command_of(container) == pod_argv_expected(any_plan, e), (e.name, where)


def test_env_is_the_plans_less_the_gpu_list_with_the_pod_ip_advertised(any_plan: Plan) -> None:
    docs = docs_of(any_plan)
    for e in leaders(any_plan):
        for spec in pod_specs(engine_workload(docs, e)).values():
            (c,) = spec["containers"]
            names = [v["name"] for v in c["env"]]
            assert "CUDA_VISIBLE_DEVICES" not in names
            assert names.count("SGLANG_HOST_IP") == 1
            assert next(v for v in c["env"] if v["name"] == "SGLANG_HOST_IP") == {
                "name": "SGLANG_HOST_IP",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            }
            want = {k: v for k, v in e.env if k not in ("CUDA_VISIBLE_DEVICES", "SGLANG_HOST_IP")}
            assert container_env(c) == want


# --------------------------------------------------------------------------- router


def router_pod(docs: Docs, plan: Plan) -> dict[str, Any]:
    return find(docs, "Deployment", plan.router.name)["spec"]["template"]["spec"]


@pytest.mark.parametrize("config", [SEED, TWO_P_ONE_D, THREE])
def test_router_dials_the_engine_services(config: Path) -> None:
    plan = plan_of(config)
    docs = docs_of(plan)
    (c,) = router_pod(docs, plan)["containers"]
    argv = command_of(c)
    prefills = [tuple(argv[i + 1:i + 3]) for i, w in enumerate(argv) if w == "--prefill"]
    decodes = [argv[i + 1] for i, w in enumerate(argv) if w == "--decode"]
    want_p = [(f"http://{e.name}.default.svc:{e.port}", str(e.bootstrap_port))
              for e in leaders(plan) if e.role == "prefill"]
    want_d = [f"http://{e.name}.default.svc:{e.port}" for e in leaders(plan) if e.role == "decode"]
    assert (prefills, decodes) == (want_p, want_d)
    # each URL is a Service of the bundle exposing that port (and the bootstrap port)
    for url, bootstrap in prefills:
        name, port = re.fullmatch(r"http://([a-z0-9-]+)\.default\.svc:(\d+)", url).groups()
        ports = {p["port"] for p in find(docs, "Service", name)["spec"]["ports"]}
        assert {int(port), int(bootstrap)} <= ports
    # the rest of the command is the plan's
    assert argv == router_argv(plan.router, python="python3", prefills=tuple(
        (u, int(p)) for u, p in prefills), decodes=tuple(decodes))


def test_router_starts_once_every_engine_service_is_healthy() -> None:
    """The units' After= on the engines: router 0.3.2 never re-registers a late worker."""
    plan = plan_of(TWO_P_ONE_D)
    (wait,) = router_pod(docs_of(plan), plan)["initContainers"]
    argv = command_of(wait)
    assert argv[:2] == ("python3", "-c")
    lc = plan.lifecycle
    assert argv[3:5] == (str(lc.liveness_interval_secs), str(lc.liveness_timeout_secs))
    assert argv[5:] == tuple(f"http://{e.name}.default.svc:{e.port}/health"
                             for e in leaders(plan))
    compile(argv[2], "wait-for-engines", "exec")  # the script is valid Python


# --------------------------------------------------------------------------- refusals


def test_object_names_are_dns_1035_labels(any_plan: Plan) -> None:
    """A Service's name must be one (the config's `name` rule guarantees it for all)."""
    for ds in docs_of(any_plan).values():
        for d in ds:
            assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", d["metadata"]["name"])


def test_a_loopback_router_is_refused(tmp_path: Path) -> None:
    plan = plan_of(write_config(tmp_path, SEED, router={"host": "127.0.0.1"}))
    with pytest.raises(ConfigError, match="router.host is 127.0.0.1"):
        render_k8s(plan, COMMAND)


def test_cli_renders_the_manifests_and_says_how_to_apply_them(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pdsvc.cli.commands import main

    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, [
        "render", "-c", str(REPO / "etc/examples/three-hosts.yaml"), "--topology",
        str(REPO / "etc/seed-host.topology.json"), "--format", "k8s", "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    assert f"next: kubectl apply -k {out}" in result.output
    files = sorted(p.name for p in out.iterdir() if p.name[0] != ".")
    assert files == ["dsv4-decode.yaml", "dsv4-prefill.yaml", "dsv4-router.yaml",
                     "kustomization.yaml"]  # the whole deployment, not one host's part
    for name in files[:-1]:
        for doc in yaml.safe_load_all((out / name).read_text()):
            assert validate(doc, "1.30") == [], (name, doc["kind"])


def test_k8s_reads_no_host_and_uses_no_hosts_settings(tmp_path: Path, monkeypatch) -> None:
    """Kubernetes places the engines: nothing of this machine is read (read_sysfs would raise
    here), a given --topology is ignored with a note, and no inventory host's settings
    (ucx_net_devices, env, address) reach a pod."""
    from click.testing import CliRunner

    import pdsvc.cli.kit
    from pdsvc.cli.commands import main

    def no_sysfs(*a, **k):
        raise AssertionError("read /sys for a k8s render")

    monkeypatch.setattr(pdsvc.cli.kit, "read_sysfs", no_sysfs)
    config = str(REPO / "etc/examples/three-hosts.yaml")
    bare = CliRunner().invoke(main, ["render", "-c", config, "--format", "k8s",
                                     "-o", str(tmp_path / "b")])
    assert bare.exit_code == 0, bare.output + bare.stderr
    given = CliRunner().invoke(main, [
        "render", "-c", config, "--topology", str(REPO / "etc/seed-host.topology.json"),
        "--format", "k8s", "-o", str(tmp_path / "a")])
    assert given.exit_code == 0, given.stderr
    assert "--topology/--sysfs-root are ignored" in given.stderr
    for f in sorted(p for p in (tmp_path / "a").iterdir() if p.name[0] != "."):
        a, b = f.read_text(), (tmp_path / "b" / f.name).read_text()
        assert "topology none: placed by the scheduler" in b.splitlines()[1]
        assert a.split("\n", 3)[3] == b.split("\n", 3)[3], f.name  # all but the Command line
        assert "UCX_NET_DEVICES" not in b and "10.0.0." not in b, f.name


def test_a_config_whose_format_is_k8s_renders_without_gpus(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pdsvc.cli.commands import main

    cfg = yaml.safe_load((REPO / "etc/examples/2p1d.yaml").read_text())
    cfg["format"] = "k8s"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tmp_path / "sys").mkdir()  # a laptop: no GPU at all
    result = CliRunner().invoke(main, ["render", "-c", str(path), "--sysfs-root",
                                       str(tmp_path / "sys"), "-o", str(tmp_path / "k")])
    assert result.exit_code == 0, result.output + result.stderr
    assert (tmp_path / "k" / "kustomization.yaml").is_file()
    cfg["format"] = "systemd"  # a host bundle still needs the host's GPUs
    path.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(main, ["render", "-c", str(path), "--sysfs-root",
                                       str(tmp_path / "sys"), "-o", str(tmp_path / "u")])
    assert result.exit_code == 3 and "no NVIDIA GPU found" in result.stderr
