"""One result type for every check: a Row (✓ ok, ! warning, ✗ failed), and the guard that turns
a check's crash into a row (as Flutter's doctor_validator.dart does with a validator that
throws), so one bug never hides the other rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warning", "failed"]

EXIT_OK = 0
EXIT_UNFIT = 3  # as TopologyError: the plan does not fit this host


@dataclass(frozen=True)
class Row:
    """One line of the report: one finding, with a one-line fix unless it is ok."""

    check: str
    status: Status
    detail: str
    fix: str | None = None


def ok(check: str, detail: str) -> Row:
    return Row(check, "ok", detail)


def warn(check: str, detail: str, fix: str) -> Row:
    return Row(check, "warning", detail, fix)


def fail(check: str, detail: str, fix: str) -> Row:
    return Row(check, "failed", detail, fix)


def exit_code(rows: Sequence[Row]) -> int:
    """0 when no row failed (warnings allowed), 3 when the host does not fit the plan."""
    return EXIT_UNFIT if any(r.status == "failed" for r in rows) else EXIT_OK


def guarded(check: str, fn: Callable[[], list[Row]]) -> list[Row]:
    """A bug in one check is a row, not a traceback that hides every other row."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return [warn(check, f"the check itself failed: {type(exc).__name__}: {exc}",
                     "report this as a pdsvc bug")]
