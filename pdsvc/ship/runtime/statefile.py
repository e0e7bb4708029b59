"""The runtime's small state files (restart policy, pair canary): JSON, written whole or not at
all (a temporary file renamed over the old one), read leniently. `pdsvc status` reads them with
the same code."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile


def state_path(directory: str, name: str, kind: str) -> str:
    """The one name of a unit's state file: NAME.KIND.json (KIND: restart, the restart
    policy's; canary, the pair canary's; metrics, the textfile's counters)."""
    return os.path.join(directory, f"{name}.{kind}.json")


def read_json(path: str) -> dict | None:
    """The object in ``path``; None when it is missing, unreadable or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_json(path: str, doc: dict) -> None:
    """Replace ``path`` with ``doc`` atomically, creating its directory (0750) if need be.
    Best effort: state that cannot be written is lost, never a reason to stop serving."""
    write_atomic(path, json.dumps(doc))


def write_atomic(path: str, text: str, *, mode: int | None = None,
                 dir_mode: int = 0o750) -> None:
    """Replace ``path`` with ``text``, whole or not at all: a temporary file in the same
    directory (a dot name that does not end like ``path``) renamed over it; ``mode``: the
    file's (default mkstemp's 0600). Best effort, like write_json."""
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
