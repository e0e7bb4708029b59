"""Read a rendered supervisord.conf the way supervisord 4 does (supervisor/options.py), without
needing supervisor installed, so tests assert options rather than bytes.

- RawConfigParser with inline comments after `;` or `#` (UnhosedConfigParser); supervisord
  reads with strict=False (a repeated key or section: the last wins), this reader with
  strict=True, so a duplicate is an error here instead of a silent override.
- A value is expanded as supervisord's saneget() does: `%(here)s` (the config's directory)
  first, then Python %-formatting with here, program_name, group_name, host_node_name,
  process_num, numprocs, numprocs_start and ENV_<NAME> for each variable of supervisord's own
  environment: `%%` is a literal `%`.
- command= is split with shlex.split; environment= is read by supervisor's
  dict_of_key_value_pairs (copied below).
"""

from __future__ import annotations

import configparser
import os
import platform
import shlex


def dict_of_key_value_pairs(arg: str) -> dict[str, str]:
    """supervisor.datatypes.dict_of_key_value_pairs (4.2), verbatim in behaviour."""
    lexer = shlex.shlex(str(arg))
    lexer.wordchars += "/.+-():"
    tokens = list(lexer)
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        k_eq_v = tokens[i:i + 3]
        if len(k_eq_v) != 3 or k_eq_v[1] != "=":
            raise ValueError(f"Unexpected end of key/value pairs in value '{arg}'")
        out[k_eq_v[0]] = k_eq_v[2].strip("'\"")
        i += 4
    return out


class SupervisordConf:
    def __init__(self, text: str, here: str, environ: dict[str, str] | None = None) -> None:
        self.parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"),
                                                   strict=True)
        self.parser.read_string(text)
        self.here = here
        self.environ = dict(os.environ if environ is None else environ)

    def sections(self) -> list[str]:
        return self.parser.sections()

    def _group_of(self, program: str) -> str:
        for section in self.sections():
            if section.startswith("group:") and program in [
                    p.strip() for p in self.parser.get(section, "programs").split(",")]:
                return section.split(":", 1)[1]
        return program

    def get(self, section: str, key: str) -> str | None:
        """The expanded value of KEY in SECTION, None when not set."""
        if not self.parser.has_option(section, key):
            return None
        value = self.parser.get(section, key).replace("%(here)s", self.here)
        name = section.split(":", 1)[-1]
        expansions = {f"ENV_{k}": v for k, v in self.environ.items()}
        expansions |= {"here": self.here, "program_name": name, "group_name":
                       self._group_of(name), "host_node_name": platform.node(),
                       "process_num": 0, "numprocs": 1, "numprocs_start": 0}
        return value % expansions

    def command(self, section: str) -> list[str]:
        return shlex.split(self.get(section, "command") or "")

    def environment(self, section: str) -> dict[str, str]:
        return dict_of_key_value_pairs(self.get(section, "environment") or "")
