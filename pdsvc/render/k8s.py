"""Plan -> Kubernetes manifests (pure): the SAME deployment as the systemd units, as a
kustomize bundle (``kubectl apply -k DIR``).

Layout, one file per workload, each beginning with the provenance header:

* ``ENGINE.yaml`` for every engine (``dsv4-prefill``, ``dsv4-decode-1``, … as its unit is
  named): an ``apps/v1`` Deployment (replicas 1, Recreate: two pods cannot share the GPUs) or,
  for an engine that spans hosts, a ``LeaderWorkerSet`` of ``nnodes`` pods; and the engine's
  ClusterIP Service;
* ``ROUTER.yaml``: the router's Deployment and Service;
* ``kustomization.yaml`` listing them.

Names. An engine's Service is named exactly as the engine (and its systemd unit), whether one
pod or a group runs it, so the URL the router and decode dial,
``http://ENGINE.NAMESPACE.svc:PORT``, does not change when an engine grows onto a second host.
A Deployment shares that name; a LeaderWorkerSet is ``ENGINE-lws``, because the LWS controller
creates a headless Service named after the LWS itself (for ``$(LWS_LEADER_ADDRESS)``).

Translated from the units: readiness (``Type=notify`` + the runtime's /health gate) becomes a
startupProbe with the start budget and a readinessProbe; the watchdog a livenessProbe with the
same hang bound; ``TimeoutStopSec=`` terminationGracePeriodSeconds; ``LimitMEMLOCK=`` the
IPC_LOCK capability (Kubernetes has no rlimit setting); the router's ``After=`` on the engines
an init container that waits for their Services' health. Left to Kubernetes: GPU assignment
(the device plugin, hence no CUDA_VISIBLE_DEVICES), CPU/NUMA pinning (the kubelet's topology
manager), restart back-off (restart_secs and start_limit_* have no counterpart). Not
expressible: restarting decode with prefill (``restarts_with``, NIXL) and the runtime's
serialised cold JIT compiles (it is not in the image).

Escaping: Kubernetes expands ``$(VAR)`` in ``command`` words and ``env`` values and reduces
``$$`` to ``$``; every ``$`` from the plan is doubled, so only the LWS references placed here
are expanded. The pieces every object is made of (escaping, labels, probes, the YAML layout)
are k8s_objects.py's.
"""

from __future__ import annotations

from typing import Any

from pdsvc.config.checks import is_loopback
from pdsvc.errors import ConfigError
from pdsvc.plan.build import EnginePlan, Plan, RouterPlan, engine_argv, router_argv
from pdsvc.render.k8s_objects import (
    engine_selector,
    escaped_command,
    http_probes,
    k8s_escape,
    object_labels,
    object_metadata,
    router_selector,
    scrape_annotations,
    service_url,
    url_path,
    workload_name,
    yaml_file,
)
from pdsvc.render.kit import File, header_lines, systemd_only_front

KUSTOMIZATION = "kustomization.yaml"
CUSTOMISE = (
    "Customise with a kustomize overlay (resources: [this directory]); do not edit. "
    "Set k8s.namespace in the config, not in the overlay: the Service URLs contain it."
)
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
#: Set by the LWS controller on every group's leader pod ("0") and by its webhook on workers.
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: Injected by the LWS pod webhook into every container of the group (lws pod_utils.go).
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
#: Where a pod listens: every address (its own IP, or the node's under hostNetwork).
POD_HOST = "0.0.0.0"

_LOOPBACK = ("127.", "localhost", "::1")

#: The router's init container: start it only once every engine Service answers its health URL
#: (a Service routes to ready pods only). The units' After= on Type=notify engines, for the
#: same reason: router 0.3.2 drops for good a worker not up within --worker-startup-timeout-secs
#: and keeps /liveness 200, so nothing would ever restart it (its --worker-startup-timeout-secs
#: help; docs/benchmarks.md).
WAIT_FOR_ENGINES = """\
import sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
interval, timeout, urls = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
for url in urls:
    while True:
        try:
            opener.open(url, timeout=timeout).close()
            print(f"{url}: healthy", flush=True)
            break
        except Exception as e:
            print(f"waiting for {url}: {e}", flush=True)
            time.sleep(interval)
"""


