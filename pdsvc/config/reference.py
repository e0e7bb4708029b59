"""The config reference table in docs/config.md, generated from the schema (one source of truth).

    python -m pdsvc.config.reference   # prints the table; tests/test_readme.py keeps it in sync
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pdsvc.config.schema import Config, model_forms


def _default(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "*(required)*" if field.default_factory is None else f"`{field.default_factory()}`"
    value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _rows(model: type[BaseModel], prefix: str, differs_from: Any = None) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, f"{key}.")
            continue
        named = _named_sections(ann)
        if named is not None:
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{key}` | {_default(field)} | {desc} |")
            rows += _rows(named, f"{key}.NAME.")
            continue
        mapping, item = model_forms(ann)
        if mapping is not None and item is not None:
            # a role: its single mapping's keys, then what differs in the list form's items
            rows += _rows(mapping, f"{key}.")
            rows += _rows(item, f"{key}[i].", differs_from=mapping)
            continue
        if differs_from is not None and _same(field, differs_from.model_fields.get(name)):
            continue
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{key}` | {_default(field)} | {desc} |")
    return rows


def _named_sections(annotation: Any) -> type[BaseModel] | None:
    """The model of a `NAME: section` mapping field (e.g. hosts), else None."""
    for member in typing.get_args(annotation) or (annotation,):
        if typing.get_origin(member) is dict:
            value = typing.get_args(member)[1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                return value
    return None


def _same(a: Any, b: Any) -> bool:
    return b is not None and all(getattr(a, k) == getattr(b, k) for k in (
        "annotation", "default", "default_factory", "description"))


def reference_markdown() -> str:
    return "\n".join(["| key | default | meaning |", "|---|---|---|", *_rows(Config, "")]) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
