"""Strict, offline schema validation of Kubernetes manifests (tests of `pdsvc render --format k8s`).

    validate(doc, k8s_version="1.30") -> list[str]     # human-readable problems; [] = valid

Core kinds (Deployment, Service, ...) are checked against the *strict* JSON schemas that the
`kubernetes-validate` package bundles (`kubernetes-json-schema/v1.NN.0-local-strict/`: every object
schema has `additionalProperties: false`, so an unknown or misspelt field is an error, as with
`kubectl apply --validate=strict`). We read those schema files ourselves instead of calling
`kubernetes_validate.validate(doc, version, strict=True)`, because that raises on the first error
only and treats an unknown kind as a warning; here every error is reported, and an unknown kind
is a problem.

LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`), which kubernetes-validate does not know, is checked
against the CRD's openAPIV3Schema vendored in tests/fixtures/k8s/ (provenance in its README), made
strict the way the API server's strict field validation treats a structural schema (unknown fields
rejected unless `x-kubernetes-preserve-unknown-fields`). Its embedded core types, which the vendored
excerpt leaves out, are checked strictly against kubernetes-validate's core schemas: `metadata` as
ObjectMeta, `spec.leaderWorkerTemplate.{leaderTemplate,workerTemplate}` as PodTemplateSpec and
`spec.leaderWorkerTemplate.volumeClaimTemplates[]` as PersistentVolumeClaim.

Beyond the schemas, two checks the API server (or `kubectl apply`) would make anyway:
`metadata.name` must be set, and an apps/v1 workload's `spec.selector.matchLabels` must match its
`spec.template.metadata.labels`. Not checked: resource.Quantity syntax, label/name syntax,
cross-object references (Service selector vs pod labels, volumeMounts vs volumes).

No network: every schema is loaded from disk into a `referencing.Registry`, which has no retrieval
function, so a `$ref` to `https://kubernetes.io/api/_definitions.json` resolves locally and an
unresolvable one raises instead of being fetched. (jsonschema only fetches remote refs when no
registry is given; kubernetes-validate's own code has no HTTP code at all.)
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_CRD = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "k8s"
    / "leaderworkerset.x-k8s.io_leaderworkersets.excerpt.yaml"
)

_SCHEMAS = Path(kubernetes_validate.__file__).resolve().parent / "kubernetes-json-schema"
_DEFS_URI = "https://kubernetes.io/api/_definitions.json"
_DIR_RE = re.compile(r"^v(\d+)\.(\d+)\.\d+-local-strict$")
_REQUIRED_RE = re.compile(r"^'(.+)' is a required property$")
_APPS_WORKLOADS = {"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"}


def bundled_versions() -> list[tuple[int, int]]:
    """Kubernetes (major, minor) versions whose strict schemas kubernetes-validate ships."""
    found = []
    for child in _SCHEMAS.iterdir():
        m = _DIR_RE.match(child.name)
        if m:
            found.append((int(m.group(1)), int(m.group(2))))
    return sorted(found)


def _schema_dir(k8s_version: str) -> Path:
    """The strict schema folder for a version: the newest bundled one not newer than it (as
    kubernetes-validate does, but comparing numbers, not strings)."""
    m = re.match(r"^v?(\d+)\.(\d+)", k8s_version)
    if not m:
        raise ValueError(f"not a Kubernetes version: {k8s_version!r} (want e.g. '1.30')")
    want = (int(m.group(1)), int(m.group(2)))
    versions = bundled_versions()
    usable = [v for v in versions if v <= want]
    if not usable or want > versions[-1]:
        span = f"{versions[0][0]}.{versions[0][1]}..{versions[-1][0]}.{versions[-1][1]}"
        raise ValueError(
            f"kubernetes-validate {kubernetes_validate.__version__} has schemas for {span}, "
            f"not {k8s_version}"
        )
    major, minor = usable[-1]
    return _SCHEMAS / f"v{major}.{minor}.0-local-strict"


def _version_of(schema_dir: Path) -> str:
    m = _DIR_RE.match(schema_dir.name)
    return f"{m.group(1)}.{m.group(2)}" if m else schema_dir.name


@cache
def _load_json(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


@cache
def _registry(schema_dir: Path) -> Registry:
    defs = Resource.from_contents(_load_json(schema_dir / "_definitions.json"))
    return Registry().with_resource(_DEFS_URI, defs)


@cache
def _kind_validator(schema_dir: Path, filename: str) -> jsonschema.Draft202012Validator | None:
    path = schema_dir / filename
    if not path.is_file():
        return None
    schema = _load_json(path)
    registry = Resource.from_contents(schema) @ _registry(schema_dir)
    return jsonschema.Draft202012Validator(schema, registry=registry)


@cache
def _def_validator(schema_dir: Path, definition: str) -> jsonschema.Draft202012Validator:
    """A validator for one entry of _definitions.json, e.g. io.k8s.api.core.v1.PodTemplateSpec."""
    if definition not in _load_json(schema_dir / "_definitions.json")["$defs"]:
        raise KeyError(f"{definition} not in {schema_dir.name}/_definitions.json")
    schema = {"$ref": f"{_DEFS_URI}#/$defs/{definition}"}
    return jsonschema.Draft202012Validator(schema, registry=_registry(schema_dir))


def _strict(node: Any) -> Any:
    """A copy of a CRD structural schema in which every object schema that lists `properties`
    rejects other fields (what the API server does under strict field validation), unless it
    sets additionalProperties or x-kubernetes-preserve-unknown-fields itself."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=1)
