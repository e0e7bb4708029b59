"""What a config string may hold: the rules every output shares, checked in the schema.

Each string of the config reaches several outputs — systemd units (values, ExecStart= words,
list settings), supervisord.conf, install.list (read by install.sh as root) and Kubernetes YAML.
Each output has an exact encoding for most characters (see pdsvc/render/kit.py,
supervisord.py, k8s.py); what none of them can carry losslessly is refused here, at config load:

- control characters (C0 but tab, DEL, C1) and the Unicode line/paragraph separators: systemd
  units (systemd.syntax(7)), supervisord.conf (configparser) and install.list (`read` in bash)
  are line-based;
- a tab in a path or a user/group name: those reach install.list, where a tab separates fields
  (elsewhere a tab is encoded: `\t` in systemd's quoted strings, as itself in quoted
  supervisord words and YAML);
- strings longer than MAX_TEXT: systemd refuses unit-file lines over LONG_LINE_MAX (1 MiB), and
  no path is longer than PATH_MAX (4096) anyway.

Paths must be absolute and normalised (no `//`, `.` or `..` component): systemd rewrites or
refuses others in list settings (CacheDirectory= must be normalised, systemd.exec(5)).
"""

from __future__ import annotations

import re
import unicodedata

#: Longest string value: PATH_MAX (Linux limits.h), far below systemd's LONG_LINE_MAX (1 MiB).
MAX_TEXT = 4096
#: Characters no output can carry: C0 controls (newline, CR, NUL, …) but tab, DEL, C1 controls,
#: and U+2028/U+2029 (str.splitlines() breaks lines there, and YAML 1.1 readers too).
_UNCARRIED = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
#: ... and in a field of install.list (a path, a user or group name) a tab too.
_UNCARRIED_FIELD = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Anything written into a comment or an error message escaped, tab included.
_ESCAPED = _UNCARRIED_FIELD
_NAMES = {"\n": "newline", "\r": "carriage return", "\x00": "NUL", "\t": "tab",
          "\x7f": "DEL", "\u2028": "line separator", "\u2029": "paragraph separator"}


def char_name(c: str) -> str:
    """How an error names a character: `newline (U+000A)`, `number sign (U+0023)`."""
    name = _NAMES.get(c) or unicodedata.name(c, "").lower() or "control character"
    return f"{name} (U+{ord(c):04X})"


def uncarried(value: str, *, field: bool = False) -> str | None:
    """Why `value` cannot reach every output unchanged, or None when it can (``field``: it
    is also an install.list field, where a tab separates fields)."""
    m = (_UNCARRIED_FIELD if field else _UNCARRIED).search(value)
    if m and m.group() == "\t":
        return (f"holds a tab (U+0009) at position {m.start()}; paths and user/group names "
                "reach install.list, which install.sh reads as root, split at tabs")
    if m:
        return (f"holds a {char_name(m.group())} at position {m.start()}; control characters "
                "cannot be written into systemd units, supervisord.conf or install.list, which "
                "are line-based")
    if len(value) > MAX_TEXT:
        return (f"is {len(value)} characters long; at most {MAX_TEXT} (systemd refuses unit "
                "lines that long and no path is longer)")
    return None


def check_text(value: str, *, field: bool = False) -> str:
    """Pydantic validator: a string every output can carry (see the module docstring)."""
    why = uncarried(value, field=field)
    if why:
        raise ValueError(why)
    return value


def check_path(value: str) -> str:
    """An absolute, normalised path (trailing slashes dropped): systemd takes it as written."""
    check_text(value, field=True)
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value!r}")
    if value != value.rstrip():
        raise ValueError(f"must not end with whitespace, got {value!r} (supervisord.conf drops "
                         "it, systemd splits list settings there)")
    trimmed = value.rstrip("/") or "/"
    parts = trimmed.split("/")[1:]
    if trimmed != "/" and any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"must be a normalised path (no '//', '.' or '..' component), got {value!r}; "
            "systemd rewrites or refuses such paths in list settings (systemd.exec(5))")
    return trimmed


def continues_line(value: str) -> str | None:
    """Why `value` cannot be the end of a systemd setting written as is (a plain value such as
    LoadCredential='s path, which systemd takes literally), or None: a line that ends in an
    unescaped backslash continues on the next line (systemd.syntax(7), conf-parser.c), and
    such a setting has no escape to write the backslash otherwise."""
    if (len(value) - len(value.rstrip("\\"))) % 2:
        return ("ends with a backslash; systemd takes this path as written in a unit setting "
                "(LoadCredential=), and a line ending in a backslash continues on the next "
                "one (systemd.syntax(7))")
    return None


def check_plain_path(value: str) -> str:
    """A path that also becomes a systemd setting written as is (see continues_line)."""
    value = check_path(value)
    why = continues_line(value)
    if why:
        raise ValueError(f"'{printable(value)}' {why}; remove the trailing backslash")
    return value


#: A user or group name: what systemd accepts in User=/Group= under its strict rules
#: (systemd.exec(5), "User=, Group=": letters, digits, '_', '-', not starting with a digit or
#: '-', at most 31 characters), which is also what useradd(8) creates.
_ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")


def check_account(value: str) -> str:
    if not _ACCOUNT.fullmatch(value):
        shown = printable(value)
        raise ValueError(
            f"must be a user/group name of letters, digits, '_' and '-' (not starting with a "
            f"digit or '-', at most 31 characters), got '{shown}' (systemd.exec(5) User=)")
    return value


def printable(value: str) -> str:
    """`value` on one line, for comments and error messages: backslashes doubled and every
    character no output can carry written as a Python escape (\\n, \\x00, \\u2028), so that
    no comment or message can end a line or continue it (systemd joins a line ending in a
    backslash with the next, systemd.syntax(7))."""
    out = value.replace("\\", "\\\\")
    return _ESCAPED.sub(_escape, out)


def one_line(text: str) -> str:
    """An error message on one line: characters no output can carry written as escapes."""
    return _ESCAPED.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    return m.group().encode("unicode_escape").decode("ascii")
