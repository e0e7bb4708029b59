"""The pieces every object of the Kubernetes bundle (k8s.py) is made of: escaping, names,
labels and metadata, probes, scrape annotations, and the YAML layout kubectl writes."""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Iterable
from typing import Any

import yaml

from pdsvc.plan.build import EnginePlan, Plan
from pdsvc.render.kit import File

#: Period of the startupProbe: its failureThreshold is the start budget over this.
STARTUP_PERIOD_SECS = 10


def k8s_escape(value: str) -> str:
    """A literal command word or env value: ``$`` -> ``$$`` (no ``$(VAR)`` expansion)."""
    return value.replace("$", "$$")


def service_url(plan: Plan, e: EnginePlan) -> str:
    """Where the router (and, through it, decode for the bootstrap host) reaches an engine."""
    return f"http://{e.name}.{plan.k8s.namespace}.svc:{e.port}"


def workload_name(e: EnginePlan) -> str:
    """The Deployment's name (the engine's), or ``ENGINE-lws`` for a LeaderWorkerSet, whose
    controller-made headless Service takes the LWS's name."""
    return f"{e.name}-lws" if e.nnodes > 1 else e.name


def escaped_command(argv: Iterable[str], references: Iterable[str] = ()) -> list[str]:
    """Every word escaped, except the ones that are meant to be expanded."""
    keep = set(references)
    return [w if w in keep else k8s_escape(w) for w in argv]


def url_path(url: str) -> str:
    """The path of a plan's URL, as a probe or the wait script asks for it."""
    return urllib.parse.urlsplit(url).path


def object_labels(plan: Plan, component: str, engine: str | None = None) -> dict[str, str]:
    """An object's labels: pdsvc's, the deployment's, its component (a role or the router)
    and, for an engine's, the engine."""
    labels = {
        "app.kubernetes.io/name": "pdsvc",
        "app.kubernetes.io/instance": plan.name,
        "app.kubernetes.io/component": component,
    }
    if engine:
        labels["pdsvc/engine"] = engine
    return labels


def engine_selector(plan: Plan, e: EnginePlan) -> dict[str, str]:
    """The labels that pick an engine's pods."""
    return {"app.kubernetes.io/instance": plan.name, "pdsvc/engine": e.name}


def router_selector(plan: Plan) -> dict[str, str]:
    """The labels that pick the router's pod."""
    return {"app.kubernetes.io/instance": plan.name, "app.kubernetes.io/component": "router"}


def object_metadata(plan: Plan, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """An object's metadata: its name, the deployment's namespace, its labels."""
    return {"name": name, "namespace": plan.k8s.namespace, "labels": labels}


def _http_get(path: str) -> dict[str, Any]:
    return {"path": path, "port": "http"}


def http_probes(plan: Plan, *, startup: str | None, ready: str, live: str) -> dict[str, Any]:
    """startupProbe: the start budget (TimeoutStartSec=); readinessProbe: in or out of the
    Service; livenessProbe: the watchdog's bound (interval × failures + timeout)."""
    lc = plan.lifecycle
    probes: dict[str, Any] = {}
    if startup:
        probes["startupProbe"] = {
            "httpGet": _http_get(startup),
            "periodSeconds": STARTUP_PERIOD_SECS,
            "timeoutSeconds": lc.liveness_timeout_secs,
            "failureThreshold": math.ceil(lc.start_timeout_secs / STARTUP_PERIOD_SECS),
        }
    probes["readinessProbe"] = {
        "httpGet": _http_get(ready),
        "periodSeconds": lc.liveness_interval_secs,
        "timeoutSeconds": lc.liveness_timeout_secs,
    }
    probes["livenessProbe"] = {
        "httpGet": _http_get(live),
        "periodSeconds": lc.liveness_interval_secs,
        "timeoutSeconds": lc.liveness_timeout_secs,
        "failureThreshold": lc.liveness_failures,
    }
    return probes


def scrape_annotations(port: int) -> dict[str, Any]:
    """Pod annotations the Prometheus Kubernetes service-discovery recipes key on
    (prometheus/documentation/examples/prometheus-kubernetes.yml: prometheus.io/scrape,
    /port, /path): a cluster's Prometheus finds each engine's and the router's metrics."""
    return {"annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                            "prometheus.io/path": "/metrics"}}


class _Dumper(yaml.SafeDumper):
    """kubectl's layout: list items indented under their key, multi-line strings as blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:  # a shared dict is written out each time
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                   style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def yaml_file(path: str, header: list[str], docs: list[dict[str, Any]]) -> File:
    """A manifest file: the provenance header as comments, then each object a document."""
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True, width=4096)
    return File(path, "".join(f"# {line}\n" for line in header) + body)
