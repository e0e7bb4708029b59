"""Running a rollout's steps on this host: its service manager (systemd or supervisord,
pdsvc/status/managers/) and the router, one step at a time.

Each engine step: take its engines out of the router (`DELETE /workers/{id}` on the control
plane both router generations have: sglang-router 0.3.2 and smg; the runtime's membership.py
does the same at every stop), wait until their in-flight requests have finished (the engine's
`sglang:num_running_reqs`; bounded here, since SGLang's own SIGTERM drain has no bound), then
restart (`systemctl restart`; supervisord: status/managers/), and wait until each unit is active
again in a new invocation (systemd's InvocationID; supervisord's pid and start time), its /health
answers 200, the pair canary has judged every pair good since the restart (the runtime's
NAME.canary.json: its own, or its peer's once it runs anew, since both ends probe the same
pair), and the router lists it healthy. A step that does not get there within its bound
fails, and the rollout stops there. It looks every 0.1 s (Bounds.poll_secs): with one pair
(1P1D) each late look is a moment of the outage; the service manager, a subprocess, is asked
every 0.5 s once the unit runs again.

The hold. Before it takes an engine out, apply writes the engine's hold file (the runtime's
NAME.hold.json, pdsvc/ship/runtime/hold.py): the runtime then neither joins the router nor
re-adds the engine, also once restarted, and its canary reports without healing. Once the
engine is healthy and every pair of it good, apply registers it itself (the step's engines
at once, what the runtime's own join waits for, Canary.admits) and releases it; the runtime
keeps that entry. Every hold apply wrote is removed when the rollout ends, fails or is
interrupted (release_all, called by the command in a `finally`); while it lasts it is leased
and renewed (lease.py), so a killed apply's hold ends by itself.

A pair-incompatible change by halves (rollout.halves, steps "restart half" and "switch
halves"): A restarts held out, its canary fenced to A's peers, while B serves fenced to B's
(old and new never meet: SGLang's decode dies on a page size or KV dtype mismatch, see
hold.py); the switch holds B out, then in the gap only router calls: B's DELETEs at once,
one look that the router lists none of B, A's POSTs at once (threads); A's hold lets it in
after. Between the DELETE and the POST no pair is listed: apply's part is those few calls,
the rest the router's own add (smg probes the new worker first; docs/benchmarks.md); a
request then gets the router's 503 "no available servers". sglang-router selects the pair
afresh inside its retry loop (src/routers/http/pd_router.rs execute_dual_dispatch:
handle_server_selection_error answers 503, a retryable status), backing off 200 ms doubling
(router.retry), so none fails there. smg's published source does the same
(model_gateway/src/routers/http/pd_router.rs execute_dual_dispatch_attempt), yet smg 1.13
(a compiled wheel) answers `no_available_workers` at once, without its retries, and its
prefill admission queue (--prefill-queue-size) does not hold a request for an empty pool:
a request in the gap can fail (docs/benchmarks.md). No order avoids the gap: the halves are
disjoint, and any moment the router lists a prefill of one half with a decode of the other
routes mixed pairs. Then B restarts held, and at the end every hold is released and B joins
(its runtime, once its canary judged the pairs with A: those were never probed).

Each kind of step (rollout.StepKind) runs through its own method, named in STEP_RUNS. The
router's control plane is router.py, "serving again" is ready.py, the limits are bounds.py;
everything outside (commands, HTTP, files, the clock) goes through a Host (host.py), so the
order of things is tested without a systemd.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pdsvc.apply.bounds import SHOW_TIMEOUT_S, Bounds, StepFailed
from pdsvc.apply.host import Host
from pdsvc.apply.lease import Lease
from pdsvc.apply.ready import Readiness
from pdsvc.apply.rollout import Step, StepKind
from pdsvc.apply.router import Entry, RouterClient, at_once, entry_in, routable
from pdsvc.apply.units import Unit
from pdsvc.sglang import running_requests
from pdsvc.ship.runtime.hold import hold_path
from pdsvc.status.managers import ServiceManager, Systemd

__all__ = ["STEP_RUNS", "Bounds", "Executor", "StepFailed", "running_requests"]


@dataclass
class _Run:
    """One step as it runs: the units it takes down, the run of each before, the pairs its
    canary judges (``among``: a half's engines; None: every pair) and its phases so far."""

    step: Step
    down: list[Unit]
    engines: list[Unit]
    before: dict[str, str]  # unit -> its invocation before the step
    among: list[str] | None
    t0: float
    took: list[tuple[str, float]] = field(default_factory=list)  # (phase, when it ended)
    since: float = 0.0  # wall clock, when the restart began
    held: set[str] = field(default_factory=set)  # engines held out of the router
    anew: dict[str, float] = field(default_factory=dict)  # unit -> first seen running anew


class Executor:
    """Runs steps against one host's service manager (status/managers/: systemd or
    supervisord) and the router the units name. A unit of a deployment over several hosts
    (HOST/UNIT) is asked for by its own name on its host."""

    def __init__(self, units: dict[str, Unit], host: Host, bounds: Bounds,
                 say: Callable[[str], None], manager: ServiceManager | None = None) -> None:
        self.units = units
        self.host = host
        self.bounds = bounds
        self.say = say
        self.manager = manager or Systemd(host, timeout=SHOW_TIMEOUT_S)
        self.router = RouterClient(host, bounds)
        self.ready = Readiness(units, host, bounds, self.manager, self.router, say)
        self.holds: dict[str, str] = {}  # hold file -> unit, every one written and not removed
        self.lease = Lease(host, say)  # renews them (lease.py; the command starts its thread)

    # ------------------------------------------------------------------ holds
    def _hold(self, u: Unit, *, out: bool, peers: list[str] | None, why: str) -> bool:
        """Write the engine's hold (runtime/hold.py); False without a state directory."""
        path = hold_path(u.option("--state-dir") or None,
                         u.option("--name", u.local_name.removesuffix(".service")))
        if path is None or u.kind != "engine":
            return False
        self.holds[path] = u.name
        return self.lease.hold(path, out=out, peers=peers, why=why)

    def release_all(self) -> list[str]:
        """Remove every hold this rollout wrote (at its end, on failure, on Ctrl-C); the
        units released."""
        released = []
        for path, name in list(self.holds.items()):
            self.lease.release(path)
            released.append(name)
            del self.holds[path]
        return released

    def _urls(self, names: tuple[str, ...]) -> list[str]:
        return [self.units[n].url for n in names if n in self.units and self.units[n].url]

    # ------------------------------------------------------------------ a step, by kind
    def run_step(self, step: Step) -> float:
        """Run one step the way its kind runs (STEP_RUNS); the seconds it took. Raises
        StepFailed."""
        t0 = self.host.now()
        STEP_RUNS[step.action](self, step, t0)
        return self.host.now() - t0

    def _restart(self, step: Step, t0: float) -> None:
        """Out of the router and drained, restarted, healthy with its pairs proven,
        registered by apply, released, listed."""
        run = self._begin(step, t0)
        self._take_out(run)
        self._restart_until_healthy(run, "restart")
        self._join(run, register=True)

    def _start(self, step: Step, t0: float) -> None:
        """A new unit: nothing to take out first."""
        run = self._begin(step, t0)
        self._restart_until_healthy(run, "start")
        self._join(run, register=True)

    def _restart_half(self, step: Step, t0: float) -> None:
        """Half A restarts held out while B serves fenced to B's pairs, and stays out until
        the switch; half B restarts held out, then every hold is released and B's runtimes
        join themselves (the pairs across the halves were never probed)."""
        run = self._begin(step, t0)
        first = tuple(step.units) == tuple(step.halves[0])
        self._take_out(run, fence=step.halves[1] if first else ())
        self._restart_until_healthy(run, "restart")
        if first:
            self._took(run)  # A stays out until the switch
            return
        self._join(run, register=False)

    def _reload_front(self, step: Step, t0: float) -> None:  # noqa: ARG002 (STEP_RUNS')
        """HAProxy re-reads its config (`systemctl reload`: new workers on the listening
        socket, the old ones finish their requests); nothing restarts, nothing is drained."""
        names = [self.units[n].local_name if n in self.units else n for n in step.units]
        rc, out = self.manager.act("reload", names, self.bounds.ready_secs)
        if rc != 0:
            raise StepFailed(f"{self.manager.name}: reload {' '.join(names)} failed ({rc}): "
                             f"{out.splitlines()[-1] if out else ''}")
        self.say(f"  {', '.join(names)}: reloaded (the front's socket stayed open)")

    def _begin(self, step: Step, t0: float) -> _Run:
        down = [self.units[n] for n in step.down if n in self.units]
        return _Run(step, down, [u for u in down if u.kind == "engine"],
                    {u.name: self.manager.invocation(u.local_name) for u in down},
                    self._urls(tuple(step.units)) if step.halves else None, t0)

    def _take_out(self, run: _Run, fence: tuple[str, ...] = ()) -> None:
        """The step's engines out of the router, held out once restarted (until released),
        drained. ``fence``: the other half, which serves meanwhile, its canary never probing
        this one."""
        self._wait_for_others(run.engines)
        for u in run.engines:
            self._hold(u, out=True, peers=run.among, why=f"{run.step.action} {u.name}")
        for n in fence:
            self._hold(self.units[n], out=False, peers=self._urls(fence),
                       why="the other half restarts with a pair-incompatible change")
        self._drain(run.engines)
        run.took.append(("out and drained", self.host.now()))

    def _restart_until_healthy(self, run: _Run, verb: str) -> None:
        """`verb` (restart or start) through the service manager, then wait until each unit
        runs anew, is healthy and its pairs are proven (held ones: outside the router)."""
        run.since = self.host.wall()
        names = [self.units[n].local_name if n in self.units else n for n in run.step.units]
        rc, out = self.manager.act(verb, names, self.bounds.ready_secs)
        if rc != 0:
            raise StepFailed(f"{self.manager.name}: {verb} {' '.join(names)} failed ({rc}): "
                             f"{out.splitlines()[-1] if out else ''}")
        run.took.append((f"{verb}ed (stop, start, load: {self.manager.name})", self.host.now()))
        run.held = {u.name for u in run.engines if u.name in self.holds.values()}
        self.ready.wait(run.down, run.before, run.since, held=run.held, among=run.among,
                        anew=run.anew)
        run.took.append(("healthy, pairs proven by the canary", self.host.now()))

    def _join(self, run: _Run, *, register: bool) -> None:
        """Into the router: with ``register``, apply posts the held engines at once (every
        pair of each proven since the restart: what the runtime's own join waits for,
        Canary.admits), not one membership check later each; then every hold is released,
        and the step waits until the router lists its units."""
        if register:
            posted = [u for u in run.engines if u.name in run.held and u.option("--router")]
            at_once(self.router.register, posted)
            if posted:
                self.say(f"  {', '.join(u.name for u in posted)}: registered with the router")
        for name in self.release_all():
            self.say(f"  {name}: released (joins the router)")
        self.ready.wait(run.down, run.before, run.since, anew=run.anew)
        run.took.append(("listed by the router", self.host.now()))
        self._took(run)

    def _took(self, run: _Run) -> None:
        """The step's seconds by phase, in one line."""
        parts, last = [], run.t0
        for phase, end in run.took:
            parts.append(f"{phase} {end - last:.2f}")
            last = end
        self.say(f"  took (s): {', '.join(parts)}")

    # ------------------------------------------------------------------ phases
    def _wait_for_others(self, going: list[Unit]) -> None:
        """Serving must not stop: before engines leave the router, it lists a healthy engine of
        each of their roles outside this step, where the deployment has one. An engine that
        has not (re-)joined yet (just started, back from a crash or a heal, its runtime still
        waiting for its canary) is waited for, up to the step's bound: the plan's "serving
        never stops" counts engines, the router counts the ones it can route to."""
        out = {u.name for u in going}
        others = [u for u in self.units.values()
                  if u.kind == "engine" and u.name not in out and u.url]
        roles = sorted({u.role for u in going} & {u.role for u in others})
        if not roles:
            return
        missing: list[str] = []

        def none_missing(workers: list[Entry]) -> bool:
            missing[:] = [r for r in roles if not any(
                u.role == r and routable(entry_in(workers, u)) for u in others)]
            return not missing

        def waiting() -> None:
            self.say(f"  waiting until the router lists another {' and '.join(missing)} "
                     f"before {', '.join(sorted(out))} leaves it (serving must not stop)")

        if not self.router.until(none_missing, others[0], poll=self.bounds.poll_secs,
                                 waiting=waiting):
            raise StepFailed(f"the router lists no other healthy {' or '.join(missing)} "
                             f"within {self.bounds.ready_secs:g} s: taking "
                             f"{', '.join(sorted(out))} out would stop serving")

    def _switch(self, step: Step, t0: float) -> None:  # noqa: ARG002 (STEP_RUNS' signature)
        """B out of the router, then A in; the gap between is what the router serves with no
        pair (smg 1.13 answers 503 then), so nothing else happens in it: B is held (its
        runtime then re-adds nothing) and its entries are read before; in the gap, B's DELETEs
        at once, one look that the router lists none of B, A's POSTs at once. A's runtime is
        held out meanwhile and keeps the entry apply posted once its hold lets it in."""
        a, b = ([self.units[n] for n in half] for half in step.halves)
        for u in b:
            self._hold(u, out=True, peers=self._urls(step.halves[1]),
                       why="switch to the new half")
        t_delete = self.host.now()
        old = [u for u in b if self.router.deregister(u)]
        # never a new engine beside an old one (a mixed pair): A only once B is gone
        if not self.router.until(lambda w: not any(routable(entry_in(w, u)) for u in b), b[0]):
            raise StepFailed(f"within {self.bounds.ready_secs:g} s: still listed after its "
                             f"DELETE: {', '.join(u.name for u in b)}")
        at_once(self.router.register, a)
        t_post = self.host.now()
        for u in a:
            self._hold(u, out=False, peers=self._urls(step.halves[0]),
                       why="serving; the old half restarts")
        for u in old:
            self.say(f"  {u.name}: out of the router")
        if not self.router.until(lambda w: all(routable(entry_in(w, u)) for u in a), a[0]):
            raise StepFailed(f"within {self.bounds.ready_secs:g} s: not listed by the router: "
                             f"{', '.join(u.name for u in a)}")
        self.say(f"  {', '.join(u.name for u in a)}: serving with the new definition (listed "
                 f"by the router {self.host.now() - t_delete:.2f} s after the first DELETE; "
                 f"posted {t_post - t_delete:.2f} s after it)")

    def _drain(self, engines: list[Unit]) -> None:
        """Out of the router (at once), then wait (bounded) until no request runs on them. The
        runtime re-registers an engine it finds missing unless apply holds it: one without a
        hold (no state directory) is taken out again at every look."""
        out = {u.name for u in engines}
        at_once(lambda u: out.discard(u.name) if not self.router.deregister(u) else None,
                engines)
        for u in engines:
            if u.name in out:
                self.say(f"  {u.name}: out of the router "
                         f"{' and '.join(self.router.routers(u))}")
        unheld = [u for u in engines if u.name not in self.holds.values()]
        deadline = self.host.now() + self.bounds.drain_secs
        while True:
            counts: dict[str, int | None] = {}
            down: list[str] = []  # nothing answered: no engine runs there, nothing to drain
            for u in engines:
                code, body = self.host.http("GET", f"{u.url}/metrics")
                counts[u.name] = running_requests(body) if code == 200 else None
                if code == 0:
                    down.append(u.name)
            busy = {n: c for n, c in counts.items() if c}
            if not busy:
                self._drained(counts, down)
                return
            if self.host.now() >= deadline:
                self.say(f"  drain bound ({self.bounds.drain_secs:g} s) reached with "
                         f"{sum(busy.values())} requests still running on {', '.join(busy)}: "
                         "restarting; SGLang drains them on SIGTERM within the unit's "
                         "TimeoutStopSec=")
                return
            for u in unheld:
                self.router.deregister(u)
            self.host.sleep(self.bounds.poll_secs)


    def _drained(self, counts: dict[str, int | None], down: list[str]) -> None:
        """Say why nothing is left to wait for: no request in flight, the engine down (a
        crashed one: nothing runs), or no gauge to read (SGLang's own drain finishes)."""
        unknown = [n for n, c in counts.items() if c is None and n not in down]
        if down:
            self.say(f"  {', '.join(down)}: not answering (no engine running): nothing to "
                     "drain")
        if unknown:
            self.say(f"  {', '.join(unknown)}: no sglang:num_running_reqs (metrics off?):"
                     " SGLang's own SIGTERM drain finishes what runs")
        idle = [n for n, c in counts.items() if c is not None]
        if idle:
            self.say(f"  {', '.join(idle)}: no request in flight")


#: How each kind of step runs (rollout.StepKind; the supervisord kinds, order.py, restart).
STEP_RUNS: dict[StepKind, Callable[[Executor, Step, float], None]] = {
    StepKind.RESTART: Executor._restart,
    StepKind.RESTART_TOGETHER: Executor._restart,
    StepKind.RESTART_ROUTER: Executor._restart,
    StepKind.REGROUP: Executor._restart,
    StepKind.UPDATE_GROUP: Executor._restart,
    StepKind.START: Executor._start,
    StepKind.RESTART_HALF: Executor._restart_half,
    StepKind.SWITCH_HALVES: Executor._switch,
    StepKind.RELOAD_FRONT: Executor._reload_front,
}
