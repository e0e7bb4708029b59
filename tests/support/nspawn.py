"""Boot a REAL systemd in a throw-away ``systemd-nspawn`` container and drive it from tests.

This module is the single place where the end-to-end tests start containers. Stdlib + pytest.

How a container is made
-----------------------
::

    timeout --kill-after=10 <max_lifetime> \\
      systemd-nspawn --register=no --keep-unit --volatile=yes -D / --machine=pdsvc-<uuid8> \\
        --console=read-only [--bind-ro=SRC:DST ...] [--bind=SRC:DST ...] \\
        [--network-namespace-path=/run/netns/NAME] --boot -- systemd.firstboot=off

started in its own session (``start_new_session``), console output to a log file. The
container's PID 1 is the child of ``systemd-nspawn`` whose ``comm`` is ``systemd``; commands
run inside through ``nsenter -t <that pid> -a`` with a clean environment (PATH of the
container, ``LANG=C.UTF-8``, ``SYSTEMD_COLORS=0``, ``SYSTEMD_PAGER=``). Readiness is
``systemctl is-system-running --wait`` reporting ``running`` or ``degraded`` (retried until
the container's manager accepts connections).

What was found on this machine (Debian 12, systemd 252, run as root, PID 1 is not systemd,
2 cores, hybrid cgroup hierarchy: cgroup v1 + ``name=systemd`` + cgroup2 at ``unified``)
------------------------------------------------------------------------------------------
* Boot: ``systemd-analyze`` inside reports ~0.7 s of userspace on an idle machine, ~2 s
  under load; start() until ``is-system-running`` says ``running`` takes 0.9-2.3 s wall,
  stop() 0.2-0.5 s. Three test runs at once (up to 6 containers on 2 cores) pass. State is
  ``running`` (nothing failed); ``degraded`` is accepted but reported (``failed_units``).
* ``--volatile=yes`` (the choice here): ``/`` is a fresh tmpfs, the host's ``/usr`` is
  mounted read-only, ``/etc`` is a *writable* tmpfs that systemd populates at first boot
  (machine-id, passwd/group/shadow from systemd-sysusers, presets). So ``/etc/systemd/system``
  is writable, and ``useradd`` works: ``useradd --system --user-group --no-create-home
  --shell /usr/sbin/nologin NAME``. There is no ``/etc/login.defs`` in there, so pass
  ``--user-group`` explicitly (without it the user gets GID 100 "users"). A ``Type=exec``
  service with ``User=`` of such a user starts and runs as that user.
  Note: the host's enabled-by-preset units get enabled at first boot (Debian's preset is
  "enable *"): e.g. postgresql.service (a no-op /bin/true unit) and a few timers; harmless.
  Prometheus and node_exporter, which CI installs for other tests, are not: a preset file
  (``e2e-containers.preset``, bound into ``/etc/systemd/system-preset/``) disables them.
  ``/etc`` holds almost nothing else (no /etc/hosts, /etc/ssl, nsswitch.conf): use
  ``127.0.0.1`` rather than ``localhost`` inside.
  ``/tmp`` inside is the container's own tmpfs; ``/root`` is empty (the pyenv Python of
  the host is NOT inside; Debian's ``/usr/bin/python3`` is).
* The other modes do not work with ``-D /`` here (tried): ``--volatile=state`` (host ``/``
  read-only, tmpfs ``/var``; ``/etc`` would be read-only anyway) dies with "/dev is
  pre-mounted and pre-populated ... mknod(/dev/null) failed: File exists";
  ``--volatile=overlay`` is refused: "Spawning container on root directory is not
  supported. Consider using --ephemeral, --volatile=yes or --volatile=state". So ``yes`` it
  is (``volatile=`` is still a constructor parameter, but only ``yes`` works with ``-D /``).
* journald works: it runs inside, persistent journal in the tmpfs ``/var/log/journal``;
  ``journalctl -u UNIT -o cat`` shows the service's stdout/stderr (plus systemd's own
  "Starting/Started" lines for that unit). Lines may land a moment after the event: poll
  with ``wait_for``.
* ``systemd-analyze`` works (``systemd-analyze``, ``verify``). ``verify`` fails on this
  image only because the man pages are missing: use ``systemd-analyze verify --man=no``.
* A venv created with ``/usr/bin/python3 -m venv`` on the host and bind-mounted in
  (``--bind-ro``) runs: ``bin/python`` is a symlink to ``/usr/bin/python3``. Mount it at
  the SAME path inside, because console scripts (``bin/pip`` ...) have absolute shebangs;
  ``<venv>/bin/python -m ...`` works at any mount point. A pyenv-based venv does NOT work.
* Network: without ``netns`` the container shares the host's network namespace, so a
  service bound to 127.0.0.1:PORT inside is on the host's loopback too: pick free ports.
  With ``netns`` (``--network-namespace-path=/run/netns/NAME``) it boots the same (~0.9 s),
  but ``lo`` stays DOWN: the container's PID 1 has no CAP_NET_ADMIN (systemd-networkd is
  skipped for the same reason), so start() sets ``lo`` up in that namespace from the host
  first. Commands run through nsenter keep the host's capabilities (``ip`` works there).
* cgroups (important when PID 1 of the host is not systemd): with ``--keep-unit`` nspawn
  puts the container's tree under ``<own cgroup>/payload``. Started from the root cgroup,
  every container would share ``/payload`` - two concurrent containers would then manage
  the same cgroups (a unit stop in one could kill processes of the other). So the launcher
  first moves itself into a private cgroup ``<own cgroup>/pdsvc-<uuid8>`` in the
  ``name=systemd`` and cgroup2 hierarchies; stop() removes those (empty) cgroups again.
  Nobody else cleans them here, since there is no systemd on the host.
* Leaks: SIGKILL of ``systemd-nspawn`` does NOT take the container down (its systemd is
  re-parented to the host's PID 1 and keeps running). Killing the container's PID 1 takes
  the whole PID namespace down. So besides ``timeout`` (SIGTERM to nspawn = orderly
  poweroff of the container, SIGKILL 10 s later) each container gets a detached watchdog
  that SIGKILLs the container's PID 1 at ``max_lifetime + 20 s`` - it checks the PID's
  PID-namespace identity first, so a recycled PID is never hit. stop() kills the watchdog.
  stop(): ``systemctl poweroff --no-block`` (or SIGRTMIN+4 to PID 1), wait, then SIGKILL
  PID 1 and the launcher's process group. Powering off takes ~0.2 s.
* nspawn warns 'Attempted to remove disk file system under
  "/run/systemd/nspawn/propagate/NAME"' because /run is not a tmpfs here; stop() removes
  that (empty) directory.

Using it
--------
::

    import nspawn  # tests/support is on the path: pyproject.toml's pytest pythonpath

    systemd_container = nspawn.systemd_container  # make the fixture visible in this module
    # (a `from nspawn import systemd_container` works too, but ruff flags F811 on its uses)

    def test_x(systemd_container):
        c = systemd_container(bind_ro=[str(venv)])      # booted, running
        c.install_unit("x.service", UNIT_TEXT)          # write + daemon-reload
        c.systemctl("start", "x.service")
        c.wait_for(lambda: "ready" in c.journal("x.service"), 30, what="x.service ready")

or ``with SystemdContainer(bind_ro=[...]) as c: ...``. Skips when nspawn cannot be used,
unless ``PDSVC_REQUIRE_E2E=1`` (CI), where it fails instead (``require_nspawn()``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from nspawn_exec import (
    CONTAINER_ENV,
    ContainerCommandError,
    ContainerCommands,
    ContainerError,
)
from nspawn_host import _WATCHDOG, _alive, _cgroup_dirs, _children, _pidns, _rmdir_tree, wait_for

__all__ = [
    "CONTAINER_ENV",
    "ContainerCommandError",
    "ContainerError",
    "SystemdContainer",
    "live_containers",
    "nspawn_available",
    "require_nspawn",
    "stop_all",
    "systemd_container",
    "wait_for",
]

DEFAULT_BOOT_TIMEOUT = 60.0
#: Hard upper bound of a container's life (seconds); env PDSVC_NSPAWN_MAX_LIFETIME overrides.
DEFAULT_MAX_LIFETIME = float(os.environ.get("PDSVC_NSPAWN_MAX_LIFETIME", "1200"))
NSPAWN = "systemd-nspawn"
#: every container's systemd takes inotify instances of root's, whose default limit (128) a
#: few containers at once use up (tests in parallel): .ci/run raises it
INOTIFY_HINT = (" (root's inotify instances ran out, as when many containers boot at once: "
                "sysctl -w fs.inotify.max_user_instances=4096)")
PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e-containers.preset")
HOST_SYSTEMD = "/usr/lib/systemd/systemd"
REQUIRE_ENV = "PDSVC_REQUIRE_E2E"

BindSpec = str | tuple[str, str] | os.PathLike


# --------------------------------------------------------------------------- availability


def nspawn_available() -> str | None:
    """None if containers can be booted here, else the reason why not."""
    if sys.platform != "linux":
        return f"systemd-nspawn needs Linux (platform is {sys.platform})"
    if os.geteuid() != 0:
        return "systemd-nspawn tests need root"
    for tool in (NSPAWN, "nsenter", "timeout"):
        if shutil.which(tool) is None:
            hint = " (apt-get install systemd-container)" if tool == NSPAWN else ""
            return f"{tool} not found on PATH{hint}"
    if not os.access(HOST_SYSTEMD, os.X_OK):
        return f"{HOST_SYSTEMD} missing: the host's systemd is what boots in the container"
    return None


def require_nspawn() -> None:
    """Skip the calling test when nspawn can't be used - or fail if PDSVC_REQUIRE_E2E=1."""
    reason = nspawn_available()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------- registry

