"""Plan -> the systemd bundle's files (pure): the target, its gate, one service per engine,
the router, the accounts, and (assembled here, the one place) the shipped runtime and
installer and the monitoring files. Writing them is pdsvc/render/bundle.py's (`write_bundle`);
the pieces every renderer shares (File, headers, escaping, templates) are kit.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from pdsvc.plan.build import Plan
from pdsvc.plan.runtime_argv import (
    KEY_CREDENTIAL,
    engine_runtime_flags,
    front_flags,
    leave_flags,
    liveness_flags,
    member_flags,
    peer_watch_flags,
    policy_flags,
    router_command,
    router_runtime_flags,
)
from pdsvc.plan.types import FRONT_CONFIG, VIP_CONFIG
from pdsvc.render.front import front_config
from pdsvc.render.kit import (
    POLL_INTERVAL,
    ROUTER_POLL_INTERVAL,
    File,
    header_lines,
    installer_files,
    jinja_environment,
    runtime_files,
    runtime_modules,
)
from pdsvc.render.monitoring import MONITORING_CUSTOMISE, monitoring_files
from pdsvc.render.vip import vip_config

#: The target's gate, a POSIX sh script run as root (it only asks systemd). Each unit is asked
#: alone: `systemctl is-active A B` exits 0 when *any* one is active (systemctl(1)). Each unit
#: that is not active gets a line with what explains it (org.freedesktop.systemd1(5)).
GATE_SCRIPT = (
    'target=$1; shift; bad=0; for u in "$@"; do systemctl is-active --quiet "$u" && continue; '
    'bad=1; echo "$u is not active: $(systemctl show --property=ActiveState,SubState,Result,'
    'ExecMainStatus,StatusText "$u" | tr \'\\n\' \' \')(see: journalctl -u $u)"; done; '
    'if [ "$bad" = 0 ]; then echo "every unit of $target is active: $*"; exit 0; fi; '
    'echo "$target is not serving: fix the cause, then: systemctl start $target"; exit 1')


def gate_command(plan: Plan) -> list[str]:
    return ["/bin/sh", "-c", GATE_SCRIPT, "gate", plan.target, *plan.units]


def render_systemd(plan: Plan, command: str, *, monitoring: bool = True) -> list[File]:
    """The systemd bundle: target, one service per engine, the router, and their support files."""
    env = jinja_environment()
    ctx = {"plan": plan, "header": header_lines(plan, command),
           "runtime_modules": runtime_modules(), "host_paths": host_paths(plan),
           "gpu_groups": GPU_GROUPS, "manifest": f"{MANIFEST_DIR}/{plan.name}.manifest",
           "sysusers": f"{SYSUSERS}/{plan.name}.conf", "tmpfiles": f"{TMPFILES}/{plan.name}.conf",
           "front_file": FRONT_CONFIG, "vip_file": VIP_CONFIG}
    files = [File(plan.target, env.get_template("systemd/target.j2").render(**ctx)),
             File(plan.gate, env.get_template("systemd/gate.service.j2").render(
                 gate_command=gate_command(plan), **ctx))]
    poll = ["--poll-interval", POLL_INTERVAL]
    for e in plan.engines:
        # the drains the runtime begins itself (a heal, a peer's restart) are bound as a
        # stop is: systemd's TimeoutStopSec= does not cover them
        drain = ["--stop-timeout", str(plan.lifecycle.stop_timeout_secs)]
        flags = [*engine_runtime_flags(plan, e), *liveness_flags(plan), *poll, *drain,
                 *policy_flags(plan, plan.paths.run_dir), *member_flags(plan, e, "systemd"),
                 *peer_watch_flags(plan, e)]
        files.append(File(e.unit, env.get_template("systemd/engine.service.j2").render(
            e=e, flags=flags, leave=leave_flags(plan, e), key=KEY_CREDENTIAL,
            **ctx)))
    for r in plan.routers:
        flags = [*router_runtime_flags(plan, r), *liveness_flags(plan),
                 "--poll-interval", ROUTER_POLL_INTERVAL, *policy_flags(plan, plan.paths.run_dir)]
        files.append(File(r.unit, env.get_template("systemd/router.service.j2").render(
            r=r, flags=flags, key=KEY_CREDENTIAL, front=front_flags(plan, r),
            command=router_command(plan, r, "systemd"), **ctx)))
    if plan.front:
        files.append(File(plan.front.unit, env.get_template(
            "systemd/front.service.j2").render(**ctx)))
        files.append(File(FRONT_CONFIG, front_config(plan.front, header_lines(plan, command))))
    if plan.vip and plan.router:  # a router host's bundle (Plan.for_host): keepalived as
        files.append(File(plan.vip.unit, env.get_template(  # its router's host runs it
            "systemd/vip.service.j2").render(**ctx)))
        files.append(File(VIP_CONFIG, vip_config(plan.vip, plan.router.machine,
                                                 header_lines(plan, command))))
    files += runtime_files(plan)
    files += installer_files(plan)
    files += account_files(plan, env, ctx)
    files.append(File("install.list", env.get_template("systemd/install.list.j2").render(**ctx)))
    if not monitoring:  # the units alone (doctor --kv, on a host that may lack the dashboard's
        return files    # builder library)
    files += monitoring_files(plan, header_lines(plan, command, MONITORING_CUSTOMISE))
    return files


@dataclass(frozen=True)
class HostPath:
    """A directory, env file or secret the installer creates (install.list's dir, envfile and
    secret lines; tmpfiles.d's d and f lines): mode and USER:GROUP from the plan."""

    kind: str
    path: str
    mode: str
    owner: str
    how: str = "-"  # a secret's: make or copy

    @property
    def user(self) -> str:
        return self.owner.split(":", 1)[0]

    @property
    def group(self) -> str:
        return self.owner.split(":", 1)[1]


def host_paths(plan: Plan) -> list[HostPath]:
    """What the units need on the host besides their files, in install.list's order: the env
    directory, the router's control-plane key (where a unit reads it), the JIT cache, the state
    directory (HOME), one env file per unit."""
    p, svc, root = plan.paths, f"{plan.user}:{plan.group}", f"root:{plan.group}"
    out = [HostPath("dir", p.env_dir, "0750", root)]
    if plan.key_use != "none":
        out.append(HostPath("secret", p.router_key, "0640", root, plan.key_use))
    out += [HostPath("dir", p.jit_cache, "0750", svc), HostPath("dir", p.state_dir, "0750", svc)]
    names = [e.name for e in plan.engines] + [r.name for r in plan.routers]
    out += [HostPath("envfile", f"{p.env_dir}/{n}.env", "0640", root) for n in names]
    return out


#: Groups the GPU device nodes belong to on many distributions: the service user joins those
#: the host has (install.list's member lines).
GPU_GROUPS = ("video", "render")
#: The installer's record of what it created, for --uninstall (manifest.py), one per deployment.
MANIFEST_DIR = "/var/lib/pdsvc"
SYSUSERS = "sysusers.d"
TMPFILES = "tmpfiles.d"


def account_files(plan: Plan, env: jinja2.Environment, ctx: dict) -> list[File]:
    """The service user and group (sysusers.d(5)) and the directories and env files
    (tmpfiles.d(5)), applied by the installer with systemd-sysusers / systemd-tmpfiles."""
    return [File(f"{SYSUSERS}/{plan.name}.conf",
                 env.get_template("systemd/sysusers.conf.j2").render(**ctx)),
            File(f"{TMPFILES}/{plan.name}.conf",
                 env.get_template("systemd/tmpfiles.conf.j2").render(**ctx))]
