"""The sha256 ownership record, shared by the bundle writer (pdsvc/render/bundle.py) and the
installer: what pdsvc wrote where, and the one test of whether a file there is still what it
wrote (an update) or was edited since (refused unless forced, with the diff shown).

Also the installer's manifest (/var/lib/pdsvc/NAME.manifest): one line per thing it created,
tab-separated ``KIND PATH INFO``, where KIND is
  file    a file it installed (INFO: the sha256 it wrote; a different one = edited in place)
  dir     a directory from install.list it created (the JIT cache, state dir, env dir)
  parent  a missing parent directory it created on the way (removed again when empty)
  envfile an env file it created empty (removed on uninstall while still empty)
  secret  a key it generated or copied (the router's control-plane key)
  user, group, member (INFO: the group)   accounts it created / group memberships it added
  enabled the target, once the installer enabled it (or found it enabled): from then on the
          admin's `systemctl disable` is respected
plus ``target TARGET UNIT_DIR``. Nothing that existed before is recorded, so nothing that
existed before is removed.

Stdlib only: it runs on the GPU host, from the bundle, by the host's python3 (>= 3.9).
"""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

#: The kinds of manifest entry (see the module docstring).
KINDS = ("file", "dir", "parent", "envfile", "secret", "user", "group", "member", "enabled")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as fh:
        return sha256_bytes(fh.read())


def ownership(path: Path, wanted: bytes, recorded: str | None) -> str:
    """What replacing `path` with `wanted` means: 'absent' (nothing there), 'same' (it holds
    `wanted` already), 'ours' (it is what pdsvc last wrote: the `recorded` sha256, so an update)
    or 'edited' (edited in place since, or someone else's, or not a regular file)."""
    if not path.exists() and not path.is_symlink():
        return "absent"
    if path.is_symlink() or not path.is_file():
        return "edited"
    data = path.read_bytes()
    if data == wanted:
        return "same"
    return "ours" if recorded is not None and sha256_bytes(data) == recorded else "edited"


def edited(path: Path, recorded: str) -> bool:
    """Whether a file pdsvc wrote (sha256 `recorded`) is there and differs from it now."""
    return path.is_file() and sha256_file(path) != recorded


def unified(old: str, new: str, old_label: str, new_label: str) -> str:
    """A unified diff from `old` to `new` ('' when equal), labelled as given."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=old_label, tofile=new_label))


def depth(path: str) -> int:
    return path.rstrip("/").count("/")


@dataclass
class Manifest:
    """The installer's record: ``target`` (TARGET, UNIT_DIR) and its entries in order, each
    (kind, path, info) at most once per (kind, path): the first one added wins."""

    target: str = ""
    unit_dir: str = ""
    entries: list[tuple[str, str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def add(self, kind: str, path: str, info: str = "-") -> None:
        if self.info(kind, path) is None:
            self.entries.append((kind, path, info))

    def info(self, kind: str, path: str) -> str | None:
        """INFO of the entry (kind, path), or None when there is none."""
        for k, p, i in self.entries:
            if k == kind and p == path:
                return i
        return None

    def of(self, *kinds: str) -> list[tuple[str, str, str]]:
        return [e for e in self.entries if e[0] in kinds]

    def format(self, name: str, title: str) -> str:
        lines = [f"# pdsvc install manifest for {name}: {title}",
                 f"target\t{self.target}\t{self.unit_dir}"]
        lines += ["\t".join(e) for e in self.entries]
        return "\n".join(lines) + "\n"


def parse_manifest(text: str) -> Manifest:
    """A manifest's text; an entry of an unknown kind is kept aside in `unknown` (a newer
    installer's), never obeyed."""
    m = Manifest()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        kind, path, info = ([*line.split("\t", 2), "", ""])[:3]
        if kind == "target":
            m.target, m.unit_dir = path, info
        elif kind in KINDS:
            m.add(kind, path, info or "-")
        else:
            m.unknown.append(kind)
    return m


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary file beside it and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
