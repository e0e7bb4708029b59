"""Reading a rendered systemd unit back: its directives, ExecStart's argv split into the
runtime's part and the engine's, its Environment=, and what the runtime is told (role, URL,
pairs, router). Only what pdsvc's own renderer writes needs to parse: one directive a line,
`\\` continuations, values quoted per systemd.syntax(7)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field


def _unescape(word: str) -> str:
    """systemd's specifier and variable escapes, as the renderer writes them (%% and $$)."""
    return word.replace("%%", "%").replace("$$", "$")


def flag_values(argv: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """`--flag value...` -> {flag: values} (a bare flag: ("true",); a repeated flag: its values
    one after another, joined by a space per occurrence)."""
    out: dict[str, list[str]] = {}
    flag = None
    for word in argv:
        if word.startswith("--"):
            flag, _, inline = word.partition("=")
            out.setdefault(flag, []).append(inline)
        elif flag is not None:
            last = out[flag][-1]
            out[flag][-1] = f"{last} {word}" if last else word
    return {f: tuple(v or "true" for v in vals) for f, vals in out.items()}


@dataclass(frozen=True)
class Unit:
    """One unit file as rendered: (section, key, value) in order, comments left out."""

    name: str
    directives: tuple[tuple[str, str, str], ...]
    text: str = field(repr=False, default="")

    @classmethod
    def parse(cls, name: str, text: str) -> Unit:
        found: list[tuple[str, str, str]] = []
        section, pending = "", ""
        for raw in text.splitlines():
            line = pending + raw.strip()
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, _, value = line.partition("=")
            found.append((section, key.strip(), value.strip()))
        return cls(name, tuple(found), text)

    def values(self, key: str) -> tuple[str, ...]:
        return tuple(v for _, k, v in self.directives if k == key)

    @property
    def argv(self) -> tuple[str, ...]:
        """ExecStart=, split as systemd splits it (the renderer quotes per systemd.syntax(7))."""
        execs = self.values("ExecStart")
        return tuple(_unescape(w) for w in shlex.split(execs[-1])) if execs else ()

    @property
    def runtime_argv(self) -> tuple[str, ...]:
        """The runtime's own part of ExecStart (before `--`); () for a unit without one."""
        argv = self.argv
        return argv[:argv.index("--")] if "--" in argv else ()

    @property
    def engine_argv(self) -> tuple[str, ...]:
        """What the runtime launches (after `--`): the engine's or the router's command line."""
        argv = self.argv
        return argv[argv.index("--") + 1:] if "--" in argv else argv

    @property
    def kind(self) -> str:
        """engine | router (the runtime's subcommand) | front (HAProxy in front of several
        routers: the one unit that runs haproxy) | vip (keepalived: the address of routers on
        several hosts) | other (the target, the gate)."""
        for word in self.runtime_argv:
            if word in ("engine", "router"):
                return word
        if self.argv and os.path.basename(self.argv[0]) == "haproxy":
            return "front"
        if self.argv and os.path.basename(self.argv[0]) == "keepalived":
            return "vip"
        return "other"

    @property
    def options(self) -> dict[str, tuple[str, ...]]:
        """The runtime's options (--role, --advertise, --pair, --router, …)."""
        return flag_values(self.runtime_argv)

    def option(self, flag: str, default: str = "") -> str:
        return self.options.get(flag, (default,))[0]

    @property
    def env(self) -> dict[str, str]:
        """Environment= (one variable each, as rendered), later ones winning."""
        out: dict[str, str] = {}
        for value in self.values("Environment"):
            for word in shlex.split(value):
                key, _, val = _unescape(word).partition("=")
                out[key] = val
        return out

    @property
    def part_of(self) -> tuple[str, ...]:
        """The units whose stop or restart takes this one along (PartOf=, systemd.unit(5))."""
        return tuple(u for v in self.values("PartOf") for u in v.split())

    @property
    def role(self) -> str:
        return self.option("--role") or (
            self.kind if self.kind in ("router", "front", "vip") else "")

    @property
    def url(self) -> str:
        """Where the router reaches this engine (what it registers as)."""
        return self.option("--advertise")

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(prefill URL, decode URL) of each pair this engine is part of (its --pair)."""
        out = []
        for triple in self.options.get("--pair", ()):
            words = triple.split()
            if len(words) == 3:
                out.append((words[0], words[2]))
        return tuple(out)

    @property
    def key_file(self) -> str:
        """The router's control-plane key on this host (LoadCredential=router-key:PATH; a
        supervisord program's runtime reads it from --control-plane-key)."""
        for value in self.values("LoadCredential"):
            name, _, path = value.partition(":")
            if name == "router-key":
                return path
        return self.option("--control-plane-key")

    @property
    def host(self) -> str:
        """The host of a unit of a deployment over several hosts (named HOST/UNIT); ""."""
        return self.name.rpartition("/")[0]

    @property
    def local_name(self) -> str:
        """The name its service manager knows it by, on its host."""
        return self.name.rpartition("/")[2]
