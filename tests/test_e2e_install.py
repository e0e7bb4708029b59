"""install.sh under a real systemd (nspawn container), driven as an admin would.

The bundle comes from a real `pdsvc render` (stand-in engines, the real sglang-router);
install.sh is the real one, run inside a booted systemd. The shared container's tests run in
file order, each starting from the state the previous one left (noted in each docstring):
fresh install -> --start -> no-op re-install -> admin edits -> uninstall -> dry runs ->
refusals and DESTDIR staging. The one refusal that needs a host whose PID 1 is not systemd
runs on this machine itself (--dry-run, and DESTDIR staging, which needs no systemd).

"No file of ours left" is checked on a listing of the container's whole root file system
(`find / -xdev`: /etc, /var, /opt, /home, /root ...; not /usr, which is the host's, read-only,
nor /tmp, /run, /proc, /sys, which are other mounts) with type, mode and owner of every entry,
taken before the first install. Left out of it, and why:
  * /var/log/journal: journald's files grow and rotate with every log line;
  * /var/lib/systemd/timers: stamps of the host's preset timers, written whenever one elapses;
  * /etc/passwd-, group-, shadow-, gshadow-: the backup copies shadow-utils writes on every
    change to the account files (the first groupadd makes them; userdel leaves them).
A listing cannot see contents, so the account files themselves are compared byte for byte
instead: a user, group or group membership left over would show. A file owned by a deleted
user lists with a numeric owner, so none can hide either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import require
from nspawn import CONTAINER_ENV, nspawn_available
from stack import REPO, Stack, e2e_config, host_topology

from pdsvc.render.kit import runtime_modules

pytestmark = pytest.mark.e2e

INSTALL_SH = str(REPO / "install.sh")
BUNDLE = "/srv/e2e/units"  # the test's work dir is bound read-only at /srv/e2e
UNIT_DIR = "/etc/systemd/system"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
LISTING = (
    r"find / -xdev \( -path /var/log/journal -o -path /var/lib/systemd/timers \) -prune"
    r" -o -printf '%y %#m %u:%g %p\n'"
)
ACCOUNT_FILES = ["/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow"]
SHADOW_BACKUPS = {f"{path}-" for path in ACCOUNT_FILES}


# --------------------------------------------------------------------------- helpers


def snapshot(stack: Stack) -> dict[str, str]:
    """path -> 'type mode owner' for everything on the container's root file system."""
    out = stack.c.run(LISTING, timeout=60).stdout
    entries = {}
    for line in out.splitlines():
        kind, mode, owner, path = line.split(" ", 3)
        if path not in SHADOW_BACKUPS:
            entries[path] = f"{kind} {mode} {owner}"
    return entries


def accounts(stack: Stack) -> str:
    return stack.c.run(["sha256sum", *ACCOUNT_FILES]).stdout


def changes(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str]]:
    return {
        "added": sorted(p for p in after if p not in before),
        "removed": sorted(p for p in before if p not in after),
        "changed": sorted(p for p in before if p in after and before[p] != after[p]),
    }


def install(stack: Stack, *args: str, bundle: str = BUNDLE, user: bool = False,
            env: dict[str, str] | None = None, timeout: float = 240,
            ) -> subprocess.CompletedProcess[str]:
    """install.sh inside the container; never raises on its exit code."""
    cmd = ["bash", INSTALL_SH, "--bundle", bundle, *args]
    return stack.c.run(NOBODY + cmd if user else cmd, check=False, timeout=timeout, env=env)


def actions(out: str) -> list[tuple[str, str]]:
    """The report lines ('  VERB  WHAT') before the state block, as (verb, what)."""
    body = out.split(">>> state (from systemd):")[0]
    return [(line[2:15].strip(), line[16:]) for line in body.splitlines()
            if line.startswith("  ") and not line.startswith("    ")]


def printed_state(out: str) -> dict[str, tuple[str, str, str]]:
    """The state block install.sh ends with: unit -> (load, enabled, active)."""
    block = out.split(">>> state (from systemd):")[1]
    res = {}
    for line in block.splitlines():
        if line.startswith("  ") and "load=" in line:
            unit, *kv = line.split()
            props = dict(x.split("=", 1) for x in kv)
            res[unit] = (props["load"], props["enabled"], props["active"])
    return res


