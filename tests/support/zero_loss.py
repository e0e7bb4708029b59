"""Zero failed requests: one event at a time on a 2P2D stack under steady load, for
benchmarks/zero_loss.py and tests/test_e2e_zero_loss.py alike.

The stack: two prefills, two decodes (one stand-in GPU each), the real router in front, real
systemd in nspawn (tests/support/stack.py). The stand-in engines take time: every generation
waits ``GEN_DELAY`` (both sides, as a prefill's forward and a decode's first token do), then a
decode streams its tokens one every ``ITL_MS`` (tests/support/fake_latency.py), so a stream
has sent tokens for a while when an event hits it. The load (tests/support/loadgen.py):
``RATE`` requests a second, half of them streamed, every one judged by content.

For each event: the requests sent while it lasted (those in flight at any moment from the event
until full capacity + ``TAIL``), the failed ones by kind, p99 latency of the good ones before
(a steady window just before) and during, and the seconds until full capacity: every engine
unit active, the hit one's engine a new process, and the router listing every engine healthy.
The goals (`Outcome.misses`): 0 failed for a restart of one engine and for `apply`; for kill
-9 of one engine 0 non-streamed and no stream failing otherwise than cut, and no more streams
cut than were in flight on that engine; a router restart is measured (no goal but: no hang).
One exception, measured and bounded rather than hidden: smg 1.13 may answer a few requests of
the ~0.25 s switch of a pair-incompatible apply with its own 503 (goal "switch" in misses).
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from faults import kill, kill_runtime, restart
from loadgen import Load, Result, failures, get, hop_times, p99
from stack import REPO, Stack
from timing import SLACK

GEN_DELAY = 0.5  # s: every generation, both sides
ITL_MS = 25  # a decode's stream: one token every 25 ms ...
TOKENS = 16  # ... of 16 (a stream lasts ~0.95 s, a non-streamed request ~0.5 s)
LOAD_SECS = 2.0  # the stand-in's weights; its warm compile is 0.1 s
RATE = 6.0  # requests a second
#: The switch of halves of a pair-incompatible apply: no pair listed from the old half's
#: DELETEs to the new half listed. apply's own calls take ~0.02 s of it (the DELETEs at once,
#: one look, the POSTs at once: "posted 0.02 s after"); the rest is the router adding a worker
#: (smg 1.13: 0.13-0.2 s, it probes the worker and builds its client first; 0.22 s the widest
#: seen idle). A busy machine stretches it (the router's probe waits for the CPU): allowed is
#: SLACK × that widest gap (tests/support/timing.py), at RATE three requests.
SWITCH_GAP_S = SLACK * 0.22
BEFORE = 6.0  # s of steady load before each event (the "before" p99)
TAIL = 3.0  # s of load after full capacity still counted as the event's
CAPACITY_TIMEOUT = 120.0


def overrides(router_package: str) -> dict:
    """Stack.up overrides of a 2P2D stack with the stand-in's latency model on."""
    return {
        "router.package": router_package,
        "prefill": [{"gpus": [0]}, {"gpus": [1]}],
        "decode": [{"gpus": [2]}, {"gpus": [3]}],
        "runtime.env.FAKE_SGLANG_LOAD_SECS": LOAD_SECS,
        "runtime.env.FAKE_SGLANG_GEN_DELAY": GEN_DELAY,
        "runtime.env.FAKE_SGLANG_KNEE_RATE": 1000,  # the latency model on, never its knee
        "runtime.env.FAKE_SGLANG_ITL_MS": ITL_MS,
    }


def boot(work: Path, venv: Path, router_package: str, **extra: object) -> Stack:
    """A 2P2D stack, started and serving."""
    s = Stack.up(work, venv, start=False, gpus=4, **{**overrides(router_package), **extra})
    try:
        s.start(timeout=240)
        s.c.wait_for(lambda: at_capacity(s), 60, interval=0.5, what="2P2D at full capacity")
    except BaseException:
        s.down()
        raise
    return s


