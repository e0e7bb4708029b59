"""supervisord as pdsvc reads it and acts through it: its XML-RPC interface over the bundle's
control socket, as supervisorctl uses it (one connection per call: a ServerProxy keeps its
connection, not for threads). Reading never raises: a supervisord that cannot be reached gives
a ServiceState whose error says why.

Acting, per program (supervisor 4.3.0): a program whose definition on disk changed is applied
by re-creating its group (reloadConfig, then stopProcessGroup, removeProcessGroup,
addProcessGroup: what `supervisorctl update GROUP` does, supervisorctl.py do_update), which
restarts only that program when it is a group of its own; a program whose definition did not
change (the shipped runtime's code only) is stopped and started (`supervisorctl restart G:P`:
it respawns from the definition its group holds). Re-creating a group that holds programs the
step does not name is refused here: pdsvc/apply/order.py makes such a group one step. pdsvc
renders each program into a group of its own (render/supervisord.py program_names).
"""

from __future__ import annotations

import time
import xmlrpc.client
from collections.abc import Callable, Mapping
from typing import Any

from pdsvc.status.managers.base import ServiceState

RPC_TIMEOUT = 5.0  # seconds per XML-RPC call to supervisord

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


def _group(name: str) -> str:
    """The group of a supervisorctl name: GROUP:PROGRAM, or PROGRAM in a group of its own."""
    return name.rpartition(":")[0] or name


class Supervisord:
    """The supervisord of a supervisord bundle, over its control socket (``socket_path``;
    ``api``: the `supervisor` XML-RPC namespace in its place, for tests).

    Units map to programs (``units``: {unit: supervisorctl name}; a name not in it is its own
    program). The plan's target has no counterpart in supervisord, so its row is the
    supervisord that runs the bundle and how many of the plan's programs run (``target``; the
    row is named ``row``, NAME-supervisord). ``conf``: the file a person reads it from.
    """

    name = "supervisord"

    def __init__(
        self,
        socket_path: str = "",
        units: Mapping[str, str] | None = None,
        *,
        target: str = "",
        row: str = "supervisord",
        timeout: float = RPC_TIMEOUT,
        conf: str = "supervisord.conf",
        api: Callable[[], Any] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.units = dict(units or {})
        self.target = target
        self.row = row
        self.timeout = timeout
        self.conf = conf
        self._given_api = api

    def api(self) -> Any:
        if self._given_api is not None:
            return self._given_api()
        from pdsvc.ship.runtime.listener import supervisor_rpc  # its AF_UNIX transport; stdlib only

        return supervisor_rpc(f"unix://{self.socket_path}", self.timeout).supervisor

    # ------------------------------------------------------------------ reading
    def _info(self, name: str) -> dict[str, Any] | ServiceState:
        """``getProcessInfo(name)``, or the ServiceState that says why there is none."""
        try:
            info = self.api().getProcessInfo(name)
        except xmlrpc.client.Fault as e:
            if e.faultCode == BAD_NAME:
                return ServiceState(name, "inactive", loaded=False,
                                    status_text="no such program in supervisord's config")
            return ServiceState(name, "unknown", error=f"supervisord: {e.faultString}")
        except Exception as e:  # reading reports; it never crashes
            return ServiceState(name, "unknown", error=self._why(e))
        if not isinstance(info, dict):
            return ServiceState(name, "unknown",
                                error=f"supervisord: unexpected answer {info!r:.60}")
        return info

    def state(self, unit: str) -> ServiceState:
        if self.target and unit == self.target:
            return self.supervisord_state()
        name = self.units.get(unit, unit)
        info = self._info(name)
        return info if isinstance(info, ServiceState) else state_from_process_info(name, info)

    def invocation(self, unit: str) -> str:
        """The program's pid and when it started: both new at every spawn."""
        info = self._info(self.units.get(unit, unit))
        return "" if isinstance(info, ServiceState) else f"{info.get('pid')}@{info.get('start')}"

    def supervisord_state(self) -> ServiceState:
        """The row in place of the target: supervisord itself (RUNNING -> active) and how many
        of the plan's programs run; not installed when supervisord runs none of them."""
        row = self.row
        try:
            api = self.api()
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

    # ------------------------------------------------------------------ acting
    def act(self, verb: str, units: list[str], timeout: float) -> tuple[int, str]:
        api = self.api()
        said: list[str] = []
        try:
            [[added, changed, removed]] = api.reloadConfig()
            if any(_group(u) in added for u in units):
                # a program that moved out of a group no longer in the config (order.py
                # _regroup): that group goes first, as supervisorctl.py do_update does, so
                # that no two copies of an engine run at once
                for group in removed:
                    api.stopProcessGroup(group)
                    api.removeProcessGroup(group)
                    said.append(f"group {group} stopped and removed")
            programs = api.getAllProcessInfo()
            for group in dict.fromkeys(_group(u) for u in units):
                mine = [u for u in units if _group(u) == group]
                if group in changed or group in added:
                    refused = self._recreate(api, group, mine, programs, group in changed)
                    if refused:
                        return 1, refused
                    said.append(f"group {group} re-created from {self.conf}")
                    continue
                said += self._restart(api, verb, mine)
        except xmlrpc.client.Fault as e:
            return 1, f"supervisord: {e.faultString}"
        except OSError as e:
            return 1, f"supervisord: {e}"
        return 0, "; ".join(said)

    @staticmethod
    def _recreate(api: Any, group: str, mine: list[str], programs: list[dict[str, Any]],
                  changed: bool) -> str:
        """Re-create ``group`` from its definition on disk (its autostart programs start with
        it); why not ("" when done): it holds programs other than ``mine``."""
        members = [f"{group}:{p['name']}" if p["name"] != group else group
                   for p in programs if p.get("group") == group]
        others = sorted(set(members) - set(mine))
        if others:
            return (f"re-creating group {group} to read its new definition would stop "
                    f"{', '.join(others)} too; not done")
        if changed:
            api.stopProcessGroup(group)
            api.removeProcessGroup(group)
        api.addProcessGroup(group)
        return ""

    def _restart(self, api: Any, verb: str, programs: list[str]) -> list[str]:
        """Stop (unless starting, or not running) and start each program as defined."""
        for u in programs:
            if verb != "start" and self.state(u).state in ("active", "activating"):
                api.stopProcess(u, True)
            api.startProcess(u, False)
        return [f"{u} restarted" for u in programs]

    def look(self, unit: str) -> str:
        ctl = f"supervisorctl -c {self.conf}"
        return f"{ctl} status {unit}; {ctl} tail {unit}"

    def tail(self, unit: str, lines: int = 50) -> list[str]:
        """The program's log (stderr goes to stdout: redirect_stderr=true) by XML-RPC."""
        try:
            text, _, _ = self.api().tailProcessStdoutLog(self.units.get(unit, unit), 0,
                                                         200 * lines)
        except Exception:  # reading reports; it never crashes
            return []
        return str(text).splitlines()[-lines:]


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