def live_state(stack: Stack, units: list[str]) -> dict[str, tuple[str, str, str]]:
    def out(*args: str) -> str:
        return stack.c.systemctl(*args, check=False).stdout.strip() or "-"
    return {u: (out("show", "-p", "LoadState", "--value", u), out("is-enabled", u),
                out("is-active", u)) for u in units}


def all_units(stack: Stack) -> list[str]:
    return [stack.target, f"{stack.name}-pd-ready.service", *stack.units]


def reloads(stack: Stack) -> int:
    """How many daemon-reloads the container's systemd has done (it logs each one)."""
    out = stack.c.run(["journalctl", "-b", "_PID=1", "-o", "cat", "--no-pager"]).stdout
    return sum(1 for line in out.splitlines() if line.strip() == "Reloading.")


def sha_in(stack: Stack, path: str) -> str:
    return stack.c.run(["sha256sum", path]).stdout.split()[0]


def invocations(stack: Stack) -> dict[str, str]:
    return {u: stack.prop(u, "InvocationID") for u in stack.units}


class FreshStack(Stack):
    """A Stack that lists the container before the install Stack.up runs (the first one)."""

    def install(self, *args: str) -> subprocess.CompletedProcess[str]:
        if hasattr(self, "first"):
            return super().install(*args)
        self.before = snapshot(self)
        self.accounts = accounts(self)
        self.first = install(self, *args)
        assert self.first.returncode == 0, self.first.stdout + self.first.stderr
        return self.first


@pytest.fixture(scope="module")
def stack(serve_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshStack]:
    require(nspawn_available())
    s = FreshStack.up(tmp_path_factory.mktemp("e2e-install"), serve_python.parent.parent,
                      start=False)
    yield s
    s.down()


# --------------------------------------------------------------------------- install


def test_fresh_install_enables_the_target_and_starts_nothing(stack: FreshStack) -> None:
    out = stack.first.stdout
    acts = actions(out)
    for unit in all_units(stack):
        assert ("created", f"{UNIT_DIR}/{unit}") in acts, out
    for what in ("/opt/pdsvc/e2e/runtime/cli.py", "group sglang", "user sglang",
                 "/etc/e2e/", "/var/cache/e2e/jit/", "/var/lib/e2e/"):
        assert ("created", what) in acts, out
    assert ("enabled", f"{stack.target} (starts at boot)") in acts
    assert stack.c.systemctl("is-enabled", stack.target).stdout.strip() == "enabled"
    for unit in all_units(stack):
        assert stack.prop(unit, "ActiveState") == "inactive", unit
    assert stack.processes_of_user() == []
    # it ends with systemd's own answers, not with a success line of its own
    assert printed_state(out) == live_state(stack, all_units(stack))
    assert out.rstrip().splitlines()[-1] == (
        f">>> {stack.target} is not started: systemctl start {stack.target} "
        "(returns when the stack serves), or re-run with --start")
    assert "success" not in out.lower()


def test_start_flag_starts_the_stack_and_reports_its_real_state(stack: FreshStack) -> None:
    r = install(stack, "--start")
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.serves()
    state = printed_state(r.stdout)
    assert {active for _, _, active in state.values()} == {"active"}, r.stdout
    assert state == live_state(stack, all_units(stack))
    assert r.stdout.rstrip().splitlines()[-1] == f">>> {stack.target} is active"


def test_second_install_changes_nothing(stack: FreshStack) -> None:
    """State: installed and serving."""
    before, n_reloads, running = snapshot(stack), reloads(stack), invocations(stack)
    manifest = sha_in(stack, "/var/lib/pdsvc/e2e.manifest")
    r = install(stack)
    assert r.returncode == 0, r.stdout + r.stderr
    acts = actions(r.stdout)
    assert len(acts) >= 14 and {verb for verb, _ in acts} == {"unchanged"}, r.stdout
    assert ">>> nothing changed" in r.stdout
    assert "daemon-reload" not in r.stdout + r.stderr
    assert reloads(stack) == n_reloads
    for unit in all_units(stack):
        assert stack.prop(unit, "NeedDaemonReload") == "no", unit
    assert snapshot(stack) == before
    assert sha_in(stack, "/var/lib/pdsvc/e2e.manifest") == manifest
    assert invocations(stack) == running  # nothing restarted
    assert r.stderr == ""


