"""The service user and group, and the directories and env files the units need, created
systemd's own way where the host has it: the bundle's sysusers.d file applied with
`systemd-sysusers`, its tmpfiles.d file with `systemd-tmpfiles --create` (sysusers.d(5),
tmpfiles.d(5)). Where it has not (or under DESTDIR, which stages files for a package and
creates no account), groupadd/useradd and mkdir/chown do the same from the same rendered data.
Either way the installer records only what was not there before."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from .host import Host, group_exists, in_group, owner_of, user_exists
from .listfile import Bundle, Item
from .manifest import Manifest

#: Mode of a missing ancestor the installer creates on the way (as `install -d`, mkdir -p).
PARENT_MODE = "0755"


def sysusers_line(bundle: Bundle) -> list[str]:
    """The `u` line of the bundle's sysusers.d file, as fields: u NAME ID GECOS HOME SHELL
    (unquoted as sysusers.d(5) reads them; `%%` is one `%`)."""
    text = (bundle.dir / bundle.sysusers).read_text(encoding="utf-8")
    for line in text.splitlines():
        words = [w.replace("%%", "%") for w in shlex.split(line, comments=True)]
        if words[:1] == ["u"] and len(words) >= 6:
            return words
    raise ValueError(f"{bundle.dir / bundle.sysusers}: no `u` line")


def ensure_accounts(host: Host, b: Bundle, new: Manifest, old: Manifest) -> None:
    """The service user and group; then the groups the GPU device nodes belong to on many
    distributions (install.list's `member` lines), joined where the host has them. A
    membership is recorded only for a user that was there before: userdel takes the others."""
    if host.dest:
        host.report("skipped", f"user {b.user}, group {b.group} (DESTDIR: create them in the "
                    "package's postinst)")
        return
    had_group, had_user = group_exists(b.group), user_exists(b.user)
    if not (had_group and had_user):
        if b.sysusers and shutil.which("systemd-sysusers"):
            host.run("systemd-sysusers", os.path.abspath(b.dir / b.sysusers))
        else:
            _, name, _, gecos, home, shell = sysusers_line(b)[:6]
            if not had_group:
                host.run("groupadd", "--system", b.group)
            if not had_user:
                host.run("useradd", "--system", "--gid", b.group, "--home-dir", home,
                         "--no-create-home", "--shell", shell, "--comment", gecos, name)
    for kind, name, had in (("group", b.group, had_group), ("user", b.user, had_user)):
        if had:
            host.report("unchanged", f"{kind} {name}")
        else:
            host.report("created", f"{kind} {name}", change=True)
            new.add(kind, name)
    created = new.info("user", b.user) is not None or old.info("user", b.user) is not None
    for g in b.members:
        if not group_exists(g) or in_group(b.user, g):
            continue
        host.run("usermod", "-a", "-G", g, b.user)
        host.report("updated", f"user {b.user}: + group {g}", change=True)
        if not created:
            new.add("member", b.user, g)


def make_parents(host: Host, d: Path, new: Manifest, made: set[Path]) -> None:
    """Create `d`'s missing ancestors (and `d`) with PARENT_MODE, recording each."""
    missing: list[Path] = []
    stop = Path(host.dest or "/")
    while d != stop and d != d.parent and not d.is_dir():
        missing.insert(0, d)
        d = d.parent
    for m in missing:
        if m in made:
            continue
        made.add(m)
        host.mkdir(m, PARENT_MODE)
        host.report("created", f"{m}/", change=True)
        new.add("parent", str(m)[len(host.dest):])


def _want(item: Item, dest: str) -> tuple[str, str]:
    """(mode as stat prints it, owner or '-') that a directory should have."""
    return f"{int(item.mode, 8):o}", "-" if dest else item.owner


def ensure_dirs(host: Host, b: Bundle, new: Manifest, old: Manifest, made: set[Path]) -> None:
    """install.list's directories and (empty) env files: created, or a directory's mode and
    owner set back where they drifted; an env file there already is the admin's, untouched."""
    tmpfiles = bool(not host.dest and b.tmpfiles and shutil.which("systemd-tmpfiles"))
    apply = False  # whether systemd-tmpfiles has anything to do
    for item in b.dirs:
        d = host.at(item.dest)
        mode, owner = _want(item, host.dest)
        want = f"{mode} {owner}" if owner != "-" else mode
        if d.is_dir():
            have = f"{d.stat().st_mode & 0o7777:o}"
            if owner != "-":
                have += f" {owner_of(d)}"
            if have == want:
                host.report("unchanged", f"{d}/")
            else:
                if not tmpfiles:
                    host.chmod(d, item.mode)
                    if owner != "-":
                        host.chown(d, owner)
                host.report("updated", f"{d}/ (was {have}, now {want})", change=True)
                apply = True
            if old.info("dir", item.dest) is not None:
                new.add("dir", item.dest)
            continue
        make_parents(host, d.parent, new, made)
        if not tmpfiles:
            host.mkdir(d, item.mode)
            if owner != "-":
                host.chown(d, owner)
        made.add(d)
        host.report("created", f"{d}/", change=True)
        apply = True
        new.add("dir", item.dest)
    keep: list[str] = []
    for item in b.envfiles:
        d = host.at(item.dest)
        if d.exists() and d.stat().st_size:
            host.report("kept", f"{d} (yours: never overwritten)")
            keep.append(item.dest)
        elif d.exists():
            host.report("unchanged", f"{d} (empty: put secrets such as API keys here)")
            keep.append(item.dest)
        else:
            make_parents(host, d.parent, new, made)
            if not tmpfiles:
                host.empty_file(d, item.mode, item.owner)
            host.report("created", f"{d} (empty: put secrets such as API keys here)",
                        change=True)
            apply = True
            new.add("envfile", item.dest, "empty")
    if tmpfiles and apply:
        host.run("systemd-tmpfiles", "--create", *(f"--exclude-prefix={p}" for p in keep),
                 os.path.abspath(b.dir / b.tmpfiles))
