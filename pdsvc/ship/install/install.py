"""Installing a bundle: refuse what was edited in place (before changing anything), then the
accounts, directories, env files and key, the units and the runtime, the removal of what an
earlier bundle installed and this one no longer has, the target's enablement, the manifest;
then, with --start, the start; last, systemd's own word on every unit."""

from __future__ import annotations

import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .accounts import ensure_accounts, ensure_dirs, make_parents
from .errors import Refused
from .host import Host, systemctl_value
from .listfile import Bundle
from .manifest import Manifest, depth, ownership, sha256_file, unified
from .progress import show_state, start_with_progress

#: A control-plane key as the router takes it: a Bearer token (RFC 6750 section 2.1, b64token:
#: no space, no ':', which would split the router's --control-plane-api-keys ID:NAME:ROLE:KEY).
KEY_RE = re.compile(r"[A-Za-z0-9._~+/-]{16,}=*")
_ENABLED = {"enabled", "enabled-runtime", "linked", "linked-runtime", "alias", "static",
            "indirect", "generated"}


@dataclass
class Run:
    """One install: what it was asked, and what it has done so far (the new manifest)."""

    host: Host
    bundle: Bundle
    shown: str  # the bundle directory as the user named it
    unit_dir: str
    old: Manifest
    force: bool = False
    start: bool = False
    key: str = ""  # --key-from's key, checked (never printed)
    key_from: str = ""
    script: str = "install.sh"  # how the user ran the installer, for the commands it prints
    new: Manifest = field(default_factory=Manifest)
    made: set[Path] = field(default_factory=set)
    gone: set[Path] = field(default_factory=set)
    changed_units: list[str] = field(default_factory=list)
    units_changed: bool = False
    key_changed: bool = False

    def pairs(self) -> list[tuple[Path, Path, str, bool]]:
        """(source in the bundle, destination, mode, is a unit) of every file it installs."""
        b = self.bundle
        return ([(b.dir / u.src, self.host.at(f"{self.unit_dir}/{u.dest}"), u.mode, True)
                 for u in b.units]
                + [(b.dir / f.src, self.host.at(f.dest), f.mode, False) for f in b.files])


