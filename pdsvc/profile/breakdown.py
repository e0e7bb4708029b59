"""Where one role's GPU time goes, from its ranks' traces: kernels, groups, how busy the GPU
was, which rank stands out, and how far a faster kernel could take the role.

Three measures, each over every rank of every engine profiled (pooled: each rank's
microseconds added up):

* **share**: of the GPU time, the sum of every GPU activity's duration (kernels, copies,
  memsets): where the GPU's time goes. What "63 % of decode time in one kernel" means.
* **busy**: the union of the activity intervals over the window, first activity's start to
  last one's end: how much of the time the GPU works at all (the rest is the scheduler's CPU
  time, launch gaps, waits).
* **the ceiling** (Amdahl's law): the role's tok/s if one kernel or group ran ``s`` times
  faster, ``1 / (1 - p + p / s)`` with ``p`` the time that kernel or group runs (the union
  of its intervals, so streams that overlap are not counted twice) over the window. With
  ``s`` infinite: the kernel took no time, ``1 / (1 - p)``. It assumes the rest of the step
  keeps its time: an upper bound when other work overlaps the kernel on another stream, and
  a communication kernel's time includes its wait for the slowest rank.

A rank stands out when its compute (its GPU time less communication, which waits for the
others) is more than IMBALANCE from the median rank's: under tensor parallelism every step
waits for the slowest rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pdsvc.profile.groups import COMMUNICATION, GROUPS, rule_for
from pdsvc.profile.trace import GpuEvent, RankTrace

#: a rank whose compute differs from the median rank's by more than this is named
IMBALANCE = 0.10
#: the speed-ups a ceiling is given for (None: the kernel or group takes no time)
SPEEDUPS: tuple[float | None, ...] = (2.0, 4.0, None)


def union(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def speedup(p: float, s: float | None) -> float:
    """Amdahl: the whole's speed-up when a part taking ``p`` of the time runs ``s`` x faster
    (None: it takes no time)."""
    rest = 1.0 - p
    if s is None:
        return float("inf") if rest <= 0 else 1.0 / rest
    return 1.0 / (rest + p / s)


@dataclass(frozen=True)
class Activity:
    """One kernel (by name) or one group, over all ranks."""

    name: str
    group: str
    rule: str  # the pattern that put it in its group
    us: float  # its GPU time, all ranks
    count: int
    share: float  # of the GPU time
    window_share: float  # the time it runs (union per rank) over the window: the ceiling's p
    by_rank: dict[str, float] = field(default_factory=dict)  # "ENGINE/RANK" -> us

    def ceiling(self, tok_s: float | None) -> dict[str, float | None]:
        """tok/s at each speed-up of SPEEDUPS (None without a measured tok/s)."""
        return {speedup_key(s): (None if tok_s is None else tok_s * speedup(self.window_share, s))
                for s in SPEEDUPS}


def speedup_key(s: float | None) -> str:
    return "zero" if s is None else f"{s:g}x"


@dataclass(frozen=True)
class RankRow:
    engine: str
    rank: int
    path: str
    gpu_us: float
    window_us: float
    busy_us: float
    compute_us: float  # gpu_us less communication
    kernels: int  # kernel events

    @property
    def label(self) -> str:
        return f"{self.engine}/TP{self.rank}"


@dataclass(frozen=True)
class Breakdown:
    role: str
    ranks: tuple[RankRow, ...]
    kernels: tuple[Activity, ...]  # by GPU time, largest first
    groups: tuple[Activity, ...]  # in GROUPS order
    outliers: tuple[tuple[str, float], ...]  # (rank label, compute / median - 1)

    @property
    def gpu_us(self) -> float:
        return sum(r.gpu_us for r in self.ranks)

    @property
    def window_us(self) -> float:
        return sum(r.window_us for r in self.ranks)

    @property
    def busy_share(self) -> float:
        return sum(r.busy_us for r in self.ranks) / self.window_us if self.window_us else 0.0

    @property
    def top_group(self) -> Activity:
        return max(self.groups, key=lambda g: g.us)


def breakdown(role: str, traces: Sequence[tuple[str, RankTrace]]) -> Breakdown:
    """The breakdown of ``traces``: (engine name, one rank's trace) each."""
    ranks = tuple(_rank_row(engine, t) for engine, t in traces)
    gpu = sum(r.gpu_us for r in ranks) or 1.0
    window = sum(r.window_us for r in ranks) or 1.0
    kernels: dict[str, list[tuple[str, RankTrace, GpuEvent]]] = {}
    groups: dict[str, list[tuple[str, RankTrace, GpuEvent]]] = {g: [] for g in GROUPS}
    for engine, t in traces:
        for e in t.events:
            kernels.setdefault(e.name, []).append((engine, t, e))
            groups[rule_for(e.name, e.kind).group].append((engine, t, e))
    by_kernel = [_activity(name, seen, gpu, window) for name, seen in kernels.items()]
    by_group = [_activity(g, seen, gpu, window, group=g) for g, seen in groups.items()]
    return Breakdown(role, ranks, tuple(sorted(by_kernel, key=lambda a: -a.us)),
                     tuple(by_group), outliers(ranks))


def _rank_row(engine: str, t: RankTrace) -> RankRow:
    start = min(e.ts for e in t.events)
    end = max(e.ts + e.dur for e in t.events)
    gpu = sum(e.dur for e in t.events)
    comm = sum(e.dur for e in t.events if rule_for(e.name, e.kind).group == COMMUNICATION)
    return RankRow(engine, t.rank, t.path, gpu, end - start,
                   union((e.ts, e.ts + e.dur) for e in t.events), gpu - comm,
                   sum(1 for e in t.events if e.kind == "kernel"))


def _activity(name: str, seen: list[tuple[str, RankTrace, GpuEvent]], gpu: float,
              window: float, group: str | None = None) -> Activity:
    by_rank: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for engine, t, e in seen:
        label = f"{engine}/TP{t.rank}"
        by_rank[label] = by_rank.get(label, 0.0) + e.dur
        spans.setdefault(label, []).append((e.ts, e.ts + e.dur))
    us = sum(by_rank.values())
    running = sum(union(s) for s in spans.values())
    if group is None:
        first = seen[0][2]
        rule = rule_for(first.name, first.kind)
        group, pattern = rule.group, rule.pattern
    else:
        pattern = ""
    return Activity(name, group, pattern, us, len(seen), us / gpu, running / window, by_rank)


def outliers(ranks: Sequence[RankRow]) -> tuple[tuple[str, float], ...]:
    """The ranks whose compute is more than IMBALANCE from the median rank's."""
    if len(ranks) < 2:
        return ()
    median = statistics.median(r.compute_us for r in ranks)
    if median <= 0:
        return ()
    return tuple((r.label, r.compute_us / median - 1.0) for r in ranks
                 if abs(r.compute_us / median - 1.0) > IMBALANCE)