_LIVE: dict[str, SystemdContainer] = {}
_LIVE_LOCK = threading.Lock()


def live_containers() -> list[SystemdContainer]:
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all() -> None:
    """Stop every container this process started (registered with atexit)."""
    for c in live_containers():
        with contextlib.suppress(Exception):
            c.stop()


atexit.register(stop_all)


def _norm_bind(spec: BindSpec) -> str:
    if isinstance(spec, tuple):
        src, dst = (os.fspath(x) for x in spec)
    else:
        src = dst = os.fspath(spec)
    for p in (src, dst):
        if ":" in p or not os.path.isabs(p):
            raise ValueError(f"bind path must be absolute and free of ':': {p!r}")
    if not os.path.exists(src):
        raise FileNotFoundError(f"bind source does not exist: {src}")
    return src if src == dst else f"{src}:{dst}"


# --------------------------------------------------------------------------- the container


class SystemdContainer(ContainerCommands):
    """A booted systemd in a volatile ``systemd-nspawn`` container of the host's /usr.

    Construct with defaults, then ``start()`` (arguments given to start() win); or use it as
    a context manager, which starts it if needed and always stops it.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        bind_ro: Iterable[BindSpec] = (),
        bind: Iterable[BindSpec] = (),
        netns: str | None = None,
        volatile: str = "yes",
        max_lifetime: float = DEFAULT_MAX_LIFETIME,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.name = name or f"pdsvc-{uuid.uuid4().hex[:8]}"
        self._bind_ro = list(bind_ro)
        self._bind = list(bind)
        self._netns = netns
        self.volatile = volatile
        self.max_lifetime = max_lifetime
        self.extra_args = list(extra_args)
        self.pid: int | None = None  #: host PID of the container's systemd (PID 1 inside)
        self.nspawn_pid: int | None = None
        self.boot_state: str | None = None
        self.boot_seconds: float | None = None
        self.failed_units: list[str] = []
        self.keep_logs = False
        self.log_path: Path | None = None
        self._launcher: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self._pidns: str | None = None
        self._cgroups: list[Path] = []
        self._log_file: Any = None
        self._stopped = False

    # ---------------------------------------------------------------- lifecycle

    def start(
        self,
        name: str | None = None,
        bind_ro: Iterable[BindSpec] | None = None,
        bind: Iterable[BindSpec] | None = None,
        netns: str | None = None,
        timeout: float = DEFAULT_BOOT_TIMEOUT,
    ) -> SystemdContainer:
        """Boot; returns self once ``is-system-running`` says running/degraded.

        ``bind_ro``/``bind``: host paths (mounted at the same path) or ``(src, dst)`` tuples.
        ``netns``: a name under /run/netns or a path to a network namespace file.
        """
        if self._launcher is not None:
            raise ContainerError(f"{self.name}: already started")
        reason = nspawn_available()
        if reason:
            raise ContainerError(reason)
        if name:
            self.name = name
        if bind_ro is not None:
            self._bind_ro = list(bind_ro)
        if bind is not None:
            self._bind = list(bind)
        if netns is not None:
            self._netns = netns

        cmd = self._command()
        log_dir = Path(tempfile.gettempdir()) / "pdsvc-nspawn"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name}.console.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._cgroups = self._make_cgroups()
        cgroups = [str(d / "cgroup.procs") for d in self._cgroups]

        def _join_cgroups() -> None:  # runs in the child, before exec
            for procs in cgroups:
                with contextlib.suppress(OSError), open(procs, "w") as f:
                    f.write(str(os.getpid()))

        t0 = time.monotonic()
        with _LIVE_LOCK:
            _LIVE[self.name] = self
        self._stopped = False
        try:
            self._launcher = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_join_cgroups if cgroups else None,
                env={**os.environ, "SYSTEMD_COLORS": "0"},
            )
            self._wait_booted(t0 + timeout)
        except BaseException:
            self.keep_logs = True
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - t0
        return self

    def _command(self) -> list[str]:
        cmd = [
            "timeout",
            "--kill-after=10",
            str(int(self.max_lifetime)),
            NSPAWN,
            "--register=no",
            "--keep-unit",
            f"--volatile={self.volatile}",
            "-D",
            "/",
            f"--machine={self.name}",
            "--console=read-only",
            "--setenv=SYSTEMD_COLORS=0",
        ]
        # presets: the host's services that are not the tests' (Prometheus, node_exporter) stay
        # off at the container's first boot (e2e-containers.preset says why)
        cmd.append(f"--bind-ro={PRESET}:/etc/systemd/system-preset/00-pdsvc-e2e.preset")
        cmd += [f"--bind-ro={_norm_bind(b)}" for b in self._bind_ro]
        cmd += [f"--bind={_norm_bind(b)}" for b in self._bind]
        if self._netns:
            path = self._netns if "/" in self._netns else f"/run/netns/{self._netns}"
            if not os.path.exists(path):
                raise FileNotFoundError(f"network namespace not found: {path}")
            cmd.append(f"--network-namespace-path={path}")
            # PID 1 of the container lacks CAP_NET_ADMIN, so systemd can't bring `lo` up there
            # itself (nsenter'ed commands could: they keep the host's capabilities).
            subprocess.run(
                ["nsenter", f"--net={path}", "ip", "link", "set", "lo", "up"],
                check=False,
                capture_output=True,
            )
        cmd += self.extra_args
        cmd += ["--boot", "--", "systemd.firstboot=off"]
        return cmd

    def _make_cgroups(self) -> list[Path]:
        made = []
        for parent in _cgroup_dirs():
            d = parent / self.name
            try:
                d.mkdir()
            except FileExistsError:
                pass
            except OSError:
                continue
            made.append(d)
        return made

    def _wait_booted(self, deadline: float) -> None:
        assert self._launcher is not None
        while True:
            self._check_launcher()
            if self.nspawn_pid is None:
                kids = _children(self._launcher.pid, NSPAWN)
                self.nspawn_pid = kids[0] if kids else None
            if self.nspawn_pid is not None:
                inits = _children(self.nspawn_pid, "systemd")
                if inits:
                    self.pid = inits[0]
                    self._pidns = _pidns(self.pid)
                    break
            self._boot_deadline_check(deadline, "the container's systemd to appear")
            time.sleep(0.05)
        self._start_watchdog()
        # The manager may not accept connections for a moment: retry until it answers.
        last = ""
        while True:
            self._check_launcher()
            left = deadline - time.monotonic()
            try:
                r = self.run(
                    ["systemctl", "is-system-running", "--wait"],
                    check=False,
                    timeout=max(1.0, left),
                )
                state = r.stdout.strip()
                last = (r.stdout + r.stderr).strip()
            except subprocess.TimeoutExpired:
                state = ""
                last = "timed out in systemctl is-system-running --wait"
            if state in ("running", "degraded"):
                self.boot_state = state
                break
            if state in ("maintenance", "stopping"):
                raise ContainerError(f"{self.name}: boot ended in {state!r}\n{self._log_tail()}")
            self._boot_deadline_check(deadline, f"boot to finish (last answer: {last!r})")
            time.sleep(0.2)
        if self.boot_state == "degraded":
            r = self.systemctl("--failed", "--no-legend", "--plain", check=False)
            self.failed_units = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
            print(
                f"[nspawn] {self.name} booted degraded; failed units: {self.failed_units}",
                file=sys.stderr,
            )

    def _boot_deadline_check(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            tail = self._log_tail()
            hint = INOTIFY_HINT if "Failed to create inotify object" in tail else ""
            raise ContainerError(f"{self.name}: timed out waiting for {what}{hint}\n{tail}")

    def _check_launcher(self) -> None:
        if self._launcher is not None and self._launcher.poll() is not None:
            raise ContainerError(
                f"{self.name}: systemd-nspawn exited with {self._launcher.returncode}\n"
                f"{self._log_tail()}"
            )

    def _start_watchdog(self) -> None:
        """A detached process that kills the container's PID 1 if we never get to stop()."""
        if not self._pidns:
            return
        args = [str(self.pid), self._pidns, str(self.max_lifetime + 20), self.name]
        args += [str(d) for d in self._cgroups]
        # One process (no orphaned `sleep` once we kill it), detached from our session.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no console log)"
        text = self.log_path.read_text(errors="replace").replace("\r", "")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return f"--- console of {self.name} ({self.log_path}), last {n} lines ---\n" + "\n".join(
            lines[-n:]
        )

    def is_running(self) -> bool:
        return self._launcher is not None and self._launcher.poll() is None and _alive(self.pid)

    def _kill_init(self, sig: int) -> None:
        if self.pid and self._pidns and _pidns(self.pid) == self._pidns:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, timeout: float = 30.0) -> None:
        """Power the container off; SIGKILL everything after ``timeout``. Idempotent."""
        if self._stopped:
            return
        try:
            if self._launcher is not None:
                self._terminate(self._launcher, timeout)
        finally:
            self._stopped = True
            self._cleanup()

    def _terminate(self, launcher: subprocess.Popen, timeout: float) -> None:
        if launcher.poll() is None:
            if self.pid:
                try:
                    r = self.run(["systemctl", "poweroff", "--no-block"], check=False, timeout=10)
                    ok = r.returncode == 0
                except (subprocess.TimeoutExpired, OSError):
                    ok = False
                if not ok:
                    self._kill_init(signal.SIGRTMIN + 4)  # systemd: SIGRTMIN+4 = poweroff
            else:
                # boot never got far enough: no orderly shutdown to wait for
                timeout = min(timeout, 5.0)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.nspawn_pid or launcher.pid, signal.SIGTERM)
            try:
                launcher.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"[nspawn] {self.name}: no poweroff in {timeout}s, killing", file=sys.stderr)
        # Whatever is left: PID 1 of the container first (that takes its whole PID namespace
        # down; killing nspawn alone would orphan it), then the launcher's process group.
        self._kill_init(signal.SIGKILL)
        if self.pid is None and self.nspawn_pid is not None:
            for child in _children(self.nspawn_pid):  # an init that never exec'ed systemd
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(launcher.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=10)

    def _cleanup(self) -> None:
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
        # cgroups empty out a moment after the processes are gone
        end = time.monotonic() + 5
        for d in self._cgroups:
            while True:
                _rmdir_tree(d)
                if not d.exists() or time.monotonic() > end:
                    break
                time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.rmdir(f"/run/systemd/nspawn/propagate/{self.name}")
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.log_path is not None and not self.keep_logs:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        with _LIVE_LOCK:
            if _LIVE.get(self.name) is self:
                del _LIVE[self.name]

    def __enter__(self) -> SystemdContainer:
        if self._launcher is None:
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.keep_logs = True
        self.stop()

    def __repr__(self) -> str:
        return f"<SystemdContainer {self.name} pid={self.pid} state={self.boot_state}>"

