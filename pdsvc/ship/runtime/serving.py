"""SERVING: one loop that waits for events and does what watch.step says, and the pollers that
do SERVING's I/O on threads of their own and post what they found (events.py):

  poller       what it does, how often                               posts
  liveness     this engine's /health, every --liveness-interval      Probed (a failure
               excused while a profile hold lasts: profiled.py)
  peers        --restart-with peers' /health, every --peer-interval  PeerRestarted
               (a refused connection confirmed every PEER_CONFIRM_S)
  membership   re-join the router when it lost this engine           (nothing: its own)
  cure         a heal cascade's cure marker, every MARKER_LOOK_S     CureDue
  profile      a profile hold's start and end, every PROFILE_LOOK_S  (nothing: its own)
  canary       the pair canary's rounds (rounds.CanaryThread)        PairsJudged
  heal         asked once per AskTurn: this engine's turn among its
               role (the routers), the heal budget, the cascade      HealSaid
  child        the engine's exit (events.watch_child)                ChildExited
  signals      a stop signal (child.Child's handler)                 StopAsked

The loop blocks on the inbox only, so a stop, a restart or a kill of the unit is acted on the
moment its signal arrives, whatever a probe or a router call is waiting for; and the stop of a
hung engine SIGKILLs it once its /health gave no answer within STOP_JUDGE_S of the forwarded
signal (stopping.py), not after the unit's stop timeout nor a probe's.
The first Outcome ends SERVING (SERVING -> STOPPING, lifecycle.Unit.serve).
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .canary import Canary, Round
from .cascade import Cascade
from .duties import Duties, quiet
from .events import (
    CureDue,
    DutyFailed,
    HealSaid,
    Inbox,
    PairsJudged,
    PeerRestarted,
    Poller,
    Probed,
    StopAsked,
    Wake,
)
from .membership import Routers
from .notify import Notifier
from .options import Options
from .phases import Outcome, PeerWatch
from .policy import RestartPolicy
from .probe import ProbeResult, at_once, http_probe
from .profiled import Profiled
from .rounds import CanaryThread
from .timings import (
    CHILD_WAIT_SLICE_S,
    DEADLOCK_S,
    HEAL_STAGGER_S,
    MARKER_LOOK_S,
    MEMBERSHIP_RETRY_S,
    PEER_CONFIRM_S,
    PROFILE_LOOK_S,
    START_PROBE_TIMEOUT_S,
)
from .watch import AskTurn, Notify, PairGood, Say, Wait, Watch, step, wake_at

if TYPE_CHECKING:
    from .events import Event
    from .watch import Effect


class Turn(enum.Enum):
    """Why a heal waits for its turn among its role's engines (Serving.turn)."""

    STAGGER = "stagger"  # its place among its role: --heal-turn x HEAL_STAGGER_S
    ALONE = "alone"  # the router lists no other healthy engine of this role


def health(urls: list[str], timeout: float) -> dict[str, bool]:
    """Whether each engine answers /health 200, all asked at once."""
    found = at_once({u: functools.partial(http_probe, f"{u}/health", timeout) for u in urls},
                    timeout + 1.0)
    return {u: u in found and found[u].ok for u in urls}