# --------------------------------------------------------------------------- engines


def pod_argv(plan: Plan, e: EnginePlan) -> tuple[str, ...]:
    """The engine's command line in its pod (before $-escaping): listening on every address,
    meeting its peers at the group leader (LWS) or itself, its rank from LWS."""
    port = e.dist_init_port
    if e.nnodes > 1:
        return engine_argv(e, python=plan.k8s.python, host=POD_HOST,
                           dist_init_addr=f"{LWS_LEADER_ADDRESS}:{port}",
                           node_rank=LWS_WORKER_INDEX)
    return engine_argv(e, python=plan.k8s.python, host=POD_HOST,
                       dist_init_addr=f"127.0.0.1:{port}")


def _engine_command(plan: Plan, e: EnginePlan) -> list[str]:
    """pod_argv as the container's command: the LWS references alone left to expand."""
    refs = (f"{LWS_LEADER_ADDRESS}:{e.dist_init_port}", LWS_WORKER_INDEX) if e.nnodes > 1 else ()
    return escaped_command(pod_argv(plan, e), refs)


def _engine_env(e: EnginePlan) -> list[dict[str, Any]]:
    """The plan's env without CUDA_VISIBLE_DEVICES (the device plugin picks the GPUs), and
    SGLANG_HOST_IP, the address advertised for KV transfer, always the pod's IP."""
    env: list[dict[str, Any]] = [
        {"name": k, "value": k8s_escape(v)} for k, v in e.env
        if k not in ("CUDA_VISIBLE_DEVICES", "SGLANG_HOST_IP")
    ]
    env.append({"name": "SGLANG_HOST_IP",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return env


def model_path(e: EnginePlan) -> str:
    """The --model-path the plan gives the engine."""
    args = list(e.model_args)
    return args[args.index("--model-path") + 1]


def _volumes(plan: Plan, e: EnginePlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): every path the plan's env or command names, at the same path."""
    jit, claim = plan.paths.jit_cache, plan.k8s.jit_cache_claim
    # the JIT cache outlives pods (cold compiles take minutes): a shared claim, or the node's
    cache = ({"persistentVolumeClaim": {"claimName": claim}} if claim
             else {"hostPath": {"path": jit, "type": "DirectoryOrCreate"}})
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # NCCL/torch IPC; 64 MiB default
        {"name": "home", "emptyDir": {}},  # HOME (the units' StateDirectory=)
        {"name": "jit-cache", **cache},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "home", "mountPath": plan.paths.state_dir},
        {"name": "jit-cache", "mountPath": jit},
    ]
    model = model_path(e)
    if model.startswith("/"):  # a local model (else a hub id, fetched into HOME)
        volumes.append({"name": "model", "hostPath": {"path": model, "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": model, "readOnly": True})
    return volumes, mounts


def _engine_pod(plan: Plan, e: EnginePlan, *, serves_http: bool) -> dict[str, Any]:
    """One engine pod's spec; ``serves_http``: rank 0 (the Deployment's pod, the LWS leader)
    has the ports and the probes, an LWS worker has neither."""
    k = plan.k8s
    volumes, mounts = _volumes(plan, e)
    container: dict[str, Any] = {
        "name": e.role,
        "image": k.image,
        "command": _engine_command(plan, e),
        "env": _engine_env(e),
    }
    if serves_http:
        ports = [{"name": "http", "containerPort": e.port, "protocol": "TCP"}]
        if e.role == "prefill":  # decode dials it at the Service (the bootstrap host)
            ports.append({"name": "bootstrap", "containerPort": e.bootstrap_port,
                          "protocol": "TCP"})
        container["ports"] = ports
    container["resources"] = {"limits": {k.gpu_resource: str(len(e.gpus))}}
    # RDMA registers (pins) GPU and host memory: the units' LimitMEMLOCK=infinity
    container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    if serves_http:
        health = url_path(e.health_url)
        container.update(http_probes(plan, startup=health, ready=health, live=health))
    container["volumeMounts"] = mounts
    spec: dict[str, Any] = {
        # no FOO_SERVICE_HOST/FOO_PORT variables: a Service named sglang-… would inject
        # SGLANG_* variables, which SGLang reads as its own settings
        "enableServiceLinks": False,
    }
    if k.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"  # still resolve the Service names
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    spec["terminationGracePeriodSeconds"] = plan.lifecycle.stop_timeout_secs
    spec["containers"] = [container]
    spec["volumes"] = volumes
    return spec


def _engine_meta(e: EnginePlan, labels: dict[str, str], serves_http: bool) -> dict[str, Any]:
    """A pod template's metadata: its labels, and the scrape annotations where the pod serves
    SGLang's /metrics (--enable-metrics, on the HTTP port of rank 0)."""
    return {"labels": labels, **(scrape_annotations(e.port) if e.metrics and serves_http else {})}


def _engine_workload(plan: Plan, e: EnginePlan) -> dict[str, Any]:
    labels = object_labels(plan, e.role, e.name)
    if e.nnodes == 1:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": object_metadata(plan, workload_name(e), labels),
            "spec": {
                "replicas": 1,
                # the old pod must free the GPUs before the new one can be scheduled
                "strategy": {"type": "Recreate"},
                # `kubectl rollout status` gives up after the start budget, not 10 minutes
                "progressDeadlineSeconds": plan.lifecycle.start_timeout_secs,
                "selector": {"matchLabels": engine_selector(plan, e)},
                "template": {"metadata": _engine_meta(e, labels, serves_http=True),
                             "spec": _engine_pod(plan, e, serves_http=True)},
            },
        }
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": object_metadata(plan, workload_name(e), labels),
        "spec": {
            "replicas": 1,
            # the leader is not ready before its workers joined: never wait for it (LeaderReady)
            "startupPolicy": "LeaderCreated",
            # as Recreate: a new group only once the old one freed its GPUs
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": e.nnodes,
                # one rank lost is the whole TP group lost: restart them together
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": _engine_meta(e, labels, serves_http=True),
                                   "spec": _engine_pod(plan, e, serves_http=True)},
                "workerTemplate": {"metadata": _engine_meta(e, labels, serves_http=False),
                                   "spec": _engine_pod(plan, e, serves_http=False)},
            },
        },
    }