# --------------------------------------------------------------------------- pytest fixture


@pytest.fixture
def systemd_container(request: pytest.FixtureRequest):
    """Factory ``(bind_ro=(), bind=(), netns=None, **kw) -> SystemdContainer`` (booted).

    Every container it started is stopped at teardown, also when the test failed; in that
    case the containers' console log, failed units and journal tail are written to
    ``$TMPDIR/pdsvc-nspawn/<name>.diagnostics.txt`` (path printed to stderr).
    Skips (or fails under PDSVC_REQUIRE_E2E=1) where nspawn can't be used.
    """
    require_nspawn()
    started: list[SystemdContainer] = []
    failed_before = request.session.testsfailed

    def factory(
        bind_ro: Iterable[BindSpec] = (),
        bind: Iterable[BindSpec] = (),
        netns: str | None = None,
        *,
        name: str | None = None,
        timeout: float = DEFAULT_BOOT_TIMEOUT,
        **kwargs: Any,
    ) -> SystemdContainer:
        c = SystemdContainer(name, bind_ro=bind_ro, bind=bind, netns=netns, **kwargs)
        started.append(c)
        return c.start(timeout=timeout)

    yield factory

    failed = request.session.testsfailed > failed_before
    errors: list[BaseException] = []
    for c in reversed(started):
        if failed and c.is_running():
            c.keep_logs = True
            with contextlib.suppress(Exception):
                out = Path(tempfile.gettempdir()) / "pdsvc-nspawn" / f"{c.name}.diagnostics.txt"
                out.write_text(c.diagnostics())
                print(f"[nspawn] diagnostics of {c.name}: {out}", file=sys.__stderr__)
        try:
            c.stop()
        except Exception as e:  # stop the others first, then report
            errors.append(e)
    if errors:
        raise errors[0]
