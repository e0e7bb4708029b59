"""How long a step may take in each phase, how long one call to the service manager may take,
and how a step fails when it takes longer."""

from __future__ import annotations

from dataclasses import dataclass

#: --drain-timeout's and --step-timeout's defaults (Bounds.drain_secs, Bounds.ready_secs)
DRAIN_SECS, STEP_SECS = 60.0, 3600.0
#: How long one `systemctl show` may take while a step waits (a busy systemd answers late).
SHOW_TIMEOUT_S = 30.0
#: Seconds per XML-RPC call of apply to supervisord: stopping a group waits for its programs.
RPC_TIMEOUT_S = 30.0


class StepFailed(Exception):
    """A step did not end with its units serving; the message says what was last seen."""


@dataclass(frozen=True)
class Bounds:
    drain_secs: float = DRAIN_SECS  # in-flight requests of an engine taken out of the router
    ready_secs: float = STEP_SECS  # restarted to serving (healthy, registered, canary good)
    #: between two looks while a step waits (loopback HTTP, a state file): every look later
    #: than the moment it waits for is a moment serving waits too (1P1D: the outage)
    poll_secs: float = 0.1
    #: between two asks of the service manager once a unit runs again (a subprocess each)
    manager_secs: float = 0.5
