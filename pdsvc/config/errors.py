"""A pydantic validation error as the user's file says it: `FILE:LINE: key: problem; fix`.

The line comes from the YAML node tree (yamlload.py): every key path maps to its line; an
unknown key gets the closest valid key of its section, read from the schema.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml
from pydantic_core import ErrorDetails

from pdsvc.config.fields import dotted
from pdsvc.config.roles import FORM_TAGS, model_forms


def line_index(node: yaml.Node | None, path: tuple = ()) -> dict[tuple, int]:
    """Map each key path (as pydantic writes `loc`) to its 1-based line in the YAML text."""
    index: dict[tuple, int] = {}
    if node is None:
        return index
    index[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            index[path + (key,)] = key_node.start_mark.line + 1
            child = path + (key,)
            index.update({k: v for k, v in line_index(value_node, child).items() if k != child})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            index.update(line_index(item, path + (i,)))
    return index


def describe(err: ErrorDetails, lines: dict[tuple, int], source: str, schema: type) -> str:
    """One line for pydantic error ``err`` of a file validated against ``schema`` (Config)."""
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _is_union_tag(p)))
    if len(loc) > 1 and loc[0] in ("prefill", "decode") and loc[1] in FORM_TAGS:
        loc = loc[:1] + loc[2:]  # the role's form (one mapping or a list), not a key
    shown_key = dotted(loc) or "(top level)"
    line = nearest_line(loc, lines)
    where = f"{source}:{line}" if line else source
    kind = err["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        valid = _valid_keys(schema, parent)
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
        fix = f"did you mean '{dotted((*parent, close[0]))}'?" if close else (
            f"valid keys here: {', '.join(valid)}"
        )
        return f"{where}: unknown key '{shown_key}'; {fix}"
    if kind == "missing":
        return f"{where}: missing required key '{shown_key}'; add it (see etc/pdsvc.yaml)"
    msg = err["msg"]
    msg = re.sub(r"^Value error, ", "", msg)
    if kind == "model_type":  # pydantic names the model class, which the user never wrote
        msg = "must be a mapping of keys" + (
            " (one engine) or a list of them (one engine each)"
            if loc in (("prefill",), ("decode",)) else ""
        )
    given = err.get("input")
    shown = "" if isinstance(given, (dict, list)) or kind.startswith("value_error") else (
        f" (got {_short(repr(given))})"
    )
    return f"{where}: {shown_key}: {msg}{shown}"


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[:most] + "…"


def _is_union_tag(part: str) -> bool:
    # pydantic inserts the union member's type name into loc ("literal['auto']", "int", …)
    scalar = part in {"int", "str", "float", "bool"}
    return scalar or part.startswith(("literal[", "list[", "constrained-", "function-"))


def nearest_line(loc: tuple, lines: dict[tuple, int]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _valid_keys(schema: type, parent: tuple) -> list[str]:
    model: Any = schema
    for i, part in enumerate(parent):
        if isinstance(part, int):
            continue  # the list item's model was chosen at its key
        field = model.model_fields.get(str(part)) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        listed = i + 1 < len(parent) and isinstance(parent[i + 1], int)
        mapping, item = model_forms(field.annotation)
        model = item if listed else mapping
    return list(model.model_fields) if hasattr(model, "model_fields") else []
