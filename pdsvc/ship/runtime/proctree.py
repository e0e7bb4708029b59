"""The process tree, for managers without cgroups (--kill-tree): subreaper, /proc table."""

from __future__ import annotations

import os
from collections.abc import Mapping

PR_SET_CHILD_SUBREAPER = 36  # prctl(2), Linux >= 3.4


def become_subreaper() -> str | None:
    """Make orphaned descendants ours instead of init's: prctl(PR_SET_CHILD_SUBREAPER).

    A process that leaves the child's process group and session (SGLang schedulers, sglang
    #23627; supervisord cannot signal them, Supervisor #1101/#1396) is still reparented to us
    when its parent dies, so it can be found and killed. Returns an error text, None on success.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:  # no libc.prctl: not Linux
        return str(exc)
    return None


def process_table() -> dict[int, tuple[int, str, str]]:
    """{pid: (parent pid, state letter, command name)} of every process, read from /proc."""
    table: dict[int, tuple[int, str, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text[text.rindex(")") + 2 :].split()
            table[int(entry)] = (int(fields[1]), fields[0], name)
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return table


def descendants(root: int, table: Mapping[int, tuple[int, str, str]] | None = None) -> list[int]:
    """Every process whose parent chain leads to ``root`` (zombies included), parents first."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        kids = sorted(pid for parent in frontier for pid in children.get(parent, ()))
        kids = [pid for pid in kids if pid not in found and pid != root]
        found += kids
        frontier = kids
    return found