def _lws_validator() -> jsonschema.Draft202012Validator:
    with LWS_CRD.open(encoding="utf-8") as f:
        crd = yaml.safe_load(f)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(v1["schema"]["openAPIV3Schema"])
    # An empty registry: the CRD schema has no $ref, and nothing may be fetched.
    return jsonschema.Draft202012Validator(schema, registry=Registry())


def clear_caches() -> None:
    """Forget every loaded schema (the offline test re-loads them with the network blocked)."""
    for cached in (_load_json, _registry, _kind_validator, _def_validator, _lws_validator):
        cached.cache_clear()


def _join(prefix: str, path: Any) -> str:
    out = prefix
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(document)"


def _problems(validator: jsonschema.Draft202012Validator, instance: Any, prefix: str) -> list[str]:
    """Every schema violation as 'dotted.path[0].field: what is wrong'."""
    found = []
    for err in validator.iter_errors(instance):
        path = _join(prefix, err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = sorted((err.schema.get("properties") or {}).keys())
            for key in sorted(set(err.instance) - set(known)):
                hint = difflib.get_close_matches(key, known, n=1)
                maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
                found.append(f"{_join(path, [key])}: unknown field {key!r}{maybe}")
            continue
        if err.validator == "required":
            m = _REQUIRED_RE.match(err.message)
            if m:
                found.append(f"{_join(path, [m.group(1)])}: required field is missing")
                continue
        if err.validator in ("oneOf", "anyOf"):
            kinds = [s.get("type") for s in err.validator_value if isinstance(s, dict)]
            if all(kinds):
                wanted = " or ".join(
                    "/".join(t for t in (k if isinstance(k, list) else [k]) if t != "null")
                    for k in kinds
                )
                found.append(f"{path}: {err.instance!r} is not of type {wanted}")
                continue
        found.append(f"{path}: {err.message}")
    return found


def _semantic(doc: dict[str, Any]) -> list[str]:
    found = []
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        found.append("metadata.name: required field is missing (kubectl apply needs a name)")
    spec = doc.get("spec")
    workload = doc.get("apiVersion") == "apps/v1" and doc.get("kind") in _APPS_WORKLOADS
    if workload and isinstance(spec, dict) and isinstance(spec.get("selector"), dict):
        wanted = spec["selector"].get("matchLabels") or {}
        template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
        tmeta = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
        labels = tmeta.get("labels") if isinstance(tmeta.get("labels"), dict) else {}
        if isinstance(wanted, dict):
            bad = {k: v for k, v in wanted.items() if labels.get(k) != v}
            if bad or not (wanted or spec["selector"].get("matchExpressions")):
                found.append(
                    "spec.selector: selector does not match template labels "
                    f"(matchLabels {wanted!r}, spec.template.metadata.labels {labels!r})"
                )
    return found


def _validate_lws(doc: dict[str, Any], schema_dir: Path) -> list[str]:
    found = _problems(_lws_validator(), doc, "")
    if isinstance(doc.get("metadata"), dict):
        meta = _def_validator(schema_dir, "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        found += _problems(meta, doc["metadata"], "metadata")
    spec = doc.get("spec")
    lwt = spec.get("leaderWorkerTemplate") if isinstance(spec, dict) else None
    if isinstance(lwt, dict):
        pod_template = _def_validator(schema_dir, "io.k8s.api.core.v1.PodTemplateSpec")
        for key in ("leaderTemplate", "workerTemplate"):
            if isinstance(lwt.get(key), dict):
                found += _problems(pod_template, lwt[key], f"spec.leaderWorkerTemplate.{key}")
        claims = lwt.get("volumeClaimTemplates")
        if isinstance(claims, list):
            pvc = _def_validator(schema_dir, "io.k8s.api.core.v1.PersistentVolumeClaim")
            for i, claim in enumerate(claims):
                where = f"spec.leaderWorkerTemplate.volumeClaimTemplates[{i}]"
                found += _problems(pvc, claim, where)
    return found


def validate(doc: dict[str, Any], k8s_version: str = "1.30") -> list[str]:
    """Problems with one manifest (a parsed YAML document) for Kubernetes `k8s_version`, each as
    '<Kind>/<name>: <path>: <problem>'; an empty list means valid. Strict: unknown fields, unknown
    kinds and unknown apiVersions are problems. Raises ValueError for an unsupported k8s_version."""
    schema_dir = _schema_dir(k8s_version)
    if not isinstance(doc, dict):
        return [f"(document): not a mapping but {type(doc).__name__}"]
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    label = f"{kind or '?'}/{name or '?'}"
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [f"{label}: apiVersion and kind must both be set (got {api_version!r}, {kind!r})"]

    if kind == LWS_KIND and api_version == LWS_API_VERSION:
        found = _validate_lws(doc, schema_dir)
    else:
        # kubernetes-validate's names: apps/v1 -> apps-v1, networking.k8s.io/v1 -> networking-v1
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        validator = _kind_validator(schema_dir, f"{kind.lower()}-{group_version}.json")
        if validator is None:
            return [
                f"{label}: no schema for kind {kind!r} in apiVersion {api_version!r} "
                f"(Kubernetes {_version_of(schema_dir)}; known CRDs: {LWS_KIND} "
                f"{LWS_API_VERSION}): misspelt kind/apiVersion, or an unknown CRD"
            ]
        found = _problems(validator, doc, "")
    found += _semantic(doc)
    return [f"{label}: {p}" for p in dict.fromkeys(found)]


def validate_all(docs: list[Any], k8s_version: str = "1.30") -> list[str]:
    """validate() over several documents (e.g. yaml.safe_load_all of a rendered file)."""
    return [p for doc in docs if doc is not None for p in validate(doc, k8s_version)]
