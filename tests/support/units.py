"""A small reader for unit files (systemd.syntax(7)) so tests assert keys, not bytes."""

from __future__ import annotations

import shlex
from collections import defaultdict

from pdsvc.doctor.kv_launch import unit_lines  # the one unit-file reader (doctor's too)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> list of values (a key may repeat). Joins backslash continuations."""
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for section, key, value in unit_lines(text):
        sections[section][key].append(value)
    return {s: dict(k) for s, k in sections.items()}


def exec_words(value: str) -> list[str]:
    """Split an ExecStart= value into argv the way systemd does for plain quoting, then undo
    systemd's own `%%` and `$$` escapes (tests compare against the plan's argv)."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]


def env_of(unit: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in unit["Service"].get("Environment", []):
        for word in shlex.split(value):
            k, _, v = word.partition("=")
            env[k] = v.replace("%%", "%")
    return env


def launched_argv(argv: list[str]) -> list[str]:
    """The argv a router launcher sees when the unit runs it under `runtime launch`
    (pdsvc/ship/runtime/launch.py): `python -m MODULE ARGS --control-plane-api-keys ENTRY`, with a
    stand-in key; any other command as it is."""
    if len(argv) > 5 and argv[2] == "launch" and argv[3] == "--control-plane-key":
        return [argv[0], "-m", argv[5], *argv[6:],
                "--control-plane-api-keys", "pdsvc:pdsvc-membership:admin:0123abcd"]
    return argv
