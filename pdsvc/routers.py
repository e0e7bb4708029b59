"""The router packages pdsvc renders: sglang-router 0.3.2 and its successor smg 1.13.0.

`router.package` picks one; everything that differs between the two is data here, and
pdsvc/plan/build.py's one composer (`_router` / `router_argv`) reads it:

* the module `python -m` runs (`sglang_router.launch_router` / `smg.launch_router`; never the
  `smg` console script: sglang-router 0.3.2 ships one of that name too, entry_points.txt
  `smg=sglang_router.cli:main`, so in a venv holding both it is whichever was installed last);
* the flags one package has and the other lacks, so that a `router.args` flag the chosen
  router would refuse at start is a config error naming the router that has it;
* flags pdsvc adds for one package only, and the flags that it therefore owns.

Both launchers parse their argv with argparse in Python (`parse_router_args(sys.argv[1:])`,
then `Router.from_args()` hands the Rust core a config object), and every flag pdsvc renders
for 0.3.2 (host, port, policy, prometheus, the four health-check flags,
--worker-startup-timeout-secs, --disable-circuit-breaker, --pd-disaggregation, --prefill URL
PORT, --decode URL) is accepted by smg 1.13.0 under the same name with the same meaning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

PackageName = Literal["sglang-router", "smg"]

#: Flags only smg 1.13.0's launch_router accepts: its parser's long options minus
#: sglang-router 0.3.2's (`RouterArgs.add_cli_args(parser, use_router_prefix=False)` of each
#: installed package, compared option by option).
_SMG_ONLY = """
balance-token-usage-threshold block-size cache-boundaries cache-index cache-match-threshold
cache-ttl-secs disable-load-monitoring disable-tokenizer-autoload
disable-worker-overload-protection discovery-check-interval-secs discovery-file
discovery-provider dp-minimum-tokens-scheduler enable-mesh enable-rl enable-wasm encode
encode-policy encode-selector epd-disaggregation header-read-timeout-secs health-check-port
history-memory-max-items history-memory-max-responses history-memory-retention-secs
idle-connection-timeout-secs jemalloc-prof-dir job-queue-capacity job-queue-concurrency
kv-connector-annotation kv-engine-id-annotation kv-index least-load-default-throughput
least-load-kv-pressure-weight least-load-max-waiting-requests least-load-mean-prefill-tokens
load-monitor-interval log-json log-mm-timing max-background-responses
max-buffered-request-bytes mesh-advertise-host mesh-host mesh-peer-urls mesh-port
mesh-server-name mesh-tls-ca-cert mesh-tls-cert mesh-tls-key mm-allow-private-media-hosts
mm-allowed-media-domains mm-per-request-image-limit mm-pixel-cache-mb mm-pixel-rdma
mm-processing model model-alias model-id-from multimodal-max-inflight-bytes
multimodal-shm-min-bytes multimodal-tensor-transport no-remove-unhealthy-workers
no-worker-auto-recovery oracle-external-auth overlap-decay overload-token-usage-threshold parser
pd-admission-wait-secs postgres-op-timeout-secs power-of-two-load-metric
prefill-max-inflight-requests-per-worker prefill-queue-size prefill-queue-timeout-secs
prefix-hash-balance-abs-threshold prefix-hash-load-factor prefix-token-count
priority-scheduler-config priority-scheduler-default-max-class priority-scheduler-enabled
priority-scheduler-tenant-metric-top-n rdma-listen-ip rdma-slot-ttl-s redis-op-timeout-secs
remove-unhealthy-workers rl-control-timeout-secs rl-fanout-concurrency router-selector
routing-key-headers routing-key-override schema-config selection-accounting-ttl-ms
selection-policy selection-temperature spill-abs-threshold spill-rel-threshold
sse-keepalive-secs sticky-key-idle-secs sticky-sessions storage-context-headers
storage-hook-wasm-path stream-body-stall-timeout-secs tenant-api-key tenant-header-name
tenant-rate-limit-config tenant-rate-limit-enabled tokenizer-cache-l0-max-memory
trust-tenant-header upstream-http2 upstream-pool-idle-timeout-secs worker-auto-recovery
worker-overload-protection worker-overload-shed worker-overload-token-usage
worker-overload-waiting-requests worker-stale-secs worker-stall-secs worker-startup-delay
worker-warmup-blocks worker-warmup-divert-every worker-warmup-secs worker-warmup-share
worker-warmup-thin-ratio worker-wedge-secs zmq-engine-count
"""
SMG_ONLY_FLAGS = frozenset(_SMG_ONLY.split())

#: Flags only sglang-router 0.3.2's launch_router accepts (same comparison).
SGLANG_ROUTER_ONLY_FLAGS = frozenset({"mini-lb"})

# smg's --remove-unhealthy-workers (alias --worker-auto-recovery; BooleanOptionalAction, default
# None = "follow service discovery", smg/router_args.py) REMOVES a worker from the registry
# once it reaches Failed ("Removing failed worker from registry", worker/manager.rs); its
# --help: "unhealthy workers are removed so service discovery re-registers and re-probes them
# once their engine returns". pdsvc lists its workers on the command line, with no discovery,
# so a removed engine never returns. On 1.13.0, without the flag a Failed worker stays listed
# in GET /workers, keeps being probed and is Ready again one probe after its engine is back;
# with --worker-auto-recovery it is removed at Failed and /readiness stays 503 until a manual
# POST /workers (docs/benchmarks.md, "Figures the code relies on"). (smg's source up
# to v1.9.0, worker/manager.rs `schedule_descriptor_at`, stopped probing Failed workers; 1.13.0
# no longer does.) So pdsvc pins the flag off, whatever smg's default becomes.
_SMG_KEEP_FAILED = "--no-remove-unhealthy-workers"
_SMG_OWNED = {
    flag: f"(pinned off by {_SMG_KEEP_FAILED}: it would remove an engine down long enough to be "
          "Failed, and without service discovery nothing re-adds it)"
    for flag in ("remove-unhealthy-workers", "no-remove-unhealthy-workers",
                 "worker-auto-recovery", "no-worker-auto-recovery")
}


#: How a PD request that failed is retried, the same in both generations (sglang-router 0.3.2 =
#: lightseekorg/smg commit c7f9bf9f563c, src/routers/http/pd_router.rs `execute_dual_dispatch`
#: and src/core/retry.rs; smg model_gateway/src/routers/http/pd_router.rs and
#: routers/common/retry.rs, v1.9.0, the newest source stored; 1.13.0 measured in
#: tests/test_e2e_coupling.py):
#:
#: * every try calls `select_pd_pair` afresh, so a retry may land on another prefill AND another
#:   decode, with a new bootstrap_room: a dead engine on either side is retried around;
#: * retried: a try whose status is 408, 429, 500, 502, 503 or 504 (`is_retryable_status`); a
#:   dead engine's connection error is a 502 (`bad_gateway("decode_server_error")`, and the
#:   prefill's likewise). NOT retried: SGLang's HTTP 200 with finish_reason abort (a stale NIXL
#:   pair, smg #2382): the router sees a success, so the runtime keeps an engine out of the
#:   router until its pairs with the registered engines pass the canary (membership.py);
#: * `--retry-max-retries N` counts tries, the first included; the pause before try k+1 is
#:   initial × multiplier^k, capped, with jitter;
#: * a stream is retried only until its headers are sent: after that the decode's stream is
#:   copied chunk by chunk (`create_streaming_response`), and a read error ends the body with
#:   an error (`tx.send(Err(..))`), so the client's chunked read fails: it does not hang;
#: * the circuit breaker is charged both sides of each try (`prefill.record_outcome(..)`,
#:   `decode.record_outcome(..)`): one dead prefill opens the breaker of every decode it was
#:   tried with, and an open breaker holds for --cb-timeout-duration-secs (60 s) whatever the
#:   engines do. So pdsvc renders --disable-circuit-breaker unless router.circuit_breaker.
RETRY_BACKOFF_MULTIPLIER = 2


def resilience_options(attempts: int, initial_ms: int, max_ms: int,
                       circuit_breaker: bool) -> tuple[str, ...]:
    """The retry and circuit-breaker flags, for either package (same names, same meaning)."""
    out = ("--retry-max-retries", str(attempts),
           "--retry-initial-backoff-ms", str(initial_ms),
           "--retry-max-backoff-ms", str(max(max_ms, initial_ms)),
           "--retry-backoff-multiplier", str(RETRY_BACKOFF_MULTIPLIER))
    return out if circuit_breaker else (*out, "--disable-circuit-breaker")


@dataclass(frozen=True)
class RouterPackage:
    name: PackageName
    version: str  # the version pdsvc renders for and its tests check against
    module: str  # what `python -m` runs
    options: tuple[str, ...]  # flags pdsvc adds for this package, after the common ones
    owned: dict[str, str]  # flags of `options`: router.args may not set them (why)
    only_flags: frozenset[str]  # flags this package's launcher has and the other's lacks

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


PACKAGES: dict[str, RouterPackage] = {
    "sglang-router": RouterPackage(
        name="sglang-router", version="0.3.2", module="sglang_router.launch_router",
        options=(), owned={}, only_flags=SGLANG_ROUTER_ONLY_FLAGS,
    ),
    "smg": RouterPackage(
        name="smg", version="1.13.0", module="smg.launch_router",
        options=(_SMG_KEEP_FAILED,), owned=_SMG_OWNED, only_flags=SMG_ONLY_FLAGS,
    ),
}
DEFAULT: PackageName = "sglang-router"


def package(name: str) -> RouterPackage:
    return PACKAGES[name]


def check_args(name: str, flags: Iterable[str]) -> None:
    """Refuse a `router.args` flag that package `name` lacks; the message names the package
    that has it (the caller prefixes `router.args: `). The flags it owns, under any
    abbreviation, are owned.check_flags's to refuse."""
    chosen = PACKAGES[name]
    for flag in flags:
        for other in PACKAGES.values():
            if other is not chosen and flag in other.only_flags:
                raise ValueError(
                    f"--{flag} is an {other.name} flag; set router.package: {other.name}"
                )