def read_key(bundle: Bundle, key_from: str) -> str:
    """--key-from FILE, checked before anything changes: this host's units read the router's
    key and do not make it, and FILE holds one key as the router takes it."""
    how, path = bundle.secret_use()
    if how == "make":
        raise Refused(f"--key-from: the router runs on this host, so install.sh makes its "
                      f"control-plane key here ({path}) and the other hosts copy it from here; "
                      "run without --key-from")
    if how != "copy":
        raise Refused("--key-from: no unit of this host reads the router's control-plane key "
                      "(it runs no engine that registers with the router); run without "
                      "--key-from")
    try:
        with open(key_from, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        raise Refused(f"--key-from {key_from}: no such readable file") from None
    key = text[:-1] if text.endswith("\n") else text
    if text.count("\n") > 1 or not KEY_RE.fullmatch(key):
        raise Refused(f"--key-from {key_from} is not a control-plane key (one line of at least "
                      "16 letters, digits or -._~+/, as install.sh makes it on the router's "
                      f"host: 64 hex digits); copy {path} from "
                      f"{bundle.key_host or 'the router host'} again")
    return key


def preflight(r: Run) -> None:
    """A destination that differs from the bundle and from what the installer last wrote there
    was edited in place (or is someone else's): show the diff and refuse, all at once, unless
    --force."""
    conflicts: list[str] = []
    hints: list[str] = []
    for src, dest, _, _ in r.pairs():
        if not src.is_file():
            raise Refused(f"{src} missing from the bundle: run `pdsvc render` again")
        recorded = r.old.info("file", str(dest)[len(r.host.dest):])
        if ownership(dest, src.read_bytes(), recorded) != "edited":
            continue
        conflicts.append(str(dest))
        if dest.is_file():
            sys.stderr.write(unified(dest.read_text(encoding="utf-8", errors="replace"),
                                     src.read_text(encoding="utf-8", errors="replace"),
                                     f"{dest} (now)", f"{src} (bundle)"))
        if dest.name.endswith((".service", ".target")):
            hints.append(f"  {dest}: keep your change in a drop-in instead: systemctl edit "
                         f"{dest.name}")
        else:
            hints.append(f"  {dest}: a copy of the bundle's {src.name}; change that in pdsvc "
                         "and re-render")
    if not conflicts:
        return
    if r.force:
        r.host.warn(f"--force: replacing what was edited in place (diff above): "
                    f"{' '.join(conflicts)}")
        return
    name = r.bundle.name
    raise Refused("\n".join([
        "refusing to overwrite what was edited in place (not what install.sh last wrote; the "
        "diff above is what you would lose). Nothing was changed.", *hints,
        f"  Drop-ins (/etc/systemd/system/UNIT.d/*.conf, or {name}-.service.d/ for every "
        f"{name} unit) are never touched.", "  Or re-run with --force to replace them."]))


def install_file(r: Run, src: Path, dest: Path, mode: str) -> bool:
    """created / unchanged / updated (preflight refused edits already); True when it changed."""
    h = r.host
    if not dest.exists() and not dest.is_symlink():
        make_parents(h, dest.parent, r.new, r.made)
        h.install_file(src, dest, mode)
        verb = "created"
    elif not dest.is_symlink() and dest.read_bytes() == src.read_bytes():
        h.report("unchanged", str(dest))
        verb = ""
    else:
        if dest.is_symlink():
            h.remove(dest)
        h.install_file(src, dest, mode)
        verb = "updated"
    if verb:
        h.report(verb, str(dest), change=True)
    r.new.add("file", str(dest)[len(h.dest):], sha256_file(src))
    return bool(verb)


def ensure_secret(r: Run) -> None:
    """The router's control-plane key (its /workers API), which the engines' runtimes use to
    register. make (the router's host): a random key, made once and never shown. copy (an
    engine host of several): the router host's key, which the admin copies here (--key-from);
    said, never invented (a key of this host's own would be refused)."""
    h, b = r.host, r.bundle
    for s in b.secrets:
        d = h.at(s.dest)
        if s.how == "copy":
            _copied_key(r, s.dest, d, s.mode, s.owner)
            continue
        if d.exists() and d.stat().st_size:
            if r.old.info("secret", s.dest) is not None:
                h.report("unchanged", f"{d} (the control-plane key)")
                r.new.add("secret", s.dest, "generated")
            else:
                h.report("kept", f"{d} (yours: never overwritten)")
            continue
        make_parents(h, d.parent, r.new, r.made)
        if h.dry:
            h.would(f"32 random bytes (hex) to {d} ({s.owner} {s.mode})", "write")
        else:
            h.write_private(d, secrets.token_hex(32), s.mode, s.owner)
        h.report("created", f"{d} (a new control-plane key; never printed)", change=True)
        r.new.add("secret", s.dest, "generated")


def _copied_key(r: Run, path: str, d: Path, mode: str, owner: str) -> None:
    h, b = r.host, r.bundle
    if r.key:
        if d.is_file() and d.read_text(errors="replace").rstrip("\n") == r.key:
            h.report("unchanged", f"{d} (the router host's key)")
        else:
            verb = "updated" if d.exists() else "created"
            make_parents(h, d.parent, r.new, r.made)
            if h.dry:
                h.would(f"the key from {r.key_from} to {d} ({owner} {mode})", "write")
            else:
                h.write_private(d, r.key + "\n", mode, owner)
            h.report(verb, f"{d} (the router host's key, from {r.key_from})", change=True)
            r.key_changed = True
        r.new.add("secret", path, "copied")
    elif d.exists() and d.stat().st_size:
        h.report("kept", f"{d} (the router host's key, as copied; replace it with --key-from "
                 "FILE)")
        if r.old.info("secret", path) is not None:
            r.new.add("secret", path, "copied")
    else:
        h.warn(f"{d} is missing: the engines here cannot register with the router without the "
               f"router's control-plane key, made on {b.key_host or 'the router host'}. Copy it "
               f"and install with it: scp root@{b.key_address or 'ROUTER_HOST'}:{path} "
               f"router.key && sudo {r.script} --bundle {r.shown} --key-from router.key && rm "
               "router.key")


def empty_after(d: Path, gone: set[Path]) -> bool:
    """`d` is empty — or, in a dry run, would be once what this run removes is gone."""
    try:
        return all(p in gone for p in d.iterdir())
    except OSError:
        return True


def remove_dir_if_empty(h: Host, d: Path, why_kept: str, gone: set[Path]) -> bool:
    """rmdir when (it would be) empty; else report it kept and say False."""
    if empty_after(d, gone) and h.rmdir(d):
        gone.add(d)
        h.report("removed", f"{d}/")
        return True
    h.report("kept", f"{d}/ ({why_kept})")
    return False


def clean_stale(r: Run) -> None:
    """What the previous manifest lists and this bundle no longer has (runtime.libexec_dir or
    runtime.jit_cache changed, say): removed if unmodified / empty, else kept recorded.
    Accounts, env files and parent directories of earlier installs stay recorded."""
    h, stale_seen, parents = r.host, False, []
    for kind, p, info in r.old.entries:
        if r.new.info(kind, p) is not None:
            continue
        d = h.at(p)
        if kind in ("user", "group", "member", "enabled"):
            r.new.add(kind, p, info)
        elif kind in ("envfile", "secret"):
            if d.exists():
                r.new.add(kind, p, info)
        elif kind == "parent":
            parents.append((kind, p, info))
        elif kind == "file" and (d.exists() or d.is_symlink()):
            if d.is_file() and sha256_file(d) != info:
                h.warn(f"{d} is no longer in the bundle but was edited in place: kept")
                r.new.add(kind, p, info)
                continue
            if not h.dest and str(Path(p).parent) == r.old.unit_dir:
                h.run("systemctl", "disable", "--now", "--quiet", d.name, check=False)
                r.units_changed = True
            h.remove(d)
            r.gone.add(d)
            stale_seen = True
            h.report("removed", f"{d} (no longer in the bundle)", change=True)
        elif kind == "dir" and d.is_dir():
            stale_seen = True
            if remove_dir_if_empty(h, d, "no longer in the bundle; --uninstall --purge removes "
                                   "it", r.gone):
                h.changed = True
            else:
                r.new.add(kind, p, info)
    for kind, p, info in sorted(parents, key=lambda e: -depth(e[1])):
        d = h.at(p)
        if not d.is_dir():
            continue
        if stale_seen and empty_after(d, r.gone) and remove_dir_if_empty(h, d, "not empty",
                                                                          r.gone):
            continue
        r.new.add(kind, p, info)


def write_manifest(r: Run, title: str, manifest: Manifest | None = None) -> None:
    from .manifest import write_atomically

    m = manifest or r.new
    m.target, m.unit_dir = r.bundle.target, r.unit_dir or r.old.unit_dir
    path = r.host.at(r.bundle.manifest)
    if r.host.dry:
        r.host.would(str(path), "write")
        return
    write_atomically(path, m.format(r.bundle.name, title))


def record_failure(r: Run) -> None:
    """An install that stopped half-way records what it did (and what the old manifest had),
    so that a re-run or --uninstall still knows what is ours."""
    for e in r.old.entries:
        r.new.add(*e)
    write_manifest(r, "a FAILED install; re-run install.sh, or --uninstall")
    print(f"install.sh: error: stopped half-way; {r.host.at(r.bundle.manifest)} records what "
          "was done", file=sys.stderr)


def install(r: Run) -> int:
    """The install itself, after the refusals; the exit status."""
    h, b = r.host, r.bundle
    first = r.old.info("enabled", b.target) is None
    h.status(f"installing {b.name} from {r.shown}{' (dry run: nothing changes)' if h.dry else ''}")
    preflight(r)
    try:
        if h.dest and not Path(h.dest).is_dir():
            h.run("mkdir", "-p", h.dest)
        ensure_accounts(h, b, r.new, r.old)
        ensure_dirs(h, b, r.new, r.old, r.made)
        ensure_secret(r)
        for src, dest, mode, unit in r.pairs():
            if install_file(r, src, dest, mode) and unit:
                r.units_changed = True
                r.changed_units.append(dest.name)
        clean_stale(r)
        if h.dest:
            write_manifest(r, "what install.sh created; --uninstall removes it")
            h.status(f"staged under DESTDIR={h.dest}; the package enables {b.target} "
                     f"(systemctl enable {b.target})")
            return 0
        _enable(r, first)
        write_manifest(r, "what install.sh created; --uninstall removes it")
    except Exception as e:
        if h.dry:
            raise
        print(f"install.sh: error: {e}", file=sys.stderr)
        record_failure(r)
        return 1
    return _finish(r)


def _enable(r: Run, first: bool) -> None:
    h, b = r.host, r.bundle
    units = b.unit_names
    if r.units_changed or any(systemctl_value("show", "-p", "NeedDaemonReload", "--value", u)
                              == "yes" for u in units):
        h.run("systemctl", "daemon-reload")
    enabled = systemctl_value("is-enabled", b.target)
    if enabled in _ENABLED:
        h.report("unchanged", f"{b.target} {enabled} (starts at boot)")
        r.new.add("enabled", b.target)
    elif enabled in ("masked", "masked-runtime"):
        h.report("kept", f"{b.target} {enabled} (yours: systemctl unmask {b.target} to use it)")
    elif first:
        h.run("systemctl", "enable", "--quiet", b.target)
        h.report("enabled", f"{b.target} (starts at boot)", change=True)
        r.new.add("enabled", b.target)
    else:
        h.report("kept", f"{b.target} {enabled or 'disabled'} (your choice: systemctl enable "
                 f"{b.target} to start it at boot)")


def _finish(r: Run) -> int:
    """--start, then systemd's state, and what it means; 1 when --start left a unit down."""
    h, b = r.host, r.bundle
    units, target = b.unit_names, b.target
    if r.start:
        h.status(f"starting {target} (returns when the stack serves; follow: journalctl -f -u "
                 f"'{b.name}-*')")
        if h.dry:
            h.run("systemctl", "start", target)
        else:
            start_with_progress(target, units)
    if not h.changed:
        h.status("nothing changed")
    if h.json:
        return 0
    show_state(units, h.status)
    if h.dry:
        return 0
    inactive = [u for u in units if systemctl_value("is-active", u) != "active"]
    running_old = [u for u in r.changed_units if systemctl_value("is-active", u) == "active"]
    if running_old:
        h.status(f"still running the previous definition: {' '.join(running_old)}; apply with: "
                 f"systemctl restart {target}")
    elif r.key_changed and len(inactive) < len(units):
        h.status(f"the engines read the key when they start: systemctl restart {target}")
    if r.start and inactive:
        raise Refused(f"{target} was started but {' '.join(inactive)} not active (see above): "
                      f"systemctl status '{b.name}-*'; journalctl -u {inactive[0]}")
    if not inactive:
        h.status(f"{target} is active")
    elif systemctl_value("is-active", target) != "active":
        h.status(f"{target} is not started: systemctl start {target} (returns when the stack "
                 "serves), or re-run with --start")
    else:
        h.status(f"{target} is active but not {' '.join(inactive)}: systemctl status "
                 f"{inactive[0]}")
    return 0