@contextmanager
def loaded(work: Path, venv: Path, router_package: str,
           front: bool = False) -> Iterator[tuple[Stack, Load]]:
    """A 2P2D stack booted (``front``: two routers behind HAProxy, FRONT), under steady load,
    its table's title and HEADER printed; the load stopped and the stack down at the end."""
    stack = boot(work, venv, router_package, **(FRONT if front else {}))
    title = "2P2D, 2 routers behind HAProxy, under steady load" if front else \
        "2P2D under steady load"
    try:
        ld = load(stack)
        ld.start()
        print(f"\n{router_package}: {title} ({RATE:g} requests/s, half streamed; p99 in s "
              f"of the good requests; capacity: s until full capacity)\n{HEADER}", flush=True)
        try:
            yield stack, ld
        finally:
            ld.stop(wait=5)
    finally:
        stack.down()


def load(stack: Stack, seed: int = 0) -> Load:
    """Steady load on the stack's router, from inside its network namespace."""
    return Load(f"{stack.plan['client_url']}/generate", rate=RATE, tokens=TOKENS,
                netns=stack.netns, timeout=30, seed=seed)


# ---------------------------------------------------------------------- the events


@dataclass(frozen=True)
class Event:
    name: str
    act: Callable[[Stack], None] | None  # None: a hook not filled yet (see ``missing``)
    target: str = ""  # the instance hit (prefill-1, router); "" for an apply
    goal: str = "none"  # "zero" | "kill" | "measure" | "switch" (zero, but see misses)
    missing: Callable[[], str | None] = lambda: None  # why it cannot run here, or None


