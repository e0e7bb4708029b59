"""One HTTP client for probes: health, readiness, a real generation, a router's workers, an
engine's /metrics. Used by the runtime, `pdsvc doctor`, `pdsvc status` and `pdsvc bench`."""

from __future__ import annotations

import enum
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from .timings import START_PROBE_TIMEOUT_S

READINESS_PROBE_BODY = {
    "text": "pdsvc readiness probe",
    "sampling_params": {"max_new_tokens": 1, "temperature": 0},
}
MAX_BODY = 1 << 20  # what is read of an answer: /workers of a big deployment stays far below
MAX_ERROR_BODY = 1 << 16  # of a 4xx/5xx answer, by default: its reason, not a page

# Probes go straight to the service: an http_proxy in the unit's environment must not
# intercept loopback health checks.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NoAnswerKind(str, enum.Enum):
    """Why no HTTP answer came, in one word: what the runtime decides on (never the text)."""

    TIMEOUT = "timeout"
    REFUSED = "refused"  # the port is closed: nothing listens (a restart, a crash)
    RESOLVE = "resolve"  # no such host
    OS = "os"  # another OS error
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


class ProbeResult(NamedTuple):
    ok: bool
    detail: str  # "HTTP 200", "HTTP 503 {...}", "connection refused", "timed out after 5 s"
    no_answer: NoAnswerKind | None = None  # no HTTP answer came: why


def _snippet(body: bytes) -> str:
    return " ".join(body.decode("utf-8", "replace").split())[:200]


class NoAnswer(NamedTuple):
    """Why no HTTP answer came, classified once; each reader words it (``words`` is the
    probes' wording, in the runtime's log and status lines)."""

    kind: NoAnswerKind
    text: str  # the OS's own words (strerror) or the exception's
    timeout: float

    @classmethod
    def of(cls, reason: object, timeout: float) -> NoAnswer:
        if isinstance(reason, (socket.timeout, TimeoutError)):  # distinct classes on 3.9
            return cls(NoAnswerKind.TIMEOUT, "", timeout)
        if isinstance(reason, ConnectionRefusedError):
            return cls(NoAnswerKind.REFUSED, "", timeout)
        if isinstance(reason, socket.gaierror):
            return cls(NoAnswerKind.RESOLVE, reason.strerror or str(reason), timeout)
        if isinstance(reason, OSError) and reason.strerror:
            return cls(NoAnswerKind.OS, reason.strerror, timeout)
        return cls(NoAnswerKind.OTHER, str(reason) or type(reason).__name__, timeout)

    def words(self) -> str:
        if self.kind is NoAnswerKind.TIMEOUT:
            return f"timed out after {self.timeout:g} s"
        if self.kind is NoAnswerKind.REFUSED:
            return "connection refused"
        return self.text.lower() if self.kind in (NoAnswerKind.RESOLVE, NoAnswerKind.OS) \
            else self.text


class HttpReply(NamedTuple):
    """One HTTP exchange: ``status`` None when no response came (``detail`` and ``no_answer``
    say why)."""

    status: int | None
    body: bytes
    detail: str  # "HTTP 200", "HTTP 503 {...}", "connection refused", "timed out after 5 s"
    latency_ms: float | None = None  # until the answer's body was read
    no_answer: NoAnswer | None = None

    def json(self) -> object:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None


def http_call(
    url: str,
    timeout: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
    opener: Callable[..., object] = _OPENER.open,
    max_body: int = MAX_BODY,
    max_error_body: int = MAX_ERROR_BODY,
) -> HttpReply:
    """One request (GET, or POST when ``body`` is given, unless ``method``), without proxies;
    at most ``max_body`` bytes of the answer are read (``max_error_body`` of a 4xx/5xx one).
    Never raises: a URL it cannot use is a reply without an answer too."""
    started = time.monotonic()

    def failed(reason: object) -> HttpReply:
        why = NoAnswer.of(reason, timeout)
        return HttpReply(None, b"", why.words(), no_answer=why)

    try:
        request = urllib.request.Request(
            url, data=body, headers=dict(headers or {}),
            method=method or ("GET" if body is None else "POST"),
        )
        with opener(request, timeout=timeout) as response:  # type: ignore[attr-defined]
            data = response.read(max_body)
            status = response.status
    except urllib.error.HTTPError as exc:
        try:
            data = exc.read(max_error_body)
        except Exception:  # noqa: BLE001 - the status alone is enough
            data = b""
        finally:
            exc.close()
        said = _snippet(data[:400])
        return HttpReply(exc.code, data, f"HTTP {exc.code}" + (f" {said}" if said else ""),
                         _since(started))
    except urllib.error.URLError as exc:
        return failed(exc.reason)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return failed(exc)
    return HttpReply(status, data, f"HTTP {status}", _since(started))


