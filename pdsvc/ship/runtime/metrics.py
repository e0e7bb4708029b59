"""pdsvc's own state as Prometheus metrics, in node_exporter's textfile-collector form.

A unit's main process serves no HTTP of its own, so the conventional way out is a file: the
runtime writes ``NAME.prom`` into ``--metrics-dir`` (``RUN_DIR/metrics``), written whole or not
at all (a temporary file that does not end in ``.prom``, renamed over the old one), which
node_exporter's textfile collector exposes on the host's ``/metrics``
(node_exporter README, "Textfile Collector": "write the file to a temporary file in the same
directory and then rename it, atomically"). No timestamps in the file, as that collector
requires.

Every series comes from the state the runtime already keeps (policy.py's NAME.restart.json,
canary.py's NAME.canary.json), read every second by a thread beside the run; the counters that
those files do not hold (starts by cause, heals) are kept in NAME.metrics.json beside them, so
they survive the runtime's own restarts (not a reboot: a counter reset Prometheus handles).
``pdsvc status --metrics`` prints the same families from the same files (pdsvc/runstate.py).

Labels: ``deployment`` (config ``name``), ``role`` (prefill | decode | router), ``unit``
(NAME.service) and, per pair, ``pair`` ("PREFILL_URL -> DECODE_URL", the canary's name).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .canary import PairHealth
from .duties import Duties, quiet
from .endings import Phase
from .options import Options
from .policy import recent_heals
from .statefile import Kind, read_known, state_path, write_atomic, write_state
from .timings import PROFILE_HOLD_MAX_S, SLOW_HEAL_S, TEXTFILE_POLL_S, TEXTFILE_REFRESH_S

#: family -> (type, help). The order is the order of the text.
FAMILIES: dict[str, tuple[str, str]] = {
    "pdsvc_unit_up": ("gauge", "1 while the unit's main process (the pdsvc runtime) runs."),
    "pdsvc_unit_ready": ("gauge", "1 while the unit serves: its health gate passed and it "
                         "has not ended since (restart policy phase 'serving')."),
    "pdsvc_unit_phase": ("gauge", "1 for the restart policy's phase of the current or last "
                         "run: starting, serving, stopped, crashed, failed-start, gave-up."),
    "pdsvc_unit_gave_up": ("gauge", "1 when the unit gave up (exit 78: its starts in a row "
                           "never became healthy); it is not restarted until an operator "
                           "starts it."),
    "pdsvc_unit_crashes_in_a_row": ("gauge", "Crashes in a row after serving (each restart "
                                    "after one waits twice as long)."),
    "pdsvc_unit_failed_starts_in_a_row": ("gauge", "Starts in a row that never became "
                                          "healthy (at lifecycle.start_attempts it gives up)."),
    "pdsvc_unit_serving_since_timestamp_seconds": ("gauge", "When the current run became "
                                                   "healthy (Unix time)."),
    "pdsvc_unit_start_phase_seconds": ("gauge", "Seconds the last start that served spent in "
                                       "each phase: backoff (crashes in a row), wait_gpus "
                                       "(busy GPUs), jit_lock (another engine compiling into "
                                       "a cold cache), starting (load, compile, warm-up until "
                                       "/health is 200)."),
    "pdsvc_unit_starts_total": ("counter", "Starts of the unit's runtime, by how the run "
                                "before ended: first, crash, failed-start, killed (ended "
                                "without a word), stop (operator, PartOf=, a pair heal), "
                                "after-gave-up."),
    "pdsvc_unit_heals_total": ("counter", "Restarts the pair canary made this engine do to "
                               "heal a pair."),
    "pdsvc_unit_heals_in_a_row": ("gauge", "Heals within the hour that have not brought a "
                                  "pair back yet (cleared by a good canary round)."),
    "pdsvc_unit_heal_budget": ("gauge", "Heals in a row before the engine heals only every "
                               f"{SLOW_HEAL_S / 60:g} minutes (lifecycle.canary_heal_attempts; "
                               "0: report only)."),
    "pdsvc_unit_duty_failures_total": ("counter", "Unexpected exceptions of each of the "
                                       "runtime's duties in this run (duties.py: each is said "
                                       "in the journal; the duty goes on, or the run ends)."),
    "pdsvc_unit_profile_held": ("gauge", "1 while a `pdsvc profile` hold is in force on the "
                                "engine (profiled.py): its liveness not judged, the routers' "
                                "health checks paused, no heals, while it writes a trace; "
                                "never longer than the hold's bound."),
    "pdsvc_pair_state": ("gauge", "1 for this side's canary state of the pair: "
                         + ", ".join(h.value for h in PairHealth) + "."),
    "pdsvc_pair_failures_in_a_row": ("gauge", "Canary rounds in a row that failed while "
                                     "both engines answered /health."),
    "pdsvc_pair_last_good_timestamp_seconds": ("gauge", "Since when the pair's canary rounds "
                                               "have been good (Unix time; absent: never)."),
    "pdsvc_pair_failing_since_timestamp_seconds": ("gauge", "Since when the pair has failed "
                                                   "(Unix time; absent: not failing)."),
    "pdsvc_textfile_timestamp_seconds": ("gauge", "When these series were written (Unix "
                                         "time): a runtime that is up writes at least every "
                                         "15 s."),
}
PHASES = tuple(p.value for p in Phase)
PAIR_STATES = tuple(h.value for h in PairHealth)
#: how the previous run ended (its phase as the next run finds it) -> the start's cause
#: (keyed by the file's words: a str enum member hashes by its name, not its value)
START_CAUSES: dict[str | None, str] = {None: "first", **{p.value: cause for p, cause in (
    (Phase.CRASHED, "crash"), (Phase.FAILED_START, "failed-start"), (Phase.SERVING, "killed"),
    (Phase.STARTING, "killed"), (Phase.STOPPED, "stop"), (Phase.GAVE_UP, "after-gave-up"))}}


@dataclass(frozen=True)
class Sample:
    family: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _escape(value: str) -> str:
    """A label value in the text format: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2 ** 53 else repr(value)


