"""How the main thread waits without missing a stop: a call that may block runs aside, on a
thread of its own, and a pause is slept in slices; ``should_stop`` is asked between them, so a
stop is seen within DUTY_SLICE_S whatever the call waits for (a probe of a hung engine, an
`nvidia-smi` that hangs, a router that does not answer)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .timings import DUTY_SLICE_S

T = TypeVar("T")


def aside(call: Callable[[], T], should_stop: Callable[[], bool],
          slice_s: float = DUTY_SLICE_S) -> T | None:
    """``call`` on a thread of its own, waited for in slices of ``slice_s`` with
    ``should_stop`` asked between them. None when ``should_stop`` said yes first (the call
    ends on its own: its thread is a daemon); an exception of ``call`` is raised here."""
    box: list[T] = []
    raised: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            raised.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="aside", daemon=True).start()
    while not done.wait(slice_s):
        if should_stop():
            return None
    if raised:
        raise raised[0]
    return box[0]


def rest(secs: float, should_stop: Callable[[], bool],
         sleep: Callable[[float], None] = time.sleep,
         clock: Callable[[], float] = time.monotonic,
         slice_s: float = DUTY_SLICE_S) -> bool:
    """Pause ``secs`` in slices of ``slice_s``; True as soon as ``should_stop`` says yes."""
    end = clock() + secs
    while True:
        if should_stop():
            return True
        left = end - clock()
        if left <= 0:
            return False
        sleep(min(slice_s, left))
