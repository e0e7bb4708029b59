"""The installer's two failures, each with its exit code: 1 refused or failed, 2 usage."""

from __future__ import annotations


class Refused(Exception):
    """Refused (before anything changed) or failed: exit 1, the message says why."""


class Usage(Exception):
    """The command line is wrong: exit 2."""
