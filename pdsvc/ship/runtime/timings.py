"""Every fixed timing of the runtime, in one place: seconds (``_S``), one line on what each paces.

What an operator may tune is not here but in options.py (a flag of the runtime, its default
there; the config's lifecycle section passes it). What is here paces the runtime's own loops
and bounds its own calls; docs/lifecycle/faults.md names them in each fault's timeline.
"""

from __future__ import annotations

# ---------------------------------------------------------------- the main loop (lifecycle.py)
#: longest a loop blocks on the child before it looks again for a stop request
CHILD_WAIT_SLICE_S = 1.0
#: every phase before SERVING (and a stop's judgment): how often a stop is looked for while a
#: call that may block runs aside or a wait between looks goes on (waiting.py; SERVING blocks
#: on its inbox instead)
DUTY_SLICE_S = 0.05
#: how often BACKOFF looks for a stop while it waits out the restart policy's delay
BACKOFF_LOOK_S = 0.2
#: the shortest timeout of one liveness probe when --watchdog-secs is nearly out
LIVENESS_PROBE_MIN_S = 0.05

# ---------------------------------------------------------------- the child (child.py)
#: after a stop, this long without the child's exit: say so in the log (and again each time)
STOP_GRACE_S = 30.0
#: after SIGKILL, how long to wait for the tree to be gone (its GPU memory freed)
KILL_WAIT_S = 30.0
#: after a stop signal, how long the engine's /health has to answer at all (a draining SGLang
#: answers 503 at once: sglang http_server.py health, gracefully_exit); no answer in this
#: long and the engine is hung (a SIGSTOPped or D-state process): SIGKILL, not a drain that
#: cannot come and would hold the stop for --stop-timeout / TimeoutStopSec=
STOP_JUDGE_S = 5.0
#: how often the leftover-process sweep looks whether the killed descendants are gone
LEFTOVER_LOOK_S = 0.05

# ---------------------------------------------------------------- probes (probe.py, gpu.py)
#: one start-phase probe's timeout: one that times out just means "not yet"
START_PROBE_TIMEOUT_S = 5.0
#: one nvidia-smi call's timeout: it can take seconds per call without persistence mode
NVIDIA_SMI_TIMEOUT_S = 30.0

#: how soon the peer watch probes again once a peer seen healthy refused a connection (its
#: process is gone): --peer-down-probes such probes confirm it within a second, not at the
#: --peer-interval pace that a slow or unreachable peer keeps
PEER_CONFIRM_S = 0.25

# ---------------------------------------------------------------- membership (membership.py)
#: one control-plane call's timeout: the router answers these from memory (less where the
#: unit's watchdog leaves less: membership.call_timeout)
ROUTER_CALL_TIMEOUT_S = 3.0
#: ... never less than this
ROUTER_CALL_MIN_S = 0.5
#: a router that did not answer a call (its host lost, a partition) is called again only this
#: much later: until then every look at it is "did not answer", and costs nothing. One timeout
#: per router and per this long is all a dark router takes from the membership poller (and
#: from the join and the heal's question, which wait on its lock); the main loop never waits
#: on a router call
ROUTER_DARK_S = 5.0
#: how soon to look again while this engine is not (yet) in the router: it restarted, or smg
#: still lists our previous entry as draining (seconds after a DELETE), and every second after
#: that one ends is a second the stack does not serve
MEMBERSHIP_RETRY_S = 0.25
#: an entry the router lists as unhealthy this long while our engine is healthy is re-posted
STUCK_UNHEALTHY_S = 30.0
#: sglang-router 0.3.2 pauses health checks by a re-registration (membership._repost): how
#: long it waits for the router to drop the old entry, then to list the new one
REPOST_WAIT_S = 2.0
#: how long a stop waits for the routers to take the engine out before it stops the engine
#: anyway (a router that does not answer must not hold a stop; the leave goes on aside, and
#: the unit's ExecStopPost= leaves once more, its calls bounded by this too)
LEAVE_WAIT_S = 2.0