def _engine_service(plan: Plan, e: EnginePlan) -> dict[str, Any]:
    selector = engine_selector(plan, e)
    if e.nnodes > 1:
        selector[LWS_WORKER_INDEX_LABEL] = "0"  # the leader alone serves HTTP
    ports = [{"name": "http", "port": e.port, "targetPort": "http", "protocol": "TCP"}]
    if e.role == "prefill":
        ports.append({"name": "bootstrap", "port": e.bootstrap_port, "targetPort": "bootstrap",
                      "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(plan, e.name, object_labels(plan, e.role, e.name)),
        "spec": {"type": "ClusterIP", "selector": selector, "ports": ports},
    }


# --------------------------------------------------------------------------- router


def router_pod_argv(plan: Plan, r: RouterPlan, engines: list[EnginePlan]) -> tuple[str, ...]:
    """The router's command line with the engines' Service URLs (prefills with their
    bootstrap ports)."""
    return router_argv(
        r, python=plan.k8s.python,
        prefills=tuple((service_url(plan, e), e.bootstrap_port) for e in engines
                       if e.role == "prefill"),
        decodes=tuple(service_url(plan, e) for e in engines if e.role == "decode"),
    )


def _router_docs(plan: Plan, r: RouterPlan, engines: list[EnginePlan]) -> list[dict[str, Any]]:
    """The router's Deployment (its container, behind an init container that waits for the
    engines) and its Service; ConfigError for a router bound to loopback."""
    if r.host.startswith(_LOOPBACK):
        raise ConfigError(
            f"{plan.config_source}: router.host is {r.host}: in a pod the router's Service "
            "could not reach it",
            hint="set router.host: 0.0.0.0",
        )
    return [_router_deployment(plan, r, engines), _router_service(plan, r)]


def _wait_for_engines(plan: Plan, engines: list[EnginePlan]) -> dict[str, Any]:
    """The router's init container: it ends once every engine's Service answers health."""
    k, lc = plan.k8s, plan.lifecycle
    waits = [service_url(plan, e) + url_path(e.health_url) for e in engines]
    return {
        "name": "wait-for-engines",
        "image": k.router_image or k.image,
        "command": escaped_command([k.python, "-c", WAIT_FOR_ENGINES,
                             str(lc.liveness_interval_secs),
                             str(lc.liveness_timeout_secs), *waits]),
    }


def _router_container(plan: Plan, r: RouterPlan, engines: list[EnginePlan]) -> dict[str, Any]:
    """The router's container: its command with the engines' Services, its port, probes."""
    return {
        "name": "router",
        "image": plan.k8s.router_image or plan.k8s.image,
        "command": escaped_command(router_pod_argv(plan, r, engines)),
        "env": [{"name": key, "value": k8s_escape(v)} for key, v in r.env],
        # only the client port: the metrics listener binds router.prometheus_host (loopback
        # by default) and is for a scraper next to it, not for clients
        "ports": [{"name": "http", "containerPort": r.port, "protocol": "TCP"}],
        # readiness: a prefill/decode pair is registered; liveness: the router itself, so an
        # engine restart does not restart it
        **http_probes(plan, startup=None, ready=url_path(r.readiness_url),
                      live=url_path(r.liveness_url)),
    }


def _router_deployment(plan: Plan, r: RouterPlan, engines: list[EnginePlan]) -> dict[str, Any]:
    """The router's Deployment: one replica, scraped where its metrics bind beyond loopback."""
    lc, labels = plan.lifecycle, object_labels(plan, "router")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(plan, r.name, labels),
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": lc.start_timeout_secs,  # it waits for the engines
            "selector": {"matchLabels": router_selector(plan)},
            "template": {
                # its metrics listener is scrapeable only when it binds beyond the pod's
                # loopback (router.prometheus_host)
                "metadata": {"labels": labels, **(
                    {} if is_loopback(r.prometheus_host)
                    else scrape_annotations(r.prometheus_port))},
                "spec": {
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": lc.stop_timeout_secs,
                    "initContainers": [_wait_for_engines(plan, engines)],
                    "containers": [_router_container(plan, r, engines)],
                },
            },
        },
    }