def apply_missing() -> str | None:
    """None once `pdsvc apply` exists; else why the apply events cannot run."""
    r = subprocess.run([sys.executable, "-m", "pdsvc.cli", "apply", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    return None if r.returncode == 0 else "`pdsvc apply` is not on this branch"


#: Changes for `apply`, set on every engine: one after which old and new engines still pair,
#: one after which they cannot (SGLang checks the page size when prefill and decode connect).
CHANGES = {
    "pair-compatible": {"args": {"max-running-requests": 128}},
    "pair-incompatible": {"args": {"page-size": 32}},
}
#: ... and a change of the router section (every router unit restarts, one at a time)
ROUTER_CHANGES = {"router": {"policy": "round_robin"}}


def changed_config(stack: Stack, change: str) -> Path:
    """The stack's config with CHANGES[change] on every engine, written beside it."""
    cfg = yaml.safe_load((stack.work / "config.yaml").read_text())
    new = copy.deepcopy(cfg)
    if change in ROUTER_CHANGES:
        new["router"] = {**new.get("router", {}), **ROUTER_CHANGES[change]}
    for role in ("prefill", "decode") if change in CHANGES else ():
        for engine in new[role] if isinstance(new[role], list) else [new[role]]:
            for key, value in CHANGES[change].items():
                engine[key] = {**engine.get(key, {}), **value}
    out = stack.work / f"config.{change}.yaml"
    out.write_text(yaml.safe_dump(new))
    return out


#: Runs a command with each line of its stderr prefixed by time.monotonic() (the host's
#: clock, the container's too: no time namespace), for apply's progress against the load.
STAMP = ("python3", "-c", "import subprocess, sys, time\n"
         "p = subprocess.Popen(sys.argv[1:], stderr=subprocess.PIPE, text=True)\n"
         "for line in p.stderr:\n"
         "    sys.stderr.write(f'{time.monotonic():.3f} {line}')\n"
         "sys.exit(p.wait())")


def stamped(stderr: str) -> list[tuple[float, str]]:
    """(time.monotonic(), line) of each line STAMP timed."""
    out = []
    for line in stderr.splitlines():
        t, _, text = line.partition(" ")
        try:
            out.append((float(t), text))
        except ValueError:
            continue
    return out


def apply(change: str, said: list[tuple[float, str]] | None = None) -> Callable[[Stack], None]:
    """Apply CHANGES[change] to the running stack as a user would (`pdsvc apply --yes`: render,
    install, roll), blocking until apply says it is done; a failed apply fails the event.
    ``said``: apply's progress lines, timed, are added to it."""
    def act(stack: Stack) -> None:
        cfg = yaml.safe_load(changed_config(stack, change).read_text())
        r = stack.apply(cfg, "--yes", "--drain-timeout", "20", "--step-timeout", "300",
                        wrap=STAMP)
        assert r.returncode == 0, f"pdsvc apply exited {r.returncode}: {r.stderr[-2000:]}"
        lines = stamped(r.stderr)
        if said is not None:
            said.extend(lines)
        for _, line in lines:  # the halves' switch: how long no pair was listed
            if "listed by the router" in line:
                print(f"\n  apply: {line.strip()}")
    return act

def out_of_router(act: Callable[[Stack], None], instance: str) -> Callable[[Stack], None]:
    """``act``, then how long the router still listed ``instance`` healthy (printed): with
    nothing but the router's health checks, a dead engine stays listed for their window."""
    def timed(stack: Stack) -> None:
        url = engine_urls(stack)[instance]
        t0 = time.monotonic()
        act(stack)
        while time.monotonic() - t0 < 30:
            listed = stack.listed()
            if listed is not None and url not in listed:
                break
            time.sleep(0.05)
        print(f"\n  {instance}: out of the router {time.monotonic() - t0:.2f} s after the kill")
    return timed


EVENTS = (
    Event("systemctl restart prefill-1", restart("prefill-1"), "prefill-1", "zero"),
    Event("systemctl restart decode-1", restart("decode-1"), "decode-1", "zero"),
    Event("kill -9 prefill-0's engine", kill("9", "prefill-0"), "prefill-0", "kill"),
    Event("kill -9 decode-0's engine", kill("9", "decode-0"), "decode-0", "kill"),
    # the runtime (the unit's main process): systemd SIGKILLs its engine, and the unit's
    # ExecStopPost= (`runtime leave`) takes it out of the router at once
    Event("kill -9 prefill-0's runtime", out_of_router(kill_runtime("prefill-0"), "prefill-0"),
          "prefill-0", "kill"),
    Event("kill -9 decode-0's runtime", out_of_router(kill_runtime("decode-0"), "decode-0"),
          "decode-0", "kill"),
    Event("systemctl restart router", restart("router"), "router", "measure"),
    Event("apply, pair-compatible change", apply("pair-compatible"), "", "zero",
          apply_missing),
    Event("apply, pair-incompatible change", apply("pair-incompatible"), "", "switch",
          apply_missing),
)


def rolling(*roles: str) -> Callable[[Stack], None]:
    """`systemctl restart` of each unit in turn, as an upgrade of the router package is
    rolled out by hand (each restart returns once that router is back in the front)."""
    def act(stack: Stack) -> None:
        for role in roles:
            restart(role)(stack)
    return act


#: router.replicas: 2 behind HAProxy (FRONT): the router's own events. A router killed with
#: requests in flight: every non-streamed one is sent again by the front (its router closed
#: without a response), a stream already begun is cut (goal "kill": ≤ the streams in flight).
FRONT = {"router.replicas": 2}
FRONT_EVENTS = (
    Event("front: systemctl restart router-0", restart("router-0"), "router-0", "zero"),
    Event("front: kill -9 router-1", kill("9", "router-1"), "router-1", "kill"),
    Event("front: upgrade (restart both)", rolling("router-0", "router-1"), "", "zero"),
    Event("front: apply, router change", apply("router"), "", "zero", apply_missing),
)


# ---------------------------------------------------------------------- measuring one


def engine_urls(stack: Stack) -> dict[str, str]:
    return {e["name"].removeprefix(f"{stack.name}-"): e["url"] for e in stack.plan["engines"]}


def at_capacity(stack: Stack) -> bool:
    """Every unit active and every router lists every engine, healthy."""
    if any(stack.prop(u, "ActiveState") != "active" for u in stack.units):
        return False
    want = set(engine_urls(stack).values())
    return all((stack.listed(port) or set()) >= want for port in stack.router_ports)


def pid_of(stack: Stack, instance: str) -> int | None:
    try:
        return stack.engine_pid(instance)
    except (AssertionError, ValueError, KeyError):
        return None


def running_on(stack: Stack, instance: str) -> int | None:
    """The engine's own count of requests in flight (sglang:num_running_reqs), None if unread."""
    url = engine_urls(stack).get(instance)
    if url is None:
        return None
    code, text = get(f"{url}/metrics", stack.netns)
    for line in text.splitlines() if code == 200 else ():
        if line.startswith("sglang:num_running_reqs"):
            return int(float(line.split()[-1]))
    return None


@dataclass
class Outcome:
    event: str
    goal: str
    sent: int = 0
    failed: Counter = field(default_factory=Counter)  # by kind: "http 503", "cut", ...
    failed_plain: int = 0  # non-streamed
    failed_streams: int = 0
    cut: int = 0
    p99_before: float = float("nan")
    p99_during: float = float("nan")
    capacity_s: float = float("nan")
    streams_in_flight: int = 0  # stack-wide, when the event hit
    on_engine: int | None = None  # requests in flight on the hit engine (its own gauge), same
    skipped: str = ""  # why it did not run
    router: str = ""  # the router package (sglang-router | smg)
    samples: list[Result] = field(default_factory=list)  # a few failures, for messages

    @property
    def cut_bound(self) -> int:
        """Streams in flight on the hit engine, bounded from above by what both counts say."""
        if self.on_engine is None:
            return self.streams_in_flight
        return min(self.streams_in_flight, self.on_engine)

    def misses(self) -> list[str]:
        """The goals this outcome misses; [] when it meets them."""
        if self.skipped:
            return []
        out = []
        if self.failed.get("timeout"):
            out.append(f"{self.failed['timeout']} request(s) hung until the client's timeout")
        total = sum(self.failed.values())
        if self.goal == "switch" and self.router == "smg":
            # smg 1.13.0 answers a request that finds no prefill (or decode) worker listed at
            # once with its own 503 {"code":"no_available_workers","message":"No available
            # servers: No prefill workers available..."}, not retried (measured: 0.00 s with
            # --retry-max-retries 6, and the same with its prefill admission queue,
            # --prefill-max-inflight-requests-per-worker/--prefill-queue-size, which gates a
            # selected worker, not an empty pool). Its published source retries a failed
            # selection (smg-project/smg model_gateway/src/routers/http/pd_router.rs
            # execute_dual_dispatch_attempt -> handle_server_selection_error,
            # "server_selection_failed", a retryable 503), and marks only its overload shed
            # `no_available_workers` non-retryable (routers/common/overload.rs shed); 1.13 is a
            # compiled wheel. sglang-router 0.3.2 reselects the pair inside its retry loop and
            # fails none. What smg may lose is bounded: only that 503, and no more than the
            # requests of SWITCH_GAP_S.
            allowed = int(RATE * SWITCH_GAP_S)
            other = {k: n for k, n in self.failed.items() if k != "http 503"}
            if other:
                out.append(f"{sum(other.values())} failed otherwise than smg's 503: {other}")
            if self.failed.get("http 503", 0) > allowed:
                out.append(f"{self.failed['http 503']} × 503 > {allowed}, the requests of "
                           f"{SWITCH_GAP_S:g} s")
        elif self.goal in ("zero", "switch") and total:
            out.append(f"{total} failed, goal 0")
        if self.goal == "kill":
            if self.failed_plain:
                out.append(f"{self.failed_plain} non-streamed failed, goal 0")
            if self.failed_streams - self.cut:
                out.append(f"{self.failed_streams - self.cut} streams failed otherwise than cut")
            if self.cut > self.cut_bound:
                out.append(f"{self.cut} streams cut > {self.cut_bound} in flight on the engine")
        return out

    def row(self) -> str:
        if self.skipped:
            return f"  {self.event:<34} skipped: {self.skipped}"
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.failed.items())) or "-"
        bound = f" (≤{self.cut_bound})" if self.goal == "kill" else ""
        return (f"  {self.event:<34}{self.sent:>6}{sum(self.failed.values()):>7}{bound:<6}"
                f" {kinds:<34}{self.p99_before:>8.2f}{self.p99_during:>8.2f}"
                f"{self.capacity_s:>9.1f}")