@dataclass
class Serving:
    """SERVING's parts: the duties' objects, the inbox, and the loop's state."""

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
    profiled: Profiled | None = None  # a `pdsvc profile` hold (engines with a state dir)
    duties: Duties = field(default_factory=quiet)  # a duty that raises: said, counted, policy
    state: Watch | None = None  # the loop's (the membership poller reads ``alive``)
    said_wait: str = ""  # the last "not now" logged (news only: rounds come every second)
    # a stale-side dead-lock: (first seen, last seen), monotonic (decide_heal's thread only)
    deadlock: tuple[float | None, float | None] = (None, None)
    up: Callable[[list[str], float], dict[str, bool]] = health  # whether engines answer
    inbox: Inbox = field(init=False)
    # the restart policy's state is written by the loop (a good pair) and the heal's question
    policy_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        a = self.args
        self.inbox = Inbox(self.clock)
        # a duty whose policy ends the runtime (duties.POLICIES) ends SERVING through the loop
        self.duties.on_fatal = lambda duty, detail: self.inbox.post(DutyFailed(duty, detail))
        if a.restart_with:
            # a peer probe must not hold up this engine's own probes (and its watchdog)
            self.peers = PeerWatch(a.restart_with, a.peer_down_probes,
                                   min(a.liveness_timeout, a.peer_interval), log=self.log)

    # ---------------------------------------------------------------- the loop
    def run(self, probe: Callable[[], ProbeResult], *, serving_status: str,
            hang_after: float | None = None,
            stopping: Callable[[], bool] = lambda: False,
            reap: Callable[[], None] | None = None) -> Outcome:
        """Wait for the next event, do what watch.step says, until it says how SERVING ends.
        ``stopping``: whether a stop was recorded (a stop before the signal handler posted to
        this inbox, and a bound of CHILD_WAIT_SLICE_S on trusting that no post is lost);
        ``reap``: reaps orphans this runtime adopted (--kill-tree), once a second."""
        state = self.state = Watch(last_ok=self.clock())
        pollers = [p.start() for p in self.pollers(probe, reap)]
        try:
            while True:
                bound = wake_at(state, hang_after)
                timeout = CHILD_WAIT_SLICE_S if bound is None else \
                    min(CHILD_WAIT_SLICE_S, bound - self.clock())
                event: Event = self.inbox.get(timeout)
                if isinstance(event, Wake) and stopping():
                    event = StopAsked(0)
                done = step(state, event, hang_after=hang_after, serving_status=serving_status)
                state = self.state = done.state
                for effect in done.effects:
                    self.carry_out(effect)
                if done.outcome is not None:
                    return done.outcome
        finally:
            for p in pollers:
                p.stop()

    def carry_out(self, effect: Effect) -> None:
        """One effect of a step: the only place SERVING's decisions touch the world."""
        if isinstance(effect, Say):
            self.log(effect.text)
        elif isinstance(effect, Notify):
            self.notifier(*effect.fields)
        elif isinstance(effect, PairGood):
            with self.policy_lock:
                self.policy.on_pair_good()
        elif isinstance(effect, AskTurn):
            why, waited = effect.why, effect.waited
            threading.Thread(target=lambda: self.inbox.post(self.heal_question(why, waited)),
                             name="heal-turn", daemon=True).start()
        elif isinstance(effect, Wait):
            self.wait(effect.why, effect.reason, effect.status)
        else:
            raise TypeError(f"not an effect: {effect!r}")

    # ---------------------------------------------------------------- the pollers
    def pollers(self, probe: Callable[[], ProbeResult],
                reap: Callable[[], None] | None) -> list[Poller]:
        """A poller per duty this engine has (its liveness probe always)."""
        a, inbox = self.args, self.inbox
        d = self.duties
        out = [Poller("liveness", inbox, lambda: self.probed(probe),
                      lambda: a.liveness_interval, first=a.liveness_interval, duties=d)]
        if self.peers is not None:
            # from the first second: a peer killed now is seen go and return
            out.append(Poller("peers", inbox, self.watch_peers, self.peer_pace, duties=d))
        if self.membership is not None:
            out.append(Poller("membership", inbox, self.keep_membership, self.membership_pace,
                              duties=d))
        if self.cascade is not None:
            out.append(Poller("cure", inbox, self.cure, lambda: MARKER_LOOK_S, duties=d))
        if self.profiled is not None:
            profiled = self.profiled
            out.append(Poller("profile", inbox, lambda: profiled.look(),
                              lambda: PROFILE_LOOK_S, duties=d))
        if self.canary is not None and self.rounds is not None:
            self.rounds.deliver(self.judged)
        if reap is not None:
            out.append(Poller("reap", inbox, lambda: reap(), lambda: CHILD_WAIT_SLICE_S,
                              first=CHILD_WAIT_SLICE_S, duties=d))
        return out

    def probed(self, probe: Callable[[], ProbeResult]) -> Probed:
        """One liveness probe; a failure is excused while a profile hold lasts (asked once
        the probe is over: a hold that ended during a long probe excuses nothing)."""
        result = probe()
        excused = self.profiled.excuse() if self.profiled is not None and not result.ok else None
        return Probed(result, self.clock(), excused or "")

    def watch_peers(self) -> Event | None:
        """The peer watch: a --restart-with peer that restarted restarts this engine."""
        assert self.peers is not None
        restarted = self.peers.check()
        return PeerRestarted(restarted) if restarted else None

    def peer_pace(self) -> float:
        """A refusal is confirmed at once (the process is gone), anything else at the pace."""
        assert self.peers is not None
        return PEER_CONFIRM_S if self.peers.confirming else self.args.peer_interval

    def keep_membership(self) -> None:
        """Membership: this engine listed in the router while it is alive, and not otherwise."""
        assert self.membership is not None
        self.membership.check(self.state.alive if self.state is not None else True)

    def membership_pace(self) -> float:
        """Not (yet) in the router — it restarted, or still drains our previous entry (smg
        keeps one for seconds): look again soon, not a whole interval later."""
        assert self.membership is not None
        every = self.args.membership_interval
        return every if self.membership.joined else min(every, MEMBERSHIP_RETRY_S)

    def cure(self) -> Event | None:
        """A heal cascade's cure: restart once when the marker is newer than our engine."""
        assert self.cascade is not None
        together = self.cascade.due(self.began, self.clock())
        return CureDue(together) if together else None

    def judged(self, rounds: list[Round]) -> None:
        """On the canary's thread, after each round: record it, post the verdict."""
        assert self.canary is not None
        self.canary.record(rounds)
        self.inbox.post(PairsJudged(self.canary.verdict(), any(one.ok for one in rounds),
                                    self.clock()))

    # ---------------------------------------------------------------- a heal's turn
    def heal_question(self, why: str, waited: float) -> HealSaid:
        """decide_heal, guarded: a question that raised is answered "not now" and asked again
        HEAL_STAGGER_S later (the loop waits for an answer before it asks another)."""
        said = self.duties.guard("heal-question", lambda: self.decide_heal(why, waited))
        if said is not None:
            return said
        return HealSaid(why, wait="the heal's question failed (see the line before); asked "
                        "again", status="pair failing, heal question failed",
                        ask_after=HEAL_STAGGER_S, at=self.clock())

    def decide_heal(self, why: str, waited: float) -> HealSaid:
        """Off the loop: whether the heal goes now (its turn among the role's engines, then
        the heal budget); if it does, it is recorded, and a heal that completes a cascade
        turns into the cure (cascade.py, which reads the other hosts). A heal that waits for
        a sibling that cannot come may be a stale-side dead-lock, cured at once (deadlocked)."""
        due = self.cascade.due_now(self.began) if self.cascade else None
        if due:  # a cure came a moment ago (its poller looks every MARKER_LOOK_S): with it
            return HealSaid(why, detail=due, at=self.clock())
        held = self.canary.hold if self.canary is not None else None
        if held is not None and held.active():  # taken while the question was asked
            return HealSaid(why, wait="a hold is in force: no heal while it lasts",
                            status="pair failing, held", at=self.clock())
        turn = self.turn(waited)
        if turn is not None:
            now = self.clock()
            lock = None
            if turn is Turn.ALONE:
                lock = self.deadlocked(now)
            else:
                self.no_deadlock()
            cure = self.cascade.after_deadlock(lock) if lock and self.cascade else None
            if cure:
                return HealSaid(why, detail=cure, at=now)
            return HealSaid(why, wait=self.turn_words(turn), status="pair failing, heal waits",
                            ask_after=self.look_again(now) if turn is Turn.ALONE else None,
                            at=now)
        self.no_deadlock()
        with self.policy_lock:
            heal, wait = self.policy.may_heal(self.args.canary_heals)
            if not heal:
                return HealSaid(why, wait=wait, status="pair failing, not healed now",
                                at=self.clock())
            self.policy.record_heal(self.args.role or "")
        cure = self.cascade.after_heal() if self.cascade else None
        return HealSaid(why, detail=cure or why, at=self.clock())

    def wait(self, why: str, reason: str, status: str) -> None:
        """A heal that must wait: say so once per reason."""
        if reason != self.said_wait:
            self.log(f"{why} — but not now: {reason}")
            self.notifier.status(f"{status}: {reason}")
        self.said_wait = reason

    def turn(self, waited: float) -> Turn | None:
        """Why a heal of this engine must wait, so that engines of one role heal one at a
        time and another pair serves meanwhile, or None. Only with siblings (other
        engines of this role): the only engine of its role has no one to wait for."""
        a = self.args
        if not a.sibling or self.membership is None:
            return None
        if waited < a.heal_turn * HEAL_STAGGER_S:
            return Turn.STAGGER
        if not self.membership.lists_any(a.sibling):
            return Turn.ALONE
        return None

    def turn_words(self, turn: Turn) -> str:
        if turn is Turn.STAGGER:
            return f"its turn among its role comes {self.args.heal_turn * HEAL_STAGGER_S:g} s in"
        return ("the router lists no other healthy engine of this role (one is down or "
                "healing): healing now would leave no pair serving")

    def not_my_turn(self, waited: float) -> str | None:
        """``turn`` in words."""
        turn = self.turn(waited)
        return None if turn is None else self.turn_words(turn)

    def deadlocked(self, now: float) -> str | None:
        """Why this is a stale-side dead-lock, once it has held DEADLOCK_S, else None.

        This engine's heal waits for a sibling to be listed (Turn.ALONE). It is one when every
        sibling and every engine of the other role (its pairs' peers) is up (/health 200: no
        load is under way that could end it) and the router leaves out an engine of the
        other role too: the engines left out are not admitted (Canary.admits) because the
        engines the router lists, this one and its counterpart in the other role, are stale
        toward them, and those cannot heal without leaving their role with no engine listed.
        Only the last resort (canary.LAST_RESORT rounds) would end it. Held DEADLOCK_S: an
        engine just up is left out for a round or two before it is admitted."""
        assert self.membership is not None and self.canary is not None
        peers = [self.canary.peer(p).rstrip("/") for p in self.canary.pairs]
        siblings = [u.rstrip("/") for u in self.args.sibling]
        up = self.up([*siblings, *peers], min(self.args.liveness_timeout, START_PROBE_TIMEOUT_S))
        listed = self.membership.listed()
        out = [u for u in peers if u not in listed]
        if not all(up.values()) or not out or any(u in listed for u in siblings):
            self.no_deadlock()
            return None
        since, seen = self.deadlock
        if since is None or seen is None or now - seen > 2 * DEADLOCK_S:
            since = now  # not seen, or not looked at for long: from now
        self.deadlock = (since, now)
        if now - since < DEADLOCK_S:
            return None
        return (f"for {now - since:.0f} s every engine has been up, the router has listed "
                f"none of {', '.join(siblings)} (this engine's role) and not "
                f"{', '.join(out)} (the other role), and this engine's heal waits for a "
                "sibling to be listed: the stale sides of both roles wait on each other")

    def look_again(self, now: float) -> float:
        """When a heal that waits for a sibling asks again, whatever the rounds' pace (failed
        rounds slow to the steady interval): when a dead-lock seen will have held DEADLOCK_S,
        else soon (HEAL_STAGGER_S), so that one forming is seen within seconds."""
        since = self.deadlock[0]
        if since is None:
            return HEAL_STAGGER_S
        return max(MEMBERSHIP_RETRY_S, since + DEADLOCK_S - now)

    def no_deadlock(self) -> None:
        self.deadlock = (None, None)
