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
* **Once**: a cascade within ``CURE_WINDOW_S`` (1 h) of the last cure is reported, with the
  command that restarts the whole deployment, and nothing more is done than the heals
  themselves (each still within the heal budget).
* **A hold** by `pdsvc apply` (any NAME.hold.json in the state directory) suppresses it all:
  no marker is written and none is acted on while apply rolls a change.

**Across hosts** the state directory is one host's. The runtimes of a deployment share the
rest through the router they all register with (the control-plane key guards it): each
engine's registration carries labels (``pdsvc.deployment``, ``pdsvc.heals``: its own heals
within the window, ``pdsvc.cure``: the last cure it knows), which both router generations
list with the worker (sglang-router 0.3.2 as ``metadata``, smg 1.13 as ``labels``), and every
runtime reads the list at each membership check. A heal restarts its engine, whose new
registration carries the heal; so a runtime judges the heals of every engine the router lists,
on every host. The cure reaches another host when the engine that found it is back and
registered with the cure's time: an engine there whose process is older restarts once, and
writes the marker on its own host for its neighbours (a cure within ``CURE_WINDOW_S``; its
engine would otherwise never meet the cure).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .options import Options
from .policy import recent_heals
from .statefile import Kind, read_known, state_path, write_state
from .timings import CASCADE_WINDOW_S, CURE_WINDOW_S, MARKER_ACT_S, MARKER_LOOK_S

CASCADE_HEALS = 3
ROLES = ("prefill", "decode")
#: what the journal says about the cause, in every line about a cascade
CAUSE = ("both sides of a pair go stale toward a replaced peer (sglang #33789 and "
         "smg-project/smg #2382 together), so each heal makes the other role stale again")


#: the labels each engine's registration carries for the others (module docstring)
LABEL_DEPLOYMENT, LABEL_HEALS, LABEL_CURE = "pdsvc.deployment", "pdsvc.heals", "pdsvc.cure"


@dataclass(frozen=True)
class Heal:
    at: float  # wall clock
    name: str  # the engine's runtime --name (the router's URL for one on another host)
    role: str  # prefill | decode


def labels_of(entry: dict[str, Any]) -> dict[str, str]:
    """A worker entry's labels: smg lists them as ``labels``, sglang-router 0.3.2 (with what
    it read of the engine's /server_info) as ``metadata``."""
    for key in ("labels", "metadata"):
        found = entry.get(key)
        if isinstance(found, dict) and LABEL_DEPLOYMENT in found:
            return {str(k): str(v) for k, v in found.items()}
    return {}


def _times(text: str) -> list[float]:
    out = []
    for word in text.split(","):
        try:
            out.append(float(word))
        except ValueError:
            continue
    return out


def fleet_heals(entries: list[dict[str, Any]], deployment: str) -> list[Heal]:
    """The heals of the deployment's engines as the router lists them (their labels)."""
    out = []
    for e in entries:
        labels = labels_of(e)
        role = str(e.get("worker_type", ""))
        if labels.get(LABEL_DEPLOYMENT) != deployment or role not in ROLES:
            continue
        name = str(e.get("url", "?"))
        out += [Heal(t, name, role) for t in _times(labels.get(LABEL_HEALS, ""))]
    return out


def fleet_cure(entries: list[dict[str, Any]], deployment: str) -> tuple[float, str] | None:
    """The latest cure any of the deployment's engines knows: (wall clock, its URL)."""
    cures = [(t, str(e.get("url", "?"))) for e, labels in ((e, labels_of(e)) for e in entries)
             if labels.get(LABEL_DEPLOYMENT) == deployment
             for t in _times(labels.get(LABEL_CURE, ""))]
    return max(cures) if cures else None


