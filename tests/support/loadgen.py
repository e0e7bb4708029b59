"""Steady load through a router, every request judged by its content (test support, stdlib).

One `Load` sends ``rate`` requests a second (open loop: a request goes out on schedule
whether or not the last one came back) to SGLang's ``/generate``, a share of them streamed,
each in a thread of its own, and keeps a `Result` per request:

* ``ok``: HTTP 200 with text and a finish_reason that is not ``abort``; for a stream, its
  final chunk (finish_reason set) and then ``data: [DONE]``;
* ``http``: any other status (``status`` says which: the router's 503, a 500 ...);
* ``abort200``: HTTP 200 whose finish_reason is ``abort`` (a failed KV transfer, SGLang's way);
* ``empty``: HTTP 200, finished, with no text;
* ``cut``: a stream that ended without its final chunk or without ``[DONE]``
  (``tokens`` says how many chunks it had sent before);
* ``connection``: no HTTP answer at all (refused, reset before the status line);
* ``timeout``: no answer, or a stream that stalled, for ``timeout`` seconds.

Bounded: addresses on loopback only, or any inside ``netns`` (a lab's); at most
``max_in_flight`` requests at once (a request that would exceed it is not sent and is counted
in ``skipped``); every request gives up after ``timeout``; the load stops by itself after
``max_seconds``. ``netns``: a network namespace
under /run/netns (the nspawn stacks' own) that every load thread enters (setns(2) acts on the
calling thread only, so the caller's own thread stays where it is; root needed).
"""

from __future__ import annotations

import ctypes
import http.client
import json
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

KINDS = ("http", "abort200", "empty", "cut", "connection", "timeout")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
CLONE_NEWNET = 0x40000000


def enter_netns(netns: str | None) -> None:
    """Move the calling thread into network namespace ``netns`` (a name under /run/netns)."""
    if not netns:
        return
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class Result:
    start: float  # time.monotonic()
    end: float
    stream: bool
    kind: str  # "ok" or one of KINDS
    status: int = 0
    tokens: int = 0  # chunks a stream sent before it ended
    detail: str = ""
    port: int | None = None  # the engine that answered (the stand-in's meta_info.port)

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def served_by(data: object) -> int | None:
    """The port of the engine that wrote a generation (or a stream's chunk): the stand-in's
    ``meta_info.port``; None where it does not say (SGLang itself does not)."""
    out = data[0] if isinstance(data, list) and data else data
    port = (out.get("meta_info") or {}).get("port") if isinstance(out, dict) else None
    return port if isinstance(port, int) and not isinstance(port, bool) else None


def judge_body(data: object) -> tuple[str, str]:
    """A finished generation's kind by its content: ok, abort200 or empty."""
    out = data[0] if isinstance(data, list) and data else data
    if not isinstance(out, dict):
        return "empty", f"not a generation: {str(data)[:120]}"
    finish = (out.get("meta_info") or {}).get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return "abort200", str(finish.get("message", ""))[:160]
    if not str(out.get("text") or "").strip():
        return "empty", f"finish_reason {finish}"
    return "ok", ""


def request(url: str, stream: bool, timeout: float, tokens: int = 16, text: str = "") -> Result:
    """One POST /generate judged by content (see the module's docstring). ``text``: the
    prompt (a unique one by default: a cache-aware router spreads them rather than sending
    every one to the engine that holds the shared prefix)."""
    parts = urlsplit(url)
    body = json.dumps({"text": text or f"{random.getrandbits(64):016x} zero loss",
                       "stream": stream,
                       "sampling_params": {"max_new_tokens": tokens}})
    t0 = time.monotonic()
    res = Result(t0, t0, stream, "connection")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("POST", parts.path or "/generate", body,
                     {"content-type": "application/json"})
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status != 200:
            res.kind, res.detail = "http", resp.read(300).decode(errors="replace")
        elif not stream:
            data = json.loads(resp.read())
            res.port = served_by(data)
            res.kind, res.detail = judge_body(data)
        else:
            res.kind, res.detail = "cut", "ended without its final chunk"
            last: object = None
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    if last is None:
                        res.detail = "[DONE] without a final chunk"
                    else:
                        res.kind, res.detail = judge_body(last)
                    break
                chunk = json.loads(payload)
                res.tokens += 1
                res.port = res.port or served_by(chunk)
                if (chunk.get("meta_info") or {}).get("finish_reason") is not None:
                    last = chunk
                elif isinstance(chunk, dict) and "error" in chunk:
                    res.detail = f"error chunk: {str(chunk)[:160]}"
            else:
                if last is not None:
                    res.detail = "final chunk but no [DONE]"
    except TimeoutError as e:
        res.kind, res.detail = "timeout", str(e)
    except (http.client.IncompleteRead, http.client.RemoteDisconnected) as e:
        res.kind = "cut" if res.status == 200 else "connection"
        res.detail = repr(e)[:160]
    except (OSError, http.client.HTTPException, ValueError) as e:
        if res.status == 200:
            res.kind = "cut"  # a 200 whose body broke off
        res.detail = repr(e)[:160]
    finally:
        conn.close()
        res.end = time.monotonic()
    return res


