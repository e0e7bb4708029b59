"""How an engine leaves its routers when it stops: within LEAVE_WAIT_S from the runtime's own
stop (a router that does not answer must not hold the stop), and once more from the unit's
ExecStopPost= (``runtime leave``), whatever ended the runtime."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .membership import Membership, Routers, Worker, read_key
from .probe import HttpReply, http_call
from .timings import LEAVE_WAIT_S, ROUTER_CALL_MIN_S
from .waiting import aside


def leave_within(routers: Routers, log: Callable[[str], None],
                 secs: float = LEAVE_WAIT_S) -> bool:
    """Leave every router, waiting ``secs`` at most (a router that does not answer, its host
    lost or frozen, or a membership check that holds the lock must not hold the stop). True
    when the routers took the engine out in time; else the leave goes on aside, and
    ExecStopPost= leaves once more."""
    deadline = time.monotonic() + secs

    def left() -> bool:
        routers.leave()
        return True

    if aside(left, lambda: time.monotonic() >= deadline) is None:
        log(f"the routers did not take this engine out within {secs:g} s: stopping it "
            "anyway (the leave goes on; ExecStopPost= leaves again)")
        return False
    return True


def leave_after_end(routers: list[str], url: str, key_spec: str | None,
                    log: Callable[[str], None], env: dict[str, str] | None = None,
                    call: Callable[..., HttpReply] = http_call) -> int:
    """`runtime leave`, the unit's ExecStopPost=: whatever ended the main process (kill -9, the
    OOM killer), the engine leaves every router now, not when the routers' health checks give
    up on it, which is seconds of requests sent to a dead engine (systemd.service(5): the
    command runs after any stop, also when the main process died; $SERVICE_RESULT and
    $EXIT_STATUS say how). A runtime that stopped cleanly already left: nothing to do then.
    Always 0: a stop must not fail for a router that is down (it routes nowhere then)."""
    env = dict(os.environ) if env is None else env
    try:
        key = read_key(key_spec, env)
    except (OSError, ValueError) as exc:
        log(f"cannot read the router's control-plane key: {exc}; {url} not deregistered")
        return 0
    how = ", ".join(f"{k.lower()} {env[k]}" for k in ("SERVICE_RESULT", "EXIT_CODE",
                                                       "EXIT_STATUS") if env.get(k))
    for router in routers:
        # bounded: a router that does not answer must not hold the unit's stop
        m = Membership(router, Worker(url.rstrip("/"), "", None), key, lambda _: None,
                       call=call, timeout=max(ROUTER_CALL_MIN_S, LEAVE_WAIT_S / len(routers)))
        dropped = m.drop()
        if dropped is None:
            log(f"router {router} unreachable: nothing to deregister")
        elif dropped:
            log(f"the runtime ended without taking {url} out of the router"
                f"{f' ({how})' if how else ''}: deregistered it from {router}")
    return 0
