"""A cache of resolved plans, keyed by everything a plan is a function of.

A plan is a pure function of the config text (and the path it is reported under), the host
topology and pdsvc's own code. Importing pydantic and building the schema costs several times
more than the rest of a render, so a render whose inputs did not change reads the plan back
from `$XDG_CACHE_HOME/pdsvc/plans/` instead. Any doubt — unreadable entry, other code, other
input — is a miss, and the plan is built and validated in full. PDSVC_NO_PLAN_CACHE=1 turns the
cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from pdsvc.plan.types import Plan, plan_from_dict
from pdsvc.topology import Topology

_PACKAGE = Path(__file__).resolve().parents[1]  # pdsvc/


def _dir() -> Path | None:
    if os.environ.get("PDSVC_NO_PLAN_CACHE") == "1":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pdsvc" / "plans"


def _code_fingerprint() -> str:
    """Size and mtime of every module of this pdsvc: a code change is a different key."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(_PACKAGE)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def key(config_source: str, config_text: str, topology: Topology | None,
        only_host: str = "") -> str:
    h = hashlib.sha256()
    layout = (topology.to_json(), topology.source) if topology else ("", "no host")
    for part in (config_source, config_text, *layout, only_host, _code_fingerprint()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def get(cache_key: str) -> Plan | None:
    d = _dir()
    if d is None:
        return None
    try:
        return plan_from_dict(json.loads((d / f"{cache_key}.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def put(cache_key: str, plan: Plan) -> None:
    """Best effort: a cache that cannot be written is simply not used."""
    d = _dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".plan-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(plan.to_dict(), fh)
        os.replace(tmp, d / f"{cache_key}.json")
    except OSError:
        pass
