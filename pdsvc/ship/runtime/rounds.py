"""The canary's rounds, run off the main loop: one round (``probe_pair``: the peer's /health,
then the PD request on both sides, judged by content), and the thread that decides when rounds
run (``CanaryThread``: at ready, when a peer's port opens again, when this engine's own KV
failure counters rise, then every ``interval``, faster after a bad round). What the rounds
mean, and who heals, is canary.py's.
"""

from __future__ import annotations

import functools
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .canary import Canary, Pair, Round
from .duties import Duties, quiet
from .probe import HttpReply, NoAnswerKind, at_once, http_call, judge_generation
from .timings import (
    CANARY_PEER_RETRY_S,
    CANARY_RETRY_S,
    COUNTERS_LOOK_S,
    PORT_CONNECT_TIMEOUT_S,
    PORT_WATCH_S,
    START_PROBE_TIMEOUT_S,
)

FAILURE_COUNTERS = ("sglang:num_transfer_failed_reqs_total",
                    "sglang:num_bootstrap_failed_reqs_total")
#: requests an engine's scheduler has taken in but not yet started: its waiting queue
#: (SGLang's srt/metrics/collector.py, "The number of requests in the waiting queue"). Not
#: the PD bootstrap, prealloc or transfer queues: those also hold what a broken pair stalls.
QUEUE_GAUGE = "sglang:num_queue_reqs"


def probe_pair(pair: Pair, peer: str, timeout: float,
               call: Callable[..., HttpReply] = http_call,
               room: Callable[[], int] = lambda: random.getrandbits(63)) -> Round:
    """One canary round for ``pair``: the peer's /health, then the PD request on both sides."""
    health = call(f"{peer}/health", START_PROBE_TIMEOUT_S)
    if health.status != 200:
        return Round(pair, False, skipped=f"peer {peer} /health: {health.detail}")
    body, headers = pair.body(room()), {"Content-Type": "application/json"}
    replies = at_once({side: functools.partial(call, f"{url}/generate", timeout, body, headers)
                       for side, url in (("prefill", pair.prefill), ("decode", pair.decode))},
                      timeout + 1.0)
    decode = replies.get("decode")
    if decode is None:
        return Round(pair, False, f"decode: no reply within {timeout:g} s", timed_out=True)
    bad = judge_generation(decode)
    late = decode.no_answer is not None and decode.no_answer.kind is NoAnswerKind.TIMEOUT
    return Round(pair, bad is None, f"decode: {bad}" if bad else "", timed_out=late)


def port_open(url: str, timeout: float = PORT_CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connect to the URL's host:port succeeds (nothing is sent)."""
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 80), timeout):
            return True
    except OSError:
        return False


def sample_sum(text: str, names: Sequence[str]) -> float | None:
    """The sum of the samples of ``names`` (over all labels) in a Prometheus text
    exposition, or None when it has none of them."""
    total, found = 0.0, False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in names:
            continue
        rest = line[line.index("}") + 1:] if "{" in line else line[len(name):]
        try:
            total += float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        found = True
    return total if found else None


def metric_sum(metrics_url: str, names: Sequence[str]) -> float | None:
    """One look at an engine's /metrics: the sum of ``names`` there, or None (no answer, no
    --enable-metrics, or none of them)."""
    reply = http_call(metrics_url, START_PROBE_TIMEOUT_S)
    if reply.status != 200:
        return None
    return sample_sum(reply.body.decode("utf-8", errors="replace"), names)


def own_failures(metrics_url: str) -> Callable[[], float | None]:
    """A look at this engine's failure counters (None: no /metrics, or not those)."""
    return lambda: metric_sum(metrics_url, FAILURE_COUNTERS)


def queued(engine: str) -> float | None:
    """The requests waiting in an engine's queue (QUEUE_GAUGE at ``engine``/metrics, the
    engine's main port), or None when it cannot be read (no --enable-metrics, no answer)."""
    return metric_sum(f"{engine.rstrip('/')}/metrics", (QUEUE_GAUGE,))


