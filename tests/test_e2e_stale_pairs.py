"""2P2D under real systemd, the real router, steady load judged by content: the faults that
the pair canary and the router's retries must absorb without a client seeing an error.

1. A prefill restarted while the decodes go stale toward it (the stand-in's
   FAKE_SGLANG_STALE_PAIR=decode: each decode keeps the replaced prefill's NIXL endpoints,
   sglang #33789, and every transfer through that pair comes back as HTTP 200 with
   finish_reason abort while every /health says 200). The new prefill stays out of the router
   until its pairs with the engines the router lists are good (Canary.admits: never beside a
   decode that is still stale toward it); the decodes,
   the stale side, heal one at a time (never both out of the router at once); no request
   fails. The seconds until full capacity are printed.
2. kill -9 of a decode's engine under paced streaming load (tests/support/zero_loss.py's kill
   event and its limits): no non-streamed request fails, every stream it cut ends with an
   error the client sees (none hangs) and was served by that engine, and no more are cut than
   were in flight on it.

One stack per router (the tests run in file order; each leaves it at full capacity).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import zero_loss
from conftest import require
from faults import kill
from loadgen import Load, failures
from nspawn import nspawn_available
from stack import Stack

pytestmark = pytest.mark.e2e

#: streams long enough that a kill finds several in flight: 40 tokens x ITL_MS
STREAM_TOKENS = 40


@pytest.fixture(scope="module")
def stack(serve_python: Path, router_package: str, tmp_path_factory) -> Iterator[Stack]:
    require(nspawn_available())
    s = zero_loss.boot(tmp_path_factory.mktemp("stale-2p2d"), serve_python.parent.parent,
                       router_package, **{"runtime.env.FAKE_SGLANG_STALE_PAIR": "decode",
                                          "runtime.env.FAKE_SGLANG_PACED": 1})
    try:
        yield s
    finally:
        s.down()


class Listing:
    """The engines the router lists as healthy, sampled every ``every`` s: [(t, {url})]."""

    def __init__(self, s: Stack, every: float = 0.25) -> None:
        self.s, self.every, self.samples = s, every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            code, body = self.s.workers(timeout=3)
            if code == 200:
                self.samples.append((t, {w["url"] for w in json.loads(body).get("workers", [])
                                         if w.get("is_healthy")}))
            self._stop.wait(self.every)

    def __enter__(self) -> Listing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def absent(self, url: str) -> list[float]:
        return [t for t, urls in self.samples if url not in urls]


def timeline(seen: Listing, urls: dict[str, str], t0: float) -> list:
    """(seconds since t0, the engines listed) per sample since t0."""
    return [(round(t - t0, 1), sorted(n for n, u in urls.items() if u in listed))
            for t, listed in seen.samples if t >= t0]


def heal_lines(s: Stack) -> str:
    """The last few lines of each engine's journal about its pairs, heals and membership."""
    keys = ("not joining", "but not now", "restarting to heal", "registered")
    return "\n".join(f"--- {e}:\n" + "\n".join(
        [ln for ln in s.c.journal(s.unit(e), lines=3000).splitlines()
         if any(k in ln for k in keys)][-4:]) for e in zero_loss.engine_urls(s))


def test_a_restarted_prefill_joins_only_once_the_stale_decodes_healed_one_at_a_time(
        stack: Stack, router_package: str) -> None:
    urls = zero_loss.engine_urls(stack)
    before = {i: stack.invocation(i) for i in (*urls, "router")}
    ld = zero_loss.load(stack)
    with ld, Listing(stack) as seen:
        zero_loss.steady(stack, ld)
        t0 = time.monotonic()
        stack.c.systemctl("restart", stack.unit("prefill-1"))

        def healed() -> bool:
            return all(stack.invocation(d) != before[d] for d in ("decode-0", "decode-1")) \
                and zero_loss.at_capacity(stack)

        try:
            stack.c.wait_for(healed, 180, interval=0.25,
                             what="both decodes healed and all four engines in the router")
        except AssertionError as e:
            raise AssertionError(f"{e}\nlisted: {timeline(seen, urls, t0)[-3:]}\n"
                                 f"{heal_lines(stack)}") from None
        capacity = time.monotonic() - t0
        time.sleep(zero_loss.TAIL)
        t1 = time.monotonic()
        ld.settle(t1)
    during = ld.between(t0, t1)
    failed = failures(during)
    print(f"\nBENCH [{router_package}] stale pairs: restart prefill-1, decodes stale toward it: "
          f"{sum(failed.values())} of {len(during)} failed {dict(failed)}; full capacity "
          f"after {capacity:.1f} s")
    p1, d0, d1 = urls["prefill-1"], urls["decode-0"], urls["decode-1"]
    after = [(t, u) for t, u in seen.samples if t >= t0]
    gone = next(t for t, u in after if p1 not in u)  # the old prefill-1 left
    joined = next(t for t, u in after if t > gone and p1 in u)
    out = {d: [t for t in seen.absent(d) if t >= t0] for d in (d0, d1)}
    listed = timeline(seen, urls, t0)
    assert out[d0] and out[d1], f"a decode never left the router to heal: {listed}"
    # prefill-1 is never listed beside a decode that has not healed yet (its pair with that
    # decode is stale); beside one that is out healing it may be: that one checks its own
    # pairs before it joins again
    for t, names in after:
        if t >= joined:
            stale = [n for n, d in (("decode-0", d0), ("decode-1", d1))
                     if d in names and not any(a < t for a in out[d])]
            assert not stale, f"prefill-1 listed beside stale {stale}: {listed}"
    assert not set(out[d0]) & set(out[d1]), f"both decodes out of the router at once: {listed}"
    assert any("not joining the router yet" in line
               for line in stack.c.journal(stack.unit("prefill-1"), lines=2000).splitlines())
    for other in ("prefill-0", "router"):
        assert stack.invocation(other) == before[other], f"{other} restarted"
    assert len(during) > 30 and not failed, \
        [(r.kind, r.stream, r.status, r.detail) for r in during if not r.ok][:10]


def test_kill_9_of_a_decode_cuts_only_its_own_streams_with_an_error_the_client_sees(
        stack: Stack, router_package: str) -> None:
    victim = "decode-1"
    port = urlsplit(zero_loss.engine_urls(stack)[victim]).port
    ld = Load(f"{stack.plan['router']['url']}/generate", rate=zero_loss.RATE,
              stream_share=0.75, tokens=STREAM_TOKENS, netns=stack.netns, timeout=30, seed=1)
    event = zero_loss.Event(f"kill -9 {victim}'s engine, paced streams", kill("9", victim),
                            victim, "kill")
    with ld:
        out = zero_loss.run_event(stack, ld, event)
    print(f"\nBENCH [{router_package}] stale pairs:{out.row()}  streams in flight: "
          f"{out.streams_in_flight}, on {victim}: {out.on_engine}")
    misses = out.misses()
    assert not misses, f"{'; '.join(misses)}\n{zero_loss.describe(out)}"
    cut = [r for r in ld.results if r.kind == "cut"]
    assert all(r.port in (None, port) for r in cut), \
        f"a stream on another engine was cut: {[(r.port, r.tokens, r.detail) for r in cut]}"
    assert all(r.latency < ld.timeout - 1 for r in cut), "a cut stream hung"
