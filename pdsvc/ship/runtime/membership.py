"""Router membership driven by the engine: join once healthy, leave before a stop, rejoin
whenever the router lost this engine.

The router takes its workers at run time (sglang-router 0.3.2 and smg, ``POST /workers``,
``GET /workers``, ``DELETE /workers/{id}``; both answer 202 to an add). So the router starts with
no workers, never waits for an engine and never needs a restart because one restarted: each
engine's runtime keeps its own engine registered. A router that restarted (empty) or dropped
the worker is noticed on the next check and the worker is posted again. An entry the router
keeps unhealthy for long while the engine itself answers /health is deleted and posted afresh;
one it still drains after this engine's last stop (smg's ``draining``) is waited out.
While `pdsvc apply` holds the engine out (hold.py, ``held``), it neither joins nor re-adds it.
While `pdsvc profile` holds it (profiled.py), the routers stop health-checking its entry
(``pause``) and membership changes nothing; the checks resume when the hold ends.

Re-posting a registered URL answers 202 on 0.3.2 and 409 ``WORKER_ALREADY_EXISTS`` on smg
(smg ``model_gateway`` worker routes): both mean "it is there". The control plane needs the
key given to the router's ``--control-plane-api-keys``, sent as ``Authorization: Bearer``; it
is read from a file (a systemd credential) and never logged.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, NamedTuple

from .probe import HttpReply, NoAnswerKind, http_call
from .timings import (
    MEMBERSHIP_RETRY_S,
    REPOST_WAIT_S,
    ROUTER_CALL_MIN_S,
    ROUTER_CALL_TIMEOUT_S,
    ROUTER_DARK_S,
    STUCK_UNHEALTHY_S,
)


class Worker(NamedTuple):
    """What the router is told about this engine."""

    url: str  # as the router must reach it: http://ADDRESS:PORT
    role: str  # prefill | decode
    bootstrap_port: int | None  # prefill only: the KV bootstrap server's port

    def payload(self, disable_health_check: bool | None = None) -> bytes:
        """The POST /workers body. ``health.drain_settle_secs: 0``: smg keeps a deleted worker
        `Draining` for a fixed 5 s by default before it removes it (``--drain-settle-secs``,
        per worker ``health.drain_settle_secs``; it does not count in-flight requests), and
        answers a re-post of the URL with 409 meanwhile: an engine back from a restart in
        under 5 s waited that out before it could serve. The drain that matters is the engine's own
        (the runtime's and apply's, on ``sglang:num_running_reqs``); requests in flight keep
        their worker when its entry goes. sglang-router 0.3.2 ignores the field.
        ``disable_health_check``: for 0.3.2 only, its flat field (``Membership.pause``)."""
        doc: dict[str, object] = {"url": self.url, "worker_type": self.role,
                                  "health": {"drain_settle_secs": 0}}
        if self.role == "prefill":
            doc["bootstrap_port"] = self.bootstrap_port
        if disable_health_check is not None:
            doc["disable_health_check"] = disable_health_check
        return json.dumps(doc).encode("utf-8")


def call_timeout(watchdog_s: float | None, interval: float, probe_timeout: float,
                 routers: int) -> float:
    """A router call's timeout: ROUTER_CALL_TIMEOUT_S, or less where the unit's watchdog
    (``watchdog_s``; None: none) leaves less than a liveness period (every ``interval``, at
    most ``probe_timeout``) for one call to each router. SERVING's duties run on threads of
    their own (events.Poller), so a router call never holds the probe that feeds the watchdog;
    the cut bounds one membership round instead: when every router stops answering at once
    (their host lost), one call to each times out before they are dark (ROUTER_DARK_S), under
    Routers.lock, which the join before READY=1, the stop's leave and the heal's question also
    wait on."""
    if watchdog_s is None:
        return ROUTER_CALL_TIMEOUT_S
    spare = (watchdog_s - interval - probe_timeout) / max(1, routers)
    return max(ROUTER_CALL_MIN_S, min(ROUTER_CALL_TIMEOUT_S, spare))


class Membership:
    """This engine's entry in one router. Every method returns within ``timeout`` (one call;
    none while the router is dark) and never raises."""

    def __init__(self, router: str, worker: Worker, key: str | None,
                 log: Callable[[str], None],
                 call: Callable[..., HttpReply] = http_call,
                 clock: Callable[[], float] = time.monotonic,
                 held: Callable[[], str | None] = lambda: None,
                 timeout: float = ROUTER_CALL_TIMEOUT_S) -> None:
        self.router = router.rstrip("/")
        self.timeout = timeout
        #: monotonic: until then the router is not called (it did not answer the last call)
        self.dark_until = 0.0
        self.worker = worker
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.log = log
        self.call = call
        self.clock = clock
        #: why apply keeps this engine out of the router now (hold.Hold.out), or None
        self.held = held
        #: why not to join yet, given the URLs of the healthy workers the router lists
        #: (None: join); the pair canary's, Canary.admits
        self.admit: Callable[[set[str]], str | None] | None = None
        #: every worker entry the router listed at the last look, as it listed them
        self.entries: list[dict[str, Any]] = []
        self.joined = False
        self.unhealthy_since: float | None = None
        self._said = ""  # the last problem logged, so a long outage is one line, not hundreds

    def _say(self, text: str) -> None:
        if text != self._said:
            self._said = text
            self.log(text)

    def _call(self, url: str, body: bytes | None = None, method: str | None = None
              ) -> HttpReply:
        """One call to the router, unless it is dark. A call that timed out makes it dark for
        ROUTER_DARK_S; a refused one does not (its host answers at once: a router that
        restarts is joined again the moment it listens)."""
        now = self.clock()
        if now < self.dark_until:
            # one wording for the whole dark period: a log line says it once (_say)
            return HttpReply(None, b"", f"timed out; called again every {ROUTER_DARK_S:g} s")
        extra: dict[str, Any] = {"method": method} if method else {}
        reply = self.call(url, self.timeout, body, self.headers, **extra)
        if reply.no_answer is not None and reply.no_answer.kind is NoAnswerKind.TIMEOUT:
            self.dark_until = self.clock() + ROUTER_DARK_S
        return reply

    def _entry(self) -> tuple[dict[str, Any] | None, str | None]:
        """(this worker's entry in GET /workers or None, an error text or None)."""
        reply = self._call(f"{self.router}/workers")
        doc = reply.json() if reply.status == 200 else None
        if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
            why = reply.detail if reply.status != 200 else "GET /workers: not a worker list"
            return None, why
        self.entries = [e for e in doc["workers"] if isinstance(e, dict)]
        for entry in self.entries:
            if str(entry.get("url", "")).rstrip("/") == self.worker.url:
                return entry, None
        return None, None

    @property
    def listed(self) -> dict[str, str]:
        """The healthy workers the router listed at the last look: {url: role}."""
        return {str(e.get("url", "")).rstrip("/"): str(e.get("worker_type", ""))
                for e in self.entries if e.get("is_healthy") is not False
                and str(e.get("status", "")).lower() not in ("draining", "failed")}

    def lists_any(self, urls: list[str]) -> bool | None:
        """Whether the router, asked now, lists one of ``urls`` as a healthy worker; None
        when it did not answer."""
        _, error = self._entry()
        return None if error is not None else any(u.rstrip("/") in self.listed for u in urls)

    def _post(self, disable_health_check: bool | None = None) -> bool:
        reply = self._call(f"{self.router}/workers", self.worker.payload(disable_health_check))
        if reply.status in (200, 201, 202, 409):
            return True
        self._say(f"router {self.router}: cannot register {self.worker.url}: {reply.detail}")
        return False

    def _delete(self, entry: dict[str, Any]) -> None:
        worker_id = urllib.parse.quote(str(entry.get("id", "")), safe="")
        self._call(f"{self.router}/workers/{worker_id}", method="DELETE")

    def join(self) -> bool:
        """Post this worker (once healthy). True when the router took it; False when it
        cannot, or still holds this URL's previous entry while it drains (smg lists a
        deleted worker as `draining` until its requests settle, and answers a POST of the
        URL meanwhile with 409): the next check posts again."""
        if self._holding():
            return False
        if self.admit is not None:
            _, error = self._entry()
            why = self.admit(set(self.listed)) if error is None else None
            if why:
                self._say(f"not joining the router yet: {why}")
                return False
        if not self._post():
            return False
        entry, _ = self._entry()
        if entry is not None and str(entry.get("status", "")).lower() == "draining":
            self._say(f"the router still drains the previous {self.worker.url}: registering "
                      "once it is gone")
            return False
        if not self.joined:
            self.log(f"registered {self.worker.role} {self.worker.url} with the router "
                     f"{self.router}")
        self.joined, self._said, self.unhealthy_since = True, "", None
        return True

    def check(self, engine_healthy: bool) -> None:
        """Make sure the router still has this worker, and one it has not given up on."""
        if self._holding():
            return
        entry, error = self._entry()
        if error is not None:
            self._say(f"router {self.router} unreachable ({error}): will register "
                      f"{self.worker.url} once it answers")
            self.joined = False
            return
        if entry is None:
            if self.joined:
                self.log(f"the router {self.router} no longer lists {self.worker.url} "
                         "(restarted or dropped it): registering again")
                self.joined = False
            self.join()
            return
        status = str(entry.get("status", "")).lower()
        if status == "draining":  # our previous entry, deleted at our last stop: wait it out
            self.joined = False
            self.join()
            return
        healthy = entry.get("is_healthy") is not False and status != "failed"
        now = self.clock()
        if healthy or not engine_healthy:
            self.unhealthy_since = None
        elif self.unhealthy_since is None:
            self.unhealthy_since = now
        # the router's own probes bring an unhealthy worker back (0.3.2, and smg >= 1.13 even
        # from `failed`); one it has held unhealthy this long while /health here says 200 is
        # one it gave up on: take it out and post it afresh
        if engine_healthy and self.unhealthy_since is not None and \
                now - self.unhealthy_since >= STUCK_UNHEALTHY_S:
            self.log(f"the router has listed {self.worker.url} as {status or 'unhealthy'} for "
                     f"{now - self.unhealthy_since:.0f} s while the engine is healthy: "
                     "re-registering")
            self._delete(entry)
            self.joined = False
            self.join()
        else:
            self.joined = True

    def _holding(self) -> bool:
        """Held out by apply: no join, no re-add (apply took the entry out, or will)."""
        why = self.held()
        if why:
            if self.joined:
                self.log(f"{self.worker.url}: {why}: not registering it again until released")
            self._say(f"not joining the router: {why}")
            self.joined = False
            return True
        if self._said.startswith("not joining the router: held"):
            self.log("hold released: joining the router")
            self._said = ""
        return False

    def pause(self, paused: bool) -> str | None:
        """Ask the router to stop (``paused``) or resume health-checking this engine's entry;
        None once it took the change, else why not.

        smg: ``PATCH /workers/{id}`` with ``{"health": {"disable_health_check": B}}``; a
        disabled check makes the worker Ready and takes it off the probe schedule (smg
        model_gateway/src/workflow/steps/local/update_worker_properties.rs, worker/
        manager.rs). sglang-router 0.3.2 has no PATCH route (405): the entry is registered
        afresh with the flat field (``_repost``). smg's PUT is a full replace that probes
        /health again: it is never sent."""
        entry, error = self._entry()
        if error is not None:
            return f"router {self.router} did not answer: {error}"
        if entry is None and paused and self.join():  # a router that restarted meanwhile
            entry, error = self._entry()
        if entry is None:
            return f"router {self.router} does not list {self.worker.url}"
        if entry.get("disable_health_check") is paused:
            return None  # 0.3.2 shows the flag: already so
        url = f"{self.router}/workers/{urllib.parse.quote(str(entry.get('id', '')), safe='')}"
        reply = self._call(url, json.dumps({"health": {"disable_health_check": paused}}).encode(),
                           method="PATCH")
        if reply.status == 405:
            return self._repost(entry, paused)
        if reply.status in (200, 202):
            return None
        return f"router {self.router}: {reply.detail}"

    def _repost(self, entry: dict[str, Any], paused: bool) -> str | None:
        """sglang-router 0.3.2: DELETE the entry and POST it again with the flat
        ``disable_health_check`` of its WorkerConfigRequest (src/protocols/worker_spec.rs).
        Not its PUT, which takes the same field but rebuilds the worker with the default
        circuit breaker, on whatever ``--disable-circuit-breaker`` said, and lists it once
        more (src/core/worker_registry.rs ``register``): failures at the engine's thaw then
        opened the breaker and every request of the role got 503 for its timeout. A POST
        takes the router's own settings. The entry is gone for the moment between the two
        calls (0.1 s measured); the router's retries carry a request of that moment."""
        self._delete(entry)
        # its DELETE and POST are jobs the router runs in the background: a POST of a URL
        # still listed is answered 202 and then dropped
        if not self._until(lambda found: found is None):
            return f"router {self.router} still lists the entry of {self.worker.url} it deleted"
        if not self._post(disable_health_check=paused) or not self._until(
                lambda found: found is not None and found.get("disable_health_check") is paused):
            self.joined = False
            return f"router {self.router}: cannot register {self.worker.url} again"
        return None

    def _until(self, done: Callable[[dict[str, Any] | None], bool]) -> bool:
        """Whether this worker's entry (None: not listed) came to be ``done`` within
        REPOST_WAIT_S; False too when the router stops answering."""
        pause = MEMBERSHIP_RETRY_S / 5
        for look in range(int(REPOST_WAIT_S / pause) + 1):
            if look:
                time.sleep(pause)
            entry, error = self._entry()
            if error is not None:
                return False
            if done(entry):
                return True
        return False

    def drop(self) -> bool | None:
        """Delete this worker's entry if the router lists it: True when it did, False when
        it was not listed, None when the router did not answer."""
        entry, error = self._entry()
        self.joined = False
        if entry is not None:
            self._delete(entry)
            return True
        return None if error is not None else False

    def leave(self) -> None:
        """Before a stop: take the worker out of rotation, so no new request reaches it while
        it drains. Best effort: a router that is down has nothing to route here anyway."""
        dropped = self.drop()
        if dropped:
            self.log(f"deregistered {self.worker.url} from the router {self.router}")
        elif dropped is None:
            self.log(f"router {self.router} unreachable: nothing to deregister")


class Routers:
    """This engine's entries in every router of the deployment (``router.replicas``, behind
    one front): one Membership each, answering together. The engine joins each router on its
    own terms (each router's list is what the canary admits against) and leaves them all."""

    def __init__(self, routers: list[str], worker: Worker, key: str | None,
                 log: Callable[[str], None], **kw: Any) -> None:
        self.each = [Membership(r, worker, key, log, **kw) for r in routers]
        # SERVING's membership poller and its heal question call from threads of their own,
        # the stop path from the main one: one call at a time, and none joins after a leave
        self.lock = threading.Lock()
        self.left = False
        #: a profile hold is in force: membership changes nothing (profiled.py)
        self.paused = False

    @property
    def admit(self) -> Callable[[set[str]], str | None] | None:
        return self.each[0].admit

    @admit.setter
    def admit(self, admits: Callable[[set[str]], str | None] | None) -> None:
        for m in self.each:
            m.admit = admits

    @property
    def joined(self) -> bool:
        """Listed by every router (one that is not gets looked at again soon)."""
        return all(m.joined for m in self.each)

    def join(self) -> bool:
        """Join every router; True when one took it (the engine is routable)."""
        with self.lock:
            return not self.left and any([m.join() for m in self.each])

    def check(self, engine_healthy: bool) -> None:
        with self.lock:
            if self.left or self.paused:
                return
            for m in self.each:
                m.check(engine_healthy)

    def pause(self, paused: bool, only: set[str] | None = None) -> dict[str, str]:
        """Pause (or resume) each router's health checks of this engine (``only``: those
        routers); while paused, membership changes nothing. Each router's answer: "" when it
        took the change, else why not."""
        with self.lock:
            self.paused = paused
            return {m.router: m.pause(paused) or "" for m in self.each
                    if only is None or m.router in only}

    def lists_any(self, urls: list[str]) -> bool:
        """Whether every router that answers lists one of ``urls`` healthy (and one answers):
        a heal that takes this engine out must leave each router a pair to serve with."""
        with self.lock:
            seen = [m.lists_any(urls) for m in self.each]
        return any(x is not None for x in seen) and all(x for x in seen if x is not None)

    def listed(self) -> set[str]:
        """The healthy workers any router listed at its last look."""
        return {url for m in self.each for url in m.listed}

    def leave(self) -> None:
        """Leave every router, for good: a check or join still in progress ends first, and
        none after this one re-adds the engine while it drains."""
        with self.lock:
            self.left = True
            for m in self.each:
                m.leave()


def read_key(spec: str | None, env: dict[str, str] | None = None) -> str | None:
    """The control-plane key from ``spec``: ``credential:NAME`` (systemd's LoadCredential=,
    in ``$CREDENTIALS_DIRECTORY``, systemd.exec(5)) or a file path. Raises OSError/ValueError
    with a message that never contains the key."""
    if not spec:
        return None
    env = dict(os.environ) if env is None else env
    if spec.startswith("credential:"):
        directory = env.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise ValueError(f"{spec}: $CREDENTIALS_DIRECTORY is not set (no LoadCredential=?)")
        path = os.path.join(directory, spec[len("credential:"):])
    else:
        path = spec
    with open(path, encoding="utf-8") as fh:
        key = fh.read().strip()
    if not key or any(ch.isspace() for ch in key):
        raise ValueError(f"{path}: the key must be one word, non-empty")
    return key
