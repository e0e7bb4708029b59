"""One engine's profiler, asked directly (not through the router: the router fans out to every
worker, and prefill and decode must be profiled apart, SGLang's docs "Profile In PD
Disaggregation Mode"): its facts (``/server_info``), the request a capture sends
(``/start_profile``), a stop (``/stop_profile``), and SGLang's answers made one line.

SGLang 0.5.23 (srt/entrypoints/http_server.py) takes the IPC struct ``ProfileReq`` as the
body (srt/managers/io_struct.py); pdsvc sends only fields every release since the profiler's
API has read: ``output_dir``, ``num_steps``, ``activities``, ``with_stack``,
``record_shapes``, ``profile_by_stage``, ``profile_id``, ``profile_prefix``. A failure the
scheduler reports (a capture already running) reaches the client only as a bare
``500 Internal Server Error``: SGLang's own message is in the engine's log, and is quoted
from there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol

from pdsvc.profile.engines import Engine
from pdsvc.profile.options import CannotProfile, ProfileError, ProfileOptions

#: how long the engine has to answer a call that needs its scheduler
CALL_TIMEOUT_S = 30.0


class Http(Protocol):
    def http(self, method: str, url: str, headers: dict[str, str] | None = None,
             timeout: float = 3.0, body: bytes | None = None) -> tuple[int, str]: ...


def headers(e: Engine) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if e.key:
        h["Authorization"] = f"Bearer {e.key}"
    return h


def no_answer(text: str) -> str:
    """urllib's words for no answer, without its wrapping: ``connection refused``."""
    m = re.fullmatch(r"<urlopen error (?:\[Errno -?\d+\] )?(.*)>", text.strip())
    return m[1].strip().lower() if m else text.strip()


def server_info(host: Http, e: Engine) -> dict[str, Any]:
    """GET /server_info; CannotProfile when the engine does not answer it."""
    status, text = host.http("GET", f"{e.url}/server_info", headers(e), CALL_TIMEOUT_S)
    if status == 0:
        raise CannotProfile(f"{e.name} ({e.url}) does not answer: {no_answer(text)}",
                            hint="is it running? see `pdsvc status`")
    if status in (401, 403):
        raise CannotProfile(f"{e.name} refused /server_info (HTTP {status}): its key is not "
                            "the one in its args (--admin-api-key / --api-key)")
    try:
        info = json.loads(text) if status == 200 else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise CannotProfile(f"{e.name}: /server_info answered HTTP {status}, not SGLang's "
                            f"server info: {' '.join(text.split())[:120]}")
    return info


def refuses_by_stage(e: Engine, info: dict[str, Any]) -> str | None:
    """Why ``--by-stage`` cannot capture this engine, or None. A by-stage capture counts only
    the engine's own stage's forward steps (not a PD decode's PREBUILT placeholders, sglang PR
    #40098), but under speculative decoding its decode window never ends (TARGET_VERIFY
    counts as extend: sglang #34943, open in 0.5.23)."""
    spec = info.get("speculative_algorithm")
    if not spec:
        return None
    return (f"--by-stage: {e.name} runs speculative decoding (speculative_algorithm {spec}), "
            "under which a by-stage decode capture never ends (sglang #34943)")


def start_body(opts: ProfileOptions, output_dir: str, run: str, stage: bool) -> dict[str, Any]:
    """The /start_profile request: N steps of the asked activities, without Python stacks and
    shapes (both default to true, and make traces of hundreds of MB: THUDM/slime PR #1879).
    Plain steps by default: such a capture runs from the request on, and /stop_profile ends it
    at any moment; a by-stage one (``stage``) waits, armed, for its stage's first step, and
    SGLang cannot cancel it while it is armed (``_stop_profile`` refuses: not in progress)."""
    return {"output_dir": output_dir, "num_steps": opts.steps,
            "activities": list(opts.activities), "with_stack": False, "record_shapes": False,
            "profile_by_stage": stage, "profile_id": run, "profile_prefix": "pdsvc"}


def start(host: Http, e: Engine, body: dict[str, Any],
          log_line: Callable[[], str | None]) -> None:
    """POST /start_profile; ProfileError (one line) when the engine refuses it."""
    status, text = host.http("POST", f"{e.url}/start_profile", headers(e), CALL_TIMEOUT_S,
                             json.dumps(body).encode())
    if status == 200:
        return
    raise ProfileError(refusal(e, "/start_profile", status, text, log_line))


def stop(host: Http, e: Engine, timeout: float) -> tuple[int, str]:
    """POST /stop_profile: it answers once the trace is written (SGLang stops and exports on
    the scheduler), or 500 when no capture runs (it stopped itself after its steps)."""
    return host.http("POST", f"{e.url}/stop_profile", headers(e), timeout, b"{}")


def refusal(e: Engine, path: str, status: int, text: str,
            log_line: Callable[[], str | None]) -> str:
    """Why ``e`` refused ``path``, in one line."""
    said = " ".join(text.split())[:160]
    if status == 0:
        return f"{e.name} did not answer {path}: {no_answer(text)}"
    if status == 404:
        return (f"{e.name} has no {path} (HTTP 404): not an SGLang with the profiler's HTTP "
                "API, or not SGLang")
    if status in (401, 403):
        return (f"{e.name} refused {path} (HTTP {status}): the profiler takes the engine's "
                "--admin-api-key when it has one, else its --api-key")
    if status == 500:
        quoted = log_line()
        return (f"{e.name} refused {path} (HTTP 500)" +
                (f"; its log says: {quoted}" if quoted else f": {said}"))
    return f"{e.name} refused {path} (HTTP {status}): {said}"


def runtime_error(lines: list[str]) -> str | None:
    """The last ``RuntimeError: ...`` of an engine's log lines (SGLang's own words)."""
    for line in reversed(lines):
        if "RuntimeError:" in line:
            return line[line.index("RuntimeError:"):].strip()
    return None
