"""Reading a rendered supervisord.conf back as the Units the rollout plans with: each
[program:X] becomes a Unit named by its supervisorctl name (GROUP:X, or X in a group of its
own), its command and environment= written as the ExecStart= and Environment= a unit would
carry, its other keys as directives; an [eventlistener:X] is a Unit of kind "other", and its
`--restart-with DEPENDENT=TRIGGER` (the bundle's stand-in for PartOf=) becomes the dependent's
PartOf=.

Parsed as supervisord parses (supervisor 4.x options.py): configparser with `;`/`#` inline
comments, continuation lines joined by a newline, `%(name)s` expansion (kept here as `{name}`:
both bundles expand alike) and `%%`, command= split by POSIX shlex, environment= as
comma-separated KEY="VALUE" pairs.
"""

from __future__ import annotations

import configparser
import re
import shlex

from pdsvc.apply.units import Unit, flag_values

CONF = "supervisord.conf"
_EXPAND = re.compile(r"%\((\w+)\)s|%%")


def _expand(value: str) -> str:
    return _EXPAND.sub(lambda m: "%" if m.group(0) == "%%" else "{" + m.group(1) + "}", value)


def _environment(value: str) -> dict[str, str]:
    lex = shlex.shlex(value, posix=True)
    lex.whitespace, lex.whitespace_split = ",\n\t ", True
    out = {}
    for word in lex:
        key, _, val = word.partition("=")
        out[key.strip()] = val
    return out


def _systemd_word(word: str) -> str:
    return shlex.quote(word.replace("%", "%%").replace("$", "$$"))


def _parser(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"), strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def groups(text: str) -> dict[str, tuple[str, ...]]:
    """{group: its programs} as supervisord forms them: each [group:G]'s programs=, and every
    program listed in none a group of its own (supervisor options.py process_groups_from_parser)."""
    parser = _parser(text)
    out: dict[str, tuple[str, ...]] = {}
    for section in parser.sections():
        if section.startswith("group:"):
            names = parser.get(section, "programs", fallback="")
            out[section[6:]] = tuple(n.strip() for n in names.split(",") if n.strip())
    grouped = {p for ps in out.values() for p in ps}
    for section in parser.sections():
        kind, _, name = section.partition(":")
        if kind in ("program", "eventlistener") and name not in grouped:
            out[name] = (name,)
    return out


def program_units(text: str) -> dict[str, Unit]:
    """Every program and event listener of a supervisord.conf, by supervisorctl name."""
    parser = _parser(text)
    group_of = {p: g for g, ps in groups(text).items() for p in ps}
    units: dict[str, Unit] = {}
    part_of: dict[str, list[str]] = {}
    for section in parser.sections():
        kind, _, prog = section.partition(":")
        if kind not in ("program", "eventlistener"):
            continue
        group = group_of.get(prog, prog)
        name = prog if group == prog else f"{group}:{prog}"
        directives: list[tuple[str, str, str]] = []
        for key, raw in parser.items(section):
            value = _expand(raw)
            if key == "command":
                words = shlex.split(value)
                directives.append(("Service", "ExecStart", " ".join(map(_systemd_word, words))))
                if kind == "eventlistener":
                    for pair in flag_values(tuple(words)).get("--restart-with", ()):
                        dependent, _, trigger = pair.partition("=")
                        part_of.setdefault(dependent, []).append(trigger)
            elif key == "environment":
                directives += [("Service", "Environment", _systemd_word(f"{k}={v}"))
                               for k, v in _environment(value).items()]
            else:
                directives.append((kind, key, " ".join(value.split())))
        units[name] = Unit(name, tuple(directives), raw_text(parser, section))
    for dependent, triggers in part_of.items():
        if dependent in units:
            u = units[dependent]
            units[dependent] = Unit(u.name, (*u.directives, ("Unit", "PartOf", " ".join(triggers))),
                                    u.text)
    return units


def raw_text(parser: configparser.RawConfigParser, section: str) -> str:
    return "\n".join([f"[{section}]", *(f"{k}={v}" for k, v in parser.items(section))])


def group_members(text: str, name: str) -> tuple[str, ...]:
    """The programs that share `name`'s supervisord group (itself included)."""
    group, _, prog = name.rpartition(":")
    return groups(text).get(group or prog, (prog,))
