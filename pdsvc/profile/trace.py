"""One rank's trace file, read whole or refused: the GPU activity it holds.

The file is what SGLang's scheduler writes for each TP rank when a capture ends
(sglang/srt/managers/scheduler_components/profiler_manager.py ``_stop_profile``):
torch.profiler's ``export_chrome_trace`` to ``[PREFIX-]ID-TP-N[-DP-N][-PP-N][-EP-N][-STAGE]
.trace.json.gz``, a gzipped Chrome trace (a JSON object whose ``traceEvents`` holds Kineto's
events). What a breakdown needs is three kinds of them, each ``"ph": "X"`` with ``ts`` and
``dur`` in microseconds: ``cat`` ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` (older
PyTorch wrote ``Kernel``, ``Memcpy``, ``Memset``).

Why a parser of our own, stdlib gzip and json, and not a library: HolisticTraceAnalysis
(PyPI ``traceinsight`` since 0.6) pulls in jupyterlab, pandas and plotly, and has no
attention or MoE groups; Perfetto's Python API downloads its trace_processor binary at run
time (perfetto python/perfetto/trace_processor/platform.py), which a GPU host without an
outbound network cannot do; SGLang's own analyzer (.claude/skills/llm-torch-profiler-analysis)
is not in its wheel. The format is plain JSON, and these few fields are all that is read.

A file is complete once it decompresses whole and parses: torch writes the JSON to a
temporary file and then gzips it into place (torch/profiler/profiler.py
``export_chrome_trace``), so a file that exists may still be growing, and one whose gzip
stream ends early is truncated.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from pdsvc.errors import PdsvcError

#: SGLang's name for a rank's trace (profiler_manager.py ``_stop_profile``): the TP rank, the
#: optional DP/PP/EP ranks, and the stage with profile_by_stage
NAME = re.compile(r"-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?"
                  r"(?:-(?P<stage>EXTEND|DECODE))?\.trace\.json\.gz$")
#: the event categories of GPU activity (lower-cased), and what each is
KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
         "memcpy": "memcpy", "memset": "memset"}


class TraceError(PdsvcError):
    """A trace that cannot be read, or that holds no GPU activity (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class GpuEvent:
    """One kernel or memory operation on the GPU (microseconds)."""

    name: str
    kind: str  # kernel | memcpy | memset
    ts: float
    dur: float
    stream: int | None = None


@dataclass(frozen=True)
class RankTrace:
    """What one rank's file holds."""

    path: str
    rank: int  # the TP rank (the file name's), else distributedInfo's
    stage: str | None  # EXTEND | DECODE (profile_by_stage), else None
    events: tuple[GpuEvent, ...]
    cpu_events: int  # other "X" events (CPU ops, CUDA runtime calls)

    @property
    def bytes(self) -> int:
        return Path(self.path).stat().st_size


def rank_of(name: str) -> tuple[int, str | None] | None:
    """(TP rank, stage) from a trace's file name, or None when it is not SGLang's."""
    m = NAME.search(name)
    return None if m is None else (int(m["tp"]), m["stage"])


def incomplete(path: Path) -> str | None:
    """Why ``path`` is not (yet) a whole trace, or None when it decompresses whole and
    parses as a JSON object. The same check ``read_trace`` makes, for a caller that polls."""
    try:
        load(path)
    except TraceError as err:
        return err.message
    return None


def load(path: Path) -> dict:
    """The trace's JSON object; TraceError (one line) for a file that is truncated, not gzip,
    not JSON, or not a Chrome trace."""
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except EOFError:
        raise TraceError(f"{path}: truncated (its gzip stream ends early: still being "
                         "written, or cut off)") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise TraceError(f"{path}: not a gzipped trace ({err})") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise TraceError(f"{path}: decompresses, but is not JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    return doc


def read_trace(path: Path) -> RankTrace:
    """One rank's GPU activity. TraceError when the file is not whole (``load``), or has no
    kernel events at all (a capture of the CPU only: ``activities`` without "GPU")."""
    doc = load(path)
    events: list[GpuEvent] = []
    others = 0
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        kind = KINDS.get(str(ev.get("cat", "")).lower())
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        if kind is None:
            others += 1
            continue
        args = ev.get("args")
        stream = args.get("stream") if isinstance(args, dict) else None
        events.append(GpuEvent(str(ev.get("name", "")), kind, ts, max(0.0, dur),
                               stream if isinstance(stream, int) else None))
    if not any(e.kind == "kernel" for e in events):
        raise TraceError(f"{path}: no kernel events ({others} CPU-side events): the capture "
                         "recorded no GPU activity (was it asked for activities [\"CPU\"] "
                         "only?)")
    named = rank_of(path.name)
    info = doc.get("distributedInfo")
    rank = named[0] if named else (info.get("rank", 0) if isinstance(info, dict) else 0)
    events.sort(key=lambda e: e.ts)
    return RankTrace(str(path), int(rank), named[1] if named else None, tuple(events), others)
