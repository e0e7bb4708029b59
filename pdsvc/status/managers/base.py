"""What every service manager answers, in systemd's words: one unit's state (ServiceState),
which run of it this is (its invocation), and the one action a rollout takes (restart or
start some units). `pdsvc status` reads through it; `pdsvc apply` reads and acts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ServiceState:
    """One unit as its service manager sees it, in systemd's words.

    Supervisord maps supervisord's states onto these: RUNNING -> active, STARTING ->
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


class ServiceManager(Protocol):
    """A service manager (systemd, supervisord): read by `pdsvc status` and `pdsvc apply`,
    acted on by `pdsvc apply`. Reading never raises: a manager that cannot be asked gives a
    ServiceState that says why (and an empty invocation)."""

    name: str

    def state(self, unit: str) -> ServiceState:
        """The unit now (reading)."""
        ...

    def invocation(self, unit: str) -> str:
        """Which run of the unit this is, "" when unknown: a restart gives a new one."""
        ...

    def act(self, verb: str, units: list[str], timeout: float) -> tuple[int, str]:
        """`restart` (stop, then start with the definition on disk) or `start` the units;
        (0, what was done) or (non-zero, why not)."""
        ...

    def look(self, unit: str) -> str:
        """The commands a person runs to see why the unit failed."""
        ...

    def tail(self, unit: str, lines: int = 50) -> list[str]:
        """The unit's last log lines ([] when they cannot be read)."""
        ...


class Runner(Protocol):
    """Runs a command: (exit status, stdout then stderr). pdsvc apply's Host is one."""

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]: ...
