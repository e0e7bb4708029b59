"""The one error hierarchy of pdsvc; the CLI maps each class to a documented exit code."""

from __future__ import annotations

from pdsvc.encode import one_line


class PdsvcError(Exception):
    """Base class: a message meant for the user, one line, plus an exit code."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        # one line whatever a path or value in it holds: line breaks are escaped
        return one_line(f"{self.message}; {self.hint}" if self.hint else self.message)


class ConfigError(PdsvcError):
    """The config file is missing, unreadable, or does not match the schema (exit 2)."""

    exit_code = 2


class TopologyError(PdsvcError):
    """The plan does not fit the host's GPUs/NUMA layout, or the layout is unknown (exit 3)."""

    exit_code = 3


class OutputError(PdsvcError):
    """Writing the rendered bundle failed (exit 1)."""

    exit_code = 1
