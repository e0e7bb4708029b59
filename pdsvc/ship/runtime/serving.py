"""SERVING: what an engine does while it serves, besides the liveness probe (phases.liveness_loop
runs that, and calls ``Serving.duties`` every DUTY_SLICE_S). Each duty runs on its own clock and
keeps its state in a named field here:

  peer watch   --restart-with: a peer on another host restarted      -> Ending.PEER
               (a refused connection confirmed every PEER_CONFIRM_S)
  membership   re-join the router when it lost this engine           (no ending)
  cascade      a heal cascade's cure marker newer than our engine    -> Ending.HEAL
  canary       a pair failing long enough, this engine's turn among
               its role and within the heal budget                   -> Ending.HEAL

The first duty that returns an Outcome ends SERVING (SERVING -> STOPPING, lifecycle.Unit.serve).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .canary import Canary
from .cascade import Cascade
from .endings import Ending
from .membership import Routers
from .notify import Notifier
from .options import Options
from .phases import Outcome, PeerWatch
from .policy import RestartPolicy
from .rounds import CanaryThread
from .timings import HEAL_STAGGER_S, MEMBERSHIP_RETRY_S, PEER_CONFIRM_S


@dataclass
class Serving:
    """SERVING's state: the duties' clocks and what they last said."""

    args: Options
    log: Callable[[str], None]
    notifier: Notifier
    policy: RestartPolicy
    membership: Routers | None
    cascade: Cascade | None
    canary: Canary | None  # what the rounds mean (canary.py)
    rounds: CanaryThread | None  # the thread that runs them (rounds.py)
    began: float | None  # wall clock: when this run's engine process started
    clock: Callable[[], float] = time.monotonic
    peers: PeerWatch | None = None  # --restart-with peers
    next_peer: float = float("inf")  # monotonic: the peer watch's next probe
    next_membership: float = 0.0  # monotonic: the next membership check
    failing_since: float | None = None  # monotonic: since when the canary says heal
    said_wait: str = ""  # the last "not now" logged (news only: rounds come every second)

    def __post_init__(self) -> None:
        a = self.args
        if a.restart_with:
            # a peer probe must not hold up this engine's own probes (and its watchdog)
            self.peers = PeerWatch(a.restart_with, a.peer_down_probes,
                                   min(a.liveness_timeout, a.peer_interval), log=self.log)
            self.peers.check()  # from the first second: a peer killed now is seen go and return
            self.next_peer = self.clock() + a.peer_interval

    def duties(self, alive: bool) -> Outcome | None:
        """Each duty that is due, in order; the first Outcome ends SERVING. ``alive``: whether
        the last liveness probe passed."""
        now = self.clock()
        ended = self.watch_peers(now)
        if ended is None:
            self.keep_membership(now, alive)
            ended = self.cure(now) or self.judge_pairs(now, alive)
        return ended

    def watch_peers(self, now: float) -> Outcome | None:
        """The peer watch: a --restart-with peer that restarted restarts this engine."""
        if self.peers is None or now < self.next_peer:
            return None
        restarted = self.peers.check()
        # a refusal is confirmed at once (the process is gone), anything else at the pace
        self.next_peer = now + (PEER_CONFIRM_S if self.peers.confirming
                                else self.args.peer_interval)
        # SERVING -> STOPPING: restart with the peer
        return Outcome(Ending.PEER, detail=restarted) if restarted else None

    def keep_membership(self, now: float, alive: bool) -> None:
        """Membership: this engine listed in the router while it is alive, and not otherwise."""
        m = self.membership
        if m is None or now < self.next_membership:
            return
        m.check(alive)
        # not (yet) in the router — it restarted, or still drains our previous entry (smg
        # keeps one for seconds): look again soon, not a whole interval later
        every = self.args.membership_interval
        self.next_membership = now + (every if m.joined else min(every, MEMBERSHIP_RETRY_S))

    def cure(self, now: float) -> Outcome | None:
        """A heal cascade's cure: restart once when the marker is newer than our engine."""
        together = self.cascade.due(self.began, now) if self.cascade is not None else None
        return Outcome(Ending.HEAL, detail=together) if together else None  # SERVING -> STOPPING

    def judge_pairs(self, now: float, alive: bool) -> Outcome | None:
        """The canary's finished rounds: record them, and heal when the verdict says so, it is
        this engine's turn among its role, and the heal budget allows."""
        canary = self.canary
        if canary is None or self.rounds is None:
            return None
        rounds = self.rounds.take()
        for r in rounds:
            canary.record(r)
            if any(one.ok for one in r):
                self.policy.on_pair_good()
        if not rounds:
            return None
        why = canary.verdict() if alive else None
        if not why:
            self.failing_since = None
            return None
        self.failing_since = self.failing_since or now
        turn = self.not_my_turn(now - self.failing_since)
        if turn:
            self.wait(why, turn, "pair failing, heal waits")
            return None
        heal, wait = self.policy.may_heal(self.args.canary_heals)
        if not heal:
            self.wait(why, wait, "pair failing, not healed now")
            return None
        self.policy.record_heal(self.args.role or "")
        cure = self.cascade.after_heal() if self.cascade else None
        return Outcome(Ending.HEAL, detail=cure or why)  # SERVING -> STOPPING: heal the pair

    def wait(self, why: str, reason: str, status: str) -> None:
        """A heal that must wait: say so once per reason."""
        if reason != self.said_wait:
            self.log(f"{why} — but not now: {reason}")
            self.notifier.status(f"{status}: {reason}")
        self.said_wait = reason

    def not_my_turn(self, waited: float) -> str | None:
        """Why a heal of this engine must wait, so that engines of one role heal one at a
        time and another pair serves meanwhile, or None. Only with siblings (other
        engines of this role): the only engine of its role has no one to wait for."""
        a = self.args
        if not a.sibling or self.membership is None:
            return None
        if waited < a.heal_turn * HEAL_STAGGER_S:
            return f"its turn among its role comes {a.heal_turn * HEAL_STAGGER_S:g} s in"
        if not self.membership.lists_any(a.sibling):
            return ("the router lists no other healthy engine of this role (one is down or "
                    "healing): healing now would leave no pair serving")
        return None
