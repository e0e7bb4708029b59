"""The probes doctor runs under runtime.python (the SGLang venv's interpreter, not pdsvc's):
``versions.py`` and ``parser.py``, plain scripts beside this file, standard library only and
Python >= 3.9. This module, which runs in pdsvc, runs them as ``PY -I FILE MARKER ARGS`` and
reads the one result line each prints."""

from __future__ import annotations

import importlib.resources
import json
import subprocess
from collections.abc import Sequence
from typing import Any

from ..host import run

VERSIONS_MARKER = "pdsvc-doctor-versions"
PARSE_MARKER = "pdsvc-doctor-parse"
RESULT_PREFIX = "pdsvc-doctor-result "  # as the probes print it

MARKERS = {"versions.py": VERSIONS_MARKER, "parser.py": PARSE_MARKER}


def run_probe(python: str, probe: str, args: Sequence[str], timeout: float,
              stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``probe`` (a file of this package) under ``python``, isolated from the caller's
    environment variables and user site (-I). The marker names the probe on its command line
    (and lets a test's stand-in interpreter tell the probes apart). OSError and TimeoutExpired
    are the caller's."""
    with importlib.resources.as_file(importlib.resources.files(__name__) / probe) as path:
        return run([python, "-I", str(path), MARKERS[probe], *args], timeout, stdin=stdin)


def probe_source(probe: str) -> str:
    """A probe's source, for a launcher that feeds it on stdin (``python -I -``)."""
    return (importlib.resources.files(__name__) / probe).read_text()


def result_line(stdout: str) -> Any:
    """The JSON of the last result line; ValueError when there is none. The line may follow
    other output on the same line (a library's own unterminated write)."""
    for line in reversed(stdout.splitlines()):
        at = line.find(RESULT_PREFIX)
        if at >= 0:
            return json.loads(line[at + len(RESULT_PREFIX):])
    raise ValueError("no result line")
