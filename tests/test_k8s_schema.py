"""The offline, strict Kubernetes validator in tests/support/k8s_schema.py: good manifests pass,
realistic renderer mistakes fail with a message that names the bad field, and nothing touches
the network."""

from __future__ import annotations

import copy
import socket
from pathlib import Path
from typing import Any

import k8s_schema
import kubernetes_validate
import pytest
import yaml
from conftest import REPO
from k8s_schema import validate, validate_all

FIXTURES = REPO / "tests" / "fixtures" / "k8s"
GOOD = ["router-deployment.yaml", "leader-service.yaml", "prefill-lws.yaml"]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((FIXTURES / name).read_text())


def one_problem_naming(doc: dict[str, Any], *needles: str) -> str:
    problems = validate(doc)
    hits = [p for p in problems if all(n in p for n in needles)]
    assert hits, f"no problem mentions {needles}: {problems}"
    return hits[0]


@pytest.fixture
def deployment() -> dict[str, Any]:
    return load("router-deployment.yaml")


@pytest.fixture
def lws() -> dict[str, Any]:
    return load("prefill-lws.yaml")


def lwt(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["leaderWorkerTemplate"]


# -- valid manifests --------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOOD)
@pytest.mark.parametrize("version", ["1.30", "v1.30.4", "1.37"])
def test_good_manifests_pass(name: str, version: str) -> None:
    assert validate(load(name), version) == []


def test_validate_all_over_a_multi_document_stream() -> None:
    text = "\n---\n".join((FIXTURES / n).read_text() for n in GOOD) + "\n---\n"
    docs = list(yaml.safe_load_all(text))
    assert validate_all(docs) == []
    docs[0]["spec"]["replica"] = 2
    assert validate_all(docs) == [
        "Deployment/pd-router: spec.replica: unknown field 'replica' (did you mean 'replicas'?)"
    ]


def test_lws_without_leader_template_or_optional_fields_passes(lws: dict[str, Any]) -> None:
    """leaderTemplate, replicas, rolloutStrategy, startupPolicy, networkConfig are optional."""
    for key in ("replicas", "rolloutStrategy", "startupPolicy", "networkConfig"):
        del lws["spec"][key]
    del lwt(lws)["leaderTemplate"]
    assert validate(lws) == []


# -- core kinds: realistic mistakes -----------------------------------------------------------


def test_container_field_typo_is_named(deployment: dict[str, Any]) -> None:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["resource"] = container.pop("resources")
    msg = one_problem_naming(deployment, "spec.template.spec.containers[0].resource:")
    assert "unknown field 'resource'" in msg and "did you mean 'resources'" in msg


def test_probe_port_as_a_list_is_named(deployment: dict[str, Any]) -> None:
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["httpGet"]["port"] = [8000]
    msg = one_problem_naming(deployment, "containers[0].readinessProbe.httpGet.port:")
    assert "[8000]" in msg


def test_deployment_without_selector(deployment: dict[str, Any]) -> None:
    del deployment["spec"]["selector"]
    assert validate(deployment) == [
        "Deployment/pd-router: spec.selector: required field is missing"
    ]


def test_deployment_selector_must_match_template_labels(deployment: dict[str, Any]) -> None:
    deployment["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "pd-ruoter"}
    one_problem_naming(deployment, "spec.selector:", "does not match template labels")


def test_service_port_as_a_string_is_named() -> None:
    svc = load("leader-service.yaml")
    svc["spec"]["ports"][0]["port"] = "30000"
    one_problem_naming(svc, "spec.ports[0].port:", "'30000'", "integer")


def test_misplaced_field_is_unknown_where_it_landed(deployment: dict[str, Any]) -> None:
    """`hostNetwork` belongs to the pod spec, not the container."""
    deployment["spec"]["template"]["spec"]["containers"][0]["hostNetwork"] = True
    one_problem_naming(deployment, "containers[0].hostNetwork:", "unknown field")


def test_every_problem_is_reported_not_just_the_first(deployment: dict[str, Any]) -> None:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = 3
    container["portz"] = []
    del deployment["metadata"]["name"]
    problems = validate(deployment)
    assert len(problems) == 3, problems
    assert any("imagePullPolicy" in p for p in problems)
    assert any("portz" in p for p in problems)
    assert any("metadata.name: required" in p for p in problems)


def test_unknown_kind_or_api_version_is_a_problem_not_a_pass() -> None:
    for api_version, kind in [("apps/v1", "Deploymnet"), ("apps/v1beta1", "Deployment")]:
        doc = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
        (problem,) = validate(doc)
        assert "no schema for kind" in problem and api_version in problem
    (problem,) = validate({"kind": "Service", "metadata": {"name": "x"}})
    assert "apiVersion and kind must both be set" in problem


def test_unsupported_kubernetes_version_raises() -> None:
    with pytest.raises(ValueError, match="has schemas for"):
        validate(load("leader-service.yaml"), "1.99")
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        validate(load("leader-service.yaml"), "latest")


# -- LeaderWorkerSet: CRD schema + strict core pod templates ----------------------------------


def test_lws_worker_template_container_typo_is_named(lws: dict[str, Any]) -> None:
    container = lwt(lws)["workerTemplate"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    msg = one_problem_naming(
        lws, "spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].volumeMount:"
    )
    assert "did you mean 'volumeMounts'" in msg


def test_lws_leader_template_pod_spec_typo_is_named(lws: dict[str, Any]) -> None:
    lwt(lws)["leaderTemplate"]["spec"]["hostNetworking"] = True
    one_problem_naming(lws, "leaderTemplate.spec.hostNetworking:", "unknown field")


def test_lws_leader_probe_port_as_a_list_is_named(lws: dict[str, Any]) -> None:
    container = lwt(lws)["leaderTemplate"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["port"] = [30000]
    one_problem_naming(lws, "leaderTemplate.spec.containers[0].readinessProbe.httpGet.port:")


def test_lws_pod_template_missing_containers(lws: dict[str, Any]) -> None:
    del lwt(lws)["workerTemplate"]["spec"]["containers"]
    one_problem_naming(lws, "workerTemplate.spec.containers: required field is missing")


def test_lws_own_fields_are_strict(lws: dict[str, Any]) -> None:
    lwt(lws)["sise"] = lwt(lws).pop("size")
    lws["spec"]["startupPolicy"] = "LeaderFirst"
    lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] = [1]
    lws["spec"]["networkConfig"] = {}
    lws["spek"] = {}
    problems = validate(lws)
    for needle in (
        "spec.leaderWorkerTemplate.sise: unknown field 'sise' (did you mean 'size'?)",
        "spec.startupPolicy: 'LeaderFirst' is not one of",
        "spec.rolloutStrategy.rollingUpdateConfiguration.maxSurge: [1]",
        "spec.networkConfig.subdomainPolicy: required field is missing",
        "spek: unknown field 'spek' (did you mean 'spec'?)",
    ):
        assert any(needle in p for p in problems), (needle, problems)


def test_lws_restart_policy_enum(lws: dict[str, Any]) -> None:
    lwt(lws)["restartPolicy"] = "Always"
    one_problem_naming(lws, "spec.leaderWorkerTemplate.restartPolicy:", "'Always'")


def test_lws_without_worker_template(lws: dict[str, Any]) -> None:
    del lwt(lws)["workerTemplate"]
    assert validate(lws) == [
        "LeaderWorkerSet/pd-prefill: spec.leaderWorkerTemplate.workerTemplate: "
        "required field is missing"
    ]


def test_lws_metadata_checked_as_object_meta(lws: dict[str, Any]) -> None:
    lws["metadata"]["label"] = lws["metadata"].pop("labels")
    one_problem_naming(lws, "metadata.label: unknown field", "did you mean 'labels'")


def test_lws_pod_template_metadata_follows_the_crd(lws: dict[str, Any]) -> None:
    """The CRD keeps only name/namespace/labels/annotations/finalizers of a template's metadata."""
    lwt(lws)["leaderTemplate"]["metadata"]["generateName"] = "x-"
    one_problem_naming(lws, "leaderTemplate.metadata.generateName: unknown field")


def test_lws_volume_claim_templates_checked_as_pvcs(lws: dict[str, Any]) -> None:
    claim = {
        "metadata": {"name": "cache"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    lwt(lws)["volumeClaimTemplates"] = [claim]
    assert validate(lws) == []
    bad = copy.deepcopy(claim)
    bad["spec"]["accesModes"] = bad["spec"].pop("accessModes")
    lwt(lws)["volumeClaimTemplates"] = [bad]
    one_problem_naming(lws, "volumeClaimTemplates[0].spec.accesModes: unknown field")


def test_lws_other_api_version_is_unknown(lws: dict[str, Any]) -> None:
    lws["apiVersion"] = "leaderworkerset.x-k8s.io/v1alpha1"
    (problem,) = validate(lws)
    assert "no schema for kind 'LeaderWorkerSet'" in problem


# -- provenance and offline behaviour ---------------------------------------------------------


def test_vendored_crd_excerpt_is_the_lws_v1_schema() -> None:
    text = k8s_schema.LWS_CRD.read_text()
    assert "kubernetes-sigs/lws" in text and "83ba21e907f84f5b713a83bd1eb39a976fde2bbc" in text
    crd = yaml.safe_load(text)
    assert crd["spec"]["group"] == "leaderworkerset.x-k8s.io"
    (v1,) = crd["spec"]["versions"]
    spec = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert sorted(spec) == [
        "leaderWorkerTemplate", "networkConfig", "replicas", "rolloutStrategy", "startupPolicy"
    ]  # fmt: skip
    assert sorted(spec["leaderWorkerTemplate"]["properties"]) == [
        "leaderTemplate", "persistentVolumeClaimRetentionPolicy", "restartPolicy", "size",
        "subGroupPolicy", "volumeClaimTemplates", "workerTemplate",
    ]  # fmt: skip


def test_agrees_with_kubernetes_validate_strict_api(deployment: dict[str, Any]) -> None:
    """Our verdicts match the package's own API (which stops at the first error, and treats a
    CRD as 'schema not found')."""
    assert kubernetes_validate.validate(deployment, "1.30", strict=True) == "1.30"
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)
    assert validate(deployment)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(load("prefill-lws.yaml"), "1.30", strict=True)


def test_works_with_the_network_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load every schema afresh with sockets and name lookups made to fail: nothing is fetched."""
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("network disabled by test_works_with_the_network_blocked")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    k8s_schema.clear_caches()
    try:
        for name in GOOD:
            assert validate(load(name)) == []
        bad = load("prefill-lws.yaml")
        lwt(bad)["workerTemplate"]["spec"]["containers"][0]["imagee"] = "x"
        assert validate(bad)
    finally:
        k8s_schema.clear_caches()
    assert attempts == []


def test_schemas_come_from_the_installed_package() -> None:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    assert (root / "v1.30.0-local-strict" / "_definitions.json").is_file()
    assert (1, 30) in k8s_schema.bundled_versions()
