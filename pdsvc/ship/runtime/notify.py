"""sd_notify and the runtime's log lines: how a unit's main process talks to systemd
(sd_notify(3)) and to the journal."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Mapping


class Log:
    """Write one flushed line per message to stderr, prefixed with the unit's name.

    journald stores stderr line by line; a prefix keeps our lines apart from the child's,
    which share the same stream.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def _line(self, message: str) -> str:
        return f"{self.name}: {' '.join(message.splitlines())}\n"

    def __call__(self, message: str) -> None:
        stream = sys.stderr
        stream.write(self._line(message))
        stream.flush()

    def from_signal_handler(self, message: str) -> None:
        """Log from a signal handler: a raw write(2) cannot re-enter Python's buffered stream."""
        with contextlib.suppress(OSError):
            os.write(2, self._line(message).encode("utf-8", "replace"))


def notify(*fields: str, env: Mapping[str, str] | None = None) -> bool:
    """Send sd_notify fields (``READY=1``, ``STATUS=...``) as one datagram to ``$NOTIFY_SOCKET``.

    Implemented by hand because libsystemd's Python bindings are not in the SGLang venv. A
    leading ``@`` names a socket in the abstract namespace. Returns False without error when
    the variable is unset (not under systemd) or the datagram could not be sent.
    """
    env = os.environ if env is None else env
    address = env.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a vsock address (VM guests only), which we do not need
    payload = "\n".join(field.replace("\n", " ") for field in fields).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(payload, address)
    except OSError:
        return False
    return True


class Notifier:
    """sd_notify with a log line the first time sending fails (a silent failure means no
    READY=1 and, much later, a start timeout that is hard to explain)."""

    def __init__(self, log: Log, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        self.env = os.environ if env is None else env
        self.enabled = bool(self.env.get("NOTIFY_SOCKET"))
        self._warned = False

    def __call__(self, *fields: str) -> None:
        if self.enabled and not notify(*fields, env=self.env) and not self._warned:
            self._warned = True
            self.log(f"cannot send to NOTIFY_SOCKET={self.env.get('NOTIFY_SOCKET')}")

    def status(self, text: str) -> None:
        self(f"STATUS={text}")


def watchdog_secs(env: Mapping[str, str] | None = None) -> float | None:
    """The unit's WatchdogSec= (WATCHDOG_USEC, sd_watchdog_enabled(3)), or None without one."""
    usec = (os.environ if env is None else env).get("WATCHDOG_USEC", "")
    return int(usec) / 1e6 if usec.isdigit() else None


def watchdog_hint(interval: float, timeout: float, log: Log) -> None:
    """Warn when the liveness cadence (--liveness-interval ``interval`` + --liveness-timeout
    ``timeout``) cannot keep the unit's watchdog (WATCHDOG_USEC, sd_watchdog_enabled(3)) fed."""
    watchdog = watchdog_secs()
    if watchdog is None:
        if os.environ.get("NOTIFY_SOCKET"):
            log("WatchdogSec= is not set for this unit: failed liveness probes are only logged")
        return
    if interval + timeout >= watchdog:
        log(f"warning: --liveness-interval {interval:g} s + --liveness-timeout {timeout:g} s "
            f">= WatchdogSec={watchdog:g} s: a single slow probe gets the unit killed")