def _since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def http_probe(
    url: str,
    timeout: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    opener: Callable[..., object] = _OPENER.open,
) -> ProbeResult:
    """GET ``url`` (POST when ``body`` is given); ok only on HTTP 200. Never raises."""
    reply = http_call(url, timeout, body, headers, opener=opener)
    return ProbeResult(reply.status == 200, reply.detail,
                       reply.no_answer.kind if reply.no_answer is not None else None)


K = TypeVar("K")
T = TypeVar("T")


def at_once(calls: Mapping[K, Callable[[], T]], bound: float) -> dict[K, T]:
    """Each call on a thread of its own, all at once, waited for together up to ``bound`` s:
    the results of those that ended by then (many slow peers cost one timeout, not one each;
    a call still running is left to end on its own: its thread is a daemon). A call that
    raised raises here, in the caller's thread (whose duty says and counts it: duties.py),
    not in a helper thread that would end without a word."""
    done: dict[K, T] = {}
    raised: list[BaseException] = []

    def one(key: K, call: Callable[[], T]) -> None:
        try:
            done[key] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            raised.append(e)

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + bound
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if raised:
        raise raised[0]
    return dict(done)


def judge_generation(reply: HttpReply) -> str | None:
    """Why a generation's reply is not a good completion, or None when it is one.

    Judged by content, not status: a broken prefill/decode pair answers **HTTP 200** with
    ``finish_reason`` of type abort (or error) and an empty text (smg-project/smg #2382, sglang
    #33789); ``meta_info`` is SGLang's ``/generate`` reply (sglang/srt/managers/io_struct.py).
    """
    if reply.status != 200:
        return reply.detail
    doc = reply.json()
    if not isinstance(doc, dict):
        return "HTTP 200 but the body is not a JSON object: " + _snippet(reply.body)
    raw = doc.get("meta_info")
    meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind in ("abort", "error"):
        said = finish.get("message", "") if isinstance(finish, dict) else ""
        return f"HTTP 200 with finish_reason {kind}" + (f": {said}" if said else "")
    tokens = meta.get("completion_tokens")
    if doc.get("text", "") == "" and not (isinstance(tokens, int) and tokens > 0):
        return "HTTP 200 with an empty completion"
    return None


def router_start_probe(
    readiness_url: str,
    generate_url: str,
    api_key: str | None,
    generate_timeout: float,
    probe: Callable[..., ProbeResult] = http_probe,
    call: Callable[..., HttpReply] = http_call,
) -> Callable[[], ProbeResult]:
    """Probe for the router's start phase: ``/readiness`` 200, then one good completion.

    ``/readiness`` turns 200 as soon as workers are registered, before a prefill/decode pair
    has served a request; only a generation through the router proves the pair works.
    """
    body = json.dumps(READINESS_PROBE_BODY).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def check() -> ProbeResult:
        ready = probe(readiness_url, START_PROBE_TIMEOUT_S)
        if not ready.ok:
            return ProbeResult(False, f"readiness: {ready.detail}")
        bad = judge_generation(call(generate_url, generate_timeout, body, headers))
        if bad:
            return ProbeResult(False, f"readiness OK, generation failed: {bad}")
        return ProbeResult(True, "HTTP 200, a good completion")

    return check


def liveness_url_for(readiness_url: str) -> str:
    """The router's ``/liveness`` on the same scheme, host and port as ``/readiness``."""
    parts = urllib.parse.urlsplit(readiness_url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/liveness", "", ""))


def base_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