HEADER = (f"  {'event':<34}{'sent':>6}{'failed':>7}{'':<6} {'failed by kind':<34}"
          f"{'p99 bef':>8}{'p99 dur':>8}{'capacity':>9}")


def steady(stack: Stack, ld: Load, seconds: float = BEFORE, tries: int = 5) -> float:
    """Wait for a window of ``seconds`` with no failure at full capacity (the stack has
    recovered from the last event); returns its start."""
    for _ in range(tries):
        t0 = time.monotonic()
        time.sleep(seconds)
        if at_capacity(stack) and not failures(ld.within(t0, time.monotonic())):
            return t0
    return t0  # not steady: the "before" figures say so


def run_event(stack: Stack, ld: Load, event: Event) -> Outcome:
    """Inflict ``event`` on the loaded stack and measure it (see the module's docstring)."""
    out = Outcome(event.name, event.goal)
    out.router = str((stack.plan.get("routers") or [{}])[0].get("package", ""))
    why = event.missing()
    if why or event.act is None:
        out.skipped = why or "hook not filled"
        return out
    t_before = steady(stack, ld)
    target = event.target
    old = pid_of(stack, target) if target else None
    t_sample = time.monotonic()
    on_engine = running_on(stack, target) if event.goal == "kill" else None
    in_flight = ld.in_flight(streams_only=True)
    t0 = time.monotonic()
    event.act(stack)
    # what was in flight when it hit: what the counts said, plus what was sent meanwhile
    since = ld.sent_between(t_sample, time.monotonic(), streams_only=True)
    out.streams_in_flight = in_flight + since
    out.on_engine = None if on_engine is None else on_engine + since

    def back() -> bool:
        if target and pid_of(stack, target) in (None, old):
            return False
        return at_capacity(stack)

    stack.c.wait_for(back, CAPACITY_TIMEOUT, interval=0.2, what=f"full capacity after {event.name}")
    t_cap = time.monotonic()
    time.sleep(TAIL)
    t1 = time.monotonic()
    ld.settle(t1)
    during = ld.between(t0, t1)
    out.sent = len(during)
    out.failed = failures(during)
    out.failed_plain = sum(1 for r in during if not r.ok and not r.stream)
    out.failed_streams = sum(1 for r in during if not r.ok and r.stream)
    out.cut = out.failed.get("cut", 0)
    out.p99_before = p99(ld.within(t_before, t0))
    out.p99_during = p99(during)
    out.capacity_s = t_cap - t0
    out.samples = [r for r in during if not r.ok][:5]
    return out


