"""What the service manager says about each unit: systemd (`systemctl show`) or supervisord
(its XML-RPC interface over the control socket), in one shape (ServiceState, systemd's words).
`pdsvc status` asks it; nothing here raises when the manager cannot be reached: the state then
says why."""

from __future__ import annotations

import subprocess
import time
import xmlrpc.client
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import click

from pdsvc.plan.build import Plan

SYSTEMCTL_TIMEOUT = 5.0
RPC_TIMEOUT = 5.0  # seconds per XML-RPC call to supervisord

#: What `systemctl show` is asked for. KEY=VALUE lines, not `--value`: with --value the values
#: come in the unit's own property order, not the order asked for, and empty ones vanish.
UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "StatusText",
    "ActiveEnterTimestamp",
    "ActiveEnterTimestampMonotonic",
    "StateChangeTimestamp",
    "StateChangeTimestampMonotonic",
)



# --------------------------------------------------------------------------- service manager


@dataclass(frozen=True)
class ServiceState:
    """One unit as its service manager sees it, in systemd's words.

    SupervisordBackend maps supervisord's states onto these: RUNNING -> active, STARTING ->
    activating, STOPPING -> deactivating, STOPPED -> inactive, BACKOFF/FATAL -> failed, EXITED
    -> inactive with exit status 0 (a clean stop), else failed; `sub` is supervisord's word.
    """

    unit: str
    state: str  # active, activating, deactivating, reloading, inactive, failed; unknown: see error
    sub: str = ""  # running, start, auto-restart, dead, …
    result: str = ""  # success, exit-code, signal, watchdog, start-limit-hit, …
    since: str = ""  # when it entered this state, as the manager prints it
    since_secs: float | None = None  # how long ago that was
    restarts: int | None = None  # automatic restarts (NRestarts); None when the unit has none
    status_text: str = ""  # the unit's own status line (sd_notify STATUS=)
    loaded: bool = True  # False: the manager does not know the unit (not installed)
    error: str | None = None  # the manager could not be asked: why

    @property
    def active(self) -> bool:
        return self.state == "active"

    def describe(self) -> str:
        """As `systemctl status` says it: `active (running)`, `failed (Result: exit-code)`."""
        if self.error:
            return "unknown"
        if not self.loaded:
            return "not installed"
        if self.state == "failed" and self.result not in ("", "success"):
            return f"failed (Result: {self.result})"
        return f"{self.state} ({self.sub})" if self.sub and self.sub != self.state else self.state


class ServiceBackend(Protocol):
    """What status needs from a service manager."""

    name: str

    def state(self, unit: str) -> ServiceState: ...


