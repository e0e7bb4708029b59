"""The state files shared between processes: one kind each, one reader and one writer.

A unit's runtime writes its state into the unit's ``StateDirectory=`` (``--state-dir``) as
NAME.KIND.json; `pdsvc status`, `pdsvc apply`, the textfile metrics and the other runtimes of
the deployment read them (docs/lifecycle/state-files.md lists each file's writer, readers,
fields and when it is removed). `pdsvc apply` replaces the runtime while older runtimes and a
newer `pdsvc status` read the same files, so every file says its ``format``: a reader that
meets a newer one says so in one line and reads nothing from it, rather than guess. A file
without the key was written before formats (format 1's fields) and is read as format 1.

Files are written whole or not at all (a temporary file renamed over the old one) and read
leniently: a missing, unreadable or malformed file is no state, never a reason to stop serving.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

#: the format this code writes and the newest it reads
FORMAT = 1


class Kind(str, enum.Enum):
    """The kinds of state file: NAME.KIND.json in the state directory."""

    RESTART = "restart"  # the restart policy's (policy.py): how the last run ended, heals
    CANARY = "canary"  # the pair canary's (canary.py): each pair's last rounds
    METRICS = "metrics"  # the textfile's counters (metrics.py): starts by cause
    HOLD = "hold"  # pdsvc apply's (hold.py, written by root): out of the router, fenced peers
    PROFILE = "profile"  # the runtime's answer to a profile hold (profiled.py): taken, paused
    DUTIES = "duties"  # the runtime's duties that failed (duties.py): counts, last words
    HEAL_ALL = "heal-all"  # DEPLOYMENT.heal-all.json (cascade.py): the cascade's cure marker


class NewerFormat(ValueError):
    """A state file written by a newer pdsvc than this one."""


def state_path(directory: str, name: str, kind: Kind) -> str:
    """The one name of a state file: NAME.KIND.json in ``directory``."""
    return os.path.join(directory, f"{name}.{Kind(kind).value}.json")


def read_state(path: str) -> dict[str, Any] | None:
    """The state in ``path``; None when it is missing, unreadable or not a JSON object.
    Raises NewerFormat (one line, naming the file) for a format newer than FORMAT."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    return parse_state(text, path)


def parse_state(text: str, where: str) -> dict[str, Any] | None:
    """read_state for a file's text read elsewhere (apply reads through its Host); ``where``
    names it in the NewerFormat line."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    found = doc.get("format", 1)
    if not isinstance(found, int) or isinstance(found, bool) or found > FORMAT:
        raise NewerFormat(f"{where}: format {found!r}, newer than this pdsvc's {FORMAT}: "
                          "not read (upgrade pdsvc on this host)")
    return doc


def read_known(path: str | None, say: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """read_state for readers that go on without the file: a newer format is ``say``-ed in
    one line (once per call) and read as no state."""
    if not path:
        return None
    try:
        return read_state(path)
    except NewerFormat as e:
        if say is not None:
            say(str(e))
        return None


def write_state(path: str, doc: dict[str, Any], *, mode: int | None = None) -> dict[str, Any]:
    """Replace ``path`` with ``doc`` and its format, atomically, creating its directory (0750)
    if need be; ``mode``: the file's (default 0600). Best effort: state that cannot be written
    is lost, never a reason to stop serving. Returns what was written."""
    doc = {"format": FORMAT, **{k: v for k, v in doc.items() if k != "format"}}
    write_atomic(path, json.dumps(doc), mode=mode)
    return doc


def write_atomic(path: str, text: str, *, mode: int | None = None,
                 dir_mode: int = 0o750) -> None:
    """Replace ``path`` with ``text``, whole or not at all: a temporary file in the same
    directory (a dot name that does not end like ``path``) renamed over it; ``mode``: the
    file's (default mkstemp's 0600). Best effort, like write_state."""
    directory = os.path.dirname(path) or "."
    with contextlib.suppress(OSError):
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=dir_mode, exist_ok=True)
            # mkdir(2)'s mode is masked by the umask (the units' UMask=0027 made 0755 a 0750)
            os.chmod(directory, dir_mode)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise
