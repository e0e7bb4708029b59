"""The runtime's command line: modes, options, help."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .options import Options, add_options, http_url, positive_float


def _couple(text: str) -> tuple[str, str]:
    """NAME=VALUE (DEPENDENT=TRIGGER, PROGRAM=URL): split at the first `=`."""
    dependent, _, trigger = text.partition("=")
    if not dependent or not trigger:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return dependent, trigger


DESCRIPTION = """\
Run one SGLang engine or sglang-router as the main process of a systemd unit
(Type=notify, NotifyAccess=main, WatchdogSec=). SGLang does not speak sd_notify and
systemd has no HTTP liveness check, so this sends READY=1, STATUS= and WATCHDOG=1 on
the service's behalf, gated on HTTP probes. Modes:

  engine         GPU idle check, cold JIT cache serialisation, READY=1 once /health is 200
  router         READY=1 once /readiness is 200 and one real generation returned 200
  eventlistener  (supervisord) restart decode whenever prefill (re)starts
  launch         run a router launcher with the control-plane key added in-process
  leave          take an engine out of every router after its runtime ended (ExecStopPost=)
  front          drain a router out of HAProxy's rotation, or put it back (router.replicas)

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
  N        the child exited on its own with status N (death by signal S: 128+S; 0: see 70)
  1        refused to start: a GPU of the unit stayed busy for --gpu-wait, nvidia-smi failed,
           or the JIT cache directory cannot be used (Restart= retries after RestartSec=)
  2        usage error (also: the control-plane key cannot be read)
  70       the child ended on its own with status 0, no stop asked for (a server never
           should): a crash, or a failed start, restarted like one
  71       a duty of its own that cannot go on raised (the watch of the child's exit): the
           engine was stopped, and the manager restarts the unit (duties.py)
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
    """The runtime's parser and each mode's: engine and router from options.Options."""
    parser = argparse.ArgumentParser(
        prog="runtime",
        usage="%(prog)s {engine,router,eventlistener,launch,leave,front} [options] "
              "[-- CMD [ARGS...]]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modes = parser.add_subparsers(
        dest="mode", metavar="{engine,router,eventlistener,launch,leave,front}", required=True
    )
    supervised = {}
    for mode, usage, help_line, description in SUPERVISED:
        sub = modes.add_parser(mode, prog=f"runtime {mode}", epilog=EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               usage=usage, help=help_line, description=description)
        add_options(sub, mode)
        supervised[mode] = sub
    return parser, {**supervised, "eventlistener": add_eventlistener(modes),
                    "launch": add_launch(modes), "leave": add_leave(modes),
                    "front": add_front(modes)}


#: the supervising modes: (mode, usage, --help line, description); their options: Options
SUPERVISED = (
    ("engine", "%(prog)s --name NAME --health-url URL [options] -- CMD [ARGS...]",
     "supervise one SGLang server (prefill or decode)",
     "Supervise one SGLang server: GPU idle check, cold-JIT serialisation,\n"
     "READY=1 once /health is 200, WATCHDOG=1 while /health stays 200."),
    ("router", "%(prog)s --name NAME --readiness-url URL --generate-url URL [options] "
     "-- CMD [ARGS...]", "supervise sglang-router in PD mode",
     "Supervise sglang-router: READY=1 once /readiness is 200 and one real generation\n"
     "through the router returned 200; WATCHDOG=1 while /liveness stays 200."),
)


def add_launch(modes: Any) -> argparse.ArgumentParser:
    launcher: argparse.ArgumentParser = modes.add_parser(
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
    return launcher


def add_front(modes: Any) -> argparse.ArgumentParser:
    front: argparse.ArgumentParser = modes.add_parser(
        "front",
        prog="runtime front",
        usage="%(prog)s {drain,ready} --socket PATH --backend NAME --server NAME [--timeout S]",
        help="take a router out of HAProxy's rotation (ExecStop=) or put it back "
             "(ExecStartPost=)",
        description=(
            "drain: no new request goes to the router; wait until those it serves are done.\n"
            "ready: back in rotation; wait until HAProxy's health check has it UP.\n"
            "Both through HAProxy's runtime API (stats socket, level admin). Exit status:\n"
            "always 0 (a router's stop or start never fails for the front)."
        ),
    )
    front.add_argument("action", choices=("drain", "ready"))
    front.add_argument("--name", required=True, help="prefix of every log line")
    front.add_argument("--socket", required=True, metavar="PATH",
                       help="HAProxy's stats socket (level admin)")
    front.add_argument("--backend", required=True, metavar="NAME")
    front.add_argument("--server", required=True, metavar="NAME", help="this router's server")
    front.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                       help="the longest wait (default: %(default)g)")
    return front


def add_leave(modes: Any) -> argparse.ArgumentParser:
    leave: argparse.ArgumentParser = modes.add_parser(
        "leave",
        prog="runtime leave",
        usage="%(prog)s --name NAME --router URL --advertise URL --control-plane-key SPEC",
        help="take an engine out of the router after its runtime ended (ExecStopPost=)",
        description=(
            "Delete the engine's entry from the router, if it is still there: run after any\n"
            "stop of the unit, so that an engine whose runtime was killed (kill -9, OOM)\n"
            "leaves the router at once. Exit status: always 0 (a stop never fails for it)."
        ),
    )
    leave.add_argument("--name", required=True, help="prefix of every log line")
    leave.add_argument("--router", required=True, type=http_url, metavar="URL",
                       action="append", help="a router it may be listed by (repeatable)")
    leave.add_argument("--advertise", required=True, type=http_url, metavar="URL",
                       help="the engine's URL as the router lists it")
    leave.add_argument("--control-plane-key", metavar="SPEC",
                       help="a file, or credential:NAME ($CREDENTIALS_DIRECTORY/NAME)")
    return leave


def add_eventlistener(modes: Any) -> argparse.ArgumentParser:
    listener: argparse.ArgumentParser = modes.add_parser(
        "eventlistener",
        prog="runtime eventlistener",
        epilog=EVENTLISTENER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s --name NAME [--restart-with DEPENDENT=TRIGGER ...] "
              "[--leave PROGRAM=URL ... --router URL ... --control-plane-key FILE]",
        help="supervisord event listener: restart decode whenever prefill (re)starts; take an "
             "engine whose runtime died out of the routers",
        description=(
            "A supervisord [eventlistener:x]. PROCESS_STATE_STARTING: whenever TRIGGER\n"
            "(re)starts, restart DEPENDENT through supervisord's XML-RPC interface, unless\n"
            "DEPENDENT was started with or after it (as at boot): systemd's PartOf=.\n"
            "PROCESS_STATE_EXITED: when PROGRAM exits without a stop asked for (kill -9 of\n"
            "its runtime, the OOM killer), delete URL from every --router: the units'\n"
            "ExecStopPost= (`runtime leave`)."
        ),
    )
    listener.add_argument("--name", required=True, help="prefix of every log line")
    listener.add_argument(
        "--restart-with",
        type=_couple,
        action="append",
        metavar="DEPENDENT=TRIGGER",
        help="supervisorctl names (program alone in its group, or group:program), e.g. "
        "dsv4-decode=dsv4-prefill (NIXL: a restarted prefill does not serve with the old "
        "decode, sglang #33789)",
    )
    listener.add_argument("--leave", type=_couple, action="append", metavar="PROGRAM=URL",
                          help="an engine program and its URL as the routers list it")
    listener.add_argument("--router", type=http_url, action="append", metavar="URL",
                          help="a router the engines register with (repeatable)")
    listener.add_argument("--control-plane-key", metavar="FILE",
                          help="the routers' control-plane key (a file; never logged)")
    listener.add_argument(
        "--server-url",
        metavar="URL",
        help="supervisord's RPC URL (default: $SUPERVISOR_SERVER_URL, which supervisord sets)",
    )
    return listener


def parse_args(argv: Sequence[str]) -> tuple[Any, list[str]]:
    """Split at the first ``--`` (the child's own options must not reach argparse); the
    supervising modes' options as ``Options``, the others' as argparse's Namespace."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1 :]
    else:
        options, command = argv, []
    parser, modes = build_parser()
    args = parser.parse_args(options)
    mode = modes[args.mode]
    if args.mode in ("eventlistener", "launch", "leave", "front"):
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
    return Options.from_namespace(args), command


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
    if args.mode == "leave":
        from .leaving import leave_after_end
        from .notify import Log

        return leave_after_end(args.router, args.advertise, args.control_plane_key,
                               Log(args.name))
    if args.mode == "front":
        from .front import run_front
        from .notify import Log

        return run_front(args.action, args.socket, args.backend, args.server, args.timeout,
                         Log(args.name))
    from .duties import Duties
    from .lifecycle import run
    from .metrics import textfile
    from .notify import Log
    from .statefile import Kind, state_path

    # one record of the duties that failed, for the unit's every thread (duties.py)
    duties = Duties(state_path(args.state_dir, args.name, Kind.DUTIES) if args.state_dir
                    else None, Log(args.name))
    with textfile(args, duties):
        return run(args, command, duties)
