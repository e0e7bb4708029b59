"""systemd as pdsvc reads it (`systemctl show`) and acts through it (`systemctl restart`).
The commands run through a Runner: `pdsvc apply` passes its Host (tests pass a fake), `pdsvc
status` the local `Commands`. Reading never raises: a systemctl that cannot be run or asked
gives a ServiceState whose error says why."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pdsvc.status.managers.base import Runner, ServiceState

SYSTEMCTL_TIMEOUT = 5.0
#: The exit statuses `Commands` answers with when the command did not run to its end (a
#: shell's: 127 not run, 124 timed out); the output then says why, in words.
NOT_RUN, TIMED_OUT = 127, 124

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


class Commands:
    """Runs a reading command here (stdin closed, undecodable bytes replaced); a command that
    cannot run or times out answers NOT_RUN or TIMED_OUT with why, in words."""

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            return NOT_RUN, f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            return TIMED_OUT, f"{Path(argv[0]).name} {argv[1]} timed out after {timeout:g}s"
        except OSError as e:
            return NOT_RUN, f"{argv[0]}: {e.strerror or e}"
        return proc.returncode, proc.stdout + proc.stderr


class Systemd:
    """systemctl on this host (one `systemctl show` per unit and question)."""

    name = "systemd"

    def __init__(
        self,
        runner: Runner | None = None,
        systemctl: str = "systemctl",
        *,
        timeout: float = SYSTEMCTL_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner: Runner = runner or Commands()
        self.systemctl = systemctl
        self.timeout = timeout  # per `systemctl show`
        self.clock = clock  # CLOCK_MONOTONIC, the clock of systemd's *Monotonic timestamps

    def _show(self, unit: str, properties: tuple[str, ...]) -> tuple[int, str]:
        return self.runner.run([self.systemctl, "show", unit, "--no-pager", "-p",
                                ",".join(properties)], self.timeout)

    def state(self, unit: str) -> ServiceState:
        rc, out = self._show(unit, UNIT_PROPERTIES)
        props = parse_show(out)
        if rc in (NOT_RUN, TIMED_OUT):
            return ServiceState(unit, "unknown", error=out.strip())
        if rc != 0 or "ActiveState" not in props:
            # what systemctl said on stderr: the lines that are no property it was asked for
            lines = [ln.strip() for ln in out.splitlines()
                     if ln.strip() and ln.partition("=")[0] not in UNIT_PROPERTIES]
            why = lines[-1] if lines else f"exit status {rc}"
            return ServiceState(unit, "unknown", error=f"systemctl: {why}")
        return state_from_show(unit, props, now_monotonic=self.clock())

    def invocation(self, unit: str) -> str:
        """systemd's InvocationID: a new one at every start (systemd.exec(5))."""
        return parse_show(self._show(unit, ("InvocationID",))[1]).get("InvocationID", "")

    def act(self, verb: str, units: list[str], timeout: float) -> tuple[int, str]:
        """`systemctl restart|start|reload UNITS` (restart: stop, then start with the new unit
        file, which install.sh's daemon-reload made the loaded one; reload: the unit's
        ExecReload=, the front's HAProxy)."""
        command = verb if verb in ("start", "reload") else "restart"
        rc, out = self.runner.run([self.systemctl, command, *units], timeout)
        return rc, out.strip()

    def look(self, unit: str) -> str:
        return f"systemctl status {unit}; journalctl -u {unit}"

    def tail(self, unit: str, lines: int = 50) -> list[str]:
        rc, out = self.runner.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager",
                                   "-o", "cat"], self.timeout)
        return out.splitlines() if rc == 0 else []


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