# ---------------------------------------------------------------- the pair canary (canary.py)
#: seconds between rounds after one that failed or could not be judged (doubling after
#: 2 x failures such rounds, up to the steady interval: a peer that stays down is not hammered)
CANARY_RETRY_S = 1.0
#: the same after a round that only found peers not healthy yet (their /health not 200): a
#: peer that comes up is probed within this, so a 1P1D restarted as one step (both sides at
#: once) is proven, and serves, as soon as the later of the two is healthy, not a second on
CANARY_PEER_RETRY_S = 0.25
#: seconds between looks at each peer's port: a port that closed and opened again is a peer
#: that was replaced (a connect is all it costs: SGLang's /health runs a generation)
PORT_WATCH_S = 0.5
#: one such look's connect timeout
PORT_CONNECT_TIMEOUT_S = 0.5
#: seconds between looks at this engine's own failure counters (its /metrics)
COUNTERS_LOOK_S = 2.0
#: seconds between the heals of engines of one role that found the same peer stale at once
#: (their rounds start on the same event): each waits its turn x this, then asks the router
HEAL_STAGGER_S = 3.0
#: a stale-side dead-lock (serving.Serving.deadlocked) is cured once it has held this long:
#: an engine of each role up but not listed, none down, and this engine's heal waiting for a
#: sibling to be listed. Longer than an engine's admission after its start (one good canary
#: round), shorter than the canary's steady interval (serving.Serving.look_again)
DEADLOCK_S = 20.0

# ---------------------------------------------------------------- a profile hold (profiled.py)
#: the longest a `pdsvc profile` hold is honoured, from when it began, renewed or not: its
#: capture's steps and the trace's write (SGLang's scheduler freezes while it exports: 25 s
#: for a 242 MB trace in sglang #34943, 108 s in PR #35115), with room to spare. Past it a
#: hung engine is judged again, whatever the hold says
PROFILE_HOLD_MAX_S = 600.0
#: seconds between the runtime's looks at its hold for a profile hold's start and end (a
#: stat and a read of a few hundred bytes)
PROFILE_LOOK_S = 0.5
#: while a profile hold lasts, every router is asked again this often whether it still lists
#: this engine with its health checks paused (a router that restarted has lost both)
PROFILE_VERIFY_S = 2.0

# ---------------------------------------------------------------- heals (policy.py, cascade.py)
#: the heal budget's window: heals within it that brought no pair back count against it
HEAL_WINDOW_S = 3600.0
#: past the budget, one more heal every this many seconds (never none)
SLOW_HEAL_S = 300.0
#: heals of both roles within this window are a heal cascade
CASCADE_WINDOW_S = 600.0
#: a cascade that comes back within this of the runtimes' own cure names the operator's cure
CURE_WINDOW_S = 3600.0
#: a cure marker is acted on only this long after it was written
MARKER_ACT_S = 60.0
#: seconds between a runtime's looks at the cure marker (a stat, a read of a few hundred bytes)
MARKER_LOOK_S = 0.5
#: the router believes an engine's give-up older than its own start after this long of it
#: (an engine started with the router rewrites its state within a second of its start)
GAVE_UP_GRACE_S = 10.0

# ---------------------------------------------------------------- other hosts (fleet.py)
#: seconds between a runtime's reads of the other engine hosts' heals and cures
FLEET_LOOK_S = 1.0
#: one such read's timeout (a host that does not answer keeps its last view)
FLEET_TIMEOUT_S = 1.0

# ---------------------------------------------------------------- the textfile (metrics.py)
#: seconds between the textfile writer's looks at the state files
TEXTFILE_POLL_S = 1.0
#: the longest a written textfile may age before it is written again, changed or not
TEXTFILE_REFRESH_S = 15.0

# ---------------------------------------------------------------- HAProxy's front (front.py)
#: one runtime API command's timeout (HAProxy answers from memory)
FRONT_CALL_TIMEOUT_S = 3.0
#: seconds between looks at a router's row while it drains or comes back UP
FRONT_POLL_S = 0.1
