"""Serialise the cold JIT compiles of engines that share one cache directory."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .notify import Log
from .waiting import rest

if TYPE_CHECKING:
    Clock = Callable[[], float]


class JitLock:
    """Serialise the first (cold) start of engines that share one JIT cache directory.

    Concurrent cold compiles into one DeepGEMM/TVM/FlashInfer cache race (sglang PR #27604,
    DeepGEMM#301). The marker ``DIR/.pdsvc/warm-KEY`` records that engine KEY became healthy
    once with this cache; until then the engine takes an exclusive flock on
    ``DIR/.pdsvc/compile.lock`` and holds it until it is healthy. Warm engines take no lock and
    start in parallel. flock is released by the kernel when the process dies, so a crash never
    leaves a stale lock; the lock fd is close-on-exec, so the child never holds it.
    """

    def __init__(
        self,
        cache_dir: str,
        key: str,
        owner: str,
        log: Log,
        progress_every: float,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        retry_every: float = 1.0,
    ) -> None:
        self.cache_dir = cache_dir
        self.key = key
        self.owner = owner
        self.log = log
        self.progress_every = progress_every
        self.clock = clock
        self.sleep = sleep
        self.retry_every = retry_every
        self.state_dir = os.path.join(cache_dir, ".pdsvc")
        self.marker = os.path.join(self.state_dir, f"warm-{key}")
        self.lock_path = os.path.join(self.state_dir, "compile.lock")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def is_warm(self) -> bool:
        return os.path.exists(self.marker)

    def holder(self) -> str:
        """Who holds the lock, as the holder wrote it into the lock file."""
        try:
            with open(self.lock_path, encoding="utf-8", errors="replace") as handle:
                text = handle.read().strip()
        except OSError:
            text = ""
        return text or "another engine"

    def acquire(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        on_wait: Callable[[str], None] = lambda holder: None,
    ) -> bool:
        """Block until this process holds the lock; False if ``should_stop()`` turned true.

        Raises OSError when the cache directory cannot be used.
        """
        os.makedirs(self.state_dir, mode=0o750, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        started = self.clock()
        next_log = started
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
            now = self.clock()
            if now >= next_log:
                holder = self.holder()
                waited = f" ({now - started:.0f} s so far)" if now > started else ""
                self.log(
                    f"JIT cache cold for {self.key}: waiting for {holder} to finish "
                    f"compiling into {self.cache_dir}{waited}"
                )
                on_wait(holder)
                next_log = now + self.progress_every
            if rest(self.retry_every, should_stop, self.sleep, self.clock):
                os.close(fd)
                return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.owner} (pid {os.getpid()})\n".encode(), 0)
        self._fd = fd
        return True

    def mark_warm(self) -> None:
        """Write the marker atomically (tmp + rename), then release the lock."""
        tmp = f"{self.marker}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(f"{self.owner} healthy at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        os.replace(tmp, self.marker)
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the only fd of the open file releases the flock


def engine_fingerprint() -> str:
    """What the cached kernels depend on besides the engine's name: the SGLang (and torch)
    versions of this interpreter — the engine's own venv. An upgrade makes the cache cold
    again, so engines serialise their compiles after it too."""
    from importlib import metadata

    parts = []
    for dist in ("sglang", "torch"):
        try:
            parts.append(f"{dist}-{metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"no-{dist}")
    return "_".join(parts)