class SystemdBackend:
    """Asks `systemctl show UNIT -p …` (one call per unit); never raises for a manager that
    cannot be reached: the ServiceState carries the error instead."""

    name = "systemd"

    def __init__(
        self,
        systemctl: str = "systemctl",
        *,
        timeout: float = SYSTEMCTL_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.systemctl = systemctl
        self.timeout = timeout
        self.clock = clock  # CLOCK_MONOTONIC, the clock of systemd's *Monotonic timestamps

    def state(self, unit: str) -> ServiceState:
        argv = [self.systemctl, "show", unit, "--no-pager", "-p", ",".join(UNIT_PROPERTIES)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                  timeout=self.timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return ServiceState(unit, "unknown", error=f"{self.systemctl}: not found")
        except subprocess.TimeoutExpired:
            return ServiceState(unit, "unknown",
                                error=f"systemctl show timed out after {self.timeout:g}s")
        except OSError as e:
            return ServiceState(unit, "unknown", error=f"{self.systemctl}: {e.strerror or e}")
        props = parse_show(proc.stdout)
        if proc.returncode != 0 or "ActiveState" not in props:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            return ServiceState(unit, "unknown", error=f"systemctl: {why}")
        return state_from_show(unit, props, now_monotonic=self.clock())


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show` output (KEY=VALUE lines) as a dict."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key] = value
    return props


def state_from_show(unit: str, props: Mapping[str, str], *, now_monotonic: float) -> ServiceState:
    """A ServiceState from `systemctl show` properties. The age comes from the *Monotonic
    timestamp (µs of CLOCK_MONOTONIC, 0 = never): no time zone or locale to parse."""
    state = props.get("ActiveState", "") or "unknown"
    # active: since it came up (a restart resets it); otherwise: since its last state change
    prefix = "ActiveEnter" if state == "active" else "StateChange"
    since_secs = None
    mono = props.get(f"{prefix}TimestampMonotonic", "")
    if mono.isdigit() and int(mono) > 0:
        since_secs = max(0.0, now_monotonic - int(mono) / 1e6)
    restarts = props.get("NRestarts", "")
    return ServiceState(
        unit=unit,
        state=state,
        sub=props.get("SubState", ""),
        result=props.get("Result", ""),
        since=props.get(f"{prefix}Timestamp", "") if since_secs is not None else "",
        since_secs=since_secs,
        restarts=int(restarts) if restarts.isdigit() else None,
        status_text=props.get("StatusText", ""),
        loaded=props.get("LoadState", "loaded") != "not-found",
    )


class SupervisordBackend:
    """Asks the supervisord of the supervisord bundle over its control socket (XML-RPC on a
    unix socket, as supervisorctl does): ``supervisor.getProcessInfo(group:program)`` per
    program, one connection per call (a ServerProxy keeps its connection: not for threads).

    The units of the plan map to programs of the bundle (``units``: {unit: supervisorctl
    name}; each program is a group of its own, named as the program). The plan's target has no
    counterpart in supervisord, so its row is the supervisord that runs the bundle and how many
    of the plan's programs run (``target``; the row is named ``row``, NAME-supervisord). Never
    raises for a supervisord that cannot be reached: the ServiceState carries the error.
    """

    name = "supervisord"

    def __init__(
        self,
        socket_path: str,
        units: Mapping[str, str],
        *,
        target: str = "",
        row: str = "supervisord",
        timeout: float = RPC_TIMEOUT,
    ) -> None:
        self.socket_path = socket_path
        self.units = dict(units)
        self.target = target
        self.row = row
        self.timeout = timeout

    @classmethod
    def for_plan(cls, plan: Plan, socket_path: str | None = None, *,
                 timeout: float = RPC_TIMEOUT) -> SupervisordBackend:
        """The bundle's socket ({supervisord.run_dir}/{name}-supervisord.sock) unless
        ``socket_path`` is given, and the bundle's program names."""
        # the renderer imports jinja2: only when this backend is used
        from pdsvc.render.supervisord import program_names, supervisord_name

        return cls(socket_path or plan.supervisord.control_socket, program_names(plan),
                   target=plan.target, row=supervisord_name(plan), timeout=timeout)

    def _api(self) -> Any:
        from pdsvc.ship.runtime.listener import supervisor_rpc  # its AF_UNIX transport; stdlib only

        return supervisor_rpc(f"unix://{self.socket_path}", self.timeout).supervisor

    def state(self, unit: str) -> ServiceState:
        if self.target and unit == self.target:
            return self.supervisord_state()
        name = self.units.get(unit, unit)
        try:
            info = self._api().getProcessInfo(name)
        except xmlrpc.client.Fault as e:
            if e.faultCode == BAD_NAME:
                return ServiceState(name, "inactive", loaded=False,
                                    status_text="no such program in supervisord's config")
            return ServiceState(name, "unknown", error=f"supervisord: {e.faultString}")
        except Exception as e:  # a status command reports; it never crashes
            return ServiceState(name, "unknown", error=self._why(e))
        if not isinstance(info, dict):
            return ServiceState(name, "unknown",
                                error=f"supervisord: unexpected answer {info!r:.60}")
        return state_from_process_info(name, info)

    def supervisord_state(self) -> ServiceState:
        """The row in place of the target: supervisord itself (RUNNING -> active) and how many
        of the plan's programs run; not installed when supervisord runs none of them."""
        row = self.row
        try:
            api = self._api()
            daemon = api.getState()
            pid = api.getPID()
            infos = api.getAllProcessInfo()
        except xmlrpc.client.Fault as e:
            return ServiceState(row, "unknown", error=f"supervisord: {e.faultString}")
        except Exception as e:
            return ServiceState(row, "unknown", error=self._why(e))
        ours = set(self.units.values())
        try:
            statename = str(daemon["statename"])
            # supervisorctl's name of each: GROUP:NAME, or NAME alone in its own group
            # (runtime/listener.py namespec; supervisor options.py split_namespec)
            mine = [i for i in infos if (i["name"] if i["group"] == i["name"]
                                         else f"{i['group']}:{i['name']}") in ours]
        except (TypeError, KeyError, AttributeError) as e:
            return ServiceState(row, "unknown", error=f"supervisord: unexpected answer ({e})")
        state = SUPERVISORD_STATES.get(statename, "unknown")
        if not mine:
            return ServiceState(row, state, sub=statename.lower(), loaded=False,
                                status_text=f"supervisord pid {pid} runs none of this "
                                "deployment's programs")
        running = sum(i.get("statename") == "RUNNING" for i in mine)
        return ServiceState(
            row, state, sub=statename.lower(),
            status_text=f"supervisord pid {pid}: {running} of {len(ours)} programs running",
        )

    def _why(self, e: BaseException) -> str:
        path = self.socket_path
        if isinstance(e, FileNotFoundError):
            why = f"{path}: no such socket — is supervisord running?"
        elif isinstance(e, ConnectionRefusedError):
            why = f"{path}: connection refused — supervisord is not running"
        elif isinstance(e, PermissionError):
            why = f"{path}: permission denied — ask as the user that runs supervisord"
        elif isinstance(e, TimeoutError):
            why = f"{path}: no answer within {self.timeout:g}s"
        elif isinstance(e, xmlrpc.client.ProtocolError):
            why = f"{path}: HTTP {e.errcode} {e.errmsg}"
        elif isinstance(e, OSError) and e.strerror:
            why = f"{path}: {e.strerror}"
        else:
            why = f"{path}: {e or type(e).__name__}"
        return f"supervisord: {why}"


#: supervisor.xmlrpc.Faults.BAD_NAME: no such process (or group).
BAD_NAME = 10

#: supervisord's process states (supervisor/states.py) in systemd's words; EXITED is decided by
#: its exit status (state_from_process_info).
SUPERVISOR_STATES = {
    "RUNNING": "active",
    "STARTING": "activating",
    "STOPPING": "deactivating",
    "STOPPED": "inactive",
    "EXITED": "inactive",
    "BACKOFF": "failed",
    "FATAL": "failed",
}
#: supervisord's own states (getState) in systemd's words.
SUPERVISORD_STATES = {
    "RUNNING": "active",
    "RESTARTING": "reloading",
    "SHUTDOWN": "deactivating",
    "FATAL": "failed",
}


def state_from_process_info(name: str, info: Mapping[str, Any]) -> ServiceState:
    """A ServiceState from ``supervisor.getProcessInfo()``. The sub-state is supervisord's own
    word (running, fatal, backoff, …); EXITED with exit status 0 is a clean stop (inactive:
    the bundle's exitcodes=0, like Restart=on-failure), any other is failed (exit-code). The
    age uses supervisord's own ``now``: no clock of ours is compared with its timestamps.
    supervisord counts no restarts, so there are none to show."""
    statename = str(info.get("statename") or "UNKNOWN")
    state = SUPERVISOR_STATES.get(statename, "unknown")
    exitstatus = _int(info.get("exitstatus"))
    result = ""
    text = str(info.get("description") or "")
    if statename == "EXITED":
        state, result = ("inactive", "success") if exitstatus == 0 else ("failed", "exit-code")
        if exitstatus:
            text = f"{text} (exit status {exitstatus})" if text else f"exit status {exitstatus}"
    start, stop, now = _int(info.get("start")), _int(info.get("stop")), _int(info.get("now"))
    # up: since the last spawn; down: since the last exit (a spawn that failed has none)
    when = start if state in ("active", "activating", "deactivating") or stop < start else stop
    since_secs = float(max(0, now - when)) if when > 0 and now > 0 else None
    return ServiceState(
        unit=name,
        state=state,
        sub=statename.lower(),
        result=result,
        since=time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(when))
        if since_secs is not None else "",
        since_secs=since_secs,
        restarts=None,
        status_text=text,
    )


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def make_backend(plan: Plan, backend: str = "auto", *, systemctl: str = "systemctl",
                 socket_path: str | None = None) -> ServiceBackend:
    """`--backend`: auto is the manager the config's `format` renders for — or supervisord
    when a control socket is given (only supervisord has one)."""
    if backend == "auto":
        backend = "supervisord" if plan.format == "supervisord" or socket_path else "systemd"
    if backend == "supervisord":
        return SupervisordBackend.for_plan(plan, socket_path)
    if socket_path:
        raise click.UsageError("--socket is supervisord's control socket; systemd has none "
                               "(use --backend supervisord, or drop --socket)")
    return SystemdBackend(systemctl)