class CanaryThread:
    """Runs the rounds off the main loop (a generation may take seconds; the main loop must
    keep feeding the watchdog), all pairs at once; each finished round is kept in ``results``
    until SERVING's loop asks for each as it ends (``deliver``).

    A round runs at once (this engine just became ready), then every ``interval`` s while
    rounds are good; after a round that failed or could not be judged, every ``retry`` s
    (CANARY_PEER_RETRY_S when only peers were not healthy yet; doubling once 2 x failures
    such rounds came, up to ``interval``); and at once whenever a peer's port opens again
    after it was seen closed (the peer was replaced) or this engine's own failure counters
    rose (``failures``: real traffic through a pair failed)."""

    def __init__(self, canary: Canary, interval: float, timeout: float,
                 probe: Callable[[Pair, str, float], Round] = probe_pair, *,
                 retry: float = CANARY_RETRY_S, watch: float = PORT_WATCH_S,
                 reachable: Callable[[str], bool] = port_open,
                 failures: Callable[[], float | None] | None = None,
                 queue: Callable[[str], float | None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 duties: Duties | None = None) -> None:
        self.canary = canary
        self.duties = duties or quiet()  # a pass that raises: said, counted, then the next
        self.interval = interval
        self.timeout = timeout
        self.probe = probe
        self.retry = min(retry, interval)
        self.watch = watch
        self.reachable = reachable
        self.failures = failures
        self.queue = queue  # an engine's URL -> the requests in its queue (queued), or None
        self.clock = clock
        self.results: list[list[Round]] = []
        # once SERVING's loop runs: each round handed to it as it ends (deliver), not kept
        self.on_round: Callable[[list[Round]], None] | None = None
        self.bad_rounds = 0  # rounds in a row that failed or could not be judged
        self.waiting_rounds = 0  # rounds in a row that found peers not up yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pair-canary", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def deliver(self, to: Callable[[list[Round]], None]) -> None:
        """From now on hand each round to ``to`` as it ends (on this thread), the rounds that
        ended before first."""
        with self._lock:  # held: a round ending meanwhile is handed over after these
            self.on_round, done, self.results = to, self.results, []
            for rounds in done:
                to(rounds)

    def next_delay(self, rounds: Sequence[Round]) -> float:
        """Seconds until the next round, given the one just run."""
        if rounds and all(r.ok for r in rounds):
            self.bad_rounds = self.waiting_rounds = 0
            return self.interval
        if rounds and all(r.ok or r.skipped or r.busy for r in rounds):  # not judged yet
            # counted apart: the looks while a peer loads must not stretch the pauses between
            # the failed rounds that follow (3 of them decide a heal)
            self.waiting_rounds += 1
            return self._backoff(self.waiting_rounds, min(self.retry, CANARY_PEER_RETRY_S))
        self.bad_rounds += 1
        return self._backoff(self.bad_rounds, self.retry)

    def _backoff(self, in_a_row: int, retry: float) -> float:
        """``retry`` s, doubling once 2 x failures_to_act such rounds came, up to interval."""
        extra = max(0, in_a_row - 2 * self.canary.failures_to_act)
        return min(self.interval, retry * float(2 ** min(extra, 16)))

    def probed(self) -> list[Pair]:
        """The pairs a round probes: all, or those with the peers apply's hold names."""
        hold = self.canary.hold
        return [p for p in self.canary.pairs
                if hold is None or hold.allows(self.canary.peer(p))]

    def round(self) -> list[Round]:
        before = self.failures() if self.failures is not None and self.queue else None
        return self.busy(self.probes(), before)

    def busy(self, rounds: list[Round], failures_before: float | None) -> list[Round]:
        """The rounds, those that timed out while an engine of their pair had requests in
        its queue marked busy: not judged (a search pushing past capacity must not make a
        side heal), unless this engine's KV failure counters rose meanwhile (real transfers
        failed: then the pair is judged as it is). SGLang's own /health counts a busy engine
        as healthy likewise: any output within its timeout (http_server.py health_generate)."""
        if not self.queue or not any(r.timed_out for r in rounds):
            return rounds
        if failures_before is not None and self.failures is not None:
            now = self.failures()
            if now is not None and now > failures_before:
                return rounds
        out = []
        for r in rounds:
            waiting = [(url, n) for url in (r.pair.prefill, r.pair.decode)
                       if r.timed_out and (n := self.queue(url))]
            if waiting:
                said = ", ".join(f"{url} had {n:g}" for url, n in waiting)
                r = Round(r.pair, False, r.error, timed_out=True, busy=(
                    f"{r.error} while {said} request(s) waiting in its queue "
                    f"({QUEUE_GAUGE}), and no KV transfer failed: an engine past its "
                    "capacity, not a broken pair"))
            out.append(r)
        return out

    def probes(self) -> list[Round]:
        pairs = self.probed()
        done = at_once({i: functools.partial(self.probe, p, self.canary.peer(p), self.timeout)
                        for i, p in enumerate(pairs)},
                       self.timeout + START_PROBE_TIMEOUT_S + 2.0)
        return [done[i] for i in range(len(pairs)) if i in done]

    def replaced_peers(self, seen: dict[str, bool]) -> list[str]:
        """Look at every peer's port once; the peers whose port opened again since it was
        seen closed (``seen``: the last look, updated)."""
        back = []
        for peer in sorted({self.canary.peer(p) for p in self.canary.pairs}):
            up = self.reachable(peer)
            if up and seen.get(peer) is False:
                back.append(peer)
            seen[peer] = up
        return back

    def failures_rose(self, last: list[float | None]) -> str | None:
        """Look at this engine's failure counters once (``last``: the previous look,
        updated); why a round is due now, or None. Only while rounds are good: failing
        rounds (each second) raise the counters themselves, and are as frequent as they get."""
        if self.failures is None:
            return None
        now = self.failures()
        before, last[0] = last[0], now
        if now is not None and before is not None and now > before and not self.bad_rounds:
            return f"this engine's KV transfer/bootstrap failures rose ({before:g} -> {now:g})"
        return None

    def _run(self) -> None:
        """The rounds' loop, one pass at a time; a pass that raised is said and counted
        (duties.py: its round is not recorded) and the next comes a retry later."""
        at = _Cursor(due=self.clock(), counters_due=self.clock(),  # a round at once: ready
                     fenced=self.canary.hold.doc() if self.canary.hold is not None else None)
        while not self._stop.is_set():
            wait = self.duties.guard("pair-canary", lambda: self._pass(at))
            if wait is None:
                at.due = self.clock() + self.retry
                wait = self.retry
            self._stop.wait(max(0.0, wait))

    def _pass(self, at: _Cursor) -> float:
        """Look at the peers' ports and the failure counters, run a round when one is due;
        the seconds until the next look."""
        hold = self.canary.hold
        if hold is not None and hold.doc() != at.fenced:
            # apply held, fenced or released this engine: the pairs to probe changed
            at.fenced, at.due, self.bad_rounds, self.waiting_rounds = \
                hold.doc(), self.clock(), 0, 0
        back = self.replaced_peers(at.seen)
        if back:
            self.canary.log(f"pair canary: {', '.join(back)} opened its port again "
                            "(started or replaced): a round now")
            at.due, self.bad_rounds, self.waiting_rounds = self.clock(), 0, 0
        if self.clock() >= at.counters_due:
            at.counters_due = self.clock() + COUNTERS_LOOK_S
            rose = self.failures_rose(at.last)
            if rose and at.due > self.clock():
                self.canary.log(f"pair canary: {rose}: a round now")
                at.due, self.bad_rounds, self.waiting_rounds = self.clock(), 0, 0
        if self.clock() >= at.due:
            rounds = self.round()
            if self._stop.is_set():
                return 0.0
            with self._lock:
                to = self.on_round
                if to is None:
                    self.results.append(rounds)
            if to is not None:
                to(rounds)
            at.due = self.clock() + self.next_delay(rounds)
        return min(self.watch, at.due - self.clock())


@dataclass
class _Cursor:
    """Where the rounds' loop stands between passes."""

    due: float  # the next round, by the clock
    counters_due: float  # the next look at this engine's failure counters
    fenced: dict[str, Any] | None  # the hold as last seen
    seen: dict[str, bool] = field(default_factory=dict)  # each peer's port, last look
    last: list[float | None] = field(default_factory=lambda: [None])  # the counters, last