def outage(results: list[Result]) -> tuple[float, float]:
    """The longest time (s) between two good answers in a stretch of load (an outage), and
    when the first of the two ended."""
    ends = sorted(r.end for r in results if r.ok)
    return max(((b - a, a) for a, b in zip(ends, ends[1:], strict=False)),
               default=(float("nan"), float("nan")))


def journal(stack: Stack) -> list[tuple[float, str]]:
    """(CLOCK_MONOTONIC, line) of the container's journal."""
    text = stack.c.run(["journalctl", "-o", "short-monotonic", "--no-pager", "-q"],
                       check=False).stdout
    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition("]")
        try:
            out.append((float(stamp.lstrip("[ ")), rest))
        except ValueError:
            continue
    return out


#: Where a 1P1D apply's outage goes, from the last good answer: (phase, where its end is read:
#: apply's progress or the journal, a pattern, the last match after the drain)
PHASES = (
    ("drained", "apply", r"no request in flight"),
    ("stopped", "journal", r"Stopped .*-(prefill|decode)\.service"),
    ("started", "journal", r"started engine pid"),
    ("healthy", "journal", r"healthy after"),
    ("pairs proven", "apply", r"its pairs good"),
    ("registered", "apply", r"registered with the router"),
)


def breakdown(last_good: float, first_good: float, said: list[tuple[float, str]],
              logged: list[tuple[float, str]]) -> str:
    """The outage by phase: the seconds from the end of one to the end of the next."""
    parts, at = [], last_good
    for phase, source, pattern in PHASES:
        lines = said if source == "apply" else logged
        ends = [t for t, text in lines if t >= at - 0.5 and re.search(pattern, text)]
        if not ends:
            parts.append(f"{phase} ?")
            continue
        parts.append(f"{phase} +{max(ends) - at:.2f}")
        at = max(at, max(ends))
    parts.append(f"first good answer +{first_good - at:.2f}")
    return ", ".join(parts)


