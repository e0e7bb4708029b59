"""The runtime's small state files (restart policy, pair canary): JSON, written whole or not at
all (a temporary file renamed over the old one), read leniently. `pdsvc status` reads them with
the same code."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile


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
    directory = os.path.dirname(path) or "."
    with contextlib.suppress(OSError):
        os.makedirs(directory, mode=0o750, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise
