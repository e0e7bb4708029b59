"""Exit statuses and timing constants shared by the runtime's modules."""

from __future__ import annotations

import signal

EXIT_REFUSED = 1  # GPU busy, nvidia-smi broken, cache dir unusable: Restart= retries later
EXIT_USAGE = 2  # argparse's own exit status for usage errors
EXIT_PEER = 75  # EX_TEMPFAIL: stopped the engine to restart it (a peer restarted, a pair heal)
EXIT_GAVE_UP = 78  # EX_CONFIG: failed to become healthy N starts in a row; not restarted
EXIT_HUNG = 124  # --watchdog-secs ran out: killed a hung child (timeout(1)'s convention)
EXIT_CANNOT_EXEC = 126  # the shell's convention for "found but could not run"
EXIT_NOT_FOUND = 127  # the shell's convention for "command not found"

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

STOP_GRACE_S = 30.0  # after this long without exit following a stop, say so in the log
CHILD_WAIT_SLICE_S = 1.0  # longest a loop blocks before re-checking for a stop request
#: how often the serving loop looks whether one of its duties is due, and whether a stop came
#: (its child wait blocks this long): a stop's delay before the engine leaves the router and
#: gets the signal, and a finished canary round's before it is recorded (apply waits on both)
DUTY_SLICE_S = 0.05
KILL_WAIT_S = 30.0  # after SIGKILL, how long to wait for the tree to be gone (GPU memory freed)