def exposition(samples: list[Sample]) -> str:
    """The Prometheus text format (0.0.4): each family once, HELP and TYPE first."""
    lines: list[str] = []
    for family, (kind, help_text) in FAMILIES.items():
        mine = [s for s in samples if s.family == family]
        if not mine:
            continue
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]
        for s in mine:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
            lines.append(f"{family}{{{labels}}} {_num(s.value)}")
    return "\n".join(lines) + "\n" if lines else ""


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def unit_samples(labels: Mapping[str, str], run: dict[str, Any] | None,
                 canary: dict[str, Any] | None, counters: dict[str, Any] | None, *,
                 up: bool | None, heal_budget: int | None,
                 now: float, duties: dict[str, Any] | None = None,
                 profile: dict[str, Any] | None = None) -> list[Sample]:
    """One unit's series from its state files (any may be None: missing or unreadable).
    ``up``: whether the unit runs (None: not known, left out)."""
    base = tuple(labels.items())
    out: list[Sample] = []

    def add(family: str, value: float, *extra: tuple[str, str]) -> None:
        out.append(Sample(family, base + extra, value))

    run = run or {}
    phase = run.get("phase")
    if up is not None:
        add("pdsvc_unit_up", 1.0 if up else 0.0)
        add("pdsvc_unit_ready", 1.0 if up and phase == Phase.SERVING else 0.0)
    if phase is not None:
        for p in PHASES:
            add("pdsvc_unit_phase", 1.0 if phase == p else 0.0, ("phase", p))
    add("pdsvc_unit_gave_up", 1.0 if phase == Phase.GAVE_UP else 0.0)
    add("pdsvc_unit_crashes_in_a_row", _number(run.get("crashes")) or 0.0)
    add("pdsvc_unit_failed_starts_in_a_row", _number(run.get("failed_starts")) or 0.0)
    since = _number(run.get("serving_since"))
    if phase == Phase.SERVING and since is not None:
        add("pdsvc_unit_serving_since_timestamp_seconds", since)
    phases = run.get("start_phases")
    for name, seconds in (phases.items() if isinstance(phases, dict) else ()):
        if isinstance(name, str) and _number(seconds) is not None:
            add("pdsvc_unit_start_phase_seconds", float(seconds), ("phase", name))
    counters = counters or {}
    raw = counters.get("starts")
    starts: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for cause in dict.fromkeys(START_CAUSES.values()):
        add("pdsvc_unit_starts_total", _number(starts.get(cause)) or 0.0, ("cause", cause))
    if heal_budget is not None:
        add("pdsvc_unit_heals_total", _number(counters.get("heals")) or 0.0)
        add("pdsvc_unit_heals_in_a_row", float(len(recent_heals(run.get("heals"), now))))
        add("pdsvc_unit_heal_budget", float(heal_budget))
    failed = (duties or {}).get("duties")
    for duty, f in sorted(failed.items()) if isinstance(failed, dict) else ():
        if isinstance(f, dict) and _number(f.get("count")) is not None:
            add("pdsvc_unit_duty_failures_total", float(f["count"]), ("duty", str(duty)))
    if labels.get("role") != "router":
        add("pdsvc_unit_profile_held", 1.0 if profile_held(profile, now) else 0.0)
    out += pair_samples(base, canary)
    add("pdsvc_textfile_timestamp_seconds", round(now, 3))
    return out


