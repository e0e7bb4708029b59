"""The service manager a step restarts units through: systemd (`systemctl`) or the
supervisord of a supervisord bundle (its XML-RPC interface, as supervisorctl uses it). Both
answer in systemd's words, read the way `pdsvc status` reads them (status.managers:
parse_show for systemd, state_from_process_info for supervisord).

supervisord, per program (supervisor 4.3.0): a program whose definition on disk changed is
applied by re-creating its group (reloadConfig, then stopProcessGroup, removeProcessGroup,
addProcessGroup: what `supervisorctl update GROUP` does, supervisorctl.py do_update), which
restarts only that program when it is a group of its own; a program whose definition did
not change (the shipped runtime's code only) is stopped and started (`supervisorctl restart
G:P`: it respawns from the definition its group holds). Re-creating a group that holds
programs the step does not name is refused here: order.py makes such a group one step.
pdsvc renders each program into a group of its own (render/supervisord.py program_names).
"""

from __future__ import annotations

import xmlrpc.client
from collections.abc import Callable
from typing import Any, Protocol

from pdsvc.status.managers import parse_show, state_from_process_info


class Runner(Protocol):
    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]: ...


class Manager(Protocol):
    name: str

    def state(self, unit: str) -> str: ...
    def invocation(self, unit: str) -> str: ...
    def act(self, verb: str, units: list[str], timeout: float) -> tuple[int, str]: ...
    def look(self, unit: str) -> str: ...


class Systemd:
    """systemctl on this host; `host` runs the commands (tests pass a fake)."""

    name = "systemd"

    def __init__(self, host: Runner, systemctl: str = "systemctl") -> None:
        self.host = host
        self.systemctl = systemctl

    def _show(self, unit: str) -> dict[str, str]:
        _, out = self.host.run([self.systemctl, "show", unit, "-p",
                                "ActiveState,InvocationID"], 30)
        return parse_show(out)

    def state(self, unit: str) -> str:
        return self._show(unit).get("ActiveState", "unknown")

    def invocation(self, unit: str) -> str:
        return self._show(unit).get("InvocationID", "")

    def act(self, verb: str, units: list[str], timeout: float) -> tuple[int, str]:
        """`systemctl restart|start UNITS` (restart: stop, then start with the new unit file,
        which install.sh's daemon-reload made the loaded one)."""
        return self.host.run([self.systemctl, "restart" if verb != "start" else "start",
                              *units], timeout)

    def look(self, unit: str) -> str:
        return f"systemctl status {unit}; journalctl -u {unit}"


class Supervisord:
    """The bundle's supervisord; `api()` returns its `supervisor` XML-RPC namespace."""

    name = "supervisord"

    def __init__(self, api: Callable[[], Any], conf: str = "supervisord.conf") -> None:
        self.api = api
        self.conf = conf

    def _info(self, unit: str) -> dict[str, Any]:
        try:
            info = self.api().getProcessInfo(unit)
        except (xmlrpc.client.Error, OSError):
            return {}
        return info if isinstance(info, dict) else {}

    def state(self, unit: str) -> str:
        info = self._info(unit)
        return state_from_process_info(unit, info).state if info else "unknown"

    def invocation(self, unit: str) -> str:
        info = self._info(unit)
        return f"{info.get('pid')}@{info.get('start')}" if info else ""

    def act(self, verb: str, units: list[str], timeout: float) -> tuple[int, str]:
        api = self.api()
        said: list[str] = []
        try:
            [[added, changed, removed]] = api.reloadConfig()
            if any((u.rpartition(":")[0] or u) in added for u in units):
                # a program that moved out of a group no longer in the config (order.py
                # _regroup): that group goes first, as supervisorctl.py do_update does, so
                # that no two copies of an engine run at once
                for group in removed:
                    api.stopProcessGroup(group)
                    api.removeProcessGroup(group)
                    said.append(f"group {group} stopped and removed")
            programs = api.getAllProcessInfo()
            for group in dict.fromkeys(u.rpartition(":")[0] or u for u in units):
                mine = [u for u in units if (u.rpartition(":")[0] or u) == group]
                members = [f"{group}:{p['name']}" if p["name"] != group else group
                           for p in programs if p.get("group") == group]
                if group in changed or group in added:
                    others = sorted(set(members) - set(mine))
                    if others:
                        return 1, (f"re-creating group {group} to read its new definition "
                                   f"would stop {', '.join(others)} too; not done")
                    if group in changed:
                        api.stopProcessGroup(group)
                        api.removeProcessGroup(group)
                    api.addProcessGroup(group)  # its autostart programs start with it
                    said.append(f"group {group} re-created from {self.conf}")
                    continue
                for u in mine:
                    if verb != "start" and self.state(u) in ("active", "activating"):
                        api.stopProcess(u, True)
                    api.startProcess(u, False)
                    said.append(f"{u} restarted")
        except xmlrpc.client.Fault as e:
            return 1, f"supervisord: {e.faultString}"
        except OSError as e:
            return 1, f"supervisord: {e}"
        return 0, "; ".join(said)

    def look(self, unit: str) -> str:
        ctl = f"supervisorctl -c {self.conf}"
        return f"{ctl} status {unit}; {ctl} tail {unit}"
