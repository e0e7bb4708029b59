"""--uninstall: stop and disable the stack, remove exactly what the manifest lists. The JIT
cache, the state directory, env files the admin filled and the service user stay (listed in
a manifest of what was kept) unless --purge."""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import Refused
from .host import Host, group_exists, in_group, user_exists
from .install import empty_after, remove_dir_if_empty
from .listfile import Bundle
from .manifest import Manifest, depth, edited, sha256_file, unified, write_atomically
from .progress import show_state


def uninstall(h: Host, b: Bundle, old: Manifest, *, purge: bool, force: bool) -> int:
    manifest = h.at(b.manifest)
    if not manifest.is_file():
        raise Refused(f"no manifest at {manifest}: nothing was installed by install.sh for "
                      f"{b.name}")
    h.status(f"uninstalling {b.name} (manifest {manifest})"
             f"{' (dry run: nothing changes)' if h.dry else ''}")
    units: list[str] = []
    changed: list[str] = []
    for _, p, info in old.of("file"):
        d = h.at(p)
        if str(Path(p).parent) == old.unit_dir:
            units.append(d.name)
        if edited(d, info):
            changed.append(str(d))
            shipped = b.dir / d.name
            if shipped.is_file() and sha256_file(shipped) == info:
                sys.stderr.write(unified(shipped.read_text(errors="replace"),
                                         d.read_text(errors="replace"),
                                         f"{d} (as installed)", f"{d} (now)"))
    if changed:
        if not force:
            raise Refused(f"refusing to uninstall: edited in place since install: "
                          f"{' '.join(changed)}\n  Nothing was changed. Move your change to a "
                          "drop-in, or re-run with --force to delete them.")
        h.warn(f"--force: deleting what was edited in place: {' '.join(changed)}")
    if not h.dest and units:
        # naming the services makes systemctl wait for their stop jobs (the target stops first)
        if not h.run("systemctl", "stop", *units, check=False):
            h.warn(f"could not stop {' '.join(units)}")
        if not h.run("systemctl", "disable", "--quiet", *units, check=False):
            h.warn(f"could not disable {' '.join(units)}")
    try:
        kept = _remove(h, old, manifest, purge=purge)
    except Exception as e:
        if h.dry:
            raise
        write_atomically(manifest, _restored(b, old))
        print(f"install.sh: error: {e}\ninstall.sh: error: uninstall stopped half-way; "
              f"{manifest} is restored", file=sys.stderr)
        return 1
    if kept.entries:
        kept.target, kept.unit_dir = old.target, old.unit_dir
        if h.dry:
            h.would(str(manifest), "write")
        else:
            write_atomically(manifest, kept.format(
                b.name, "what --uninstall kept; --uninstall --purge removes it"))
        h.report("kept", f"{manifest} (lists what was kept)")
    else:
        h.report("removed", str(manifest))
    if not h.dest and units:
        h.run("systemctl", "daemon-reload")
        h.run("systemctl", "reset-failed", *units, check=False, quiet=True)
        if not h.json:
            show_state(units, h.status)
    return 0


def _restored(b: Bundle, old: Manifest) -> str:
    return old.format(b.name, "an uninstall that FAILED; re-run it")


def _remove(h: Host, old: Manifest, manifest: Path, *, purge: bool) -> Manifest:
    """Remove what the manifest lists; return what stays recorded."""
    gone: set[Path] = set()
    kept = Manifest()
    keep_accounts = not purge or bool(h.dest)
    _remove_files(h, old, kept, gone, purge=purge)
    # the manifest goes now, so that its directory does not keep parents alive; what is kept
    # is written back at the end
    h.remove(manifest)
    gone.add(manifest)
    if empty_after(manifest.parent, gone) and h.rmdir(manifest.parent):
        gone.add(manifest.parent)
    _remove_dirs(h, old, kept, gone, purge=purge)
    deleted = _remove_users(h, old, kept, keep=keep_accounts)
    _remove_groups(h, old, kept, deleted, keep=keep_accounts)
    return kept


def _remove_files(h: Host, old: Manifest, kept: Manifest, gone: set[Path], *,
                  purge: bool) -> None:
    """The manifest's files and secrets; an env file only when empty (or with ``purge``)."""
    for kind, p, info in old.entries:
        d = h.at(p)
        if kind == "file" and not (d.exists() or d.is_symlink()):
            h.report("gone", str(d))
        elif kind in ("file", "secret") and (d.exists() or d.is_symlink()):
            # a secret was made (or copied) by the installer, never the admin's: it goes too
            h.remove(d)
            gone.add(d)
            h.report("removed", str(d))
        elif kind == "envfile" and d.exists():
            if purge or not d.stat().st_size:
                h.remove(d)
                gone.add(d)
                h.report("removed", str(d))
            else:
                h.report("kept", f"{d} (not empty: yours; --purge removes it)")
                kept.add(kind, p, info)


def _remove_dirs(h: Host, old: Manifest, kept: Manifest, gone: set[Path], *,
                 purge: bool) -> None:
    """The manifest's directories, deepest first: each when empty, a data directory with all
    in it with ``purge``."""
    for kind, p, info in sorted(old.of("dir", "parent"), key=lambda e: -depth(e[1])):
        d = h.at(p)
        if not d.is_dir():
            continue
        if kind == "dir" and purge:
            h.remove_tree(d)
            gone.add(d)
            h.report("removed", f"{d}/ (and all in it)")
        elif not remove_dir_if_empty(h, d, "not empty; --purge removes it" if kind == "dir"
                                     else "not empty", gone):
            kept.add(kind, p, info)


def _remove_users(h: Host, old: Manifest, kept: Manifest, *, keep: bool) -> list[str]:
    """The users the installer made (unless ``keep``); the names deleted."""
    deleted: list[str] = []
    for _, p, info in old.of("user"):  # users before groups: a primary group goes last
        if keep:
            h.report("kept", f"user {p} (owns what is kept; --purge removes it)")
            kept.add("user", p, info)
        elif not user_exists(p):
            h.report("gone", f"user {p}")
        else:
            h.run("userdel", p)
            deleted.append(p)
            h.report("removed", f"user {p}")
    return deleted


def _remove_groups(h: Host, old: Manifest, kept: Manifest, deleted: list[str], *,
                   keep: bool) -> None:
    """The groups the installer made and the memberships it added (unless ``keep``); a
    deleted user's memberships went with it."""
    for kind, p, info in old.of("member", "group"):
        if keep:
            if kind == "group":
                h.report("kept", f"group {p} (--purge removes it)")
            kept.add(kind, p, info)
        elif kind == "member":
            if p not in deleted and in_group(p, info):
                h.run("gpasswd", "-d", p, info, quiet=True)
                h.report("removed", f"user {p}: - group {info}")
        elif not group_exists(p):
            h.report("gone", f"group {p}")
        elif h.run("groupdel", p, check=False):
            h.report("removed", f"group {p}")
        else:
            h.warn(f"could not delete group {p}")
            kept.add(kind, p, info)
