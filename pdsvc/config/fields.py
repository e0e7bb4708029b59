"""The vocabulary of the config schema: the field types every section is built from, the
strict base model, and key paths as the user writes them (`prefill[1].gpus`).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic import Strict as StrictType

from pdsvc.encode import check_account, check_path, check_plain_path, check_text

#: Every string of the schema is one of these (encode.py: what every output can carry).
Text = Annotated[str, AfterValidator(check_text)]
AbsPath = Annotated[str, AfterValidator(check_path)]
#: ... a path written into a systemd setting as is (no quoting: LoadCredential=).
PlainPath = Annotated[str, AfterValidator(check_plain_path)]
Account = Annotated[str, AfterValidator(check_account)]
#: Integers are YAML integers: `port: true` or `gpus: [0, true]` is refused, not read as 1
#: (pydantic's lax mode would take a bool, a float or a numeric string), and so is `1e20`.
Int = Annotated[int, StrictType()]
Port = Annotated[int, StrictType(), Field(ge=1, le=65535)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=255)]
FlagName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=255)]
EnvValue = Text | Int | float | bool
ArgValue = Text | Int | float | bool | list[Text | Int | float]
#: Bounded by what systemd and a sane deployment accept: a value systemd cannot
#: hold (`1e20`) would be ignored and its default would apply silently.
DAY, HOUR = 86400, 3600


HourSecs = Annotated[int, StrictType(), Field(ge=1, le=HOUR)]
DaySecs = Annotated[int, StrictType(), Field(ge=1, le=DAY)]
WeekSecs = Annotated[int, StrictType(), Field(ge=1, le=7 * DAY)]
Count100 = Annotated[int, StrictType(), Field(ge=1, le=100)]
Count1000 = Annotated[int, StrictType(), Field(ge=1, le=1000)]
TpSize = Annotated[int, StrictType(), Field(ge=1, le=4096)]
GpuIndex = Annotated[int, StrictType(), Field(ge=0, le=1023)]
Module = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=255)]


@functools.cache
def _runtime_types() -> dict[str, Callable[[str], Any]]:
    """Each option of the runtime's parser (pdsvc/ship/runtime/cli.py, every mode) -> its type."""
    from pdsvc.ship.runtime.cli import build_parser

    _, modes = build_parser()
    return {opt: action.type for mode in modes.values() for action in mode._actions
            for opt in action.option_strings if callable(action.type)}


def runtime_flag(flag: str) -> AfterValidator:
    """A number the renderer hands the runtime as `flag`: checked by the runtime's own parser
    type (one source for its bound), so the schema never accepts a value every start of the
    unit would refuse with exit 2 (`canary_heal_attempts: 0`)."""
    def check(value: Any) -> Any:
        try:
            _runtime_types()[flag](str(value))
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{e}: every start of the unit would refuse it ({flag})") from None
        return value
    check.runtime_flag = flag  # type: ignore[attr-defined]  # which option: the contract test
    return AfterValidator(check)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def dotted(loc: tuple) -> str:
    """A key path as the user writes it: ('prefill', 1, 'gpus') -> 'prefill[1].gpus'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def no_repeats(items: list, what: str = "") -> list:
    dupes = sorted({x for x in items if items.count(x) > 1})
    if dupes:
        raise ValueError(f"{what}{dupes[0]} is listed twice")
    return items
