"""Commands inside a booted container (tests/support/nspawn.py's SystemdContainer): run,
systemctl, journal, files, users. A mixin: the container provides ``pid``, ``name``,
``_stopped``, ``is_running()`` and ``_log_tail()``."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping
from typing import TypeVar

from nspawn_host import wait_for

T = TypeVar("T")

#: Environment given to every command run inside (plus the caller's ``env``).
CONTAINER_ENV: dict[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "TERM": "dumb",
    "SYSTEMD_COLORS": "0",
    "SYSTEMD_PAGER": "",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class ContainerError(RuntimeError):
    """The container could not be started / is not running."""


class ContainerCommandError(subprocess.CalledProcessError):
    """A command inside the container failed; str() carries its output."""

    def __str__(self) -> str:
        cmd = self.cmd if isinstance(self.cmd, str) else shlex.join(map(str, self.cmd))
        return (
            f"command in container exited {self.returncode}: {cmd}\n"
            f"--- stdout ---\n{(self.stdout or '').rstrip()}\n"
            f"--- stderr ---\n{(self.stderr or '').rstrip()}"
        )


class ContainerCommands:
    """Everything a test does inside a running container."""

    pid: int | None
    name: str
    _stopped: bool

    def is_running(self) -> bool:
        raise NotImplementedError

    def _log_tail(self, n: int = 40) -> str:
        raise NotImplementedError


    def _nsenter(self, cmd: list[str] | str) -> list[str]:
        if not self.pid or self._stopped:
            raise ContainerError(f"{self.name}: not running")
        args = ["sh", "-c", cmd] if isinstance(cmd, str) else [os.fspath(c) for c in cmd]
        return ["nsenter", "-t", str(self.pid), "-a", *args]

    def _exec(
        self,
        argv: list[str],
        *,
        input: str | bytes | None,
        env: Mapping[str, str] | None,
        timeout: float,
        text: bool,
    ) -> subprocess.CompletedProcess:
        """subprocess.run, but a timeout kills nsenter's whole process group (its child too)."""
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={**CONTAINER_ENV, **(env or {})},
            text=text,
            encoding="utf-8" if text else None,
            errors="replace" if text else None,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def run(
        self,
        cmd: list[str] | str,
        check: bool = True,
        timeout: float = 60.0,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside (a string goes through ``sh -c``); text output captured.

        ``env`` adds to/overrides :data:`CONTAINER_ENV`. Raises ContainerCommandError on a
        non-zero exit when ``check``; subprocess.TimeoutExpired on timeout.
        """
        r = self._exec(self._nsenter(cmd), input=input, env=env, timeout=timeout, text=True)
        r.args = cmd
        if check and r.returncode != 0:
            raise ContainerCommandError(r.returncode, cmd, r.stdout, r.stderr)
        return r

    def systemctl(
        self, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess:
        return self.run(["systemctl", "--no-pager", *args], check=check, timeout=timeout)

    def daemon_reload(self) -> None:
        self.systemctl("daemon-reload")

    def journal(self, unit: str, lines: int = 200) -> str:
        """Messages of ``unit`` (journalctl -u UNIT -o cat), the last ``lines`` of them."""
        r = self.run(
            ["journalctl", "-u", unit, "--no-pager", "-o", "cat", "-n", str(lines)],
            check=False,
        )
        return r.stdout

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show UNIT -p P ...`` as a dict (all properties if none given)."""
        args = ["show", unit]
        for p in props:
            args += ["-p", p]
        out = self.systemctl(*args).stdout
        res = {}
        for line in out.splitlines():
            k, sep, v = line.partition("=")
            if sep:
                res[k] = v
        return res

    def unit_state(self, unit: str) -> str:
        """ActiveState of ``unit`` (active, inactive, failed, activating, ...)."""
        return self.show(unit, "ActiveState").get("ActiveState", "")

    def write_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Create/replace ``path`` inside (parent dirs created)."""
        if not os.path.isabs(path):
            raise ValueError(f"path must be absolute: {path!r}")
        data = content.encode() if isinstance(content, str) else content
        q = shlex.quote(path)
        script = (
            f'set -e; mkdir -p -- "$(dirname -- {q})"; tmp={q}.tmp.$$; '
            f'cat > "$tmp"; chmod {mode:o} "$tmp"; mv -f -- "$tmp" {q}'
        )
        r = self._exec(self._nsenter(script), input=data, env=None, timeout=60, text=False)
        if r.returncode != 0:
            raise ContainerCommandError(
                r.returncode,
                f"write_file {path}",
                r.stdout.decode(errors="replace"),
                r.stderr.decode(errors="replace"),
            )

    def read_file(self, path: str) -> str:
        return self.run(["cat", "--", path]).stdout

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).returncode == 0

    def install_unit(self, name: str, content: str, reload: bool = True) -> str:
        """Write /etc/systemd/system/NAME and daemon-reload; returns the path."""
        path = f"/etc/systemd/system/{name}"
        self.write_file(path, content)
        if reload:
            self.daemon_reload()
        return path

    def useradd(self, user: str, *extra: str) -> None:
        """A system user with its own group (/etc has no login.defs here: be explicit)."""
        self.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                *extra,
                user,
            ]
        )

    def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 30.0,
        interval: float = 0.2,
        what: str = "condition",
    ) -> T:
        return wait_for(predicate, timeout=timeout, interval=interval, what=what)

    def diagnostics(self, lines: int = 300) -> str:
        """Console tail + journal tail + failed units: for error messages / failed tests."""
        parts = [self._log_tail(60)]
        if self.is_running():
            with contextlib.suppress(Exception):
                parts.append(
                    "--- systemctl --failed ---\n"
                    + self.systemctl("--failed", "--plain", check=False, timeout=10).stdout
                )
            with contextlib.suppress(Exception):
                parts.append(
                    f"--- journal (last {lines}) ---\n"
                    + self.run(
                        ["journalctl", "--no-pager", "-n", str(lines)], check=False, timeout=20
                    ).stdout
                )
        return "\n".join(parts)