def test_reinstall_keeps_the_admins_disable(stack: FreshStack) -> None:
    """ollama re-enables (and starts) its service on every update (#162, #1352); we don't."""
    stack.c.systemctl("disable", stack.target)
    try:
        r = install(stack)
        assert r.returncode == 0, r.stdout + r.stderr
        assert stack.c.systemctl("is-enabled", stack.target, check=False).stdout.strip() \
            == "disabled"
        assert ("kept", f"{stack.target} disabled (your choice: systemctl enable "
                f"{stack.target} to start it at boot)") in actions(r.stdout)
        assert printed_state(r.stdout)[stack.target][1] == "disabled"
    finally:
        stack.c.systemctl("enable", stack.target)


def test_unit_edited_in_place_is_refused_then_replaced_with_force(stack: FreshStack) -> None:
    """State: installed and serving."""
    unit = stack.unit("decode")
    path = f"{UNIT_DIR}/{unit}"
    restart = stack.plan["lifecycle"]["restart_secs"]
    stack.c.run(["sed", "-i", "s/^RestartSec=.*/RestartSec=77/", path])
    edited = stack.c.read_file(path)
    assert "\nRestartSec=77\n" in edited
    before, n_reloads = snapshot(stack), reloads(stack)

    r = install(stack)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"-RestartSec=77\n+RestartSec={restart}\n" in r.stderr  # the diff: yours -> bundle
    assert f"--- {path} (now)" in r.stderr
    assert f"systemctl edit {unit}" in r.stderr
    assert "Drop-ins (/etc/systemd/system/UNIT.d/*.conf" in r.stderr
    assert "--force" in r.stderr and "Nothing was changed" in r.stderr
    assert stack.c.read_file(path) == edited
    assert snapshot(stack) == before and reloads(stack) == n_reloads

    r = install(stack, "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"-RestartSec=77\n+RestartSec={restart}\n" in r.stderr  # shown before replacing
    assert ("updated", path) in actions(r.stdout)
    assert stack.c.run(["cmp", path, f"{BUNDLE}/{unit}"], check=False).returncode == 0
    assert reloads(stack) == n_reloads + 1
    assert stack.prop(unit, "NeedDaemonReload") == "no"
    assert stack.prop(unit, "RestartUSec") == f"{restart}s"
    assert (f">>> still running the previous definition: {unit}; apply with: "
            f"systemctl restart {stack.target}") in r.stdout


def test_admin_drop_in_survives_reinstall_and_stays_applied(stack: FreshStack) -> None:
    """State: installed and serving. Leaves the drop-in for the uninstall tests."""
    unit = stack.unit("decode")
    dropin = f"{UNIT_DIR}/{unit}.d/override.conf"
    stack.c.write_file(dropin, "[Service]\nEnvironment=PDSVC_E2E_ADMIN=from-drop-in\n")
    stack.c.daemon_reload()
    stat = ["stat", "-c", "%s %a %U:%G %Y %i", dropin]
    meta, digest = stack.c.run(stat).stdout, sha_in(stack, dropin)
    for args in ((), ("--force",)):
        r = install(stack, *args)
        assert r.returncode == 0, r.stdout + r.stderr
        assert {verb for verb, _ in actions(r.stdout)} == {"unchanged"}, r.stdout
        assert "override.conf" not in r.stdout + r.stderr
        assert stack.c.run(stat).stdout == meta and sha_in(stack, dropin) == digest
    assert dropin in stack.prop(unit, "DropInPaths")
    assert "PDSVC_E2E_ADMIN=from-drop-in" in stack.prop(unit, "Environment")
    # and the engine a restart starts has it
    stack.c.systemctl("restart", unit, timeout=120)
    environ = stack.c.run(["cat", f"/proc/{stack.engine_pid('decode')}/environ"]).stdout
    assert "PDSVC_E2E_ADMIN=from-drop-in" in environ.split("\0")
    stack.wait_serving(90)


def test_bundle_that_moved_a_file_leaves_no_stale_copy(stack: FreshStack) -> None:
    """A re-render with another runtime.libexec_dir: the old runtime and the directories
    install.sh made for it go; going back restores them. State: installed and serving."""
    cfg = yaml.safe_load((stack.work / "config.yaml").read_text())
    cfg["runtime"]["libexec_dir"] = "/opt/pdsvc-next"
    nxt = stack.work / "next"
    nxt.mkdir(exist_ok=True)
    nxt.chmod(0o755)
    (nxt / "config.yaml").write_text(yaml.safe_dump(cfg))
    render = subprocess.run(
        [sys.executable, "-m", "pdsvc.cli", "render", "-c", str(nxt / "config.yaml"), "--topology",
         str(stack.work / "topology.json"), "-o", str(nxt / "units")],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert render.returncode == 0, render.stderr
    running = invocations(stack)

    r = install(stack, bundle="/srv/e2e/next/units")
    assert r.returncode == 0, r.stdout + r.stderr
    acts = actions(r.stdout)
    assert ("removed", "/opt/pdsvc/e2e/runtime/cli.py (no longer in the bundle)") in acts
    assert ("removed", "/opt/pdsvc/e2e/") in acts and ("removed", "/opt/pdsvc/") in acts
    assert ("created", "/opt/pdsvc-next/e2e/runtime/cli.py") in acts
    for unit in stack.units:
        assert ("updated", f"{UNIT_DIR}/{unit}") in acts
    assert not stack.c.exists("/opt/pdsvc")
    manifest = stack.c.read_file("/var/lib/pdsvc/e2e.manifest")
    assert "/opt/pdsvc-next/e2e/runtime/cli.py" in manifest and "/opt/pdsvc/" not in manifest

    r = install(stack)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("removed", "/opt/pdsvc-next/") in actions(r.stdout)
    assert not stack.c.exists("/opt/pdsvc-next")
    assert stack.c.exists("/opt/pdsvc/e2e/runtime/cli.py")
    assert invocations(stack) == running and stack.serves()


def test_start_that_fails_is_not_reported_as_success(stack: FreshStack) -> None:
    """`systemctl start TARGET` exits 0 although a unit it Wants= failed (ollama #11980 is
    this class of false success): install.sh --start checks every unit. State: serving."""
    router = stack.unit("router")
    broken = f"{UNIT_DIR}/{router}.d"
    stack.c.systemctl("stop", router)
    stack.c.write_file(f"{broken}/pdsvc-e2e-broken.conf", "[Service]\nExecStartPre=/bin/false\n")
    stack.c.daemon_reload()
    try:
        r = install(stack, "--start")
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{stack.target} was started but {router} not active" in r.stderr
        assert printed_state(r.stdout)[router][2] != "active"
        assert printed_state(r.stdout)[stack.target][2] == "active"  # what systemctl believed
    finally:
        stack.c.run(["rm", "-rf", broken])
        stack.c.daemon_reload()
        stack.c.systemctl("reset-failed", router, check=False)
    stack.c.systemctl("start", router, timeout=120)
    stack.wait_serving(90)


# --------------------------------------------------------------------------- uninstall


def test_uninstall_removes_what_it_installed_and_keeps_user_data(stack: FreshStack) -> None:
    """State: serving, with the admin's drop-in. Leaves: as before the first install, plus
    the drop-in."""
    env = "/etc/e2e/e2e-router.env"
    stack.c.run(["sh", "-c", f"echo ROUTER_API_KEY=s3cret >> {env}"])  # as an editor would
    dropin_dir = f"{UNIT_DIR}/{stack.unit('decode')}.d"
    admin = {dropin_dir, f"{dropin_dir}/override.conf"}

    r = install(stack, "--uninstall")
    assert r.returncode == 0, r.stdout + r.stderr
    acts = actions(r.stdout)
    for unit in all_units(stack):
        assert ("removed", f"{UNIT_DIR}/{unit}") in acts
    assert ("kept", f"{env} (not empty: yours; --purge removes it)") in acts
    assert ("kept", "/var/cache/e2e/jit/ (not empty; --purge removes it)") in acts
    assert printed_state(r.stdout) == {u: ("not-found", "-", "inactive")
                                       for u in all_units(stack)}
    assert stack.processes_of_user() == []
    diff = changes(stack.before, snapshot(stack))
    assert diff["removed"] == [] and diff["changed"] == [], diff
    cache = [p for p in diff["added"] if p.startswith("/var/cache/e2e/jit/")]
    assert cache, "the JIT cache had the compile output of the earlier starts"
    assert set(diff["added"]) - set(cache) == admin | {
        "/etc/e2e", env,  # the admin's secret, in its directory
        "/var/cache/e2e", "/var/cache/e2e/jit",  # the JIT cache, which took minutes to fill
        "/var/lib/pdsvc", "/var/lib/pdsvc/e2e.manifest",  # lists what was kept, for --purge
    }, diff
    assert stack.c.read_file(env).endswith("ROUTER_API_KEY=s3cret\n")
    assert stack.c.run(["getent", "passwd", "sglang"], check=False).returncode == 0

    r = install(stack, "--uninstall", "--purge")
    assert r.returncode == 0, r.stdout + r.stderr
    acts = actions(r.stdout)
    assert ("removed", "user sglang") in acts and ("removed", "group sglang") in acts
    assert ("removed", env) in acts
    diff = changes(stack.before, snapshot(stack))
    assert diff == {"added": sorted(admin), "removed": [], "changed": []}, diff
    assert accounts(stack) == stack.accounts  # no user, group or membership left over
    assert stack.c.run(["getent", "passwd", "sglang"], check=False).returncode == 2


def test_install_that_fails_half_way_still_records_what_it_did(stack: FreshStack) -> None:
    """A file where install.sh needs a directory stops it after the units are in place: the
    manifest lists them all the same, so a re-run finishes the job (and enables the target,
    which the failed run never got to) and --uninstall takes everything away. State (before
    and after): nothing installed, the admin's drop-in only."""
    before = snapshot(stack)
    blocker = "/opt/pdsvc"  # runtime.libexec_dir; the runtime goes below it, last
    made_opt = "/opt" not in before
    stack.c.run(["sh", "-c", f"mkdir -p /opt && touch {blocker}"])
    try:
        r = install(stack)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "stopped half-way; /var/lib/pdsvc/e2e.manifest records what was done" in r.stderr
        manifest = stack.c.read_file("/var/lib/pdsvc/e2e.manifest")
        for unit in all_units(stack):
            assert f"file\t{UNIT_DIR}/{unit}\t" in manifest, manifest
        assert "user\tsglang\t-" in manifest and "dir\t/var/cache/e2e/jit\t-" in manifest
    finally:
        stack.c.run(["rm", "-f", blocker])
        if made_opt:
            stack.c.run(["rmdir", "/opt"])
    r = install(stack)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("enabled", f"{stack.target} (starts at boot)") in actions(r.stdout)
    r = install(stack, "--uninstall", "--purge")
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(stack) == before
    assert stack.prop(stack.target, "LoadState") == "not-found"


def test_dry_run_changes_nothing_and_prints_every_action(stack: FreshStack) -> None:
    """State: nothing installed (the admin's drop-in only). Leaves: installed and serving."""
    before, accts = snapshot(stack), accounts(stack)
    r = install(stack, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(stack) == before and accounts(stack) == accts
    out = r.stdout
    assert "(dry run: nothing changes)" in out
    assert {verb for verb, _ in actions(out)} == {"would create", "would update", "would enable"}
    # accounts, directories and env files: systemd's own tools where the host has them (this
    # container has), else useradd/install/chown; either way each item is reported
    if stack.c.run(["sh", "-c", "command -v systemd-sysusers"], check=False).returncode == 0:
        made = [f"systemd-sysusers {BUNDLE}/sysusers.d/e2e.conf",
                f"systemd-tmpfiles --create {BUNDLE}/tmpfiles.d/e2e.conf"]
    else:
        made = ["groupadd --system sglang",
                "useradd --system --gid sglang --home-dir /var/lib/e2e",
                "install -d -m 0750 /etc/e2e", "chown root:sglang /etc/e2e",
                "install -d -m 0750 /var/cache/e2e/jit", "chown sglang:sglang /var/cache/e2e/jit",
                "install -m 0640 /dev/null /etc/e2e/e2e-router.env"]
    for what in ("group sglang", "user sglang", "/etc/e2e/", "/var/cache/e2e/jit/",
                 "/etc/e2e/e2e-router.env (empty: put secrets such as API keys here)"):
        assert ("would create", what) in actions(out), (what, out)
    for action in [
        *made, "usermod -a -G video sglang",
        *(f"install -m 0644 {BUNDLE}/{u} {UNIT_DIR}/{u}" for u in all_units(stack)),
        f"install -m 0644 {BUNDLE}/runtime/cli.py /opt/pdsvc/e2e/runtime/cli.py",
        "systemctl daemon-reload", f"systemctl enable --quiet {stack.target}",
    ]:
        assert f"    would run: {action}" in out, (action, out)
    assert "    would write: /var/lib/pdsvc/e2e.manifest" in out

    r = install(stack, "--start")
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.serves()
    before, accts, running = snapshot(stack), accounts(stack), invocations(stack)
    for args in (["--uninstall", "--dry-run"], ["--uninstall", "--purge", "--dry-run"]):
        r = install(stack, *args)
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout
        assert f"    would run: systemctl stop {' '.join(all_units(stack))}" in out
        assert f"    would run: systemctl disable --quiet {' '.join(all_units(stack))}" in out
        for unit in all_units(stack):
            assert f"    would run: rm -f {UNIT_DIR}/{unit}" in out
        assert "    would run: rm -f /opt/pdsvc/e2e/runtime/cli.py" in out
        if "--purge" in args:
            for action in ["rm -rf /var/cache/e2e/jit", "userdel sglang", "groupdel sglang"]:
                assert f"    would run: {action}" in out, (action, out)
        else:
            assert ("kept", "/var/cache/e2e/jit/ (not empty; --purge removes it)") in actions(out)
        assert snapshot(stack) == before and accounts(stack) == accts
    assert invocations(stack) == running and stack.serves()


# --------------------------------------------------------------------------- refusals


def test_refusals_change_nothing(stack: FreshStack) -> None:
    """Not root, no bundle, a bundle older than its config, bad usage. State: serving."""
    before, n_reloads = snapshot(stack), reloads(stack)

    r = install(stack, user=True)
    assert r.returncode == 1 and r.stdout == ""
    assert "must run as root (sudo ./install.sh)" in r.stderr

    r = install(stack, bundle="/srv/e2e/no-such-bundle")
    assert r.returncode == 1 and r.stdout == ""
    assert "/srv/e2e/no-such-bundle/install.list not found: run `pdsvc render` first" in r.stderr

    config = stack.work / "config.yaml"  # /srv/e2e/config.yaml inside, bound read-only
    text = config.read_text()
    config.write_text(text + "# edited after the render\n")
    try:
        r = install(stack)
        assert r.returncode == 1, r.stdout + r.stderr
        assert ("/srv/e2e/config.yaml changed since the bundle in /srv/e2e/units was rendered "
                "from it") in r.stderr
        assert "run `pdsvc render` first" in r.stderr
        assert "installing" not in r.stdout
    finally:
        config.write_text(text)

    for args in (["--purge"], ["--uninstall", "--start"], ["--bogus"]):
        r = install(stack, *args)
        assert r.returncode == 2 and "see --help" in r.stderr, (args, r.stderr)
    assert snapshot(stack) == before and reloads(stack) == n_reloads
    assert stack.serves()


def test_destdir_stages_files_without_systemctl_useradd_or_root(stack: FreshStack) -> None:
    """Packaging: as nobody, with systemctl/useradd/... on PATH replaced by stubs that log and
    fail. State: serving, and stays so."""
    stubs, stage = "/tmp/pdsvc-stubs", "/tmp/pdsvc-stage"
    tools = "systemctl useradd groupadd usermod userdel groupdel gpasswd chown"
    stack.c.run(
        f"set -e; rm -rf {stubs} {stage}; mkdir -p {stubs}; : > {stubs}/calls; "
        f"chmod 666 {stubs}/calls; install -d -o 65534 -g 65534 {stage}; "
        f"for t in {tools}; do printf '#!/bin/sh\\necho \"$0 $*\" >> {stubs}/calls\\nexit 1\\n'"
        f" > {stubs}/$t; chmod 755 {stubs}/$t; done")
    env = {"DESTDIR": stage, "PATH": f"{stubs}:{CONTAINER_ENV['PATH']}"}
    before, n_reloads = snapshot(stack), reloads(stack)
    units_dir = "/usr/lib/systemd/system"  # where a package puts them

    r = install(stack, "--unit-dir", units_dir, user=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.c.read_file(f"{stubs}/calls") == ""
    assert ("skipped", "user sglang, group sglang (DESTDIR: create them in the package's "
            "postinst)") in actions(r.stdout)
    staged = stack.c.run(["find", stage, "-printf", "%y %m %P\n"]).stdout.splitlines()
    expected = {f"f 644 usr/lib/systemd/system/{u}" for u in all_units(stack)} | {
        *(f"f 644 opt/pdsvc/e2e/runtime/{name}" for name, _ in runtime_modules()),
        "f 640 etc/e2e/router.key",  # the control-plane key, made once
        "d 750 etc/e2e", "d 750 var/cache/e2e/jit",
        "d 750 var/lib/e2e", "f 644 var/lib/pdsvc/e2e.manifest",
        *(f"f 640 etc/e2e/e2e-{r}.env" for r in ("prefill", "decode", "router")),
    }
    assert expected <= set(staged), staged
    assert {line.split()[0] for line in set(staged) - expected} == {"d"}, staged  # parents
    for unit in all_units(stack):
        assert stack.c.run(["cmp", f"{stage}{units_dir}/{unit}", f"{BUNDLE}/{unit}"],
                           check=False).returncode == 0
    manifest = stack.c.read_file(f"{stage}/var/lib/pdsvc/e2e.manifest")
    assert f"file\t{units_dir}/{stack.target}\t" in manifest and stage not in manifest

    r = install(stack, "--unit-dir", units_dir, user=True, env=env)  # idempotent there too
    assert r.returncode == 0, r.stdout + r.stderr
    assert {verb for verb, _ in actions(r.stdout)} == {"skipped", "unchanged"}, r.stdout
    r = install(stack, "--uninstall", user=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stack.c.run(["find", stage, "-mindepth", "1"]).stdout == ""
    assert stack.c.read_file(f"{stubs}/calls") == ""
    assert snapshot(stack) == before and reloads(stack) == n_reloads
    assert stack.serves()


def test_refuses_where_systemd_is_not_pid_1(tmp_path: Path) -> None:
    """On this machine itself, whose PID 1 is not systemd (a systemd host hides its
    /run/systemd in a private mount namespace). --dry-run refuses too: a dry run that
    passes where the real run would refuse is a false success; DESTDIR needs no systemd."""
    if os.geteuid() != 0:
        pytest.skip("install.sh refuses non-root before it looks at systemd")
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(e2e_config("e2e", Path("/opt/venv"), "/srv/e2e/model")))
    (tmp_path / "topology.json").write_text(json.dumps(host_topology()))
    render = subprocess.run(
        [sys.executable, "-m", "pdsvc.cli", "render", "-c", str(tmp_path / "config.yaml"),
         "--topology", str(tmp_path / "topology.json"), "-o", str(tmp_path / "units")],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert render.returncode == 0, render.stderr
    hide = []
    if Path("/run/systemd/system").is_dir():
        hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs tmpfs /run/systemd && exec "$@"', "sh"]
    cmd = [*hide, "bash", INSTALL_SH, "--bundle", str(tmp_path / "units")]

    r = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert "systemd is not PID 1 here (no /run/systemd/system)" in r.stderr
    assert "DESTDIR=DIR" in r.stderr

    stage = tmp_path / "stage"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DESTDIR": str(stage)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (stage / "etc/systemd/system/e2e-pd.target").read_bytes() == \
        (tmp_path / "units/e2e-pd.target").read_bytes()
    assert (stage / "opt/pdsvc/e2e/runtime/cli.py").read_bytes() == \
        (tmp_path / "units/runtime/cli.py").read_bytes()
