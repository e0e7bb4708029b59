"""A heal cascade, and its one cure: every engine of the deployment restarted together.

Why. A heal restarts one engine; its new process has a new NIXL agent (a fresh uuid4 per
process, SGLang ``disaggregation/nixl/conn.py``). Every engine of the other role that talked to
the previous process can then be stale toward the new one: a decode keeps a replaced
prefill's endpoints (sglang #33789), a prefill keeps a replaced decode's agent state
(smg-project/smg #2382). With one of the two bugs, heals settle: only the side that stayed is
stale, it heals, and the replaced side never goes stale toward it. With both, and several
engines of each role, every heal poisons the other role, whose heal poisons back, forever; a
pair serves between heals, so the heal budget (policy.py) never slows it. The only cure is a
restart of every engine at once: no new process ever meets an old one, because a new
engine's canary and router membership start only once it is healthy, after its load, by
which time every old process is gone.

The rule (read from the engines' own restart state files, NAME.restart.json in the shared
``--state-dir``, whose ``heal_log`` and ``role`` the restart policy keeps):

* **A cascade** is at least ``CASCADE_HEALS`` (3) heals within ``CASCADE_WINDOW_S`` (10 min),
  by engines of *both* roles, none before the last cure. With one of the bugs only, the heals
  are all of one role (the side that stayed); two heals of one role, then one of the other,
  is the poison going back. Three, not two: one heal of each role may be two faults that
  happened together. A fresh engine's last-resort heal (canary.py) can add the other role
  with one bug only; it too replaces a process its peers talked to, so a cure is right there
  as well.
* **The cure**: the runtime whose heal completes a cascade writes ``DEPLOYMENT.heal-all.json``
  (atomically: ``at``, ``by``, ``why``) and every engine runtime of the deployment whose
  engine process started before that time restarts it (Ending.HEAL, the heal's path) within
  ``MARKER_LOOK_S`` of it: one serving, and one still loading too (a heal of its own just
  before the marker), whose load could otherwise end while an old peer still drains, so that
  its canary meets an old process. Restarting a loading engine costs the deployment nothing:
  every other engine loads from the marker on as well. A marker older than ``MARKER_ACT_S``
  is not acted on (an engine that was held, or down, starts fresh anyway).
* **A stale-side dead-lock** is the same fault stopped short of a cascade: the engines the
  router lists are the stale sides of pairs with engines it leaves out, and each waits for a
  sibling to be listed (serving.Serving.deadlocked judges it). ``after_deadlock`` writes the
  same cure, under the same rules, without waiting for the last resort to add the heals.
* **Once**: a cascade within ``CURE_WINDOW_S`` (1 h) of the last cure is reported, with the
  command that restarts the whole deployment, and nothing more is done than the heals
  themselves (each still within the heal budget).
* **A hold** by `pdsvc apply` (any NAME.hold.json in the state directory) suppresses it all:
  no marker is written and none is acted on while apply rolls a change.

**Across hosts** the state directory is one host's. Each host's engine runtimes serve its
heals and its marker to the deployment's other engine hosts, keyed with the control-plane key
(fleet.py), and read theirs every second: a runtime judges the heals of every engine on every
host, and a cure found on another host becomes this host's marker (``take_fleet_cure``): the
engines here whose process is older restart once with it (a cure within ``CURE_WINDOW_S``; the
marker keeps the cure's own time, so a cure passed on is never a cure of its own). The router's
worker list cannot carry this: an engine whose pairs are all stale is never admitted to it, and
in a cascade that is every engine that just healed. A heal reads the other hosts before it
judges, so a cure written elsewhere a moment ago is this host's last cure too; two heals on two
hosts that complete one cascade at the same instant may both write their host's marker, and
each engine still restarts once: the later cure is older than every engine the earlier one
restarted (``due`` and ``take_fleet_cure`` act only on an engine older than the cure).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .options import Options
from .statefile import Kind, read_known, state_path, write_state
from .timings import CASCADE_WINDOW_S, CURE_WINDOW_S, MARKER_ACT_S, MARKER_LOOK_S

CASCADE_HEALS = 3
ROLES = ("prefill", "decode")
#: what the journal says about the cause, in every line about a cascade
CAUSE = ("both sides of a pair go stale toward a replaced peer (sglang #33789 and "
         "smg-project/smg #2382 together), so each heal makes the other role stale again")


@dataclass(frozen=True)
class Heal:
    at: float  # wall clock
    name: str  # the engine's runtime --name (ADDR:PORT/name for one on another host)
    role: str  # prefill | decode


class Remote(Protocol):
    """The other hosts' heals and cures, as last read (fleet.Fleet)."""

    def refresh(self) -> None: ...

    def heals(self) -> list[Heal]: ...

    def cure(self) -> tuple[float, str] | None: ...


