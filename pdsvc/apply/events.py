"""What `pdsvc apply`'s flow reports as it runs a rollout, typed: a program that drives apply
(`pdsvc tune`, tune/live.py) decides on these, never on the printed lines; the command prints
each as ``words`` says (one home for the text).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepStarted:
    index: int  # 1-based, of ``total`` (across hosts: the global numbering)
    total: int
    action: str  # restart, start, stop, … (rollout.Step.action)
    units: tuple[str, ...]
    takes: tuple[str, ...] = ()  # units its restart takes with it (PartOf=)


@dataclass(frozen=True)
class StepDone:
    index: int
    total: int
    seconds: float


@dataclass(frozen=True)
class StepFailed:
    index: int
    total: int
    units: tuple[str, ...]
    why: str  # execute.StepFailed's words: what failed, the engine's state


@dataclass(frozen=True)
class InstallFailed:
    status: int  # install.sh's exit status; no unit was restarted


ApplyEvent = StepStarted | StepDone | StepFailed | InstallFailed
#: the events that end a rollout unapplied
FAILURES = (StepFailed, InstallFailed)


def words(e: ApplyEvent) -> str:
    """The event as `pdsvc apply` prints it (without its ``pdsvc apply: `` prefix)."""
    if isinstance(e, StepStarted):
        return (f"step {e.index}/{e.total}: {e.action} {', '.join(e.units)}"
                + (f" (with {', '.join(e.takes)})" if e.takes else ""))
    if isinstance(e, StepDone):
        return f"step {e.index}/{e.total} done in {e.seconds:.1f} s"
    if isinstance(e, StepFailed):
        return f"step {e.index}/{e.total} failed: {e.why}"
    return f"install.sh failed ({e.status}); no unit was restarted"
