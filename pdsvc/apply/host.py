"""Everything outside a rollout goes through a Host: commands, HTTP, files, hold files and the
clock. `LocalHost` is this machine; the tests pass doubles with the same methods, so the order
of things is tested without a systemd."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

from pdsvc.ship.runtime.hold import clear_hold, write_hold
from pdsvc.ship.runtime.statefile import read_state


class Host(Protocol):
    """What a rollout needs of the machine it runs on (lease.HoldWriter and
    status.managers.Runner are parts of it)."""

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]:
        """(exit status, stdout then stderr); 127 when the command could not run."""
        ...

    def http(self, method: str, url: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0, body: bytes | None = None) -> tuple[int, str]:
        """(status, body); status 0 when nothing answered."""
        ...

    def read(self, path: str) -> str | None:
        """A file's text; None when it cannot be read."""
        ...

    def write_hold(self, path: str, out: bool, peers: list[str] | None, why: str,
                   until: float | None = None, since: float | None = None,
                   by: str = "pdsvc apply", profile: str | None = None) -> bool:
        """Write a hold file (lease.py: ``until``, ``since``; ``by`` who holds it, ``profile``
        a profile hold's run); whether it now holds what was written."""
        ...

    def clear_hold(self, path: str) -> None: ...

    def now(self) -> float:
        """Seconds of a monotonic clock (bounds, phases)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (what the runtime's state files are stamped with)."""
        ...

    def sleep(self, secs: float) -> None: ...


class LocalHost:
    """This machine: subprocesses, HTTP and files."""

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return 127, str(e)
        return proc.returncode, (proc.stdout + proc.stderr).strip()

    def http(self, method: str, url: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0, body: bytes | None = None) -> tuple[int, str]:
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (our URLs)
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")
        except (OSError, ValueError) as e:
            return 0, str(e)

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError:
            return None

    def write_hold(self, path: str, out: bool, peers: list[str] | None, why: str,
                   until: float | None = None, since: float | None = None,
                   by: str = "pdsvc apply", profile: str | None = None) -> bool:
        """Whether the hold is there (the runtime's state directory exists and the write went
        through)."""
        doc = write_hold(path, out=out, peers=peers, why=why, until=until, since=since, by=by,
                         profile=profile)
        return read_state(path) == doc

    def clear_hold(self, path: str) -> None:
        clear_hold(path)

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, secs: float) -> None:
        time.sleep(secs)
