"""What `pdsvc tune` measured, kept on disk as it goes, so that a re-run (after Ctrl-C, a lost
SSH session, a reboot) measures only what is missing.

The results of one question live in a directory of their own, ``RESULTS/KEY/``: KEY hashes
the search space's text, the baseline config's text and the host (its name and GPUs), so a
different space, config or host never reuses a measurement. Inside:

* ``results.json`` (``pdsvc-tune-results/2``): one entry per measurement, written whole
  after each (a temporary file, then rename(2): never half-written). /2 names the results as
  Result does; /1 files (``failed`` for ``failed-start``, ``again`` for ``first_invalid``)
  are read too, and written as /2 from their next measurement on;
* ``configs/NAME.yaml``: each candidate's config as applied;
* ``bench/NAME-rI/``: bench_serving's files of each measurement;
* ``best.yaml``, ``tune.png``: the answer, once there is one.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdsvc.errors import OutputError

from .space import Value

RESULTS_SCHEMA = "pdsvc-tune-results/2"

RESULTS_FILE = "results.json"

class Result(str, enum.Enum):
    """What one measurement of a candidate came to: one word, the fact that decides."""

    MEASURED = "measured"  # the highest rate meeting the SLO (below a rate that missed it)
    LOWER_BOUND = "lower-bound"  # the SLO held at the range's top: goodput ≥ rates.high
    NO_RATE = "no-rate"  # no rate in the range met the SLO: goodput below rates.low
    BELOW = "below"  # lost the race: missed the SLO at the rate to beat (``above``), 1 run
    INVALID = "invalid"  # a run's gate failed, and again when measured once more
    FAILED_START = "failed-start"  # the switch failed: the engine's own words say why
    OUTAGE = "outage"  # not switched: serving would stop (measured only with --allow-outage)

    def __str__(self) -> str:
        return self.value


#: the results that found a rate meeting the SLO (a goodput to say)
RATED = (Result.MEASURED, Result.LOWER_BOUND)
#: the valid measurements (no-rate as 0; below: less than the rate it lost at):
#: "only valid repeats count"
COUNTED = (*RATED, Result.NO_RATE, Result.BELOW)


def _from_first_format(doc: dict[str, Any]) -> dict[str, Any]:
    """A measurement as pdsvc-tune-results/1 wrote it, as /2 writes it: a failed start was
    ``failed``, the first of two tries' reason ``again``."""
    doc = dict(doc)
    if doc.get("status") == "failed":
        doc["status"] = Result.FAILED_START.value
    if "again" in doc:
        doc["first_invalid"] = doc.pop("again")
    return doc


#: the formats read, each with how one of its measurements reads as today's
READS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "pdsvc-tune-results/1": _from_first_format, RESULTS_SCHEMA: dict}


@dataclass
class Point:
    """One bench run of a measurement: the rate, whether it met the SLO, its latencies."""

    rate: float
    met: bool | None  # None: invalid (a gate failed)
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None


@dataclass
class Measurement:
    """One measurement of one candidate (the baseline and the best are measured
    ``space.repeats`` times: ``repeat`` 0, 1, 2 …)."""

    key: str  # the candidate's changes, canonical (changes_key; the baseline's: BASELINE_KEY)
    name: str
    changes: list[tuple[str, Value]]
    repeat: int
    status: Result
    why: str = ""  # failed/invalid/no-rate: what says so (the engine's own last error line)
    rate: float | None = None  # goodput: the highest rate meeting the SLO (requests/s)
    above: float | None = None  # the lowest rate that missed it, above ``rate`` (None: none)
    tokens_per_s: float | None = None  # output tokens/s of the run at that rate
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    gates: dict[str, str] = field(default_factory=dict)  # gate -> pass/fail/unchecked
    apply_seconds: float = 0.0  # switching the deployment to it (apply, pairs proven)
    seconds: float = 0.0  # all it cost, apply and the SLO search
    points: list[Point] = field(default_factory=list)
    first_invalid: str = ""  # measured twice: why the first was (a transient is no verdict)

    @property
    def counted(self) -> bool:
        """Whether its goodput counts (a valid measurement)."""
        return self.status in COUNTED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Measurement:
        """A measurement as the current format writes it (READS reads the older ones)."""
        doc = dict(doc)
        doc["changes"] = [(str(p), v) for p, v in doc.get("changes", [])]
        doc["points"] = [Point(**p) for p in doc.get("points", [])]
        doc["status"] = Result(doc["status"])
        return cls(**doc)


def changes_key(changes: tuple[tuple[str, Value], ...] | list[tuple[str, Value]]) -> str:
    """The changes as one canonical string (sorted by path): the candidate's identity."""
    return json.dumps(sorted(([p, v] for p, v in changes), key=lambda x: x[0]),
                      separators=(",", ":"), sort_keys=True)


#: the baseline's key: no changes
BASELINE_KEY = changes_key(())


def results_key(space_text: str, config_text: str, host: str) -> str:
    """The directory name of one question: the space, the baseline config and the host."""
    h = hashlib.sha256()
    for part in (space_text, config_text, host):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def write_atomic(path: Path, text: str) -> None:
    """The whole file or the old one, never half (a temporary beside it, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Store:
    """The measurements of one question, in ``directory`` (RESULTS/KEY)."""

    def __init__(self, directory: Path, about: dict[str, Any]) -> None:
        self.directory = directory
        self.about = about  # what the key hashes, in words (space file, config file, host)
        self.outcomes: list[Measurement] = []
        path = directory / RESULTS_FILE
        if path.is_file():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                upgrade = READS.get(doc.get("format"))
                if upgrade is None:
                    raise ValueError(f"format {doc.get('format')!r}")
                self.outcomes = [Measurement.from_dict(upgrade(o)) for o in doc["outcomes"]]
            except (ValueError, KeyError, TypeError) as e:
                raise OutputError(f"{path}: not results this pdsvc reads ({e})",
                                  hint="move it away to measure again") from None

    def get(self, key: str, repeat: int = 0) -> Measurement | None:
        for o in self.outcomes:
            if o.key == key and o.repeat == repeat:
                return o
        return None

    def of(self, key: str) -> list[Measurement]:
        """Every measurement of the candidate, in repeat order."""
        return sorted((o for o in self.outcomes if o.key == key), key=lambda o: o.repeat)

    def add(self, outcome: Measurement) -> None:
        self.outcomes = [o for o in self.outcomes
                         if (o.key, o.repeat) != (outcome.key, outcome.repeat)] + [outcome]
        doc = {"format": RESULTS_SCHEMA, **self.about,
               "outcomes": [o.to_dict() for o in self.outcomes]}
        write_atomic(self.directory / RESULTS_FILE, json.dumps(doc, indent=1) + "\n")

    def config_path(self, name: str) -> Path:
        return self.directory / "configs" / f"{name}.yaml"

    def bench_dir(self, name: str, repeat: int, second: bool = False) -> Path:
        """bench_serving's files of one measurement (``second``: of its second try, the first
        one invalid)."""
        return self.directory / "bench" / f"{name}-r{repeat}{'-again' if second else ''}"
