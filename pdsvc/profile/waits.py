"""What `pdsvc profile` waits for, each with a bound and progress on stderr: every batch full,
the runtime's answer to the hold, every rank's trace whole, the engine healthy again; and the
tok/s measured under the load.

The batch and the tok/s come from the engine's own /metrics (SGLang with --enable-metrics,
srt/observability/metrics_collector.py): ``sglang:num_running_reqs`` (the running batch),
``sglang:num_queue_reqs`` (requests waiting for a place in it), and the token counters a
finished request adds to, ``sglang:generation_tokens_total`` (a decode's output) and
``sglang:prompt_tokens_total`` (a prefill's input).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pdsvc.profile.engines import Engine
from pdsvc.profile.options import CannotProfile, ProfileError
from pdsvc.profile.trace import incomplete, rank_of
from pdsvc.ship.runtime.rounds import sample_sum
from pdsvc.ship.runtime.statefile import read_known

RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"
TOKENS = {"decode": "sglang:generation_tokens_total", "prefill": "sglang:prompt_tokens_total"}
LOOK_S = 1.0  # between looks at an engine's /metrics while the batch fills
STEADY_LOOKS = 5  # a window of looks: tokens/s of two in a row within STEADY is steady
STEADY = 0.25
POLL_S = 0.5  # between looks at the traces, the runtime's answer, /health
PROGRESS_S = 10.0  # a progress line while a wait goes on this long
#: how long each engine's runtime has to answer a hold: a look (runtime PROFILE_LOOK_S) and
#: a call to each router (its ROUTER_CALL_TIMEOUT_S), with room
ACK_WAIT_S = 15.0
#: how long an engine has to answer /health 200 once its trace is whole
HEALTHY_WAIT_S = 60.0
#: with no /metrics to read: seconds of load before the capture
BLIND_WARMUP_S = 10.0


@dataclass(frozen=True)
class Fill:
    """What makes one engine's batch full."""

    engine: Engine
    batch: int | None = None  # this many running: its limit, or a decode's share of the load
    batch_words: str = ""  # what that number is
    #: a prefill's: the decodes and the share each runs when the load's requests are all in
    #: flight (the prefill then sees them arrive at the pace they finish)
    feeders: tuple[tuple[Engine, int], ...] = ()
    least: float = 0.0  # tokens/s a steady load has at least (a request a second)


class Host(Protocol):
    def http(self, method: str, url: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0, body: bytes | None = None) -> tuple[int, str]: ...

    def now(self) -> float: ...

    def sleep(self, secs: float) -> None: ...