def get(url: str, netns: str | None = None, timeout: float = 3) -> tuple[int, str]:
    """GET ``url`` from inside ``netns`` (a thread of its own enters it); (0, why) on error."""
    out: list[tuple[int, str]] = [(0, "no answer")]

    def one() -> None:
        try:
            enter_netns(netns)
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
            try:
                conn.request("GET", parts.path)
                resp = conn.getresponse()
                out[0] = (resp.status, resp.read().decode(errors="replace"))
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as e:
            out[0] = (0, repr(e))

    t = threading.Thread(target=one, daemon=True)
    t.start()
    t.join(timeout + 2)
    return out[0]


def hop_times(urls: list[str], netns: str | None = None, rounds: int = 400,
              timeout: float = 3) -> dict[str, list[float]]:
    """Seconds of each GET of each URL, the URLs taken in turn ``rounds`` times over one
    kept-alive connection each (as a client keeps one), from inside ``netns``: what one hop
    costs beside another, in the same moments."""
    out: dict[str, list[float]] = {u: [] for u in urls}

    def run() -> None:
        enter_netns(netns)
        conns = {u: (http.client.HTTPConnection(urlsplit(u).hostname, urlsplit(u).port,
                                                timeout=timeout), urlsplit(u).path)
                 for u in urls}
        try:
            for _ in range(rounds):
                for u, (conn, path) in conns.items():
                    t0 = time.perf_counter()
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status == 200:
                        out[u].append(time.perf_counter() - t0)
        finally:
            for conn, _ in conns.values():
                conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(rounds * len(urls) * timeout + 5)
    return out


@dataclass
class Load:
    url: str  # the router's /generate
    rate: float = 6.0  # requests a second
    stream_share: float = 0.5
    tokens: int = 16  # max_new_tokens
    timeout: float = 20.0
    max_in_flight: int = 64
    max_seconds: float = 900.0
    netns: str | None = None
    seed: int = 0
    results: list[Result] = field(default_factory=list)
    skipped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _slots: threading.Semaphore | None = None
    _starts: dict[int, tuple[float, bool]] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        host = urlsplit(self.url).hostname
        if host not in LOOPBACK and not self.netns:  # a lab's address: from inside the lab
            raise ValueError(f"load generator: loopback or a namespace's own, not {host!r}")
        self._slots = threading.BoundedSemaphore(self.max_in_flight)

    def __enter__(self) -> Load:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._dispatch, name="load", daemon=True)
        self._thread.start()

    def stop(self, wait: float | None = None) -> None:
        """Stop sending; wait (up to the request timeout) for what is in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        deadline = time.monotonic() + (self.timeout + 2 if wait is None else wait)
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _dispatch(self) -> None:
        rng = random.Random(self.seed)
        t0 = time.monotonic()
        n = 0
        while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds:
            due = t0 + n / self.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            n += 1
            stream = rng.random() < self.stream_share
            if not self._slots.acquire(blocking=False):
                with self._lock:
                    self.skipped += 1
                continue
            threading.Thread(target=self._one, args=(n, stream), daemon=True).start()

    def _one(self, n: int, stream: bool) -> None:
        try:
            with self._lock:
                self._starts[n] = (time.monotonic(), stream)
            try:
                enter_netns(self.netns)
                res = request(self.url, stream, self.timeout, self.tokens)
            except OSError as e:
                t = time.monotonic()
                res = Result(t, t, stream, "connection", detail=repr(e))
            with self._lock:
                del self._starts[n]
                self.results.append(res)
        finally:
            self._slots.release()

    # ------------------------------------------------------------------ reading it
    def in_flight(self, streams_only: bool = False) -> int:
        with self._lock:
            return sum(1 for _, s in self._starts.values() if s or not streams_only)

    def sent_between(self, t0: float, t1: float, streams_only: bool = False) -> int:
        """How many requests were sent in [t0, t1], answered or not."""
        with self._lock:
            starts = [(r.start, r.stream) for r in self.results] + list(self._starts.values())
        return sum(1 for t, s in starts if t0 <= t <= t1 and (s or not streams_only))

    def settle(self, t: float) -> None:
        """Wait until every request sent before ``t`` has its result (bounded by its timeout)."""
        deadline = time.monotonic() + self.timeout + 2
        while time.monotonic() < deadline:
            with self._lock:
                if all(start >= t for start, _ in self._starts.values()):
                    return
            time.sleep(0.05)

    def between(self, t0: float, t1: float) -> list[Result]:
        """The requests in flight at any moment of [t0, t1] (sent before t1, ended after t0)."""
        with self._lock:
            return [r for r in self.results if r.start < t1 and r.end > t0]

    def within(self, t0: float, t1: float) -> list[Result]:
        """The requests sent and answered inside [t0, t1]."""
        with self._lock:
            return [r for r in self.results if r.start >= t0 and r.end <= t1]


def failures(results: Iterable[Result]) -> Counter:
    """Failed requests by kind (``http 503``, ``cut``, ...); empty when every one was ok."""
    return Counter(f"http {r.status}" if r.kind == "http" else r.kind
                   for r in results if not r.ok)


def p99(results: Iterable[Result]) -> float:
    """The 99th percentile latency (s) of the requests that succeeded (nearest rank)."""
    lat = sorted(r.latency for r in results if r.ok)
    if not lat:
        return math.nan
    return lat[min(len(lat) - 1, max(0, math.ceil(0.99 * len(lat)) - 1))]
