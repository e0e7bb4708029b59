"""Every knob of `pdsvc profile` and its default, in one place (the CLI takes its defaults from
here), and the errors a run ends in, each with its exit code (docs/commands.md)."""

from __future__ import annotations

from dataclasses import dataclass

from pdsvc.errors import PdsvcError
from pdsvc.ship.runtime.timings import PROFILE_HOLD_MAX_S

ROLES = ("prefill", "decode")  # the order `--role both` captures them in
#: the room a capture's hold needs beyond --write-timeout: the runtime's answer, the steps,
#: the engine's /health after the write
HOLD_SPARE_S = 60.0
#: the longest --write-timeout may be: a hold longer than PROFILE_HOLD_MAX_S is not honoured
MAX_WRITE_TIMEOUT_S = PROFILE_HOLD_MAX_S - HOLD_SPARE_S


@dataclass(frozen=True)
class ProfileOptions:
    roles: tuple[str, ...] = ("decode",)  # captured one after the other, in ROLES order
    engine: str | None = None  # one engine (its unit name), else every engine of the role
    steps: int = 20  # forward steps each engine records
    activities: tuple[str, ...] = ("GPU",)  # SGLang's: GPU (kernels), CPU (ops)
    by_stage: bool = False  # SGLang's profile_by_stage: only the engine's own stage's steps
    load: bool = True  # drive bench_serving through the router (else: live traffic only)
    concurrency: int | None = None  # requests in flight (None: the decodes' batch limits)
    rate: float | None = None  # a Poisson rate instead of a concurrency
    input_len: int = 1024
    output_len: int = 256
    warmup_timeout: float = 120.0  # s: for every batch to be full, with the load running
    measure_secs: float = 5.0  # s: the window tok/s is measured over, before the capture
    write_timeout: float = 300.0  # s: for every rank's trace to be whole once asked
    top: int = 10  # kernels a table shows


class ProfileError(PdsvcError):
    """A capture failed: an engine refused it, or a trace did not come whole (exit 1)."""

    exit_code = 1


class CannotProfile(PdsvcError):
    """pdsvc profile cannot run here: not root, the router or an engine does not answer, a
    runtime that does not take the hold, a hold already there (exit 3)."""

    exit_code = 3
