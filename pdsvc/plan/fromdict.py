"""The inverse of dataclasses.asdict, driven by the field types: one loader for every plan type.

`from_dict(Plan, d)` builds a (nested) frozen dataclass from the plain data asdict() gave,
after a trip through JSON: lists become the tuples the fields declare (tuples of tuples too),
a mapping where a tuple of pairs is declared is read as its items (an env written as a dict),
Optional, Literal, nested dataclasses and dicts are followed. A field the data lacks is a
KeyError and a value of the wrong type a TypeError or ValueError: the plan cache reads either
as a miss. Keys that are not fields (derived values a writer added) are ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def from_dict(cls: type[T], data: Any) -> T:
    """``cls`` (a dataclass) from ``data`` (what asdict and a JSON round trip made of one)."""
    return _load(cls, data, cls.__name__)


@functools.cache
def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def _load(tp: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{where}: a mapping expected for {tp.__name__}, got {value!r}")
        return tp(**{name: _load(ftp, value[name], f"{where}.{name}")
                     for name, ftp in _field_types(tp)})
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for member in (a for a in args if a is not type(None)):
            try:
                return _load(member, value, where)
            except (TypeError, ValueError):
                continue
        raise TypeError(f"{where}: {value!r} is none of {tp}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {args}")
        return value
    if origin is tuple:
        if isinstance(value, dict):
            value = list(value.items())
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where}: a list expected, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{where}: {len(args)} items expected, got {value!r}")
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(_load(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: a mapping expected, got {value!r}")
        key, item = args
        return {_load(key, k, where): _load(item, v, f"{where}[{k!r}]") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is an int to isinstance: neither stands for the other
    if isinstance(tp, type) and isinstance(value, tp) and (tp is bool) == isinstance(value, bool):
        return value
    raise TypeError(f"{where}: {tp} expected, got {value!r}")
