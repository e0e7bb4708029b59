"""The pair canary: a one-token generation through every prefill×decode pair this engine is
part of, sent exactly as the router sends a PD request, and judged by content.

Why: a pair can be broken while both /health endpoints answer 200. A decode keeps the NIXL
endpoints of a prefill that was replaced behind a stable address (sglang #33789, PR #34289); a
prefill keeps stale NIXL/UCX agent state of decode peers that were replaced, and every transfer
through it fails as **HTTP 200 with finish_reason abort** and no text (smg-project/smg #2382;
vllm #49238 reports both directions). Only a real PD request shows it.

The request: the same JSON body POSTed to the prefill's and the decode's ``/generate`` at
once, with ``bootstrap_host`` (the host of the prefill's URL, verbatim), ``bootstrap_port`` and
a fresh random ``bootstrap_room`` below 2^63, which is what the router adds (sglang-router
``src/routers/http/pd_router.rs``); the decode's reply is the verdict.

When a round runs (rounds.py). Detection must not wait for the steady interval (the canary is
real traffic, so that interval may be long): a round runs as soon as this engine is ready, as
soon as a peer comes back after its port was closed (it was replaced: the moment a stale pair is
born), as soon as this engine's own KV failure counters rise (real traffic failed: SGLang's
``sglang:num_transfer_failed_reqs_total`` / ``sglang:num_bootstrap_failed_reqs_total`` with
--enable-metrics, srt/observability/metrics_collector.py), and every second after a round that
failed or could not be judged, until one is good.

Which side heals. Each side runs the canary for its own pairs and acts only on itself: no unit
gets the right to restart another. A heal must leave *both* sides fresh: a side that restarts
alone gets a new NIXL agent (a fresh uuid4 per process, ``nixl/conn.py``), and the side that
stayed, having talked to the old one while the pair failed, can then be stale toward the new
one. So:

* When the pair's decode restarts with its prefill (``--follower``: ``PartOf=`` on one host,
  ``--restart-with`` across hosts), the prefill heals the pair, whichever side is stale: its
  restart takes the decode with it, and both come back fresh in one step. The decode leaves it
  to the prefill, and acts itself only as a last resort, after ``LAST_RESORT`` × ``failures``
  rounds (minutes at the slowed pace): a decode that healed alone would come back with a new
  NIXL agent, and the prefill, which talked to the old one while the pair failed, could be
  stale toward it; a second heal.
* Otherwise the stale side is the one that is *unchanged* since the pair last worked: it served
  this pair with its current engine, then the peer was replaced, and the state it kept about
  the old peer is what fails. The replaced side is fresh: it has never served this pair. So a
  side restarts its own engine when a pair fails ``failures`` rounds in a row while both
  engines answer /health, and it has had a good round with that peer since its engine started
  (the round at ready makes that the case within a second of both being up). A side without
  that history leaves the pair to the peer, unless it has no working pair at all for twice as
  long (both sides fresh and still failing: each side restarts on its own word; with several
  pairs, as long as a last resort: the stale peers heal one at a time, ``unserved_after``).
  A side with other healthy pairs never restarts for a pair it has never served, so one
  flapping pair does not take down the healthy pairs of an xPyD deployment.

The restart policy's heal budget bounds the rest in time (policy.py).

While `pdsvc apply` holds this engine or fences its peers (hold.py), the canary probes only
the peers the hold names (an old and a new engine must not meet: SGLang's decode dies on a
page size or KV dtype mismatch) and reports without healing.
"""

from __future__ import annotations

import enum
import json
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .hold import Hold
from .statefile import write_state

CANARY_PROMPT = "pdsvc pair canary"
#: a decode whose prefill heals their pair acts itself only after this many times
#: ``failures`` rounds: well after the prefill would have (its rounds start up to a second
#: later, and may take longer), so the two never race
LAST_RESORT = 10


@dataclass(frozen=True)
class Pair:
    """One prefill×decode pair, by the URLs the router uses for them."""

    prefill: str  # http://HOST:PORT of the prefill
    bootstrap_port: int | None
    decode: str  # http://HOST:PORT of the decode

    @property
    def name(self) -> str:
        return f"{self.prefill} -> {self.decode}"

    def body(self, room: int) -> bytes:
        return json.dumps({
            "text": CANARY_PROMPT,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True},
            "stream": False,
            "bootstrap_host": urllib.parse.urlsplit(self.prefill).hostname,
            "bootstrap_port": self.bootstrap_port,
            "bootstrap_room": room,
        }).encode("utf-8")