def merged(local: list[Heal], fleet: list[Heal]) -> list[Heal]:
    """This host's heals, and the router's of other hosts, oldest first: an engine of this
    host is in its file and in its labels (the labels' time rounded), and counts once."""
    mine = {(h.role, round(h.at, 2)) for h in local}
    return sorted([*local, *(h for h in fleet if (h.role, round(h.at, 2)) not in mine)],
                  key=lambda h: h.at)


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
        #: the router's worker entries at the last membership check (Membership.entries)
        self.fleet: Callable[[], list[dict[str, Any]]] = list

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
        now = self.clock()
        last = self.last_cure()
        why = is_cascade(merged(heals(self.state_dir),
                                fleet_heals(self.fleet(), self.deployment)), now, since=last)
        if why is None:
            return None
        if now - last < CURE_WINDOW_S:
            if self.reported != last:
                self.reported = last
                self.log(f"heal cascade again: {why}, {(now - last) / 60:.0f} min after every "
                         f"engine was restarted together; {CAUSE}. Not restarting everything "
                         f"again within {CURE_WINDOW_S / 60:g} min: heals go on one by one; "
                         f"to cure it, run `{self.restart_all}`")
            return None
        cure = (f"heal cascade in deployment {self.deployment or '?'}: {why}; {CAUSE}. The "
                f"cure: one restart of every engine together, so that no new process meets "
                f"an old one (the same as `{self.restart_all}`)")
        write_state(marker_path(self.state_dir, self.deployment),
                   {"at": now, "by": self.name, "why": cure})
        self.log(f"{cure}: wrote {marker_path(self.state_dir, self.deployment)}")
        return cure

    def last_cure(self) -> float:
        """The last cure this runtime knows of: its host's marker or one the router lists."""
        marker = read_marker(self.state_dir, self.deployment)
        remote = fleet_cure(self.fleet(), self.deployment)
        return max(float(marker["at"]) if marker else float("-inf"),
                   remote[0] if remote else float("-inf"))

    def labels(self) -> dict[str, str]:
        """What this engine's registration tells the deployment's other runtimes: its heals
        within the window (its restart policy's file) and the last cure it knows."""
        doc = read_known(state_path(self.state_dir, self.name, Kind.RESTART)) or {}
        mine = recent_heals(doc.get("heal_log"), self.clock(), CASCADE_WINDOW_S)
        out = {LABEL_DEPLOYMENT: self.deployment, LABEL_HEALS: ",".join(f"{t:.2f}" for t in mine)}
        last = self.last_cure()
        if last > float("-inf"):
            out[LABEL_CURE] = f"{last:.2f}"
        return out

    def due(self, began: float | None, monotonic: float) -> str | None:
        """Why this engine restarts now with the whole deployment (a marker newer than
        ``began``, when its engine process started (wall clock; None: not started), at most
        MARKER_ACT_S old, no hold), or None; looks every MARKER_LOOK_S (``monotonic``: the
        caller's clock)."""
        if monotonic < self.next_look or began is None:
            return None
        self.next_look = monotonic + MARKER_LOOK_S
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
        remote = fleet_cure(self.fleet(), self.deployment)
        if remote is None:
            return
        at, by = remote
        marker = read_marker(self.state_dir, self.deployment)
        mine = float(marker["at"]) if marker else float("-inf")
        now = self.clock()
        if at <= mine or at <= began or now - at >= CURE_WINDOW_S or held(self.state_dir):
            return
        # the cure's own time (engines that restarted since took part), seen now: this is what
        # MARKER_ACT_S counts from, and what the labels pass on unchanged (no cure of cures)
        write_state(marker_path(self.state_dir, self.deployment),
                    {"at": at, "seen": now, "by": by, "why": f"the cure {by} found "
                     f"{now - at:.0f} s ago on its host, as the router lists it"})
        self.log(f"{by} cured a heal cascade {now - at:.0f} s ago on its host (the router "
                 f"lists it): this host's engines restart with it; wrote "
                 f"{marker_path(self.state_dir, self.deployment)}")
