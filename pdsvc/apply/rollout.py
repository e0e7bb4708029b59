"""The plan of a rollout (pure): compare the running bundle with the new one, say per unit why
it changes, and order the restarts so that serving goes on.

Rules, each for a reason:
* Only engines and the router are restarted; the target and the ready gate only need
  `systemctl daemon-reload` (their next start reads them), and the installer does that.
* A change after which an old and a new engine cannot pair (pdsvc.sglang.PAIR_FLAGS /
  PAIR_ENV: a decode refuses a prefill of another page size, KV dtype or layout when they
  connect) is never rolled one engine at a time. With at least two engines of each role
  it rolls as two halves, each with a prefill and a decode (halves()): A restarts held out
  of the router while B serves; the switch takes B out and puts A in; B restarts and joins.
  Old and new never meet, and capacity halves but never reaches zero. Otherwise the
  engines of every pair it touches restart as one step, and serving stops for that step.
* Any other change rolls one engine at a time, prefills first: a prefill's restart may take
  decodes along (their PartOf= on it), which then need no step of their own.
* A unit's restart also restarts the units that are PartOf= it (systemd.unit(5)): a step
  says which, and the pairs it takes out count them.
* New engines (a layout with more engines, or other names) start first, all in one step:
  a new engine takes nothing out of serving, and its canary proves its pairs with the
  engines that run. An engine restarted before its new peers run could never prove its
  pairs with them, and its step would fail at its bound. With a pair-incompatible change
  they start after it instead: they pair only with engines of the new definition.
* When serving stops during an engine step anyway (no pair left: on 1P1D every engine
  step), the engine steps of the rollout, on one host, become one step: the outage is one
  engine load instead of one per step, and nothing that served is lost by it.
* The router changes last: the engines register themselves again when it is back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum

from pdsvc.apply.changes import ROLE_ORDER, Change, bundle_changes
from pdsvc.apply.hosts import bundle_units
from pdsvc.apply.units import Unit


class StepKind(str, Enum):
    """What a step does (execute.py runs each kind its own way). The value is the step's
    name in a printed plan and in --json (a str: json writes the value), as before the kinds
    were typed; enum.StrEnum would do, from Python 3.11 on."""

    RESTART = "restart"  # one engine (and what is PartOf= it), the others serve
    RESTART_TOGETHER = "restart together"  # every pair a pair-incompatible change touches
    RESTART_HALF = "restart half"  # one half of a pair-incompatible change, held out
    SWITCH_HALVES = "switch halves"  # the router from half B to half A; nothing restarts
    START = "start"  # a new engine, router or front
    RELOAD_FRONT = "reload front"  # HAProxy re-reads its config; its socket stays open
    RESTART_ROUTER = "restart router"  # serving stops meanwhile, unless routers are fronted
    REGROUP = "regroup"  # supervisord: programs leave a shared group (order.py)
    UPDATE_GROUP = "update group"  # supervisord: a shared group re-created (order.py)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclass(frozen=True)
class Step:
    action: StepKind
    units: tuple[str, ...]  # what apply restarts (or starts)
    takes: tuple[str, ...]  # restarted along with them (PartOf=)
    pairs_down: tuple[str, ...]  # "PREFILL -> DECODE" without an engine during the step
    pairs_left: int  # pairs that still serve during the step
    serving_stops: bool
    why: str
    #: a pair-incompatible rollout by halves: (A, B), the units of each half
    halves: tuple[tuple[str, ...], ...] = ()

    @property
    def down(self) -> tuple[str, ...]:
        return (*self.units, *self.takes)

    def clause(self) -> str:
        """The step as a clause of a sentence: its units and what they do ("dsv4-decode.service
        restarts", "dsv4-prefill.service, dsv4-decode.service restart together")."""
        one, many = VERBS[self.action]
        return f"{', '.join(self.units)} {one if len(self.units) == 1 else many}"


#: each step's verb after one unit, and after several
VERBS: dict[StepKind, tuple[str, str]] = {
    StepKind.RESTART: ("restarts", "restart"),
    StepKind.RESTART_TOGETHER: ("restarts", "restart together"),
    StepKind.RESTART_HALF: ("restarts, one half held out", "restart, one half held out"),
    StepKind.SWITCH_HALVES: ("switches halves", "switch halves"),
    StepKind.START: ("starts", "start"),
    StepKind.RELOAD_FRONT: ("reloads", "reload"),
    StepKind.RESTART_ROUTER: ("restarts", "restart"),
    StepKind.REGROUP: ("regroups", "regroup"),
    StepKind.UPDATE_GROUP: ("is re-created as a group", "are re-created as a group"),
}


@dataclass(frozen=True)
class Rollout:
    changes: tuple[Change, ...]
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()

    @property
    def nothing_to_do(self) -> bool:
        return not self.changes

    @property
    def outage(self) -> tuple[Step, ...]:
        """The steps during which no pair serves."""
        return tuple(s for s in self.steps if s.serving_stops)

    def to_dict(self) -> dict:
        return {"changes": [asdict(c) for c in self.changes],
                "steps": [asdict(s) for s in self.steps],
                "serving_stops": bool(self.outage), "notes": list(self.notes)}


def _coupled(name: str, units: dict[str, Unit]) -> set[str]:
    """The units a restart of `name` restarts too: PartOf= it, transitively."""
    out: set[str] = set()
    todo = [name]
    while todo:
        cur = todo.pop()
        for u in units.values():
            if cur in u.part_of and u.name not in out and u.name != name:
                out.add(u.name)
                todo.append(u.name)
    return out


class _Capacity:
    """Which pairs of the new bundle serve while a set of units is down. An engine new to
    the bundle runs only from its start step on: the planner counts it down until then."""

    def __init__(self, units: dict[str, Unit], running: set[str]) -> None:
        engines = [u for u in units.values() if u.kind == "engine"]
        by_url = {u.url: u.name for u in engines if u.url}
        self.new = {u.name for u in engines if u.name not in running}
        self.pairs: list[tuple[str, str, str]] = []  # (label, prefill unit, decode unit)
        for p, d in dict.fromkeys(pair for u in engines for pair in u.pairs):
            self.pairs.append((f"{p} -> {d}", by_url.get(p, p), by_url.get(d, d)))

    def during(self, down: set[str]) -> tuple[tuple[str, ...], int]:
        lost = tuple(label for label, p, d in self.pairs if p in down or d in down)
        return lost, len(self.pairs) - len(lost)


def _pair_group(seeds: set[str], units: dict[str, Unit]) -> set[str]:
    """Every engine that shares a pair with an engine of the group, until none is added."""
    by_url = {u.url: u.name for u in units.values() if u.kind == "engine" and u.url}
    group = set(seeds)
    grew = True
    while grew:
        grew = False
        for name in list(group):
            for p, d in units[name].pairs:
                for peer in (by_url.get(p), by_url.get(d)):
                    if peer and peer not in group:
                        group.add(peer)
                        grew = True
    return group


def halves(group: set[str], units: dict[str, Unit]) -> tuple[tuple[str, ...], ...] | None:
    """Two halves of `group`, each with at least one prefill and one decode and no unit that
    restarts along with (PartOf=) a unit of the other half; None when it cannot be split,
    or spans hosts (each host runs its own steps: not yet)."""
    by_role: dict[str, list[str]] = {"prefill": [], "decode": []}
    for name in sorted(group):
        by_role.setdefault(units[name].role, []).append(name)
    if len(by_role["prefill"]) < 2 or len(by_role["decode"]) < 2 or any(
            "/" in n for n in group) or set(by_role) != {"prefill", "decode"}:
        return None
    a = tuple(n for role in ("prefill", "decode")
              for n in by_role[role][:len(by_role[role]) // 2])
    b = tuple(n for role in ("prefill", "decode")
              for n in by_role[role][len(by_role[role]) // 2:])
    for half in (a, b):
        if any(not _coupled(n, units) <= set(half) for n in half):
            return None
    return a, b


class _Planner:
    """The steps as the strategies add them: what each takes down (PartOf=), which pairs it
    leaves, and every unit a step already restarts."""

    def __init__(self, units: dict[str, Unit], capacity: _Capacity) -> None:
        self.units = units
        self.capacity = capacity
        self.steps: list[Step] = []
        self.done: set[str] = set()
        self.notes: list[str] = []
        #: several routers (router.replicas ≥ 2: only ever behind HAProxy's front): one
        #: restarts while the others serve, each unit drains itself out of the front first
        #: and is back in it when `systemctl restart` returns (its ExecStop=/ExecStartPost=)
        self.fronted = sum(u.kind == "router" for u in units.values()) > 1

    def _down(self, names: Sequence[str]) -> tuple[set[str], set[str]]:
        """(what restarts along with `names`, everything the step takes down)."""
        takes = set().union(*(_coupled(n, self.units) for n in names)) - set(names)
        return takes, set(names) | takes

    def add(self, kind: StepKind, names: Sequence[str], why: str, *, stops: bool = False,
            halves: tuple[tuple[str, ...], ...] = ()) -> None:
        """A step that restarts (or starts) `names`; serving stops when `stops`, or when no
        pair is left (a router restart: always, no pair is routed meanwhile)."""
        takes, down = self._down(names)
        lost, left = self.capacity.during(down | (self.capacity.new - self.done))
        stops = stops or (bool(self.capacity.pairs) and left == 0)
        if kind is StepKind.RELOAD_FRONT:
            lost, left, stops = (), len(self.capacity.pairs), False
        if kind is StepKind.RESTART_ROUTER:  # the others serve through the front, if any
            left = len(self.capacity.pairs) if self.fronted else 0
            lost, stops = (), not self.fronted
        self.steps.append(Step(kind, tuple(names), tuple(sorted(takes)), lost, left, stops, why,
                               halves))
        self.done.update(down)

    def add_switch(self, a: tuple[str, ...], b: tuple[str, ...], why: str) -> None:
        """The switch of halves: nothing restarts; A serves while B is out of the router."""
        self.done.update(self._down(b)[1])
        lost, left = self.capacity.during(set(b))
        self.steps.append(Step(StepKind.SWITCH_HALVES, b, (), lost, left, not left, why, (a, b)))


def _incompatible(why: str) -> str:
    return f"old and new engines cannot pair ({why})"


def _by_halves(plan: _Planner, a: tuple[str, ...], b: tuple[str, ...], keys: str) -> None:
    """A pair-incompatible change by halves: A restarts held out, the router switches from B
    to A, B restarts held out, then both join."""
    plan.add(StepKind.RESTART_HALF, a, f"{_incompatible(keys)}: half A restarts held out of "
             "the router (its canary probes only A) while half B serves", halves=(a, b))
    plan.add_switch(a, b, "B out of the router, then A in: the gap between is one membership "
                    "call, inside the routers' retries")
    plan.add(StepKind.RESTART_HALF, b, "half B restarts held out of the router, then both "
             "halves join", halves=(a, b))


def _together(plan: _Planner, group: set[str], keys: str) -> None:
    """A pair-incompatible change that cannot be halved: every pair it touches, one step."""
    names = sorted(group, key=lambda n: (ROLE_ORDER[plan.units[n].role], n))
    plan.add(StepKind.RESTART_TOGETHER, names, f"{_incompatible(keys)}: the engines of every "
             "pair it touches restart as one step", stops=True)


def _pair_incompatible(plan: _Planner, restart: list[Change]) -> set[str]:
    """The engines a pair-incompatible change restarts (by halves, else together); every
    engine that shares a pair with one of them comes along. () without such a change."""
    breaking = {c.unit for c in restart if c.pair_breaking}
    if not breaking:
        return set()
    group = _pair_group(breaking, plan.units)
    keys = "; ".join(sorted({k for c in restart for k in c.pair_breaking}))
    split = halves(group, plan.units)
    if split:
        a, b = split
        _by_halves(plan, a, b, keys)
    else:
        _together(plan, group, keys)
    return group


def _why(c: Change) -> str:
    """A change's first three reasons, and how many more."""
    return "; ".join(r.detail for r in c.reasons[:3])


def _one_by_one(plan: _Planner, restart: list[Change], group: set[str]) -> None:
    """Every other engine one at a time (prefills first: the changes come in role order),
    unless an earlier step restarts it already (PartOf=)."""
    for c in restart:
        if c.unit in group:
            continue
        if c.unit in plan.done:
            plan.notes.append(f"{c.unit} restarts with an earlier step (PartOf=)")
            continue
        more = f"; and {len(c.reasons) - 3} more" if len(c.reasons) > 3 else ""
        plan.add(StepKind.RESTART, [c.unit], _why(c) + more)


def _new_engines(plan: _Planner, changes: list[Change]) -> None:
    """Every new engine in one step (they take nothing out; the module's doc says why they
    come first)."""
    new = [c.unit for c in changes if c.action == "start" and c.role in ("prefill", "decode")]
    if new:
        plan.add(StepKind.START, new, "new engine" + "s, together" * (len(new) > 1) +
                 ": nothing is taken out for them, and they run before the engines that "
                 "pair with them restart")


#: the engine steps an outage merges into one (not the halves: they never stop serving)
MERGED_BY_OUTAGE = frozenset({StepKind.START, StepKind.RESTART, StepKind.RESTART_TOGETHER})


def _one_outage(plan: _Planner) -> None:
    """When some engine step leaves no pair, the engine steps become one (module's doc):
    serving stops for that step whatever the others do, so the others' loads, one after
    another, only make the rollout and the outage longer. Not across hosts: each host runs
    its part of a step on its own (order.py)."""
    steps = [s for s in plan.steps if s.action in MERGED_BY_OUTAGE]
    hosts = {n.rpartition("/")[0] for s in steps for n in s.down}
    if len(steps) < 2 or not any(s.serving_stops for s in steps) or len(hosts) > 1:
        return
    names = sorted(dict.fromkeys(n for s in steps for n in s.units),
                   key=lambda n: (ROLE_ORDER[plan.units[n].role], n))
    plan.steps = [s for s in plan.steps if s not in steps]
    plan.add(StepKind.RESTART_TOGETHER, names, f"serving stops during {_steps(steps)} anyway "
             f"(no pair left): these {len(steps)} steps' engines restart (or start) as one, "
             f"one engine load instead of {len(steps)}", stops=True)


def _steps(steps: list[Step]) -> str:
    """Which of ``steps`` stop serving, in words."""
    stopping = [s for s in steps if s.serving_stops]
    return ("each of them" if len(stopping) == len(steps) else
            " and ".join(f"{s.action} {', '.join(s.units)}" for s in stopping))


def _front(plan: _Planner, changes: list[Change]) -> None:
    """The front before the routers: a new one starts (on the clients' port, which the
    installer freed by removing the router that held it), a changed one (its unit or its
    config) reloads: HAProxy's new workers take the listening socket over, the old ones
    finish their requests (haproxy(1), -Ws and SIGUSR2)."""
    for c in changes:
        if c.role == "front":
            if c.action == "start":
                plan.add(StepKind.START, [c.unit], "the front: HAProxy on the clients' port, "
                         "before the routers behind it", stops=_routers_replaced(changes))
            elif c.action == "restart":
                plan.add(StepKind.RELOAD_FRONT, [c.unit], _why(c) + "; a reload, not a "
                         "restart: no connection is refused or cut")


def _router(plan: _Planner, changes: list[Change]) -> None:
    """The router last: the engines register themselves again once it is back. Several
    routers: one at a time, each out of the front while it restarts."""
    for c in changes:
        if c.role == "router" and c.action in ("restart", "start"):
            kind = StepKind.RESTART_ROUTER if c.action == "restart" else StepKind.START
            how = ("; drained out of the front first, back in it once it serves, the other "
                   "routers serve meanwhile" if plan.fronted and c.action == "restart" else "")
            plan.add(kind, [c.unit], _why(c) + "; the engines register themselves again once "
                     "it is back" + how, stops=c.action == "start" and _routers_replaced(changes))
    if _routers_replaced(changes):
        plan.notes.append(
            "router.replicas changes: the installer removes "
            + ", ".join(c.unit for c in changes if c.role == "router" and c.action == "remove")
            + ", so serving stops from the install until the new routers serve")


def _vip(plan: _Planner, changes: list[Change]) -> None:
    """keepalived last, one router host at a time: a restart gives the address up (the other
    router host takes it within three adverts, and clients' connections are sent again there)
    and reads its config anew (it came in as a credential at its start)."""
    for c in changes:
        if c.role == "vip" and c.action in ("restart", "start"):
            kind = StepKind.RESTART if c.action == "restart" else StepKind.START
            plan.add(kind, [c.unit], _why(c) + "; the moving address goes to another router "
                     "host meanwhile (~3 adverts); requests sent then are late, not lost")


def _routers_replaced(changes: list[Change]) -> bool:
    """A router unit goes and another comes (router.replicas changed): no router serves
    from the install, which removes the old one, until the new ones are up."""
    return any(c.role == "router" and c.action == "remove" for c in changes) and any(
        c.role == "router" and c.action == "start" for c in changes)


def plan_rollout(old: dict[str, str], new: dict[str, str]) -> Rollout:
    """The rollout from the running bundle `old` to `new` (each: path in the bundle -> text):
    new engines first, then the other engines one by one (a pair-incompatible change: it
    first, by halves or together, and new engines after the others), one step for all of
    them when serving stops anyway, and the router last."""
    old_units, new_units = bundle_units(old), bundle_units(new)
    changes = bundle_changes(old, new, old_units, new_units)
    restart = [c for c in changes if c.action == "restart" and c.role in ("prefill", "decode")]
    plan = _Planner(new_units, _Capacity(new_units, set(old_units)))
    breaking = any(c.pair_breaking for c in restart)
    if not breaking:
        _new_engines(plan, changes)
    _one_by_one(plan, restart, _pair_incompatible(plan, restart))
    if breaking:
        _new_engines(plan, changes)
    _one_outage(plan)
    _front(plan, changes)
    _router(plan, changes)
    _vip(plan, changes)
    return Rollout(tuple(changes), tuple(plan.steps), tuple(plan.notes))


def format_rollout(r: Rollout) -> str:
    """The plan as a person reads it: what changes and why, then the steps."""
    if r.nothing_to_do:
        return "nothing to do: the running bundle is what this config renders"
    lines = ["changes:"]
    for c in r.changes:
        head = f"  {c.unit} ({c.action}{' only: systemctl daemon-reload' * (c.action == 'reload')})"
        lines.append(head)
        lines += [f"      {x.kind}: {x.detail}" for x in c.reasons]
        if c.pair_breaking:
            lines.append("      PAIR-INCOMPATIBLE: " + "; ".join(c.pair_breaking))
    if r.steps:
        lines.append("steps (each engine: out of the router, drained, restarted, healthy, "
                     "registered again, its pairs' canary good; then the next):")
    for i, s in enumerate(r.steps, 1):
        takes = f" (takes {', '.join(s.takes)} along: PartOf=)" if s.takes else ""
        lines.append(f"  {i}. {s.action} {', '.join(s.units)}{takes}")
        lines.append(f"     why: {s.why}")
        if s.action is StepKind.RESTART_ROUTER and s.serving_stops:
            lines.append("     serving STOPS while the router restarts")
        elif s.action is StepKind.RESTART_ROUTER:
            lines.append("     serving goes on: the other routers, through the front")
        elif s.action is StepKind.SWITCH_HALVES:
            lines.append(f"     serving goes on: {', '.join(s.halves[0])} serve(s) with the "
                         f"new definition ({s.pairs_left} pairs), no mixed pair ever routed")
        elif s.serving_stops and not s.pairs_down:
            lines.append("     serving STOPS: no router serves until the new ones do")
        elif s.serving_stops:
            lines.append(f"     serving STOPS: no pair left ({len(s.pairs_down)} pairs down)")
        elif s.pairs_down:
            lines.append(f"     capacity: {len(s.pairs_down)} pairs down "
                         f"({', '.join(s.pairs_down)}), {s.pairs_left} serving")
    lines += [f"note: {n}" for n in r.notes]
    lines.append("serving: " + ("STOPS during step " + ", ".join(
        str(r.steps.index(s) + 1) for s in r.outage) if r.outage else "never stops"))
    return "\n".join(lines)