class PairHealth(str, enum.Enum):
    """What one side's canary says of a pair (the canary file's ``state``; the
    pdsvc_pair_state metric's label)."""

    OK = "ok"  # the last round's transfer worked
    FAILING = "failing"  # rounds failed while both engines were healthy
    PEER_DOWN = "peer-down"  # not judged: the peer is not healthy
    BUSY = "busy"  # not judged: the round waited behind queued requests (rounds.CanaryThread.busy)
    UNKNOWN = "unknown"  # no round yet

    def __str__(self) -> str:
        return self.value


class HealBy(str, enum.Enum):
    """Who restarts for a pair when it fails (the canary file's ``heals_by``)."""

    ME = "me"  # this engine: the prefill of a coupled pair (its decode follows it)
    PEER = "peer"  # the other engine: this is the decode of a coupled pair
    STALE_SIDE = "stale side"  # not coupled: the side holding the stale NIXL state

    def __str__(self) -> str:
        return self.value


@dataclass
class PairState:
    """What this side knows of one pair (written to the canary file for `pdsvc status`)."""

    pair: str
    peer: str
    state: PairHealth = PairHealth.UNKNOWN
    failures: int = 0  # rounds in a row that failed while both engines were healthy
    failing_since: float | None = None  # wall clock
    last_error: str = ""
    last_ok: float | None = None  # wall clock: ok since
    served: bool = False  # a good round with this peer since this engine started
    heals_by: HealBy | None = None  # who restarts for this pair when it fails


@dataclass(frozen=True)
class Round:
    """One probe of one pair: ``ok``, or ``error`` (a pair failure), or ``skipped`` (the
    peer's /health failed: not the pair's fault), or ``busy`` (no reply in time, while an
    engine of the pair had requests waiting in its queue: an engine past its capacity, not a
    broken pair)."""

    pair: Pair
    ok: bool
    error: str = ""
    skipped: str = ""
    timed_out: bool = False  # the decode's reply did not come within the canary's timeout
    busy: str = ""


