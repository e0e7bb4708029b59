"""A strict decoder of unit files, after systemd's own rules, for the property tests.

It returns what systemd hands the process, and raises SyntaxError wherever systemd would read
the text as something other than literal data: a specifier other than `%%`, a `$` expansion in
a command line, an unknown escape, a bare `;` between commands, a prefix on the executable.

Sources: systemd.syntax(7) (lines, comments, continuations, quoting), systemd.service(5)
"Command lines" (ExecStart= words, `$` and `;`), systemd.exec(5) (Environment=, list settings),
systemd.unit(5) "Specifiers"; the splitting itself is src/basic/extract-word.c
(extract_first_word) and the comment/continuation handling src/shared/conf-parser.c.
"""

from __future__ import annotations

import re
from collections import defaultdict

WHITESPACE = " \t\n\r"
COMMENTS = "#;"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "\\": "\\", '"': '"', "'": "'", "s": " "}


def unit_settings(text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) of every assignment, in order (conf-parser.c: a comment line
    is skipped even inside a continuation, a line ending in an unescaped backslash continues
    with the next one, the backslash read as a space)."""
    if "\x00" in text or "\r" in text:
        raise SyntaxError("NUL or carriage return in a unit file")
    out: list[tuple[str, str, str]] = []
    section = ""
    pending: str | None = None
    for raw in text.split("\n"):
        stripped = raw.lstrip(WHITESPACE)
        if stripped and stripped[0] in COMMENTS:
            continue
        line = raw if pending is None else pending + raw
        if _ends_escaped(line):
            pending = line[:-1] + " "
            continue
        pending = None
        line = line.strip(WHITESPACE)
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise SyntaxError(f"bad section line {line!r}")
            section = line[1:-1]
            continue
        if "=" not in line:
            raise SyntaxError(f"assignment without '=': {line!r}")
        key, _, value = line.partition("=")
        out.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE)))
    if pending is not None:
        raise SyntaxError("file ends in a continuation")
    return out


def sections(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> its raw values (a key may repeat)."""
    d: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for section, key, value in unit_settings(text):
        d[section][key].append(value)
    return {s: dict(k) for s, k in d.items()}


def _ends_escaped(line: str) -> bool:
    escaped = False
    for c in line:
        escaped = (not escaped) and c == "\\"
    return escaped


def extract_words(value: str, *, cunescape: bool) -> list[tuple[str, str]]:
    """extract_first_word(EXTRACT_UNQUOTE [| EXTRACT_CUNESCAPE]) until the value ends:
    (word, its raw text) pairs. Quotes may open and close anywhere in a word; a backslash
    escapes the next character, inside quotes and out (C-style with cunescape)."""
    words: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        start, word, quote = i, [], ""
        while i < n:
            c = value[i]
            if c == "\\":
                if i + 1 >= n:
                    raise SyntaxError(f"trailing backslash in {value!r}")
                text, i = _unescape(value, i + 1) if cunescape else (value[i + 1], i + 2)
                word.append(text)
                continue
            if quote:
                if c == quote:
                    quote = ""
                else:
                    word.append(c)
            elif c in "'\"":
                quote = c
            elif c in WHITESPACE:
                break
            else:
                word.append(c)
            i += 1
        if quote:
            raise SyntaxError(f"unterminated quote in {value!r}")
        words.append(("".join(word), value[start:i]))


def _unescape(s: str, i: int) -> tuple[str, int]:
    """cunescape_one() at s[i] (the character after the backslash): (text, next index)."""
    c = s[i]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 1
    for prefix, digits, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if c == prefix:
            code = s[i + 1:i + 1 + digits]
            if len(code) != digits or not re.fullmatch(r"[0-9a-fA-F]+", code):
                raise SyntaxError(f"bad \\{c} escape in {s!r}")
            return _nonzero(int(code, base), s), i + 1 + digits
    if c in "01234567":
        code = s[i:i + 3]
        if not re.fullmatch(r"[0-7]{3}", code):
            raise SyntaxError(f"bad octal escape in {s!r}")
        return _nonzero(int(code, 8), s), i + 3
    raise SyntaxError(f"unknown escape \\{c} in {s!r}")


def _nonzero(code: int, s: str) -> str:
    if code == 0:
        raise SyntaxError(f"NUL escape in {s!r}")
    return chr(code)


def specifiers(word: str) -> str:
    """Resolve `%%`; any other specifier would expand to something else (systemd.unit(5))."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "%":
            if word[i + 1:i + 2] != "%":
                raise SyntaxError(f"unescaped specifier in {word!r}")
            out.append("%")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def exec_dollars(word: str) -> str:
    """Resolve `$$`; `$NAME`/`${NAME}` would expand (systemd.service(5) "Command lines")."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            nxt = word[i + 1:i + 2]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "{" or re.match(r"[A-Za-z_]", nxt):
                raise SyntaxError(f"variable expansion in {word!r}")
        out.append(word[i])
        i += 1
    return "".join(out)


def exec_argv(value: str) -> list[str]:
    """The argv an ExecStart= value runs."""
    words = extract_words(value, cunescape=True)
    if not words:
        raise SyntaxError("empty command line")
    if any(raw == ";" for _, raw in words):
        raise SyntaxError(f"a bare ';' starts another command in {value!r}")
    first = words[0][0]
    if first[:1] in "@-:+!|":
        raise SyntaxError(f"executable prefix in {first!r}")
    return [exec_dollars(specifiers(w)) for w, _ in words]


def environment(value: str) -> dict[str, str]:
    """The variables one Environment= line sets (systemd.exec(5): quoted, C-unescaped)."""
    env: dict[str, str] = {}
    for word, _ in extract_words(value, cunescape=True):
        key, sep, val = specifiers(word).partition("=")
        if not sep:
            raise SyntaxError(f"Environment= word without '=': {word!r}")
        env[key] = val
    return env


def list_items(value: str) -> list[str]:
    """A space-separated path list (ReadWritePaths=, CacheDirectory=): EXTRACT_UNQUOTE, then
    specifiers; a leading '-' or '+' would be a flag, not part of the path."""
    items = [specifiers(w) for w, _ in extract_words(value, cunescape=False)]
    for item in items:
        if item[:1] in "-+":
            raise SyntaxError(f"list item with a prefix: {item!r}")
    return items


def plain(value: str) -> str:
    """A plain string setting (User=, Description=): specifiers only."""
    return specifiers(value)
