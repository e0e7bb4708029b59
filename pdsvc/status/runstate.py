"""What the units' runtimes left for `pdsvc status` in their state directory: how each unit's
last run ended (the restart policy's NAME.restart.json: why it gave up, crashes in a row) and
the pair canary's view of every prefill×decode pair (NAME.canary.json), as a P×D matrix.

The files are the runtime's own (pdsvc/ship/runtime/policy.py, canary.py); this module only reads
them, leniently: a missing or unreadable file is "unknown", never an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdsvc.plan.build import Plan
from pdsvc.ship.runtime.canary import PairHealth
from pdsvc.ship.runtime.endings import Phase
from pdsvc.ship.runtime.hold import lease_end, profile_end
from pdsvc.ship.runtime.metrics import exposition, unit_samples
from pdsvc.ship.runtime.policy import recent_heals
from pdsvc.ship.runtime.statefile import Kind, NewerFormat, read_known, read_state, state_path
from pdsvc.ship.runtime.timings import SLOW_HEAL_S


@dataclass(frozen=True)
class UnitRun:
    unit: str
    phase: str  # starting | serving | stopped | crashed | failed-start | gave-up | unknown
    reason: str
    crashes: int
    heals: int = 0  # pair heals within the hour that brought no pair back (policy.may_heal)
    held: str = ""  # pdsvc apply's hold on the engine (runtime/hold.py), as words; "" if none
    loaded_s: float | None = None  # the last start that served: its load until /health 200
    duties: str = ""  # the runtime's duties that failed in this run (duties.py), as words


@dataclass(frozen=True)
class PairView:
    prefill: str
    decode: str
    state: PairHealth  # UNKNOWN: no engine has judged it yet
    since: float | None  # wall clock: failing since / ok since
    last_error: str
    by: str  # the engine whose canary said so


#: a unit whose restart file is of a newer format than this pdsvc reads (UnitRun.phase)
NEWER = "newer-format"


def _state(directory: Path, name: str, kind: Kind) -> dict[str, Any] | None:
    return read_known(state_path(str(directory), name, kind))


def state_dir(plan: Plan, backend: str) -> Path:
    """Where the runtimes keep their state: RuntimeDirectory= under systemd, beside
    supervisord's socket otherwise (both the plan's)."""
    return Path(plan.supervisord.state_dir if backend == "supervisord" else plan.paths.run_dir)


def unit_runs(plan: Plan, directory: Path) -> list[UnitRun]:
    runs = []
    names = [e.name for e in plan.engines] + [r.name for r in plan.routers]
    for name in dict.fromkeys(names):
        try:
            doc = read_state(state_path(str(directory), name, Kind.RESTART)) or {}
        except NewerFormat as e:
            doc = {"phase": NEWER, "reason": str(e)}
        recent = recent_heals(doc.get("heals"), time.time())
        runs.append(UnitRun(f"{name}.service", str(doc.get("phase", "unknown")),
                            str(doc.get("reason", "")), int(doc.get("crashes", 0) or 0),
                            len(recent), hold_words(directory, name), _loaded(doc),
                            duty_words(directory, name)))
    return runs


def duty_words(directory: Path, name: str) -> str:
    """The runtime's duties that raised in this run, as words: each duty, how often, its
    last words and what followed (duties.py); "" when none did."""
    doc = _state(directory, name, Kind.DUTIES) or {}
    failed = doc.get("duties")
    if not isinstance(failed, dict):
        return ""
    return "; ".join(f"duty {duty} failed {f.get('count')}x (it {f.get('policy')}; last: "
                     f"{f.get('last')})" for duty, f in sorted(failed.items())
                     if isinstance(f, dict))


def _loaded(doc: dict[str, Any]) -> float | None:
    """The seconds the last start that served spent loading (the restart policy's
    start_phases["starting"]: load, compile, warm-up until /health is 200), or None."""
    phases = doc.get("start_phases")
    took = phases.get("starting") if isinstance(phases, dict) else None
    return float(took) if isinstance(took, (int, float)) and took > 0 else None


def hold_words(directory: Path, name: str, now: float | None = None) -> str:
    """apply's hold on the engine as words: how long its lease has left, or that it expired
    (the runtime ignores it then: hold.Hold.doc)."""
    hold = _state(directory, name, Kind.HOLD)
    if hold is None:
        return ""
    now = time.time() if now is None else now
    path, by = state_path(str(directory), name, Kind.HOLD), hold.get("by") or "pdsvc apply"
    until = lease_end(hold)
    if until is not None and until <= now:
        return f"hold by {by} expired {now - until:.0f} s ago (not renewed: {by} is gone): " \
               f"the runtime ignores it and the engine serves as usual ({path}: stale)"
    since = hold.get("since")
    ago = f" for {int(now - since)} s" if isinstance(since, int | float) else ""
    left = f" (lease: {until - now:.0f} s left)" if until is not None else ""
    if hold.get("profile"):
        if now >= profile_end(hold):
            return f"profile hold {hold['profile']} past its bound: the runtime judges the " \
                   f"engine as usual ({path}: stale)"
        return f"profiled by {by}{ago}{left} (run {hold['profile']}): liveness not judged " \
               "while it writes its trace, router health checks paused, no heals " \
               f"({path}: removing it releases the engine)"
    what = "out of the router" if hold.get("out") is not False else "in the router"
    peers = hold.get("peers")
    fence = f", canary only with {', '.join(map(str, peers))}" if isinstance(peers, list) else ""
    return f"held by {by}{ago}{left}: {what}{fence}, no heals " \
           f"({path}: removing it releases the engine)"


def pair_views(plan: Plan, directory: Path) -> list[PairView]:
    """Every prefill×decode pair, with the worst word any of its two engines has for it."""
    rank = {PairHealth.FAILING.value: 4, PairHealth.PEER_DOWN.value: 3,
            PairHealth.BUSY.value: 2, PairHealth.OK.value: 1, PairHealth.UNKNOWN.value: 0}
    views: dict[tuple[str, str], PairView] = {}
    for e in plan.engines:
        for prefill, _, decode in e.pairs:
            views.setdefault((prefill, decode), PairView(prefill, decode, PairHealth.UNKNOWN,
                                                         None, "", ""))
        doc = _state(directory, e.name, Kind.CANARY) or {}
        for p in doc.get("pairs", []):
            prefill, _, decode = str(p.get("pair", "")).partition(" -> ")
            key, state = (prefill, decode), str(p.get("state", PairHealth.UNKNOWN.value))
            since = p.get("failing_since") if state == PairHealth.FAILING else p.get("last_ok")
            old = views.get(key)
            if old is not None and rank.get(state, 0) > rank.get(old.state.value, 0):
                views[key] = PairView(prefill, decode, PairHealth(state), since,
                                      str(p.get("last_error", "")), e.name)
    return list(views.values())


def problems(runs: list[UnitRun], pairs: list[PairView], heal_budget: int = 0) -> list[str]:
    out = [f"{r.unit} gave up: {r.reason}" for r in runs if r.phase == Phase.GAVE_UP]
    out += [f"{r.unit}: {r.reason}" for r in runs if r.phase == NEWER]
    out += [f"{r.unit}: {r.heals} pair heals within the hour brought no pair back: it heals "
            f"again only every {SLOW_HEAL_S / 60:g} minutes (`systemctl restart {r.unit}` "
            "starts afresh)"
            for r in runs if heal_budget and r.heals >= heal_budget]
    out += [f"{r.unit} {r.held}" for r in runs if r.held]
    out += [f"{r.unit}: {r.duties}" for r in runs if r.duties]
    out += [f"pair {p.prefill} -> {p.decode} failing ({p.by}): {p.last_error}"
            for p in pairs if p.state is PairHealth.FAILING]
    return out


def format_pairs(pairs: list[PairView], now: float | None = None) -> list[str]:
    """The P×D matrix: one row per prefill, one column per decode."""
    if not pairs:
        return []
    now = time.time() if now is None else now
    prefills = list(dict.fromkeys(p.prefill for p in pairs))
    decodes = list(dict.fromkeys(p.decode for p in pairs))
    cell = {(p.prefill, p.decode): p for p in pairs}

    def word(p: PairView | None) -> str:
        if p is None:
            return "-"
        if p.state is PairHealth.FAILING and p.since is not None:
            return f"FAILING {int(now - p.since)}s"
        return p.state

    rows = [["prefill \\ decode", *decodes]]
    rows += [[pf, *(word(cell.get((pf, d))) for d in decodes)] for pf in prefills]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["pair canary (prefill x decode):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    lines += [f"  {p.prefill} -> {p.decode}: {p.last_error}" for p in pairs
              if p.state is PairHealth.FAILING and p.last_error]
    return lines


def to_dict(runs: list[UnitRun], pairs: list[PairView]) -> dict[str, Any]:
    return {
        "runs": [r.__dict__ for r in runs],
        "pairs": [p.__dict__ for p in pairs],
    }


def metrics_text(plan: Plan, directory: Path, up: dict[str, bool], now: float) -> str:
    """`pdsvc status --metrics`: the pdsvc_* series of every unit of the plan, from the same
    state files the runtimes derive their textfiles from (runtime/metrics.py); ``up``: each
    unit's service manager state (unit -> active)."""
    samples = []
    units: list[tuple[str, str, bool]] = [(e.name, e.role, bool(e.pairs)) for e in plan.engines]
    units += [(r.name, "router", False) for r in plan.routers]
    for name, role, paired in dict.fromkeys(units):
        labels = {"deployment": plan.name, "role": role, "unit": f"{name}.service"}
        samples += unit_samples(
            labels, _state(directory, name, Kind.RESTART),
            _state(directory, name, Kind.CANARY), _state(directory, name, Kind.METRICS),
            up=up.get(f"{name}.service"),
            heal_budget=plan.lifecycle.canary_heal_attempts if paired else None, now=now,
            duties=_state(directory, name, Kind.DUTIES),
            profile=_state(directory, name, Kind.PROFILE))
    return exposition(samples)