def apply_outage_1p1d(work: Path, venv: Path, router_package: str) -> str:
    """1P1D: `apply` of a pair-compatible change stops serving (nothing else can take the
    load): the outage against the engine's load time (goal: ≤ LOAD_SECS + 2 s), and where it
    goes (apply's progress, timed, and the runtimes' and systemd's journal)."""
    why = apply_missing()
    if why:
        return f"1P1D apply outage: skipped: {why}"
    o = overrides(router_package)
    del o["prefill"], o["decode"]
    s = Stack.up(work, venv, **o)
    said: list[tuple[float, str]] = []
    try:
        with load(s) as ld:
            steady(s, ld)
            t0 = time.monotonic()
            apply("pair-compatible", said)(s)
            s.c.wait_for(lambda: at_capacity(s), CAPACITY_TIMEOUT, interval=0.2,
                         what="1P1D back after apply")
            time.sleep(TAIL)
            t1 = time.monotonic()
            ld.settle(t1)
            gap, last_good = outage(ld.between(t0, t1))
            logged = journal(s)
    finally:
        s.down()
    return (f"1P1D apply outage: {gap:.1f} s against the engine's load time {LOAD_SECS:g} s "
            f"(goal ≤ {LOAD_SECS + 2:g} s)\n    from the last good answer: "
            + breakdown(last_good, last_good + gap, said, logged))


#: A marathon of faults in a row on the fronted 2P2D stack under load (FRONT), as a new user's
#: chaos run: (what, act, whether the next waits for full capacity first). A fault that does
#: not wait hits while the last one still heals, never the role-mate of an instance still
#: down (one of each role always serves); the apply runs in the middle.
MARATHON = (
    ("systemctl restart prefill-1", restart("prefill-1"), False),
    ("kill -9 decode-0's engine", kill("9", "decode-0"), True),
    ("kill -9 router-1", kill("9", "router-1"), False),
    ("kill -9 prefill-0's runtime", kill_runtime("prefill-0"), True),
    ("systemctl restart router-0", restart("router-0"), False),
    ("kill -9 decode-1's runtime", kill_runtime("decode-1"), True),
    ("apply, pair-compatible change", apply("pair-compatible"), True),
    ("kill -9 prefill-1's engine", kill("9", "prefill-1"), False),
    ("kill -9 router-0", kill("9", "router-0"), True),
    ("systemctl restart decode-0", restart("decode-0"), False),
    ("systemctl restart router-1", restart("router-1"), True),
    ("kill -9 prefill-0's engine", kill("9", "prefill-0"), False),
    ("kill -9 decode-1's engine", kill("9", "decode-1"), True),
    ("kill -9 router-1, again", kill("9", "router-1"), True),
)
#: between two faults that do not wait for full capacity
MARATHON_GAP_S = 1.5


