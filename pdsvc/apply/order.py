"""The rollout as it runs on real hosts: rollout.plan_rollout's steps, then what the service
managers and the hosts require of them.

* supervisord re-reads a program's definition only when it re-creates the program's group,
  which first stops every program of that group (supervisor 4.3.0: `supervisorctl update`
  is supervisorctl.py do_update: reloadConfig, then for each changed group stopProcessGroup,
  removeProcessGroup, addProcessGroup; a group changes when any of its programs does:
  options.py ProcessGroupConfig.__eq__ compares its process_configs; and `restart G:P`
  respawns from the config the running group holds: process.py get_execv_args reads
  self.config.command). So a program whose definition changes rolls one at a time only
  when it is a group of its own; one that shares a group makes the whole group one step,
  during which serving stops, and the plan says so. A change of the shipped runtime's code
  only (not of any definition) needs no re-read: `supervisorctl restart G:P` picks it up.
* Several hosts: the steps of each host stand together, hosts in the order their first
  step had (prefill hosts first), the router's host last; each host runs its own steps with
  `pdsvc apply --host HOST`, one host after the other, so the order is the global one.
"""

from __future__ import annotations

from dataclasses import replace

from pdsvc.apply.hosts import bundle_units, hosts_of, sub_bundle
from pdsvc.apply.programs import CONF, group_members
from pdsvc.apply.rollout import Rollout, Step, StepKind, plan_rollout


def plan(old: dict[str, str], new: dict[str, str]) -> Rollout:
    r = plan_rollout(old, new)
    r = _regroup(r, old, new) or _whole_groups(r, old, new)
    return by_host(r) if hosts_of(new) else r


def _conf_of(bundle: dict[str, str], name: str) -> str:
    host = name.rpartition("/")[0]
    return (sub_bundle(bundle, host) if host else bundle).get(CONF, "")


def _regroup(r: Rollout, old: dict[str, str], new: dict[str, str]) -> Rollout | None:
    """A running bundle whose programs share a group (pdsvc's render before each program got
    a group of its own) and a new one where they stand alone: the names change (G:P -> P),
    so nothing can roll. One step per host does what `supervisorctl update` does
    (supervisorctl.py do_update): the removed group stops and goes, every program starts
    anew alone, the restart listener too (its --restart-with names change). Serving stops
    once; every later apply rolls one program at a time."""
    if CONF not in new and not any(CONF in sub_bundle(new, h) for h in hosts_of(new)):
        return None
    old_units, new_units = bundle_units(old), bundle_units(new)
    grouped = {n.rpartition("/")[0] + "/" + n.rpartition(":")[2] for n in old_units if ":" in n}
    moved = [n for n in new_units if n not in old_units and ":" not in n
             and n.rpartition("/")[0] + "/" + n.rpartition("/")[2] in grouped]
    if not moved:
        return None
    order = {"other": 0, "prefill": 1, "decode": 2, "router": 3}
    steps = []
    for host in dict.fromkeys(n.rpartition("/")[0] for n in moved):
        names = sorted((n for n in new_units if n.rpartition("/")[0] == host),
                       key=lambda n: (order.get(new_units[n].role, 0), n))
        on = f" on {host}" if host else ""
        steps.append(Step(
            StepKind.REGROUP, tuple(names), (), tuple(dict.fromkeys(
                p for s in r.steps for p in s.pairs_down)), 0, True,
            f"the running bundle{on} puts its programs in one supervisord group and this render "
            "gives each a group of its own: supervisord stops that group and starts each "
            "program alone, once (supervisorctl update); later changes roll one at a time"))
    return replace(r, steps=tuple(steps), notes=(*r.notes, "supervisord: once regrouped, "
                   "a changed program is re-read alone (docs/supervisord.md)"))


def _whole_groups(r: Rollout, old: dict[str, str], new: dict[str, str]) -> Rollout:
    """Steps of programs that share a supervisord group and whose definition changes become
    one step per group (see the module's doc)."""
    if not any(CONF in sub_bundle(new, h) for h in hosts_of(new)) and CONF not in new:
        return r
    units = bundle_units(new)
    redefined = {c.unit for c in r.changes if c.action in ("restart", "start")
                 and any(x.kind != "runtime" for x in c.reasons)}
    whole: dict[str, tuple[str, ...]] = {}  # a program's group -> its programs, as names
    for name in sorted(redefined):
        host = name.rpartition("/")[0]
        local = name.rpartition("/")[2]
        members = group_members(_conf_of(new, name), local)
        if len(members) > 1:
            group = local.rpartition(":")[0]
            names = tuple(f"{host + '/' if host else ''}{group}:{m}" for m in members)
            whole[f"{host}/{group}" if host else group] = tuple(n for n in names if n in units)
    if not whole:
        return r
    steps: list[Step] = []
    for group, members in whole.items():
        steps.append(Step(
            StepKind.UPDATE_GROUP, members, (), tuple(dict.fromkeys(
                p for s in r.steps for p in s.pairs_down)), 0, True,
            f"supervisord re-reads a changed program only by re-creating its group {group}, "
            f"which stops all {len(members)} programs of it (supervisorctl update {group})"))
    inside = {m for ms in whole.values() for m in ms}
    rest = [s for s in r.steps if not set(s.units) <= inside]
    notes = (*r.notes, "supervisord: a program that shares its group cannot take a new "
             "definition alone (supervisor 4.3.0 supervisorctl.py do_update); render each "
             "program into a group of its own to roll them one at a time")
    return replace(r, steps=(*steps, *rest), notes=notes)


def by_host(r: Rollout) -> Rollout:
    """Each host's steps together; hosts in the order of their first step, the one that
    restarts the router last."""
    def host(s: Step) -> str:
        return s.units[0].rpartition("/")[0]

    order: list[str] = []
    for s in r.steps:
        if host(s) not in order:
            order.append(host(s))
    routers = [host(s) for s in r.steps if s.action is StepKind.RESTART_ROUTER]
    order = [h for h in order if h not in routers] + [h for h in order if h in routers]
    steps = sorted(r.steps, key=lambda s: order.index(host(s)))
    return replace(r, steps=tuple(steps))


def host_steps(r: Rollout, host: str) -> list[tuple[int, Step]]:
    """(global number, step) of the steps that run on `host`: its part of each."""
    out = []
    for i, s in enumerate(r.steps, 1):
        mine = tuple(u for u in s.units if u.rpartition("/")[0] == host)
        if mine:
            out.append((i, replace(s, units=mine,
                                   takes=tuple(u for u in s.takes
                                               if u.rpartition("/")[0] == host))))
    return out


def host_sequence(r: Rollout) -> list[tuple[str, list[int]]]:
    """(host, its global step numbers) in the order the hosts run."""
    seq: list[tuple[str, list[int]]] = []
    for i, s in enumerate(r.steps, 1):
        for h in dict.fromkeys(u.rpartition("/")[0] for u in s.units):
            if seq and seq[-1][0] == h:
                seq[-1][1].append(i)
            elif h in (x for x, _ in seq):
                dict(seq)[h].append(i)
            else:
                seq.append((h, [i]))
    return seq