def pair_samples(base: tuple[tuple[str, str], ...], canary: dict[str, Any] | None
                 ) -> list[Sample]:
    """Each pair's series from this side's canary file."""
    out: list[Sample] = []
    pairs = (canary or {}).get("pairs")
    for p in pairs if isinstance(pairs, list) else []:
        if not isinstance(p, dict) or not isinstance(p.get("pair"), str):
            continue
        pair = base + (("pair", p["pair"]),)
        state = p.get("state") if p.get("state") in PAIR_STATES else PairHealth.UNKNOWN.value
        for s in PAIR_STATES:
            out.append(Sample("pdsvc_pair_state", pair + (("state", s),),
                              1.0 if s == state else 0.0))
        out.append(Sample("pdsvc_pair_failures_in_a_row", pair,
                          _number(p.get("failures")) or 0.0))
        if _number(p.get("last_ok")) is not None and state == PairHealth.OK:
            out.append(Sample("pdsvc_pair_last_good_timestamp_seconds", pair,
                              float(p["last_ok"])))
        if _number(p.get("failing_since")) is not None and state == PairHealth.FAILING:
            out.append(Sample("pdsvc_pair_failing_since_timestamp_seconds", pair,
                              float(p["failing_since"])))
    return out


def profile_held(doc: dict[str, Any] | None, now: float) -> bool:
    """Whether the runtime's answer to a profile hold (NAME.profile.json) says it is in force:
    taken, not ended, not past PROFILE_HOLD_MAX_S after it began. Not its ``until``: that is
    the lease's end when it was written, and the lease is renewed (profiled.py) without a
    write; a runtime writes ``ended_at`` when the hold ends, the lease's lapse included."""
    doc = doc or {}
    since = _number(doc.get("since"))
    return bool(doc.get("run")) and doc.get("ended_at") is None and since is not None \
        and now < since + PROFILE_HOLD_MAX_S


def count(counters: dict[str, Any], run: dict[str, Any] | None, *, starting: bool) -> bool:
    """Fold what the restart file shows into the counters (in place); True when they changed.
    ``starting``: this run has just begun (before the restart policy read the file), so the
    phase found is how the previous run ended: one start, by that cause."""
    run = run or {}
    changed = False
    if starting:
        cause = START_CAUSES.get(run.get("phase"), "first") if run else "first"
        starts = counters.setdefault("starts", {})
        starts[cause] = int(starts.get(cause, 0)) + 1
        changed = True
    heals = [h for h in run.get("heals", []) if _number(h) is not None] \
        if isinstance(run.get("heals"), list) else []
    seen = _number(counters.get("seen_heal")) or 0.0
    new = [h for h in heals if h > seen]
    if new:
        counters["heals"] = int(counters.get("heals", 0)) + len(new)
        counters["seen_heal"] = max(new)
        changed = True
    return changed


