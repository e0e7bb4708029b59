"""Every option of the runtime's engine and router modes, with its default, in one dataclass (as
sglang-router's RouterArgs holds every knob of the router): the one home of each knob. The
parser is built from these fields (cli.build_parser), and the runtime reads a typed ``Options``,
never an argparse Namespace.

Who owns a default: the knobs the config's ``lifecycle`` section passes (``config=True``) have
the config's default here too, and tests/test_config_contract.py holds them equal; the rest are
the runtime's own and the config does not repeat them. One exception, by design:
``--stop-timeout`` defaults to no bound of its own (the process manager's stop timeout is the
bound), since the router's unit under systemd does not pass it.
"""

from __future__ import annotations

import argparse
import dataclasses
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .endings import Exit
from .timings import HEAL_STAGGER_S

ENGINE, ROUTER = ("engine",), ("router",)
BOTH = ("engine", "router")
MEMBERSHIP = ("router membership", "register the engine with the router once healthy, "
              "deregister before a stop, re-register when the router lost it")
CANARY = ("pair canary", "a one-token PD generation through each pair, judged by content")


# ---------------------------------------------------------------- argument types
def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def whole_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def gpu_list(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(item.isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1,2,3, got {text!r}")
    gpus = [int(item) for item in items]
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"GPU listed twice in {text!r}")
    return gpus


def http_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def host_port(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {text!r}")
    return text


# ---------------------------------------------------------------- field makers
def opt(help: str, *, modes: tuple[str, ...] = BOTH,  # noqa: A002
        type: Callable[[str], Any] | None = None,  # noqa: A002
        metavar: str | tuple[str, ...] | None = None, group: tuple[str, str] | None = None,
        config: bool = False, **argparse_kwargs: Any) -> dict[str, Any]:
    """A field's metadata: its flag's help, the modes that take it, its argparse type and
    metavar, its group in --help, whether the config owns its default, argparse's rest."""
    return {"help": help, "modes": modes, "type": type, "metavar": metavar, "group": group,
            "config": config, "argparse": argparse_kwargs}


def seconds(default: float | None, help: str, **kw: Any) -> Any:  # noqa: A002
    """A duration in seconds (> 0)."""
    return field(default=default, metadata=opt(help, type=positive_float, metavar="S", **kw))


def urls(help: str, **kw: Any) -> Any:  # noqa: A002
    """A repeatable http(s) URL."""
    return field(default_factory=list, metadata=opt(help, type=http_url, metavar="URL",
                                                    action="append", **kw))


@dataclass
class Options:
    """The engine's and the router's options (``mode``: which). A field a mode does not take
    keeps its default there."""

    mode: str = "engine"
    # ------------------------------------------------------------ both modes
    name: str = field(default="", metadata=opt(
        "unit name used as the prefix of every log line and in STATUS= (e.g. dsv4-prefill)",
        required=True))
    liveness_interval: float = seconds(10.0, config=True, help=(
        "seconds between liveness probes once ready; each 200 sends WATCHDOG=1, so keep it "
        "well below the unit's WatchdogSec= (default: %(default)g)"))
    liveness_timeout: float = seconds(30.0, config=True, help=(
        "timeout of one liveness probe; an engine's /health runs a 1-token generation "
        "(SGLang gives up after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s) (default: %(default)g)"))
    progress_every: float = seconds(15.0, help=(
        "seconds between progress lines while waiting (for health, the JIT lock, or the "
        "child's exit); keeps long starts visible without flooding the journal "
        "(default: %(default)g)"))
    poll_interval: float = seconds(1.0, help=(
        "seconds between start-phase probes; short so READY=1 follows health closely "
        "(default: %(default)g)"))
    wait_for: list[str] = urls(
        "start the command only once URL answers 200 (repeatable: all of them); for "
        "managers that order spawns but not readiness (supervisord): the router waits for both "
        "engines' /health, as After= on the Type=notify units makes it under systemd")
    watchdog_secs: float | None = seconds(None, help=(
        "without systemd's watchdog: once no liveness probe has succeeded for S seconds "
        "(pass the units' WatchdogSec=), SIGKILL the command and exit 124 so the process "
        "manager restarts it; probes are cut short so that S is the bound"))
    kill_tree: bool = field(default=False, metadata=opt(
        "for managers without cgroups: become a child subreaper (so descendants that leave "
        "the command's process group or session stay ours) and SIGKILL every descendant left "
        "once the command is gone, as KillMode=mixed does with a unit's cgroup",
        action="store_true"))
    min_uptime: float | None = seconds(None, help=(
        f"exit with a give-up ({Exit.GAVE_UP:d}) no sooner than S seconds after this process "
        "started: supervisord honours exitcodes= only for a process that ran startsecs (pass "
        "them), and retries one that ended sooner as a failed spawn"))
    prefix_output: bool = field(default=False, metadata=opt(
        "prefix every line of the command's stdout and stderr with 'NAME: ', as our own "
        "lines are, for a log that mixes programs (supervisord's stdout in a container; "
        "journald keeps units apart by itself)", action="store_true"))
    # not the config's default: without it the process manager's own stop timeout is the
    # bound (systemd's TimeoutStopSec= for the router); the units pass the config's value
    # where the runtime must bound a drain itself (an engine's heal, supervisord)
    stop_timeout: float | None = seconds(None, help=(
        "after a stop signal, SIGKILL the command (its tree with --kill-tree) if it has "
        "not exited within S seconds (default: wait; systemd's TimeoutStopSec= is the "
        "bound)"))
    state_dir: str | None = field(default=None, metadata=opt(
        "where the restart policy keeps how the last run ended (NAME.restart.json) and the "
        "pair canary its results (NAME.canary.json), for the next run and `pdsvc status`; the "
        "unit's StateDirectory= (default: keep nothing, every start is a first start)",
        metavar="DIR"))
    metrics_dir: str | None = field(default=None, metadata=opt(
        "write this unit's state as Prometheus text (NAME.prom, atomically) into DIR, for "
        "node_exporter's textfile collector (metrics.py; needs --state-dir)", metavar="DIR"))
    deployment: str = field(default="", metadata=opt(
        "the deployment (the config's name): the label of those series, and the name of "
        "the deployment-wide heal marker in --state-dir (NAME.heal-all.json, cascade.py)",
        metavar="NAME"))
    start_timeout: float | None = seconds(3600.0, config=True, help=(
        "a start not healthy within S seconds is stopped and counts as a failed start "
        "(see --start-attempts); the units give systemd's TimeoutStartSec= a stop's time more, "
        "so this fires first (default: %(default)g)"))
    restart_delay: float = seconds(1.0, config=True, help=(
        "the unit's RestartSec=: a crash's restart waits S, the next crash in a row 2*S, "
        "then 4*S... (the extra wait is ours: systemd 252 has no RestartSteps=) "
        "(default: %(default)g)"))
    restart_max_delay: float = seconds(300.0, config=True, help=(
        "longest wait before a restart after crashes in a row (default: %(default)g)"))
    restart_reset: float = seconds(600.0, config=True, help=(
        "serving this long in a row forgives earlier crashes (default: %(default)g)"))
    start_attempts: int = field(default=3, metadata=opt(
        "starts in a row that end before the service is healthy (a missing model, a "
        f"rejected flag, OOM at load) before giving up: exit {Exit.GAVE_UP:d}, which the unit "
        "does not restart (RestartPreventExitStatus=); stops never count (default: "
        "%(default)s)", type=positive_int, metavar="N", config=True))
    # ------------------------------------------------------------ engine
    health_url: str = field(default="", metadata=opt(
        "the engine's /health; SGLang answers 503 until weights are loaded and warmup is "
        "done, so 200 means ready; also the liveness probe", modes=ENGINE, type=http_url,
        metavar="URL", required=True))
    restart_with: list[str] = urls(
        "/health of a peer on another host this engine must restart with (a NIXL "
        "decode's prefill, sglang #33789; on one host systemd's PartOf= does it): once "
        "--peer-down-probes probes of a peer seen healthy failed in a row, its port closed "
        "(the process is gone; a refusal is confirmed within a second), stop the engine and "
        f"exit {Exit.PEER:d} so that Restart=on-failure starts it afresh; repeatable",
        modes=ENGINE)
    peer_down_probes: int = field(default=3, metadata=opt(
        "failed probes in a row that make a --restart-with peer's recovery a restart "
        "(default: %(default)s; the units pass the liveness failure count)", modes=ENGINE,
        type=positive_int, metavar="N", config=True))
    peer_interval: float = seconds(1.0, modes=ENGINE, help=(
        "seconds between probes of --restart-with peers, from the moment this engine is "
        "ready: a peer that restarts within one liveness interval is still seen go and return "
        "(default: %(default)g)"))
    gpus: list[int] | None = field(default=None, metadata=opt(
        "nvidia-smi indices of the unit's GPUs (e.g. 0,1,2,3); before starting, refuse "
        "(exit 1) while any compute process holds one of them, so a restart does not run into "
        "the memory of a previous instance that is still being torn down", modes=ENGINE,
        type=gpu_list, metavar="LIST"))
    nvidia_smi: str | None = field(default=None, metadata=opt(
        "nvidia-smi to run for --gpus (default: search PATH); when it is absent the check "
        "is skipped with a log line (no NVIDIA driver), when it fails the start is refused",
        modes=ENGINE, metavar="PATH"))
    gpu_wait: float = seconds(600.0, modes=ENGINE, config=True, help=(
        "with --gpus: while a compute process holds one of them, wait (with progress) up "
        f"to S seconds, then exit {Exit.REFUSED:d} so the process manager retries; never "
        "counted as a failed start (default: %(default)g)"))
    jit_cache: str | None = field(default=None, metadata=opt(
        "JIT cache directory shared with other engines; while DIR/.pdsvc/warm-KEY is "
        "missing, take DIR/.pdsvc/compile.lock and hold it until healthy, because concurrent "
        "cold compiles into one cache race; warm engines take no lock", modes=ENGINE,
        metavar="DIR"))
    jit_key: str | None = field(default=None, metadata=opt(
        "name of this engine's warm marker (required with --jit-cache); include anything "
        "that invalidates the cache, e.g. the SGLang version", modes=ENGINE, metavar="KEY"))
    # ------------------------------------------------------------ engine: router membership
    router: list[str] = urls(
        "a router's base URL (its /workers API); repeatable: the engine joins every router "
        "of the deployment", modes=ENGINE, group=MEMBERSHIP)
    role: str | None = field(default=None, metadata=opt(
        "the worker type to register as", modes=ENGINE, group=MEMBERSHIP,
        choices=("prefill", "decode")))
    advertise: str | None = field(default=None, metadata=opt(
        "this engine's URL as the router reaches it (default: the base of --health-url)",
        modes=ENGINE, type=http_url, metavar="URL", group=MEMBERSHIP))
    bootstrap_port: int | None = field(default=None, metadata=opt(
        "prefill: the KV bootstrap port the router hands to decodes", modes=ENGINE,
        type=positive_int, metavar="PORT", group=MEMBERSHIP))
    control_plane_key: str | None = field(default=None, metadata=opt(
        "file holding the router's control-plane key, or credential:NAME for "
        "$CREDENTIALS_DIRECTORY/NAME (systemd LoadCredential=); never logged", modes=ENGINE,
        metavar="SPEC", group=MEMBERSHIP))
    membership_interval: float = seconds(2.0, modes=ENGINE, group=MEMBERSHIP, help=(
        "seconds between membership checks (default: %(default)g)"))
    # ------------------------------------------------------------ engine: the pair canary
    pair: list[list[str]] = field(default_factory=list, metadata=opt(
        "a prefill x decode pair this engine is part of (repeatable)", modes=ENGINE,
        metavar=("PREFILL_URL", "BOOTSTRAP_PORT", "DECODE_URL"), group=CANARY, nargs=3,
        action="append"))
    follower: list[str] = field(default_factory=list, metadata=opt(
        "a decode of these pairs that restarts whenever its prefill does (PartOf= or "
        "--restart-with): its prefill heals their pair, whichever side is stale, and both "
        "come back fresh at once (repeatable)", modes=ENGINE, metavar="DECODE_URL",
        group=CANARY, action="append"))
    sibling: list[str] = field(default_factory=list, metadata=opt(
        "another engine of this role (repeatable): a heal waits until the router lists one "
        "of them, so that another pair serves meanwhile, and engines of one role heal one at "
        "a time", modes=ENGINE, metavar="URL", group=CANARY, action="append"))
    heal_turn: int = field(default=0, metadata=opt(
        f"this engine's place among its role: a heal waits N x {HEAL_STAGGER_S:g} s after "
        "the verdict, then looks at the router again, so that two engines that find the same "
        "peer stale at once do not both leave (default: %(default)s)", modes=ENGINE,
        type=whole_number, metavar="N", group=CANARY))
    canary_interval: float = seconds(30.0, modes=ENGINE, group=CANARY, config=True, help=(
        "seconds between canary rounds while they are good; a round also runs once ready, "
        "whenever a peer's port opens again, and every second after a bad one "
        "(default: %(default)g)"))
    canary_failures: int = field(default=3, metadata=opt(
        "failed rounds in a row, both engines healthy, before the stale side restarts "
        "itself (default: %(default)s)", modes=ENGINE, type=positive_int, metavar="N",
        group=CANARY, config=True))
    canary_timeout: float = seconds(60.0, modes=ENGINE, group=CANARY, config=True, help=(
        "one canary generation's timeout (default: %(default)g)"))
    canary_heals: int = field(default=2, metadata=opt(
        "at most N heals in a row (within an hour) that do not bring a pair back; then one "
        "every 5 minutes, with the reason in the status (0: never heal, only report); a heal "
        "after which a pair serves again is forgotten, and a stop of the unit clears the "
        "count (default: %(default)s)", modes=ENGINE, type=whole_number, metavar="N",
        group=CANARY, config=True))
    restart_all: str = field(default="", metadata=opt(
        "the command that restarts every engine of the deployment together (e.g. systemctl "
        "restart NAME-pd.target), named when a heal cascade comes back within an hour of the "
        "runtimes' own cure (cascade.py; needs --state-dir and --deployment)", modes=ENGINE,
        metavar="CMD", group=CANARY))
    fleet_listen: str | None = field(default=None, metadata=opt(
        "serve this host's heals and cure marker to the deployment's other engine hosts on "
        "ADDR:PORT, for holders of --control-plane-key; every engine runtime of the host "
        "binds the same port (SO_REUSEPORT), fleet.py", modes=ENGINE, type=host_port,
        metavar="ADDR:PORT", group=CANARY))
    fleet: list[str] = field(default_factory=list, metadata=opt(
        "another engine host's --fleet-listen address (repeatable): its heals and cures count "
        "in this host's judgment of a heal cascade (cascade.py)", modes=ENGINE,
        type=host_port, metavar="ADDR:PORT", group=CANARY, action="append"))
    # ------------------------------------------------------------ router
    readiness_url: str = field(default="", metadata=opt(
        "the router's /readiness: 503 until a prefill and a decode worker are healthy",
        modes=ROUTER, type=http_url, metavar="URL", required=True))
    generate_url: str = field(default="", metadata=opt(
        "the router's /generate; one 1-token generation must return 200 before READY=1, "
        "because /readiness turns 200 before a prefill/decode pair can serve", modes=ROUTER,
        type=http_url, metavar="URL", required=True))
    liveness_url: str | None = field(default=None, metadata=opt(
        "probed every --liveness-interval once ready (default: /liveness next to "
        "--readiness-url); liveness, not readiness, so engine restarts do not kill the router",
        modes=ROUTER, type=http_url, metavar="URL"))
    api_key_env: str | None = field(default=None, metadata=opt(
        "environment variable holding the router's --api-key; sent as 'Authorization: "
        "Bearer' with the probe generation (the key itself never goes on a command line)",
        modes=ROUTER, metavar="VAR"))
    generate_timeout: float = seconds(60.0, modes=ROUTER, help=(
        "timeout of the probe generation; the first PD request may set up the KV transfer "
        "connection, which can take tens of seconds (default: %(default)g)"))
    engine: list[str] = field(default_factory=list, metadata=opt(
        "an engine of this host (its runtime's --name, sharing --state-dir): when it gave "
        "up during this start, stop waiting for a generation through it and send READY=1 with "
        "the reason in the status, so that the start ends and the target's gate names it "
        "(repeatable)", modes=ROUTER, metavar="NAME", action="append"))

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> Options:
        """The parsed command line as Options (a mode's own fields; the rest default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})


def fields_of(mode: str) -> list[dataclasses.Field[Any]]:
    """The option fields ``mode`` takes, in their order."""
    return [f for f in dataclasses.fields(Options) if mode in f.metadata.get("modes", ())]


def default_of(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def add_options(parser: argparse.ArgumentParser, mode: str) -> None:
    """Add ``mode``'s options to ``parser``, each with its default from Options."""
    groups: dict[str, Any] = {}
    for f in fields_of(mode):
        meta = f.metadata
        target: Any = parser
        if meta["group"]:
            title, description = meta["group"]
            if title not in groups:
                groups[title] = parser.add_argument_group(title, description)
            target = groups[title]
        kwargs = dict(meta["argparse"])
        for key in ("type", "metavar"):
            if meta[key] is not None:
                kwargs[key] = meta[key]
        if not kwargs.get("required"):
            kwargs["default"] = default_of(f)
        target.add_argument("--" + f.name.replace("_", "-"), help=meta["help"], **kwargs)
