"""The start phase and the peer watch: loops that end in an Outcome, and what SERVING's ends in."""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .endings import Ending
from .probe import NoAnswerKind, ProbeResult, at_once, http_probe
from .timings import DUTY_SLICE_S, START_PROBE_TIMEOUT_S
from .waiting import aside

if TYPE_CHECKING:  # aliases for annotations only: "int | None" cannot be evaluated on 3.9
    Clock = Callable[[], float]
    ChildWait = Callable[[float], int | None]


class End(str, enum.Enum):
    """Why a loop of this module ended, when that is not yet how the run ends: the run's
    ``Ending`` follows from it and from whether the engine served (stopping.Stopping.ending). A
    loop that decides the ending itself (hung, a peer's restart, a heal, too late) returns
    that ``Ending``. Both are ``str`` enums, so an Outcome compares with the word:
    ``Outcome("exited", 3) == Outcome(End.EXITED, 3)``."""

    HEALTHY = "healthy"
    EXITED = "exited"  # the child exited (returncode set)
    STOP = "stop"  # a stop signal arrived


class Outcome(NamedTuple):
    kind: End | Ending
    returncode: int | None = None
    elapsed: float = 0.0
    detail: str = ""


class PeerWatch:
    """``--restart-with``: restart this engine when a peer on another host restarts.

    systemd's PartOf= couples units of one host only. A NIXL decode cannot serve a prefill
    that restarted under it (sglang #33789), so a decode whose prefill runs elsewhere watches
    that prefill's /health: seen healthy, then failing ``down_after`` probes in a row (dead by
    the same measure as the watchdog's) of which at least one was refused (its port closed:
    the process was gone, not merely slow or unreachable) = it is restarting. This engine then
    restarts at once, as PartOf= would stop it with its prefill: it reloads while the prefill
    does, and never talks to the prefill's successor with the state of the old one (a decode
    that did would leave that successor stale toward this engine's own successor: smg #2382).
    A peer never seen healthy (still loading when this engine came up) is not a restart.

    A refused connection from a peer seen healthy is confirmed at once: while one is
    ``confirming``, the caller probes again every PEER_CONFIRM_S, not every --peer-interval,
    so a peer whose process is gone is known within a second, across hosts as on one. A probe
    that times out (a slow peer, a network blip) never speeds it up: it counts, at the usual
    pace, and without a refusal it is never a restart.
    """

    def __init__(self, urls: Sequence[str], down_after: int, timeout: float,
                 probe: Callable[[str, float], ProbeResult] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.log = log or (lambda message: None)
        self.urls = list(urls)
        self.down_after = down_after
        self.timeout = timeout
        self.probe = probe or http_probe
        self.seen_up = dict.fromkeys(self.urls, False)
        self.failures = dict.fromkeys(self.urls, 0)
        self.refused = dict.fromkeys(self.urls, False)

    @property
    def confirming(self) -> bool:
        """Whether a peer seen healthy has refused a connection since its last good probe."""
        return any(self.seen_up[u] and self.refused[u] for u in self.urls)

    def check(self) -> str | None:
        """Probe every peer once, all at once (many unreachable peers cost one timeout, not
        one each, so they cannot starve this engine's own watchdog); the reason to restart,
        or None."""
        results = at_once({u: functools.partial(self.probe, u, self.timeout) for u in self.urls},
                          self.timeout + 1.0)
        for url in self.urls:
            result = results.get(url) or ProbeResult(False, f"timed out after {self.timeout:g} s")
            if not result.ok:
                if self.seen_up[url] and not self.failures[url]:
                    self.log(f"peer {url}: {result.detail}; watching it")
                self.failures[url] += 1
                self.refused[url] |= result.no_answer is NoAnswerKind.REFUSED
                down, refused = self.failures[url], self.refused[url]
                if self.seen_up[url] and down >= self.down_after and refused:
                    return (f"{url} failed {down} probes in a row and its port was closed: it "
                            "is restarting, and a NIXL decode must come back with it, fresh "
                            "(sglang #33789)")
                continue
            down, refused = self.failures[url], self.refused[url]
            self.failures[url], self.refused[url] = 0, False
            if not self.seen_up[url]:
                self.log(f"peer {url} is up: a restart of it will restart this engine")
            elif down:
                self.log(f"peer {url} is back after {down} failed probe(s), "
                         f"{'not refused' if not refused else 'too few'}: not a restart")
            self.seen_up[url] = True
        return None


def wait_until_healthy(
    probe: Callable[[], ProbeResult],
    child_wait: ChildWait,
    *,
    what: str,
    log: Callable[[str], None],
    status: Callable[[str], None],
    poll_interval: float,
    progress_every: float,
    should_stop: Callable[[], bool],
    clock: Clock = time.monotonic,
    started: float | None = None,
) -> Outcome:
    """Probe every ``poll_interval`` s until 200, the child exits, or a stop arrives.

    No deadline here: systemd's ``TimeoutStartSec=`` bounds the start. ``child_wait(t)``
    waits up to t seconds and returns the child's returncode if it exited.
    """
    started = clock() if started is None else started
    next_log = clock() + progress_every
    while True:
        if should_stop():
            return Outcome(End.STOP)
        returncode = child_wait(0)
        if returncode is not None:
            return Outcome(End.EXITED, returncode)
        attempt_at = clock()
        # aside: a stop is seen within DUTY_SLICE_S while a probe of a hung engine waits out
        # its timeout (the probe is left to end on its own)
        result = aside(probe, should_stop, DUTY_SLICE_S)
        if result is None:
            return Outcome(End.STOP)
        if result.ok:
            return Outcome(End.HEALTHY, elapsed=clock() - started)
        now = clock()
        if now >= next_log:
            line = f"waiting for {what} ({result.detail}) — {now - started:.0f} s since start"
            log(line)
            status(line)
            next_log = now + progress_every
        while True:  # until the next probe, a stop seen within DUTY_SLICE_S
            left = attempt_at + poll_interval - clock()
            returncode = child_wait(max(0.0, min(left, DUTY_SLICE_S)))
            if returncode is not None:
                return Outcome(End.EXITED, returncode)
            if left <= DUTY_SLICE_S:
                break
            if should_stop():
                return Outcome(End.STOP)


def wait_for_urls(
    urls: Sequence[str],
    *,
    log: Callable[[str], None],
    status: Callable[[str], None],
    poll_interval: float,
    progress_every: float,
    should_stop: Callable[[], bool],
    probe: Callable[[str], ProbeResult] = lambda url: http_probe(url, START_PROBE_TIMEOUT_S),
    sleep: Callable[[float], None] = time.sleep,
    clock: Clock = time.monotonic,
) -> bool:
    """Block until every URL answers 200 at once (``--wait-for``); False if a stop arrived.

    The ordering that systemd's ``After=`` on ``Type=notify`` units gives, for managers that
    only order spawns (supervisord's ``priority=``): the router must not start before both
    engines are healthy, because router 0.3.2 drops a worker that was not up in time.
    """

    def idle(timeout: float) -> None:
        sleep(min(timeout, DUTY_SLICE_S))
        return None

    started = clock()
    log(f"waiting for {', '.join(urls)} before starting")
    while True:
        for url in urls:
            outcome = wait_until_healthy(
                functools.partial(probe, url),
                idle,
                what=url,
                log=log,
                status=status,
                poll_interval=poll_interval,
                progress_every=progress_every,
                should_stop=should_stop,
                clock=clock,
                started=started,
            )
            if outcome.kind is End.STOP:
                return False
        # none of them went down meanwhile: asked aside, a stop is seen while they answer
        still = aside(lambda: all(probe(url).ok for url in urls), should_stop)
        if still is None:
            return False
        if still:
            log(f"{', '.join(urls)}: all healthy after {clock() - started:.1f} s")
            return True