def marker_path(state_dir: str, deployment: str) -> str:
    return state_path(state_dir, deployment or "deployment", Kind.HEAL_ALL)


def read_marker(state_dir: str, deployment: str) -> dict[str, Any] | None:
    """The last cure's marker ({"at", "by", "why"}, and "seen" when it came from another
    host), or None (missing or unreadable)."""
    doc = read_known(marker_path(state_dir, deployment))
    if doc is None or not isinstance(doc.get("at"), (int, float)):
        return None
    return doc


def held(state_dir: str) -> list[str]:
    """The engines `pdsvc apply` holds now (their NAME.hold.json files)."""
    suffix = f".{Kind.HOLD.value}.json"
    return sorted(os.path.basename(p)[:-len(suffix)]
                  for p in glob.glob(os.path.join(state_dir, f"*{suffix}")))


def heals(state_dir: str) -> list[Heal]:
    """Every engine's logged heals (the restart policy's files), oldest first."""
    out = []
    suffix = f".{Kind.RESTART.value}.json"
    for path in glob.glob(os.path.join(state_dir, f"*{suffix}")):
        doc = read_known(path) or {}
        role, log = doc.get("role"), doc.get("heal_log")
        if role not in ROLES or not isinstance(log, list):
            continue
        name = os.path.basename(path)[:-len(suffix)]
        out += [Heal(float(t), name, role) for t in log
                if isinstance(t, (int, float)) and not isinstance(t, bool)]
    return sorted(out, key=lambda h: h.at)


def is_cascade(recent: list[Heal], now: float, since: float = float("-inf")) -> str | None:
    """The rule (module docstring): what makes ``recent`` a cascade, in words, or None."""
    inside = [h for h in recent if h.at > since and now - h.at < CASCADE_WINDOW_S]
    roles = {h.role for h in inside}
    if len(inside) < CASCADE_HEALS or not set(ROLES) <= roles:
        return None
    told = ", ".join(f"{h.name} {now - h.at:.0f} s ago" for h in inside[-6:])
    return (f"{len(inside)} heals of both roles within {CASCADE_WINDOW_S / 60:g} min "
            f"({told})")