class Canary:
    """The pairs this engine is part of, their recent rounds, and the heal decision."""

    def __init__(self, me: str, pairs: Sequence[Pair], *, failures_to_act: int,
                 log: Callable[[str], None], path: str | None = None,
                 followers: Sequence[str] = (),
                 wall: Callable[[], float] = time.time, hold: Hold | None = None) -> None:
        self.me = me.rstrip("/")
        self.pairs = list(pairs)
        self.failures_to_act = failures_to_act
        self.log = log
        self.path = path
        self.followers = {f.rstrip("/") for f in followers}
        self.wall = wall
        #: apply's hold (hold.Hold: active(), allows(peer)), or None
        self.hold = hold
        self.states = {p.name: PairState(p.name, self.peer(p), heals_by=self._healer(p))
                       for p in self.pairs}
        self._saved: list[tuple[str, PairHealth, int, str]] = []

    def peer(self, pair: Pair) -> str:
        return pair.decode if self.is_prefill(pair) else pair.prefill

    def is_prefill(self, pair: Pair) -> bool:
        return pair.prefill.rstrip("/") == self.me

    def coupled(self, pair: Pair) -> bool:
        """The pair's decode restarts whenever its prefill does."""
        return pair.decode.rstrip("/") in self.followers

    def _healer(self, pair: Pair) -> HealBy:
        if not self.coupled(pair):
            return HealBy.STALE_SIDE
        return HealBy.ME if self.is_prefill(pair) else HealBy.PEER

    def record(self, rounds: Sequence[Round]) -> None:
        """Fold one round of every pair into the states (journal lines on every change)."""
        now = self.wall()
        for r in rounds:
            s = self.states[r.pair.name]
            if r.ok:
                if s.state is PairHealth.FAILING:
                    self.log(f"pair canary {s.pair}: good again after {s.failures} failed "
                             "round(s)")
                kept = s.state is PairHealth.BUSY and s.last_ok is not None  # ok, then busy
                if s.state is not PairHealth.OK and not kept:
                    s.last_ok = now  # ok since
                s.state, s.failures, s.failing_since, s.served = PairHealth.OK, 0, None, True
            elif r.busy:
                # not judged, and not a failure: a round that waits behind a queue says
                # nothing of the pair; an ok pair stays "ok since" across it
                if s.state is not PairHealth.BUSY:
                    self.log(f"pair canary {s.pair}: not judged: {r.busy}")
                if s.state is not PairHealth.OK and s.state is not PairHealth.BUSY:
                    s.last_ok = None
                s.state, s.last_error = PairHealth.BUSY, r.busy
            elif r.skipped:
                if s.state is not PairHealth.PEER_DOWN:
                    self.log(f"pair canary {s.pair}: not judged: {r.skipped}")
                s.state, s.last_error = PairHealth.PEER_DOWN, r.skipped
            else:
                if s.failures == 0:
                    s.failing_since = now
                s.failures += 1
                said = s.last_error
                s.state, s.last_error = PairHealth.FAILING, r.error
                # every round up to the verdict, then only news: rounds run every second
                # while a pair fails, and the journal is not a metrics store
                if s.failures <= 2 * self.failures_to_act or r.error != said \
                        or s.failures % 60 == 0:
                    self.log(f"pair canary {s.pair}: failed ({s.failures}x in a row) "
                             f"while both engines are healthy: {r.error}")
        self._save()

    def verdict(self) -> str | None:
        """Why this engine must restart to heal a pair, or None (always while held)."""
        if self.hold is not None and self.hold.active():
            return None
        states = list(self.states.values())
        working = any(s.state is PairHealth.OK for s in states)
        by_name = {p.name: p for p in self.pairs}
        for s in states:
            if s.failures < self.failures_to_act:
                continue
            pair = by_name[s.pair]
            if self.coupled(pair):
                if self.is_prefill(pair):
                    return (f"pair {s.pair} failed {s.failures} canary rounds in a row while "
                            f"both engines are healthy ({s.last_error}); its decode restarts "
                            "with this prefill, so restarting this prefill renews both sides "
                            "at once and neither keeps the other's stale NIXL state "
                            "(sglang #33789, smg #2382)")
                if s.failures >= LAST_RESORT * self.failures_to_act:
                    return (f"pair {s.pair} failed {s.failures} canary rounds in a row and "
                            "its prefill, which heals it (this decode restarts with it), did "
                            "not: restarting this side of the pair, as a last resort")
                continue
            if s.served:
                return (f"pair {s.pair} failed {s.failures} canary rounds in a row while both "
                        f"engines are healthy ({s.last_error}); this engine served that pair "
                        "before, so it holds the stale NIXL state of a replaced peer "
                        "(sglang #33789, smg #2382): restarting it")
            if not working and s.failures >= self.unserved_after():
                return (f"no pair works from this engine: {s.pair} failed {s.failures} canary "
                        f"rounds in a row ({s.last_error}) and neither side has served it "
                        "since it started: restarting this side of the pair")
        return None

    def admits(self, registered: set[str]) -> str | None:
        """Why this engine must not join the router yet, or None. The router pairs every
        prefill with every decode it lists, and a stale pair fails as HTTP 200 with
        finish_reason abort, which neither router retries (both retry 408/429/5xx only:
        is_retryable_status, sglang-router src/core/retry.rs, smg routers/common/retry.rs). So
        an engine joins only once its last round with each engine the router lists was good:
        a replaced engine never takes traffic on a pair that is stale. Peers the router does
        not list do not hold it back: each checks its pairs with us before it joins."""
        for p in self.pairs:
            peer = self.peer(p).rstrip("/")
            if peer not in registered:
                continue
            s = self.states[p.name]
            if s.state is not PairHealth.OK:
                why = s.last_error or "no canary round yet"
                return f"pair {s.pair} is {s.state} ({why})"
        return None

    def unserved_after(self) -> int:
        """Failed rounds in a row after which a side that has served none of its failing
        pairs restarts anyway. One pair (1P1D): 2 x failures, the peer had its chance. Several
        pairs (xPyD, uncoupled): this side is the fresh one, replaced while its peers stayed,
        and each stale peer heals in its turn, one engine of a role at a time (each reloads:
        minutes with real engines). Restarting this side meanwhile would only make it new
        again toward the peers that already healed: wait as long as a last resort."""
        return (LAST_RESORT if len(self.pairs) > 1 else 2) * self.failures_to_act

    def _save(self) -> None:
        """The states as JSON beside the restart policy's file, for `pdsvc status`; written
        when a pair's state changes, not every round (the state directory stays quiet)."""
        if not self.path:
            return
        said = [(s.pair, s.state, s.failures, s.last_error) for s in self.states.values()]
        if said == self._saved:
            return
        self._saved = said
        doc = {"me": self.me, "at": self.wall(), "pairs": [asdict(s) for s in self.states.values()]}
        write_state(self.path, doc)
