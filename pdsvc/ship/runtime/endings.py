"""How a run ends, in one vocabulary: the exit statuses the process manager sees, the phase the
restart policy records for the next run (and `pdsvc status`, the metrics), and the endings that
join the two.

A run that started its child ends in exactly one ``Ending`` (stopping.Stopping.ending decides it,
the first that holds in the class's order). Each ending says, in one row of the table below,
what the restart policy records and what the unit's main process exits with; ``None`` there
means the child's own status (runtime_exit_code). The unit templates render ``Exit.GAVE_UP``
(``RestartPreventExitStatus=``, supervisord's ``exitcodes=``) from here.
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    """The runtime's own exit statuses (its --help's "Exit status" lists them)."""

    REFUSED = 1  # GPU busy, nvidia-smi broken, cache dir unusable: Restart= retries later
    USAGE = 2  # argparse's own exit status for usage errors
    ENDED = 70  # EX_SOFTWARE: the child ended on its own with status 0 (a server never should)
    DUTY = 71  # a duty of the runtime's own failed and cannot go on (duties.py): restarted
    PEER = 75  # EX_TEMPFAIL: stopped the engine to restart it (a peer restarted, a pair heal)
    GAVE_UP = 78  # EX_CONFIG: failed to become healthy N starts in a row; not restarted
    HUNG = 124  # --watchdog-secs ran out: killed a hung child (timeout(1)'s convention)
    CANNOT_EXEC = 126  # the shell's convention for "found but could not run"
    NOT_FOUND = 127  # the shell's convention for "command not found"


class Phase(str, enum.Enum):
    """The restart file's ``phase`` (NAME.restart.json): where the unit's last run stands, as
    the next run, `pdsvc status` and the textfile metrics read it. The values are the file's
    format: changing one is a new format version (statefile.py)."""

    STARTING = "starting"  # a run began; still so when it was killed before it served
    SERVING = "serving"  # healthy; still so when it was killed while serving (kill -9)
    STOPPED = "stopped"  # a stop: asked for, or the runtime's own (peer, heal)
    CRASHED = "crashed"  # the child exited or hung after it served
    FAILED_START = "failed-start"  # the child ended before it served (or was too late)
    GAVE_UP = "gave-up"  # --start-attempts failed starts in a row: exit Exit.GAVE_UP


class Ending(str, enum.Enum):
    """How a run that started its child ended; decided in this order (the first that holds).

    Each member carries what the restart policy records (``phase``), the exit status
    (``exit``; None: the child's own), and whether it is the runtime's own stop, which the
    process manager must restart (``own_stop``)."""

    phase: Phase
    exit: int | None
    own_stop: bool

    def __new__(cls, value: str, phase: Phase, exit: int | None,  # noqa: A002
                own_stop: bool = False) -> Ending:
        member = str.__new__(cls, value)
        member._value_ = value
        member.phase, member.exit, member.own_stop = phase, exit, own_stop
        return member

    #: a stop signal from the process manager: a clean stop or a failed one (the child's)
    ASKED = ("asked", Phase.STOPPED, None)
    #: not healthy within --start-timeout: our own stop, a failed start (it may give up)
    LATE = ("late", Phase.FAILED_START, Exit.REFUSED, True)
    #: our own stop: a --restart-with peer restarted
    PEER = ("peer", Phase.STOPPED, Exit.PEER, True)
    #: our own stop: the pair canary heals this engine's pair (or a cascade's cure)
    HEAL = ("heal", Phase.STOPPED, Exit.PEER, True)
    #: our own stop: a duty whose policy ends the runtime raised (duties.py)
    DUTY = ("duty", Phase.STOPPED, Exit.DUTY, True)
    #: no good liveness probe for --watchdog-secs: killed, counted as a crash
    HUNG = ("hung", Phase.CRASHED, Exit.HUNG)
    #: the child exited after it served (status 0 too: exit Exit.ENDED, so it is restarted)
    CRASHED = ("crashed", Phase.CRASHED, None)
    #: the child exited before it served, or could not be executed (status 0: Exit.ENDED)
    FAILED_START = ("failed_start", Phase.FAILED_START, None)
    #: a failed start (LATE or FAILED_START) that was the last of --start-attempts in a row
    GAVE_UP = ("gave_up", Phase.GAVE_UP, Exit.GAVE_UP)

    @property
    def failed_start(self) -> bool:
        """Counts against --start-attempts (and so may become GAVE_UP)."""
        return self.phase is Phase.FAILED_START
