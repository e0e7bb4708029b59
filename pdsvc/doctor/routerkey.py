"""One host of several: the router's control-plane key on this host is the router's.

The engines register with the router (``POST /workers``) with the key in
``Authorization: Bearer`` (pdsvc/ship/runtime/membership.py); a router started with
``--control-plane-api-keys`` answers another key with 401 (sglang-router 0.3.2 and smg), so an
engine host holding a key of its own never joins. The check asks the router what the engines
will: an authenticated ``GET /workers``, which changes nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pdsvc.plan.build import Plan
from pdsvc.render.kit import key_fetch_command
from pdsvc.render.supervisord import key_copy_command, keygen_command
from pdsvc.ship.runtime.membership import read_key
from pdsvc.ship.runtime.probe import HttpReply, http_call

from .rows import Row, fail, ok, warn

CHECK = "router key"
TIMEOUT_S = 3.0


def check_router_key(plan: Plan, call: Callable[..., HttpReply] = http_call) -> list[Row]:
    """✓ the router answers this host's key with 200; ✗ it refuses it (401/403), or the key
    here is malformed; ! the key is not here yet (made by the router host's install, copied
    by the engine hosts' install.sh --key-from), or the router cannot be asked (not running
    yet, or this user may not read the key)."""
    path = plan.paths.router_key
    url = plan.key_router_url()
    fix = copy_fix(plan)
    try:
        key = read_key(path, {})
    except FileNotFoundError:
        if plan.key_use == "make":
            return [warn(CHECK, f"{path} is not made yet (the router's control-plane key)",
                         make_fix(plan))]
        return [warn(CHECK, f"{path} is missing: the engines here cannot register with the "
                     "router until it is copied here", fix)]
    except PermissionError:
        return [warn(CHECK, f"cannot read {path} (root:{plan.group} 0640)",
                     "run pdsvc doctor as root")]
    except (OSError, ValueError) as exc:
        return [fail(CHECK, f"{path} is not a control-plane key: {exc}", fix)]
    assert key is not None
    reply = call(f"{url}/workers", TIMEOUT_S, headers={"Authorization": f"Bearer {key}"})
    del key
    if reply.status == 200:
        return [ok(CHECK, f"the router at {url} takes this host's key (GET /workers: 200)")]
    if reply.status in (401, 403):
        return [fail(CHECK, f"the router at {url} refuses this host's key ({reply.detail}): "
                     "it is not the router's", fix)]
    if reply.status is None:
        where = f" on {plan.router_machine}" if plan.router_machine else ""
        return [warn(CHECK, f"cannot reach the router at {url} ({reply.detail}): the key is "
                     "checked once it answers", f"start {plan.target}{where}, then run "
                     "pdsvc doctor again")]
    return [warn(CHECK, f"the router at {url} answered GET /workers with {reply.detail}",
                 "see the router's log (journalctl -u " + shlex.quote(f"{plan.name}-router")
                 + ")")]


def make_fix(plan: Plan) -> str:
    """How the router's host makes the key: its install.sh, or the supervisord header's line."""
    if plan.format == "supervisord":
        return f"make it as the supervisord.conf header says: {keygen_command(plan)}"
    return f"install the bundle: sudo install.sh --bundle BUNDLE/{plan.hosts[0].name}"


def copy_fix(plan: Plan) -> str:
    """How this host gets the router's key: copied from the router's host (install.sh
    --key-from, or the supervisord header's line); on the router's host, the router itself
    runs with another key than the file: restart it."""
    if plan.key_use == "make":
        return (f"the router runs with another key than {plan.paths.router_key}: "
                f"systemctl restart {plan.name}-router (supervisorctl restart for supervisord)")
    if plan.format == "supervisord":
        return f"copy the key from the router's host: {key_copy_command(plan)}"
    return (f"copy the key from the router's host: {key_fetch_command(plan)} && sudo "
            f"install.sh --bundle BUNDLE/{plan.hosts[0].name} --key-from router.key && rm "
            f"router.key; then systemctl restart {plan.target}")
