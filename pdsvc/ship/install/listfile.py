"""install.list, the renderer's list of what the installer installs and creates: parsed into a
`Bundle`. Every path, mode and owner the installer uses comes from here (or from the rendered
sysusers.d/tmpfiles.d files it names); the installer derives none."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import Refused

LIST = "install.list"
#: A bundle of several hosts: one subdirectory per host, listed here.
HOSTS_LIST = "hosts.list"


@dataclass(frozen=True)
class Item:
    """A file to install (`src` in the bundle), or a directory / env file / secret to create
    (`src` empty; for a secret, `how`: make or copy)."""

    dest: str
    mode: str
    owner: str
    src: str = ""
    how: str = ""


@dataclass
class Bundle:
    """What install.list says, field by field."""

    dir: Path
    name: str = ""
    target: str = ""
    user: str = ""
    group: str = ""
    home: str = ""
    config_src: str = ""
    config_sha: str = ""
    manifest: str = ""
    sysusers: str = ""
    tmpfiles: str = ""
    key_host: str = ""
    key_address: str = ""
    units: list[Item] = field(default_factory=list)
    files: list[Item] = field(default_factory=list)
    dirs: list[Item] = field(default_factory=list)
    envfiles: list[Item] = field(default_factory=list)
    secrets: list[Item] = field(default_factory=list)
    members: list[str] = field(default_factory=list)  # groups the service user joins

    @property
    def unit_names(self) -> list[str]:
        return [u.src for u in self.units]

    def secret_use(self) -> tuple[str, str]:
        """(how, path) of the router's key here: make, copy or '' (no unit reads one)."""
        for s in self.secrets:
            return s.how, s.dest
        return "", ""


def parse_list(text: str, where: Path) -> Bundle:
    """install.list's text (tab-separated: kind, then the kind's fields). An unknown kind is
    refused (a newer pdsvc's), as is a list without name, target, user or manifest."""
    b = Bundle(dir=where.parent)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        kind, *f = line.split("\t")
        f += [""] * (5 - len(f))
        if kind == "name":
            b.name = f[0]
        elif kind == "target":
            b.target = f[0]
        elif kind == "config":
            b.config_src, b.config_sha = f[0], f[1]
        elif kind == "user":
            b.user, b.group, b.home = f[0], f[1], f[2]
        elif kind == "unit":
            b.units.append(Item(src=f[0], dest=f[1], mode=f[2], owner=f[3]))
        elif kind == "file":
            b.files.append(Item(src=f[0], dest=f[1], mode=f[2], owner=f[3]))
        elif kind == "dir":
            b.dirs.append(Item(dest=f[0], mode=f[2], owner=f[3]))
        elif kind == "envfile":
            b.envfiles.append(Item(dest=f[0], mode=f[2], owner=f[3]))
        elif kind == "secret":
            b.secrets.append(Item(dest=f[0], how=f[1], mode=f[2], owner=f[3]))
        elif kind == "keyhost":
            b.key_host, b.key_address = f[0], f[1]
        elif kind == "member":
            b.members.append(f[1])
        elif kind == "manifest":
            b.manifest = f[0]
        elif kind == "sysusers":
            b.sysusers = f[0]
        elif kind == "tmpfiles":
            b.tmpfiles = f[0]
        else:
            raise Refused(f"{where}: unknown entry '{kind}' (rendered by a newer pdsvc?)")
    if not (b.name and b.target and b.user and b.manifest):
        raise Refused(f"{where} is incomplete; run `pdsvc render` again")
    return b


def load(bundle: Path) -> Bundle:
    """The bundle in directory `bundle` (as the user named it), or a refusal that says why
    there is none: not rendered, or a directory of several hosts' bundles."""
    path = bundle / LIST
    hosts = bundle / HOSTS_LIST
    if not path.is_file() and hosts.is_file():
        names = [line.split("\t", 1)[0] for line in hosts.read_text(encoding="utf-8").splitlines()
                 if line and not line.startswith("#")]
        raise Refused(f"{bundle} holds one bundle per host ({', '.join(names)}): on each host "
                      f"run install.sh --bundle {bundle}/HOST")
    if not path.is_file():
        raise Refused(f"{path} not found: run `pdsvc render` first (or pass --bundle DIR)")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        raise Refused(f"cannot read {path}") from None
    return parse_list(text, path)
