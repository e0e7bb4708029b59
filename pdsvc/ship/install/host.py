"""The installer's hands and voice: every change to the host goes through `Host` (which under
--dry-run only says what it would do), every line it prints through its report methods, and
every question to systemd through `systemctl_value`/`journal_last`."""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

PROG = "install.sh"
#: The report's verbs that a dry run says as what it would do.
_WOULD = {"created": "would create", "updated": "would update", "removed": "would remove",
          "enabled": "would enable"}


class Host:
    """The machine (or, with `dest`, the DESTDIR staging tree) the bundle goes onto.

    `dry`: print each command instead of running it (`    would run: CMD`). `json`: collect
    the report as records for a machine-readable dry run instead of printing it.
    """

    def __init__(self, *, dry: bool = False, dest: str = "", json: bool = False) -> None:
        self.dry = dry
        self.dest = dest
        self.json = json
        self.records: list[dict[str, str]] = []
        self.changed = False

    # ------------------------------------------------------------------ where
    def at(self, path: str) -> Path:
        """A host path under DESTDIR (itself when there is none)."""
        return Path(self.dest + path)

    # ------------------------------------------------------------------ voice
    def status(self, text: str) -> None:
        if self.json:
            self.records.append({"kind": "status", "text": text})
        else:
            print(f">>> {text}", flush=True)

    def report(self, verb: str, what: str, *, change: bool = False) -> None:
        """One line per item; `change` marks it as something this run changes."""
        if change:
            self.changed = True
        if self.dry:
            verb = _WOULD.get(verb, verb)
        if self.json:
            self.records.append({"kind": "action", "verb": verb, "what": what})
        else:
            print(f"  {verb:<13} {what}", flush=True)

    def would(self, what: str, how: str = "run") -> None:
        if self.json:
            self.records.append({"kind": how, "text": what})
        else:
            print(f"    would {how}: {what}", flush=True)

    @staticmethod
    def warn(text: str) -> None:
        print(f"{PROG}: warning: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ hands
    def run(self, *cmd: str, check: bool = True, quiet: bool = False) -> bool:
        """Run `cmd` (or, in a dry run, print it); False when it failed and not `check`."""
        if self.dry:
            self.would(" ".join(cmd))
            return True
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else None)
        if r.returncode and check:
            raise OSError(f"{shlex.join(cmd)} failed (exit status {r.returncode})")
        return r.returncode == 0

    def mkdir(self, path: Path, mode: str) -> None:
        """`install -d -m MODE PATH`: one directory, its parent already there."""
        if self.dry:
            self.would(f"install -d -m {mode} {path}")
            return
        os.mkdir(path, int(mode, 8))
        os.chmod(path, int(mode, 8))  # not narrowed by the umask

    def install_file(self, src: Path, dest: Path, mode: str) -> None:
        """`install -m MODE SRC DEST`: copied beside DEST, then renamed over it."""
        if self.dry:
            self.would(f"install -m {mode} {src} {dest}")
            return
        tmp = dest.with_name(f".{dest.name}.pdsvc-tmp")
        shutil.copyfile(src, tmp)
        os.chmod(tmp, int(mode, 8))
        os.replace(tmp, dest)

    def write_private(self, dest: Path, data: str, mode: str, owner: str) -> None:
        """A secret: written 0600 to a temporary file, then given to OWNER (not under
        DESTDIR) and MODE, then renamed into place: no one reads a partial key."""
        tmp = dest.with_name(dest.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        if not self.dest:
            chown(tmp, owner)
        os.chmod(tmp, int(mode, 8))
        os.replace(tmp, dest)

    def empty_file(self, dest: Path, mode: str, owner: str) -> None:
        """`install -m MODE /dev/null DEST` and, not under DESTDIR, `chown OWNER DEST`."""
        if self.dry:
            self.would(f"install -m {mode} /dev/null {dest}")
        else:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, int(mode, 8))
            os.close(fd)
            os.chmod(dest, int(mode, 8))
        if not self.dest:
            self.chown(dest, owner)

    def chown(self, path: Path, owner: str) -> None:
        if self.dry:
            self.would(f"chown {owner} {path}")
        else:
            chown(path, owner)

    def chmod(self, path: Path, mode: str) -> None:
        if self.dry:
            self.would(f"chmod {mode} {path}")
        else:
            os.chmod(path, int(mode, 8))

    def remove(self, path: Path) -> None:
        """`rm -f PATH`."""
        if self.dry:
            self.would(f"rm -f {path}")
        elif path.exists() or path.is_symlink():
            path.unlink()

    def remove_tree(self, path: Path) -> None:
        if self.dry:
            self.would(f"rm -rf {path}")
        else:
            shutil.rmtree(path)

    def rmdir(self, path: Path) -> bool:
        if self.dry:
            self.would(f"rmdir {path}")
            return True
        try:
            os.rmdir(path)
        except OSError:
            return False
        return True


def chown(path: os.PathLike[str] | str, owner: str) -> None:
    """chown USER:GROUP PATH (names, looked up now)."""
    user, _, group = owner.partition(":")
    os.chown(path, pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid if group else -1)


def owner_of(path: Path) -> str:
    st = path.stat()
    return f"{_name(pwd.getpwuid, st.st_uid)}:{_name(grp.getgrgid, st.st_gid)}"


def _name(lookup: Callable[[int], pwd.struct_passwd | grp.struct_group], ident: int) -> str:
    """The user's or group's name for ``ident``; the number itself when none has it."""
    try:
        entry = lookup(ident)
    except KeyError:
        return str(ident)
    return entry.pw_name if isinstance(entry, pwd.struct_passwd) else entry.gr_name


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def in_group(user: str, group: str) -> bool:
    """Whether `user` is a member of `group` (primary or supplementary)."""
    try:
        g = grp.getgrnam(group)
        return user in g.gr_mem or pwd.getpwnam(user).pw_gid == g.gr_gid
    except KeyError:
        return False


def systemctl_value(*args: str) -> str:
    """The output of `systemctl ARGS` (stripped; '' when it fails to say anything)."""
    try:
        r = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    except OSError:
        return ""
    return r.stdout.strip()


def journal_last(unit: str) -> str:
    """The unit's last journal line ('' when none)."""
    try:
        r = subprocess.run(["journalctl", "-u", unit, "-n", "1", "-o", "cat", "--no-pager", "-q"],
                           capture_output=True, text=True)
    except OSError:
        return ""
    lines = r.stdout.splitlines()
    return lines[-1] if lines else ""