@dataclass(frozen=True)
class Waits:
    """The waits of one run: its host (HTTP, clock) and where progress goes."""

    host: Host
    say: Callable[[str], None]

    def metrics(self, e: Engine, names: tuple[str, ...]) -> dict[str, float] | None:
        """Each of ``names`` in the engine's /metrics (None: no /metrics to read)."""
        if not e.metrics:
            return None
        status, text = self.host.http("GET", f"{e.url}/metrics", timeout=5.0)
        if status != 200:
            return None
        found = {n: sample_sum(text, (n,)) for n in names}
        return {n: v for n, v in found.items() if v is not None}

    def full(self, fills: list[Fill], timeout: float, alive: Callable[[], str | None]
             ) -> dict[str, str]:
        """Wait until each engine's batch is full (Fill says what makes it so), at most
        ``timeout`` s; how it knew, per engine. ``alive``: why the load stopped, or None
        while it runs."""
        seen: dict[str, list[tuple[float, float, float]]] = {f.engine.name: [] for f in fills}
        found: dict[str, str] = {}
        start = last_said = self.host.now()
        while len(found) < len(fills):
            gone = alive()
            if gone:
                raise CannotProfile(f"the load stopped before the batches were full: {gone}")
            for f in (f for f in fills if f.engine.name not in found):
                why = self._full(f, seen[f.engine.name])
                if why:
                    found[f.engine.name] = why
                    self.say(f"pdsvc profile: {f.engine.name}: batch full: {why}")
            now = self.host.now()
            if len(found) < len(fills) and now - start >= timeout:
                return {**found, **{f.engine.name: self._not_full(f.engine, seen[f.engine.name],
                                                                  timeout)
                                    for f in fills if f.engine.name not in found}}
            if now - last_said >= PROGRESS_S and len(found) < len(fills):
                last_said = now
                self.say("pdsvc profile: waiting for full batches: " + ", ".join(
                    f"{n} runs {v[-1][1]:g}" for n, v in seen.items() if n not in found and v)
                    + f" ({now - start:.0f} s of {timeout:g})")
            self.host.sleep(LOOK_S)
        return found

    def _full(self, f: Fill, seen: list[tuple[float, float, float]]) -> str | None:
        m = self.metrics(f.engine, (RUNNING, QUEUED, TOKENS[f.engine.role]))
        if m is None:
            self.host.sleep(BLIND_WARMUP_S)
            return (f"no /metrics to read (metrics.engines: false): {BLIND_WARMUP_S:g} s of "
                    "load, not checked")
        running, queued = m.get(RUNNING, 0.0), m.get(QUEUED, 0.0)
        seen.append((self.host.now(), running, m.get(TOKENS[f.engine.role], 0.0)))
        if f.batch and running >= f.batch:
            return f"{running:g} running ({RUNNING}): {f.batch_words}"
        if running > 0 and queued > 0:
            return f"{running:g} running, {queued:g} waiting in its queue ({QUEUED})"
        if f.feeders and all((self.metrics(d, (RUNNING,)) or {}).get(RUNNING, 0.0) >= n
                             for d, n in f.feeders):
            names = ", ".join(d.name for d, _ in f.feeders)
            return (f"every decode runs its share of the load ({names}): the requests it "
                    "prefills arrive steadily")
        return self._steady(f, seen)

    def _steady(self, f: Fill, seen: list[tuple[float, float, float]]) -> str | None:
        """Its tokens/s over the last two windows of STEADY_LOOKS looks, each at least
        ``f.least`` and within STEADY of each other."""
        if len(seen) < 2 * STEADY_LOOKS + 1:
            return None
        a, b, c = seen[-2 * STEADY_LOOKS - 1], seen[-STEADY_LOOKS - 1], seen[-1]
        r0, r1 = (b[2] - a[2]) / max(1e-6, b[0] - a[0]), (c[2] - b[2]) / max(1e-6, c[0] - b[0])
        if min(r0, r1) >= max(f.least, 1e-9) and abs(r1 - r0) <= STEADY * max(r0, r1):
            return (f"{r1:.0f} tok/s ({TOKENS[f.engine.role]}), steady over two windows of "
                    f"{STEADY_LOOKS * LOOK_S:g} s")
        return None

    def _not_full(self, e: Engine, seen: list[tuple[float, float, float]],
                  timeout: float) -> str:
        if not seen or seen[-1][2] <= seen[0][2]:
            raise CannotProfile(f"{e.name} served no request within {timeout:g} s of load "
                                "(its token counter did not move): does the load reach it? "
                                "see `pdsvc status`")
        return f"not steady after {timeout:g} s: captured anyway"

    def tok_s(self, engines: list[Engine], role: str, secs: float) -> dict[str, float | None]:
        """Each engine's tokens/s over ``secs`` s now (None without /metrics)."""
        name = TOKENS[role]
        first = {e.name: (self.metrics(e, (name,)) or {}).get(name) for e in engines}
        t0 = self.host.now()
        self.host.sleep(secs)
        took = max(1e-6, self.host.now() - t0)
        out: dict[str, float | None] = {}
        for e in engines:
            after = (self.metrics(e, (name,)) or {}).get(name)
            before = first[e.name]
            out[e.name] = None if after is None or before is None else (after - before) / took
        return out

    def acknowledged(self, acks: dict[str, str], run: str) -> dict[str, dict[str, str]]:
        """Wait for each engine's runtime to answer the hold (its NAME.profile.json naming
        ``run``, every router paused): CannotProfile when one does not within ACK_WAIT_S."""
        start = self.host.now()
        while True:
            docs = {name: read_known(path) for name, path in acks.items()}
            mine = {n: d for n, d in docs.items() if d and d.get("run") == run
                    and not d.get("ended")}
            paused = {n: d.get("routers") or {} for n, d in mine.items()}
            if len(mine) == len(acks) and not any(v for r in paused.values() for v in r.values()):
                return paused
            if self.host.now() - start >= ACK_WAIT_S:
                raise CannotProfile(self._unanswered(acks, mine, paused))
            self.host.sleep(POLL_S)

    @staticmethod
    def _unanswered(acks: dict[str, str], mine: dict, paused: dict[str, dict[str, str]]) -> str:
        missing = [n for n in acks if n not in mine]
        if missing:
            return (f"the runtime of {', '.join(missing)} did not take the profile hold within "
                    f"{ACK_WAIT_S:g} s (no {acks[missing[0]]} naming this run): its runtime "
                    "predates pdsvc profile, or is not running (or --state-dir is not its "
                    "state directory); render and install the bundle again, restart the unit, "
                    "then try again")
        refused = "; ".join(f"{n}: router {r}: {why}" for n, rs in paused.items()
                            for r, why in rs.items() if why)
        return (f"a router did not pause its health checks ({refused}): it would take the "
                "frozen engine out of rotation and fail requests; see `pdsvc status`")

    def traces(self, e: Engine, directory: Path, stage: str | None, timeout: float
               ) -> list[Path]:
        """Wait until each TP rank's trace in ``directory`` is whole (ProfileError past
        ``timeout``); the files in rank order."""
        start = last_said = self.host.now()
        while True:
            found, why = whole(directory, e.tp, stage)
            if len(found) == e.tp:
                return [found[r] for r in range(e.tp)]
            now = self.host.now()
            if now - start >= timeout:
                raise ProfileError(f"{e.name}: {len(found)} of {e.tp} rank traces whole after "
                                   f"{timeout:g} s ({'; '.join(why)}) in {directory}",
                                   hint="raise --write-timeout if the write is slow")
            if now - last_said >= PROGRESS_S:
                last_said = now
                self.say(f"pdsvc profile: {e.name}: {len(found)} of {e.tp} rank traces whole, "
                         f"{now - start:.0f} s of {timeout:.0f} (the engine is frozen while it "
                         "writes them)")
            self.host.sleep(POLL_S)

    def healthy(self, e: Engine, timeout: float = HEALTHY_WAIT_S) -> bool:
        """Whether the engine answers /health 200 within ``timeout``."""
        start = self.host.now()
        while self.host.now() - start < timeout:
            if self.host.http("GET", f"{e.url}/health", timeout=5.0)[0] == 200:
                return True
            self.host.sleep(POLL_S)
        return False


def whole(directory: Path, tp: int, stage: str | None) -> tuple[dict[int, Path], list[str]]:
    """The whole trace of each rank in ``directory`` (SGLang's names), and why each other rank
    has none yet."""
    found: dict[int, Path] = {}
    why: list[str] = []
    files = sorted(directory.glob("*.trace.json.gz")) if directory.is_dir() else []
    for rank in range(tp):
        mine = [f for f in files if rank_of(f.name) == (rank, stage)]
        if not mine:
            why.append(f"TP-{rank}: not written")
            continue
        problem = incomplete(mine[-1])
        if problem is None:
            found[rank] = mine[-1]
        else:
            why.append(f"TP-{rank}: {problem.split(': ', 1)[-1]}")
    return found, why
