"""The runtime's command line: modes, options, help."""

from __future__ import annotations

import argparse
import signal
import sys
import urllib.parse
from collections.abc import Sequence

from .endings import Exit
from .timings import HEAL_STAGGER_S


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _whole_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def _gpu_list(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(item.isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1,2,3, got {text!r}")
    gpus = [int(item) for item in items]
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"GPU listed twice in {text!r}")
    return gpus


def _couple(text: str) -> tuple[str, str]:
    dependent, _, trigger = text.partition("=")
    if not dependent or not trigger:
        raise argparse.ArgumentTypeError(f"expected DEPENDENT=TRIGGER, got {text!r}")
    return dependent, trigger


def _http_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text




DESCRIPTION = """\
Run one SGLang engine or sglang-router as the main process of a systemd unit
(Type=notify, NotifyAccess=main, WatchdogSec=). SGLang does not speak sd_notify and
systemd has no HTTP liveness check, so this sends READY=1, STATUS= and WATCHDOG=1 on
the service's behalf, gated on HTTP probes. Modes:

  engine         GPU idle check, cold JIT cache serialisation, READY=1 once /health is 200
  router         READY=1 once /readiness is 200 and one real generation returned 200
  eventlistener  (supervisord) restart decode whenever prefill (re)starts
  launch         run a router launcher with the control-plane key added in-process

Without systemd (supervisord), --wait-for, --watchdog-secs, --kill-tree and --stop-timeout
take over what the units get from After=, WatchdogSec= and KillMode=mixed.
"""

EPILOG = """\
Everything after "--" is the command to supervise, run as a child with the same stdout and
stderr (so its lines reach the journal) and without NOTIFY_SOCKET.

Exit status:
  0        after a stop (SIGTERM/SIGINT/SIGHUP) when the child then exits 0, by SIGTERM or
           by SIGKILL (SGLang kills its own process tree with SIGKILL: 137), or by the
           forwarded signal; also when a stop arrives while waiting for the JIT lock
  N        the child exited on its own with status N (death by signal S: 128+S)
  1        refused to start: a GPU of the unit stayed busy for --gpu-wait, nvidia-smi failed,
           or the JIT cache directory cannot be used (Restart= retries after RestartSec=)
  2        usage error (also: the control-plane key cannot be read)
  75       stopped the engine to restart it: a --restart-with peer restarted, or the pair
           canary found this engine the stale side of a broken pair
  78       gave up: --start-attempts starts in a row ended before the service was healthy
           (the units list 78 in RestartPreventExitStatus=); `systemctl start` tries afresh
  124      --watchdog-secs ran out without a good liveness probe: the child was killed
  126/127  the command could not be executed / was not found
"""


EVENTLISTENER_EPILOG = """\
supervisord speaks to it on stdin/stdout (the event listener protocol), so it logs to stderr.
Exit status: 0 when supervisord closes its stdin, 2 on a usage error.
"""


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="runtime",
        usage="%(prog)s {engine,router,eventlistener,launch} [options] [-- CMD [ARGS...]]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modes = parser.add_subparsers(
        dest="mode", metavar="{engine,router,eventlistener,launch}", required=True
    )

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--name",
        required=True,
        help="unit name used as the prefix of every log line and in STATUS= (e.g. dsv4-prefill)",
    )
    common.add_argument(
        "--liveness-interval",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="seconds between liveness probes once ready; each 200 sends WATCHDOG=1, so keep it "
        "well below the unit's WatchdogSec= (default: %(default)g)",
    )
    common.add_argument(
        "--progress-every",
        type=_positive_float,
        default=15.0,
        metavar="S",
        help="seconds between progress lines while waiting (for health, the JIT lock, or the "
        "child's exit); keeps long starts visible without flooding the journal "
        "(default: %(default)g)",
    )
    common.add_argument(
        "--poll-interval",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="seconds between start-phase probes; short so READY=1 follows health closely "
        "(default: %(default)g)",
    )
    common.add_argument(
        "--wait-for",
        type=_http_url,
        action="append",
        default=[],
        metavar="URL",
        help="start the command only once URL answers 200 (repeatable: all of them); for "
        "managers that order spawns but not readiness (supervisord): the router waits for both "
        "engines' /health, as After= on the Type=notify units makes it under systemd",
    )
    common.add_argument(
        "--watchdog-secs",
        type=_positive_float,
        metavar="S",
        help="without systemd's watchdog: once no liveness probe has succeeded for S seconds "
        "(pass the units' WatchdogSec=), SIGKILL the command and exit 124 so the process "
        "manager restarts it; probes are cut short so that S is the bound",
    )
    common.add_argument(
        "--kill-tree",
        action="store_true",
        help="for managers without cgroups: become a child subreaper (so descendants that leave "
        "the command's process group or session stay ours) and SIGKILL every descendant left "
        "once the command is gone, as KillMode=mixed does with a unit's cgroup",
    )
    common.add_argument(
        "--min-uptime",
        type=_positive_float,
        metavar="S",
        help="exit with a give-up (78) no sooner than S seconds after this process started: "
        "supervisord honours exitcodes= only for a process that ran startsecs (pass them), "
        "and retries one that ended sooner as a failed spawn",
    )
    common.add_argument(
        "--prefix-output",
        action="store_true",
        help="prefix every line of the command's stdout and stderr with 'NAME: ', as our own "
        "lines are, for a log that mixes programs (supervisord's stdout in a container; "
        "journald keeps units apart by itself)",
    )
    common.add_argument(
        "--stop-timeout",
        type=_positive_float,
        metavar="S",
        help="after a stop signal, SIGKILL the command (its tree with --kill-tree) if it has "
        "not exited within S seconds (default: wait; systemd's TimeoutStopSec= is the bound)",
    )

    common.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the restart policy keeps how the last run ended (NAME.restart.json) and the "
        "pair canary its results (NAME.canary.json), for the next run and `pdsvc status`; the "
        "unit's StateDirectory= (default: keep nothing, every start is a first start)",
    )
    common.add_argument(
        "--metrics-dir", metavar="DIR",
        help="write this unit's state as Prometheus text (NAME.prom, atomically) into DIR, for "
        "node_exporter's textfile collector (metrics.py; needs --state-dir)",
    )
    common.add_argument(
        "--deployment", metavar="NAME", default="",
        help="the deployment (the config's name): the label of those series, and the name of "
        "the deployment-wide heal marker in --state-dir (NAME.heal-all.json, cascade.py)",
    )
    common.add_argument(
        "--start-timeout", type=_positive_float, metavar="S",
        help="a start not healthy within S seconds is stopped and counts as a failed start "
        "(see --start-attempts); the units pass lifecycle.start_timeout_secs and give systemd's "
        "TimeoutStartSec= a stop's time more, so this fires first (default: no deadline)",
    )
    common.add_argument(
        "--restart-delay", type=_positive_float, default=1.0, metavar="S",
        help="the unit's RestartSec=: a crash's restart waits S, the next crash in a row 2*S, "
        "then 4*S... (the extra wait is ours: systemd 252 has no RestartSteps=) "
        "(default: %(default)g)",
    )
    common.add_argument(
        "--restart-max-delay", type=_positive_float, default=300.0, metavar="S",
        help="longest wait before a restart after crashes in a row (default: %(default)g)",
    )
    common.add_argument(
        "--restart-reset", type=_positive_float, default=600.0, metavar="S",
        help="serving this long in a row forgives earlier crashes (default: %(default)g)",
    )
    common.add_argument(
        "--start-attempts", type=_positive_int, default=3, metavar="N",
        help="starts in a row that end before the service is healthy (a missing model, a "
        f"rejected flag, OOM at load) before giving up: exit {Exit.GAVE_UP}, which the unit "
        "does not restart (RestartPreventExitStatus=); stops never count (default: %(default)s)",
    )

    engine = modes.add_parser(
        "engine",
        prog="runtime engine",
        parents=[common],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME --health-url URL [options] -- CMD [ARGS...]",
        help="supervise one SGLang server (prefill or decode)",
        description=(
            "Supervise one SGLang server: GPU idle check, cold-JIT serialisation,\n"
            "READY=1 once /health is 200, WATCHDOG=1 while /health stays 200."
        ),
    )
    engine.add_argument(
        "--health-url",
        type=_http_url,
        required=True,
        metavar="URL",
        help="the engine's /health; SGLang answers 503 until weights are loaded and warmup is "
        "done, so 200 means ready; also the liveness probe",
    )
    engine.add_argument(
        "--liveness-timeout",
        type=_positive_float,
        default=20.0,
        metavar="S",
        help="timeout of one liveness probe; SGLang's /health runs a 1-token generation and "
        "gives up after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) (default: %(default)g)",
    )
    engine.add_argument(
        "--restart-with",
        action="append",
        default=[],
        metavar="URL",
        help="/health of a peer on another host this engine must restart with (a NIXL "
        "decode's prefill, sglang #33789; on one host systemd's PartOf= does it): once the "
        "peer is back after --peer-down-probes failed probes in a row, stop the engine and "
        f"exit {Exit.PEER} so that Restart=on-failure starts it afresh; repeatable",
    )
    engine.add_argument(
        "--peer-down-probes",
        type=int,
        default=3,
        metavar="N",
        help="failed probes in a row that make a --restart-with peer's recovery a restart "
        "(default: %(default)s; the units pass the liveness failure count)",
    )
    engine.add_argument(
        "--gpus",
        type=_gpu_list,
        metavar="LIST",
        help="nvidia-smi indices of the unit's GPUs (e.g. 0,1,2,3); before starting, refuse "
        "(exit 1) while any compute process holds one of them, so a restart does not run into "
        "the memory of a previous instance that is still being torn down",
    )
    engine.add_argument(
        "--nvidia-smi",
        metavar="PATH",
        help="nvidia-smi to run for --gpus (default: search PATH); when it is absent the check "
        "is skipped with a log line (no NVIDIA driver), when it fails the start is refused",
    )
    engine.add_argument(
        "--jit-cache",
        metavar="DIR",
        help="JIT cache directory shared with other engines; while DIR/.pdsvc/warm-KEY is "
        "missing, take DIR/.pdsvc/compile.lock and hold it until healthy, because concurrent "
        "cold compiles into one cache race; warm engines take no lock",
    )
    engine.add_argument(
        "--jit-key",
        metavar="KEY",
        help="name of this engine's warm marker (required with --jit-cache); include anything "
        "that invalidates the cache, e.g. the SGLang version",
    )

    engine.add_argument(
        "--peer-interval", type=_positive_float, default=1.0, metavar="S",
        help="seconds between probes of --restart-with peers, from the moment this engine is "
        "ready: a peer that restarts within one liveness interval is still seen go and return "
        "(default: %(default)g)",
    )
    engine.add_argument(
        "--gpu-wait", type=_positive_float, default=600.0, metavar="S",
        help="with --gpus: while a compute process holds one of them, wait (with progress) up "
        f"to S seconds, then exit {Exit.REFUSED} so the process manager retries; never counted "
        "as a failed start (default: %(default)g)",
    )
    member = engine.add_argument_group(
        "router membership", "register the engine with the router once healthy, deregister "
        "before a stop, re-register when the router lost it")
    member.add_argument("--router", type=_http_url, metavar="URL",
                        help="the router's base URL (its /workers API)")
    member.add_argument("--role", choices=("prefill", "decode"),
                        help="the worker type to register as")
    member.add_argument("--advertise", type=_http_url, metavar="URL",
                        help="this engine's URL as the router reaches it (default: the base of "
                        "--health-url)")
    member.add_argument("--bootstrap-port", type=_positive_int, metavar="PORT",
                        help="prefill: the KV bootstrap port the router hands to decodes")
    member.add_argument("--control-plane-key", metavar="SPEC",
                        help="file holding the router's control-plane key, or credential:NAME "
                        "for $CREDENTIALS_DIRECTORY/NAME (systemd LoadCredential=); never logged")
    member.add_argument("--membership-interval", type=_positive_float, default=2.0,
                        metavar="S", help="seconds between membership checks (default: "
                        "%(default)g)")
    canary = engine.add_argument_group(
        "pair canary", "a one-token PD generation through each pair, judged by content")
    canary.add_argument("--pair", nargs=3, action="append", default=[],
                        metavar=("PREFILL_URL", "BOOTSTRAP_PORT", "DECODE_URL"),
                        help="a prefill x decode pair this engine is part of (repeatable)")
    canary.add_argument("--follower", action="append", default=[], metavar="DECODE_URL",
                        help="a decode of these pairs that restarts whenever its prefill does "
                        "(PartOf= or --restart-with): its prefill heals their pair, whichever "
                        "side is stale, and both come back fresh at once (repeatable)")
    canary.add_argument("--sibling", action="append", default=[], metavar="URL",
                        help="another engine of this role (repeatable): a heal waits until the "
                        "router lists one of them, so that another pair serves meanwhile, and "
                        "engines of one role heal one at a time")
    canary.add_argument("--heal-turn", type=_whole_number, default=0, metavar="N",
                        help="this engine's place among its role: a heal waits N x "
                        f"{HEAL_STAGGER_S:g} s after the verdict, then looks at the router "
                        "again, so that two engines that find the same peer stale at once do "
                        "not both leave (default: %(default)s)")
    canary.add_argument("--canary-interval", type=_positive_float, default=30.0, metavar="S",
                        help="seconds between canary rounds while they are good; a round also "
                        "runs once ready, whenever a peer's port opens again, and every second "
                        "after a bad one (default: %(default)g)")
    canary.add_argument("--canary-failures", type=_positive_int, default=3, metavar="N",
                        help="failed rounds in a row, both engines healthy, before the stale "
                        "side restarts itself (default: %(default)s)")
    canary.add_argument("--canary-timeout", type=_positive_float, default=60.0, metavar="S",
                        help="one canary generation's timeout (default: %(default)g)")
    canary.add_argument("--canary-heals", type=_whole_number, default=2, metavar="N",
                        help="at most N heals in a row (within an hour) that do not bring a "
                        "pair back; then one every 5 minutes, with the reason in the status "
                        "(0: never heal, only report); a heal after which a pair serves again "
                        "is forgotten, and a stop of the unit clears the count (default: "
                        "%(default)s)")
    canary.add_argument("--restart-all", metavar="CMD", default="",
                        help="the command that restarts every engine of the deployment "
                        "together (e.g. systemctl restart NAME-pd.target), named when a heal "
                        "cascade comes back within an hour of the runtimes' own cure "
                        "(cascade.py; needs --state-dir and --deployment)")

    router = modes.add_parser(
        "router",
        prog="runtime router",
        parents=[common],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME --readiness-url URL --generate-url URL [options] "
        "-- CMD [ARGS...]",
        help="supervise sglang-router in PD mode",
        description=(
            "Supervise sglang-router: READY=1 once /readiness is 200 and one real generation\n"
            "through the router returned 200; WATCHDOG=1 while /liveness stays 200."
        ),
    )
    router.add_argument(
        "--readiness-url",
        type=_http_url,
        required=True,
        metavar="URL",
        help="the router's /readiness: 503 until a prefill and a decode worker are healthy",
    )
    router.add_argument(
        "--generate-url",
        type=_http_url,
        required=True,
        metavar="URL",
        help="the router's /generate; one 1-token generation must return 200 before READY=1, "
        "because /readiness turns 200 before a prefill/decode pair can serve",
    )
    router.add_argument(
        "--liveness-url",
        type=_http_url,
        metavar="URL",
        help="probed every --liveness-interval once ready (default: /liveness next to "
        "--readiness-url); liveness, not readiness, so engine restarts do not kill the router",
    )
    router.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the router's --api-key; sent as 'Authorization: "
        "Bearer' with the probe generation (the key itself never goes on a command line)",
    )
    router.add_argument(
        "--liveness-timeout",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="timeout of one liveness probe (default: %(default)g)",
    )
    router.add_argument(
        "--generate-timeout",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="timeout of the probe generation; the first PD request may set up the KV "
        "transfer connection, which can take tens of seconds (default: %(default)g)",
    )
    router.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME",
        help="an engine of this host (its runtime's --name, sharing --state-dir): when it gave "
        "up during this start, stop waiting for a generation through it and send READY=1 with "
        "the reason in the status, so that the start ends and the target's gate names it "
        "(repeatable)",
    )
    launcher = modes.add_parser(
        "launch",
        prog="runtime launch",
        usage="%(prog)s --control-plane-key SPEC MODULE [ARGS...]",
        help="run a router launcher module with the control-plane key added to its arguments",
        description=(
            "Run `python -m MODULE ARGS --control-plane-api-keys ENTRY` in this process, the\n"
            "key read from SPEC, so that it never appears on a command line (/proc/PID/cmdline)."
        ),
    )
    launcher.add_argument("--control-plane-key", required=True, metavar="SPEC",
                          help="a file, or credential:NAME ($CREDENTIALS_DIRECTORY/NAME)")
    launcher.add_argument("module", metavar="MODULE",
                          help="e.g. sglang_router.launch_router or smg.launch_router")
    launcher.add_argument("module_args", nargs=argparse.REMAINDER, metavar="ARGS")
    listener = modes.add_parser(
        "eventlistener",
        prog="runtime eventlistener",
        epilog=EVENTLISTENER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME --restart-with DEPENDENT=TRIGGER [...]",
        help="supervisord event listener: restart decode whenever prefill (re)starts",
        description=(
            "A supervisord [eventlistener:x] for events=PROCESS_STATE_STARTING: whenever\n"
            "TRIGGER (re)starts, restart DEPENDENT through supervisord's XML-RPC interface,\n"
            "unless DEPENDENT was started with or after it (as at boot). systemd's PartOf=."
        ),
    )
    listener.add_argument("--name", required=True, help="prefix of every log line")
    listener.add_argument(
        "--restart-with",
        type=_couple,
        action="append",
        required=True,
        metavar="DEPENDENT=TRIGGER",
        help="supervisorctl names (program alone in its group, or group:program), e.g. "
        "dsv4-decode=dsv4-prefill (NIXL: a restarted prefill does not serve with the old "
        "decode, sglang #33789)",
    )
    listener.add_argument(
        "--server-url",
        metavar="URL",
        help="supervisord's RPC URL (default: $SUPERVISOR_SERVER_URL, which supervisord sets)",
    )
    return parser, {"engine": engine, "router": router, "eventlistener": listener,
                    "launch": launcher}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split at the first ``--`` (the child's own options must not reach argparse)."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1 :]
    else:
        options, command = argv, []
    parser, modes = build_parser()
    args = parser.parse_args(options)
    mode = modes[args.mode]
    if args.mode in ("eventlistener", "launch"):
        if command:
            mode.error(f"{args.mode} takes no '-- CMD'")
        return args, command
    if not command:
        mode.error("missing '-- CMD [ARGS...]': the command to supervise")
    if args.mode == "engine" and bool(args.jit_cache) != bool(args.jit_key):
        mode.error("--jit-cache and --jit-key go together")
    if args.mode == "engine" and args.router and not args.role:
        mode.error("--router needs --role (prefill or decode)")
    if args.mode == "engine" and args.role == "prefill" and args.router \
            and args.bootstrap_port is None:
        mode.error("--role prefill needs --bootstrap-port")
    return args, command


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the mode; returns the exit status (see EPILOG)."""
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    if args.mode == "eventlistener":
        from .listener import run_eventlistener

        # supervisord stops it with SIGTERM while it blocks on stdin: a clean exit, not a crash
        signal.signal(signal.SIGTERM, lambda signo, frame: sys.exit(0))
        return run_eventlistener(args)
    if args.mode == "launch":
        from .launch import launch

        return launch(args.control_plane_key, args.module, args.module_args)
    from .lifecycle import run
    from .metrics import textfile

    with textfile(args):
        return run(args, command)