def _router_service(plan: Plan, r: RouterPlan) -> dict[str, Any]:
    """The router's Service, of k8s.router_service_type, on its client port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(plan, r.name, object_labels(plan, "router")),
        "spec": {
            "type": plan.k8s.router_service_type,
            "selector": router_selector(plan),
            "ports": [{"name": "http", "port": r.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


# --------------------------------------------------------------------------- the bundle


def engine_groups(plan: Plan) -> list[EnginePlan]:
    """One EnginePlan per engine, its rank 0 (an engine spanning hosts appears once per rank).

    Where a pod runs is the scheduler's choice, so no host's own settings (hosts.NAME.env,
    ucx_net_devices) apply: the plan for manifests is built without a host (UNPLACED), and an
    inventory only says how many nodes an engine spans."""
    ranks: dict[str, list[EnginePlan]] = {}
    for e in plan.engines:
        ranks.setdefault(e.name, []).append(e)
    leaders = []
    for name, group in ranks.items():
        leader = next((e for e in group if e.node_rank == 0), None)
        if leader is None:
            raise ConfigError(f"{name}: the plan has no rank 0 of this engine (a host's view?); "
                              "Kubernetes manifests are rendered from the whole plan")
        leaders.append(leader)
    return leaders


def render_k8s(plan: Plan, command: str) -> list[File]:
    """The Kubernetes bundle: ``ENGINE.yaml`` per engine (Deployment or LeaderWorkerSet, and
    its Service), ``ROUTER.yaml`` (Deployment, Service) and ``kustomization.yaml`` listing them.

    Object names are the unit names, DNS-1035 labels already (the config's `name` is 2-32
    of [a-z0-9-], starting with a letter). Raises ConfigError for a router bound to loopback,
    which its Service could not reach."""
    systemd_only_front(plan, "k8s")
    header = header_lines(plan, command, customise=CUSTOMISE)
    engines = engine_groups(plan)
    files = [yaml_file(f"{e.name}.yaml", header,
                        [_engine_workload(plan, e), _engine_service(plan, e)]) for e in engines]
    if plan.router:
        files.append(yaml_file(f"{plan.router.name}.yaml", header,
                                _router_docs(plan, plan.router, engines)))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f.path for f in files],
    }
    return [*files, yaml_file(KUSTOMIZATION, header, [kustomization])]