class Cascade:
    """One engine runtime's part: judge its own heals, write the marker, act on one."""

    def __init__(self, state_dir: str, deployment: str, name: str, restart_all: str,
                 log: Callable[[str], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.state_dir, self.deployment, self.name = state_dir, deployment, name
        self.restart_all = restart_all or "a restart of every engine of the deployment"
        self.log = log
        self.clock = clock
        self.next_look = 0.0
        self.reported: float | None = None  # the marker whose repeat this runtime reported
        #: the other engine hosts' heals and cures (fleet.Fleet), when the engines span hosts
        self.remote: Remote | None = None

    @classmethod
    def of(cls, a: Options, log: Callable[[str], None]) -> Cascade | None:
        """An engine runtime's part, from its options: one with pairs, a state directory and
        a role takes part; any other (a router, an engine without pairs) does not."""
        if not (a.pair and a.state_dir and a.role):
            return None
        return cls(a.state_dir, a.deployment, a.name, a.restart_all, log)

    def after_heal(self) -> str | None:
        """Called once this engine's heal is logged: the cure's reason when that heal
        completes a cascade and this runtime wrote the marker (the caller restarts its engine
        at once), else None (a repeat within CURE_WINDOW_S is only reported)."""
        if held(self.state_dir):
            return None
        self.read_remote()
        remote = self.remote.heals() if self.remote is not None else []
        why = is_cascade(sorted([*heals(self.state_dir), *remote], key=lambda h: h.at),
                         self.clock(), since=self.last_cure())
        return None if why is None else self.cure("heal cascade", why)

    def after_deadlock(self, why: str) -> str | None:
        """A stale-side dead-lock (serving.Serving.deadlocked): each role's serving engines are
        the stale side of a pair with an engine of the other role that the router does not
        list, and a heal of either would leave its role with no engine listed, so neither
        heals, and the engines left out are not admitted while their stale peers serve. The
        same cure as a cascade's, without waiting for the heals (or the last resort) that
        would make one. The cure's reason, or None (held; a cure within CURE_WINDOW_S)."""
        if held(self.state_dir):
            return None
        self.read_remote()
        return self.cure("heal cascade (a stale-side dead-lock)", why)

    def read_remote(self) -> None:
        """Read the other hosts now, not a second ago: two hosts that find one cascade within
        the same second would both cure it."""
        if self.remote is not None:
            self.remote.refresh()

    def cure(self, kind: str, why: str) -> str | None:
        """Write the marker that restarts every engine together, unless a cure came within
        CURE_WINDOW_S (then say once what the operator's cure is)."""
        now, last = self.clock(), self.last_cure()
        if now - last < CURE_WINDOW_S:
            if self.reported != last:
                self.reported = last
                self.log(f"{kind} again: {why}, {(now - last) / 60:.0f} min after every "
                         f"engine was restarted together; {CAUSE}. Not restarting everything "
                         f"again within {CURE_WINDOW_S / 60:g} min: heals go on one by one; to "
                         f"cure it, run `{self.restart_all}`")
            return None
        cure = (f"{kind} in deployment {self.deployment or '?'}: {why}; {CAUSE}. The cure: one "
                f"restart of every engine together, so that no new process meets an old one "
                f"(the same as `{self.restart_all}`)")
        write_state(marker_path(self.state_dir, self.deployment),
                    {"at": now, "by": self.name, "why": cure})
        self.log(f"{cure}: wrote {marker_path(self.state_dir, self.deployment)}")
        return cure

    def remote_cure(self) -> tuple[float, str] | None:
        return self.remote.cure() if self.remote is not None else None

    def last_cure(self) -> float:
        """The last cure this runtime knows of: its host's marker or another host's."""
        marker = read_marker(self.state_dir, self.deployment)
        remote = self.remote_cure()
        return max(float(marker["at"]) if marker else float("-inf"),
                   remote[0] if remote else float("-inf"))

    def due(self, began: float | None, monotonic: float) -> str | None:
        """Why this engine restarts now with the whole deployment (a marker newer than
        ``began``, when its engine process started (wall clock; None: not started), at most
        MARKER_ACT_S old, no hold), or None; looks every MARKER_LOOK_S (``monotonic``: the
        caller's clock)."""
        if monotonic < self.next_look or began is None:
            return None
        self.next_look = monotonic + MARKER_LOOK_S
        return self.due_now(began)

    def due_now(self, began: float | None) -> str | None:
        """``due`` without waiting for its next look: a heal about to be recorded asks first,
        so that an engine whose cure is due restarts with the cure, not on its own."""
        if began is None:
            return None
        self.take_fleet_cure(began)
        marker = read_marker(self.state_dir, self.deployment)
        if marker is None:
            return None
        at, now = float(marker["at"]), self.clock()
        seen = marker.get("seen")
        seen = float(seen) if isinstance(seen, (int, float)) else at
        if at <= began or now - seen >= MARKER_ACT_S or held(self.state_dir):
            return None
        by = marker.get("by") or "an engine"
        return (f"{by} found a heal cascade {now - at:.1f} s ago: every engine of the "
                f"deployment restarts together ({CAUSE}; "
                f"{marker_path(self.state_dir, self.deployment)})")

    def take_fleet_cure(self, began: float) -> None:
        """A cure found on another host, newer than this host's marker and than this engine's
        process, within CURE_WINDOW_S and no hold: written as this host's marker, which this
        engine and its neighbours then act on (``due``)."""
        remote = self.remote_cure()
        if remote is None:
            return
        at, by = remote
        marker = read_marker(self.state_dir, self.deployment)
        mine = float(marker["at"]) if marker else float("-inf")
        now = self.clock()
        if at <= mine or at <= began or now - at >= CURE_WINDOW_S or held(self.state_dir):
            return
        # the cure's own time (engines that restarted since took part), seen now: this is what
        # MARKER_ACT_S counts from, and what this host's view passes on unchanged (no cure of cures)
        write_state(marker_path(self.state_dir, self.deployment),
                    {"at": at, "seen": now, "by": by, "why": f"the cure {by} found "
                     f"{now - at:.0f} s ago on its host"})
        self.log(f"{by} cured a heal cascade {now - at:.0f} s ago on its host (read from "
                 f"there): this host's engines restart with it; wrote "
                 f"{marker_path(self.state_dir, self.deployment)}")
