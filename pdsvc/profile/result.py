"""What one `pdsvc profile` run found: per role, the engines captured (their traces, how the
batch was known full, the tok/s measured) and the breakdown of their traces."""

from __future__ import annotations

from dataclasses import dataclass

from pdsvc.profile.breakdown import Breakdown


@dataclass(frozen=True)
class EngineCapture:
    """One engine's capture."""

    name: str  # its unit (program) name
    url: str  # where it was asked, directly
    trace_dir: str  # the directory its ranks wrote to
    traces: tuple[str, ...]  # one file per TP rank, rank order
    batch: str  # how the batch was known full when the capture began
    tok_s: float | None  # its tokens/s under the load, None when it could not be read
    write_s: float | None = None  # from /start_profile to its last rank's file complete


@dataclass(frozen=True)
class RoleResult:
    role: str  # prefill | decode
    steps: int  # forward steps each engine was asked for
    tok_s_how: str  # what the tok/s is (the counter and the window)
    engines: tuple[EngineCapture, ...]
    breakdown: Breakdown

    @property
    def tok_s(self) -> float | None:
        """The role's tok/s: its engines' together (None if one could not be read)."""
        values = [e.tok_s for e in self.engines]
        return None if any(v is None for v in values) else sum(v or 0.0 for v in values)


@dataclass(frozen=True)
class ProfileRun:
    """A whole run: what was loaded, where the traces are, each role's result."""

    run_id: str
    trace_root: str  # STATE_DIR/profiles/RUN_ID
    load: str  # the load, in words ("bench_serving 8 req/s, 1024 in, 256 out" / "live traffic")
    roles: tuple[RoleResult, ...]
    warmup_s: float  # from the load's start until every batch was full
    capture_s: float  # from the first /start_profile until the last trace was whole