def marathon(stack: Stack, ld: Load) -> tuple[Counter, int, int, float, str]:
    """MARATHON under the running load: (failed by kind, non-streamed failed, sent, seconds,
    a BENCH line)."""
    t0 = time.monotonic()
    for _what, act, settle in MARATHON:
        act(stack)
        if settle:
            stack.c.wait_for(lambda: at_capacity(stack), CAPACITY_TIMEOUT, interval=0.2,
                             what=f"full capacity after {_what}")
        else:
            time.sleep(MARATHON_GAP_S)
    stack.c.wait_for(lambda: at_capacity(stack), CAPACITY_TIMEOUT, interval=0.2,
                     what="full capacity after the marathon")
    time.sleep(TAIL)
    t1 = time.monotonic()
    ld.settle(t1)
    during = ld.between(t0, t1)
    failed = failures(during)
    plain = sum(1 for r in during if not r.ok and not r.stream)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(failed.items())) or "-"
    return failed, plain, len(during), t1 - t0, (
        f"marathon: {len(MARATHON)} faults in a row in {t1 - t0:.0f} s (an apply in the "
        f"middle), {len(during)} requests: {sum(failed.values())} failed ({kinds}), "
        f"{plain} of them non-streamed; goal 0 non-streamed, only cut streams")


def front_latency(stack: Stack, rounds: int = 400) -> tuple[dict[str, tuple[float, float]], str]:
    """The latency the front adds, beside the router alone in the same run: GET /liveness (the
    router answers it itself) through the front and straight to router-0, in turn. ({"front"|
    "router": (p50, p99) in ms}, a BENCH line)."""
    front = f"{stack.plan['client_url']}/liveness"
    direct = f"http://127.0.0.1:{stack.router_ports[0]}/liveness"
    times = hop_times([front, direct], stack.netns, rounds)
    assert all(len(v) == rounds for v in times.values()), {k: len(v) for k, v in times.items()}

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))]

    got = {name: (pct(times[u], 0.5), pct(times[u], 0.99))
           for name, u in (("front", front), ("router", direct))}
    (f50, f99), (r50, r99) = got["front"], got["router"]
    return got, (f"front adds p50 {f50 - r50:+.2f} ms, p99 {f99 - r99:+.2f} ms (front "
                 f"{f50:.2f}/{f99:.2f}, router alone {r50:.2f}/{r99:.2f} ms p50/p99; {rounds} "
                 f"GET /liveness each, in turn; goal ≤ +1 / +2 ms)")


def front_memory(stack: Stack) -> str:
    """The resident memory of the front and of one router (each unit's main process and its
    children: HAProxy's master and worker; the runtime and the router it launched)."""
    def mib(unit: str) -> float:
        main = stack.prop(unit, "MainPID")
        out = stack.c.run(["ps", "-o", "rss=", "-p", main, "--ppid", main]).stdout.split()
        return sum(int(x) for x in out) / 1024

    return (f"memory: the front (HAProxy) {mib(stack.unit('front')):.0f} MiB, one router "
            f"{mib(stack.unit('router-0')):.0f} MiB (RSS under load)")


def meets_goal(stack: Stack, ld: Load, event: Event, label: str) -> Outcome:
    """A test's run of one event: skipped when it cannot run here, its BENCH line printed,
    and failed (with a few of its failures) when it misses its goal."""
    import pytest

    why = event.missing()
    if why:
        pytest.skip(why)
    out = run_event(stack, ld, event)
    print(f"BENCH [{out.router}] {label}:{out.row()}")
    misses = out.misses()
    assert not misses, f"{event.name} [{out.router}]: {'; '.join(misses)}\n{describe(out)}"
    return out


def describe(out: Outcome) -> str:
    """One outcome with a few of its failures, for a test's message."""
    lines = [HEADER, out.row()]
    lines += [f"    {r.kind} {'stream' if r.stream else 'plain'} status={r.status} "
              f"tokens={r.tokens}: {r.detail[:140]}" for r in out.samples]
    return "\n".join(lines)