def write_textfile(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, readable by node_exporter's user (0644), in a
    directory of 0755 (created if need be). Best effort, like the state files.

    A directory already there with another mode is set to 0755 too: one an earlier runtime
    made 0750 under the unit's UMask=0027 outlives restarts (RuntimeDirectoryPreserve=yes), and
    node_exporter's user could not list it."""
    write_atomic(path, text, mode=0o644, dir_mode=0o755)
    with contextlib.suppress(OSError):
        directory = os.path.dirname(path) or "."
        if stat.S_IMODE(os.stat(directory).st_mode) != 0o755:
            os.chmod(directory, 0o755)


@dataclass
class Textfile:
    """One unit's textfile, kept current by a thread for the length of one run."""

    name: str
    state_dir: str
    metrics_dir: str
    labels: dict[str, str]
    heal_budget: int | None = None
    clock: Callable[[], float] = time.time
    duties: Duties = field(default_factory=quiet)  # a write that raises: said, counted
    _counters: dict[str, Any] = field(default_factory=dict)
    _said: tuple[Sample, ...] = ()
    _written: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _path(self, kind: Kind) -> str:
        return state_path(self.state_dir, self.name, kind)

    def refresh(self, *, up: bool, starting: bool = False) -> None:
        """Read the state files, count what happened, and write the textfile when a value
        changed or it is TEXTFILE_REFRESH_S old."""
        run, canary = read_known(self._path(Kind.RESTART)), read_known(self._path(Kind.CANARY))
        if count(self._counters, run, starting=starting):
            write_state(self._path(Kind.METRICS), self._counters)
        now = self.clock()
        samples = unit_samples(self.labels, run, canary, self._counters, up=up,
                               heal_budget=self.heal_budget, now=now,
                               duties=read_known(self._path(Kind.DUTIES)),
                               profile=read_known(self._path(Kind.PROFILE)))
        said = tuple(s for s in samples if s.family != "pdsvc_textfile_timestamp_seconds")
        if said == self._said and now - self._written < TEXTFILE_REFRESH_S:
            return
        write_textfile(os.path.join(self.metrics_dir, f"{self.name}.prom"), exposition(samples))
        self._said, self._written = said, now

    def _run(self) -> None:
        while not self._stop.wait(TEXTFILE_POLL_S):
            self.duties.guard("metrics-textfile", lambda: self.refresh(up=True))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around one run: a start counted before the restart policy reads how the last run
        ended, a look every TEXTFILE_POLL_S, and the run's end written once it returned."""
        self._counters = read_known(self._path(Kind.METRICS)) or {}
        self.refresh(up=True, starting=True)
        thread = threading.Thread(target=self._run, name="metrics-textfile", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(TEXTFILE_POLL_S + 1.0)
            self._said = ()
            self.refresh(up=False)


def textfile(args: Options, duties: Duties | None = None
             ) -> contextlib.AbstractContextManager[None]:
    """The textfile for the runtime's options (--metrics-dir, --deployment, --state-dir), or a
    context that does nothing when metrics are off."""
    metrics_dir = args.metrics_dir
    if not metrics_dir or not args.state_dir:
        return contextlib.nullcontext()
    role = "router" if args.mode == "router" else (args.role or "engine")
    labels = {"deployment": args.deployment or "", "role": role, "unit": f"{args.name}.service"}
    budget = args.canary_heals if args.pair else None
    return Textfile(args.name, args.state_dir, metrics_dir, labels, budget,
                    duties=duties or quiet()).running()
