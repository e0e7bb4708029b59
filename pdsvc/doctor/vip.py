"""The moving address of routers on several hosts (router.vip): keepalived, at the path the
unit runs it from, able to read the config pdsvc renders for this router host (its own
``--config-test``, which also refuses an interface this host lacks: the usual mistake, since
NIC names differ between machines). Nothing is changed on the host."""

from __future__ import annotations

import os
import subprocess
import tempfile

from pdsvc.plan.build import Plan
from pdsvc.render.vip import vip_config

from .host import find_tool, run, said
from .rows import Row, fail, ok

CHECK = "address"
FIX_INSTALL = "install Debian's package: apt install keepalived (its own keepalived.service " \
              "may stay off: pdsvc runs NAME-vip.service)"


def check_vip(plan: Plan) -> list[Row]:
    v = plan.vip
    assert v is not None and plan.router is not None  # only on a router host (checks.py)
    keepalived = find_tool(v.keepalived, "keepalived")
    if keepalived is None:
        return [fail(CHECK, f"{v.keepalived} not found: {v.address} cannot move to this host "
                            "when the other router host is lost",
                     FIX_INSTALL + "; or set router.vip.keepalived")]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vip.conf")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(vip_config(v, plan.router.machine, ["doctor"]))
        try:
            proc = run([keepalived, "--config-test", "--use-file", path], 20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [fail(CHECK, f"cannot run {keepalived} --config-test: {exc}", FIX_INSTALL)]
    if proc.returncode != 0:
        gist = said(proc)
        if v.interface in gist:
            return [fail(CHECK, f"keepalived refuses router.vip.interface {v.interface} here: "
                                f"{gist}", "set router.vip.interface to the NIC of this host's "
                                "network (`ip -br link`; the same name on every router host)")]
        return [fail(CHECK, f"keepalived refuses the address's config: {gist}",
                     "report this as a pdsvc bug, with keepalived --config-test of the "
                     "rendered vip.conf")]
    return [ok(CHECK, f"keepalived at {keepalived} takes the config: {v.address} on "
                      f"{v.interface}, VRRP {v.vrrp_id} with "
                      f"{', '.join(m for m, _ in v.members if m != plan.router.machine)}")]
