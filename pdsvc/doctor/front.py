"""The front of several routers (router.replicas ≥ 2): HAProxy, at the path the units run it
from, new enough for what its config uses (``retry-on`` and L7 retries: 2.0; the runtime API's
``set server … state``: 1.6), and able to read the config pdsvc renders for it."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from pdsvc.plan.build import Plan
from pdsvc.render.front import front_config

from .host import find_tool, run, said
from .rows import Row, fail, ok

#: `retry-on` (L7 retries) came with HAProxy 2.0 (its configuration.txt); Debian 12 ships 2.6.
HAPROXY_MIN = (2, 0)
FIX_INSTALL = "install Debian's package: apt install haproxy (its own haproxy.service may stay " \
              "off: pdsvc runs NAME-front.service)"


def check_front(plan: Plan) -> list[Row]:
    f = plan.front
    assert f is not None  # only when the plan has one (checks.py)
    haproxy = find_tool(f.haproxy, "haproxy")
    if haproxy is None:
        return [fail("front", f"{f.haproxy} not found: the front of the "
                              f"{len(plan.routers)} routers (router.replicas) cannot start",
                     FIX_INSTALL + "; or set router.front.haproxy")]
    try:
        proc = run([haproxy, "-v"], 10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [fail("front", f"cannot run {haproxy} -v: {exc}", FIX_INSTALL)]
    m = re.search(r"version (\d+)\.(\d+)", proc.stdout or "")
    if proc.returncode != 0 or m is None:
        return [fail("front", f"{haproxy} -v printed no version: {said(proc)}", FIX_INSTALL)]
    version = (int(m.group(1)), int(m.group(2)))
    shown = ".".join(map(str, version))
    if version < HAPROXY_MIN:
        return [fail("front", f"HAProxy {shown} is older than "
                              f"{'.'.join(map(str, HAPROXY_MIN))} (retry-on)", FIX_INSTALL)]
    problem = config_problem(haproxy, plan)
    if problem:
        return [fail("front", f"HAProxy {shown} refuses the front's config: {problem}",
                     "report this as a pdsvc bug, with `haproxy -c -f` of the rendered front.cfg")]
    return [ok("front", f"HAProxy {shown} at {haproxy} takes the front's config "
                        f"({len(plan.routers)} routers behind {f.url})")]


def config_problem(haproxy: str, plan: Plan) -> str | None:
    """`haproxy -c` of the config pdsvc renders for this plan (its socket moved to a scratch
    directory: checking it creates nothing); None when valid, else its gist."""
    assert plan.front is not None
    with tempfile.TemporaryDirectory() as tmp:
        text = front_config(plan.front, ["doctor"]).replace(
            plan.front.socket, os.path.join(tmp, "admin.sock"))
        path = os.path.join(tmp, "front.cfg")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        proc = run([haproxy, "-c", "-q", "-f", path], 20)
    return None if proc.returncode == 0 else said(proc)
