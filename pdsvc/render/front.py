"""Plan -> HAProxy's configuration for the front of several routers (router.replicas ≥ 2).

HAProxy (Debian's package, haproxy 2.6) listens on router.host:router.port and sends each
request to a router that answers; every directive is HAProxy's own (configuration.txt of
haproxy 2.6):

* ``option httpchk GET /readiness`` + ``check inter … fall 2 rise 1``: a router whose process
  is gone, or that lists no healthy prefill and decode (both routers answer /readiness 503
  then, without a key; smg also while it drains on SIGTERM), leaves rotation within two
  checks. /liveness would keep in rotation a router cut off from the engines (its host back
  from a partition, before the engines registered with it again): every request it took
  would be a 503;
* ``retry-on conn-failure empty-response 503`` with ``retries`` and ``option redispatch 1``: a
  request that a router refused, reset, closed without a byte of response, or answered 503
  (no worker for it) is sent again, to another router. ``option http-buffer-request`` keeps
  the whole request (up to tune.bufsize) so that a POST can be sent again; a response that
  has begun (a stream) is never retried;
* ``stats socket … level admin``: the runtime API through which a router unit drains itself
  out of rotation before it stops and puts itself back once ready (runtime/front.py);
* ``balance roundrobin``: the routers share the load. Each router keeps its own cache-aware
  tree over the same engines;
* HAProxy's own Prometheus exporter (``http-request use-service prometheus-exporter``, built
  into Debian's package) on router.prometheus_host:router.front.prometheus_port: each
  router's state (``haproxy_server_status{proxy="routers",server=…,state=…}``) and requests.

The values come from the plan: names and ports the schema bounds, addresses check_host
accepted; nothing here is quoted because nothing can need it (``::`` gets HAProxy's ``ipv6@``
prefix and ``v4v6``).
"""

from __future__ import annotations

from pdsvc.plan.types import FrontPlan


def bind_address(host: str, port: int) -> str:
    """``bind``'s address: ``ADDRESS:PORT``; ``::`` (the only IPv6 literal router.host
    takes) with the ``ipv6@`` prefix and ``v4v6``, so IPv4 clients are served as well
    whatever net.ipv6.bindv6only says."""
    return f"ipv6@{host}:{port} v4v6" if ":" in host else f"{host}:{port}"


def front_config(f: FrontPlan, header: list[str]) -> str:
    """The haproxy.cfg of the front (installed at f.config_path)."""
    lines = [*(f"# {line}" for line in header), "",
             "global",
             # events (a router DOWN/UP) to stderr: the unit's journal; no request log
             "    log stderr format short daemon notice",
             f"    stats socket {f.socket} mode 660 level admin",
             f"    tune.bufsize {f.buffer_kib * 1024}",
             "",
             "defaults",
             "    mode http",
             "    log global",
             "    option dontlognull",
             "    option http-buffer-request",
             "    timeout connect 2s",
             "    timeout http-request 60s",
             f"    timeout client {f.timeout_secs}s",
             f"    timeout server {f.timeout_secs}s",
             "    timeout queue 30s",
             f"    retries {f.retries}",
             "    retry-on conn-failure empty-response 503",
             "    option redispatch 1",
             "",
             f"frontend {f.name}",
             f"    bind {bind_address(f.host, f.port)}",
             f"    default_backend {f.backend}",
             "",
             f"frontend {f.name}-metrics",
             f"    bind {bind_address(f.prometheus_host, f.prometheus_port)}",
             "    no log",
             "    http-request use-service prometheus-exporter if { path /metrics }",
             "    http-request return status 404",
             "",
             f"backend {f.backend}",
             "    balance roundrobin",
             "    option httpchk GET /readiness",
             f"    default-server check inter {f.check_interval_ms}ms fall 2 rise 1",
             *(f"    server {name} {address}" for name, address in f.servers),
             ""]
    return "\n".join(lines)
