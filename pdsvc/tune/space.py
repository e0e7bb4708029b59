"""The search space of `pdsvc tune`: a YAML file beside the config (etc/tune/seed.yaml is the
seed deployment's) that names the levers and the values to try, the SLO and the workload.

    slo: {ttft_ms: 2000, itl_ms: 50}                 # per request; share 0.99 of them
    workload: {input_len: 1024, output_len: 256, num_prompts: 200}
    rates: {low: 0.5, high: 32, precision: 0.1}      # the SLO search's range (pdsvc bench)
    engine_load_secs: 600                            # for the estimate only
    repeats: 3                                       # the baseline and the best, each
    search: auto                                     # grid | one-at-a-time | auto
    max_grid: 16                                     # auto: a grid up to this many
    levers:
      decode.args.cuda-graph-max-bs: [16, 32, 64]
      decode.env.NCCL_PROTO: [LL, LL128, Simple]

A lever is a path into the config (`ROLE.args.FLAG`, `ROLE.env.VAR`, any key: `router.policy`);
a role given as a list (`prefill: [{…}, {…}]`) takes the value on every item, or on one with
`prefill[1].args.…`. `null` in a lever's values means "unset" (the flag left out).

**Layouts.** A value may also be a mapping or a list. A mapping is merged into the mapping at
the path (keys it names replaced, the others kept), so flags that only work together change
together: `decode.args: [{enable-dp-attention: true, dp-size: 4}]`, `decode: [{gpus: [4, 5],
tp: 2}]`. A list replaces the value at the path (`decode.gpus: [[4, 5, 6, 7], [4, 5]]`); at a
role's own path (`prefill`, `decode`) a list of mappings is the role's engines laid out anew:
each item is the role's engine as it is (tp, args, env, …) less what each engine has for
itself (config/roles.py PER_ENGINE_KEYS: GPUs, NUMA node, ports; left out, the ports come
from the index), with the item's keys over it: `prefill: [[{gpus: [0, 1], tp: 2}, {gpus: [2,
3], tp: 2}]]` is two TP2 prefills instead of one TP4. Each candidate's config is checked by
the schema and its plan against the host before anything restarts (check.py). The
candidates are the current config (the baseline) and, by ``search``: every combination
(grid), or each lever's values one at a time from the baseline, the other levers as they are
(the first round of a one-at-a-time search; later rounds start from each round's best, which
only measuring tells). ``auto``: the grid when it has at most ``max_grid`` candidates.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from pdsvc.config.roles import PER_ENGINE_KEYS
from pdsvc.errors import ConfigError

#: a lever's value: a YAML scalar (None: unset), or a layout (module docstring): a mapping
#: merged in, a list put in place
Value = str | int | float | bool | None | list[Any] | dict[str, Any]
SEARCHES = ("auto", "grid", "one-at-a-time")
#: how many times the baseline and the best are measured, unless the space says (``repeats``)
DEFAULT_REPEATS = 3
#: the most ``repeats`` a space may ask for (each is a whole SLO search)
MAX_REPEATS = 10
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)(?:\[(\d+)\])?$")
#: the keys a lever's path may start with: the config's sections that a candidate may change
ROOTS = ("prefill", "decode", "router", "runtime", "transfer", "lifecycle")
#: the roots a lever may be whole (its values: layouts of the role's engines)
ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Lever:
    path: str  # as written: decode.args.cuda-graph-max-bs
    values: tuple[Value, ...]

    def parts(self) -> list[tuple[str, int | None]]:
        """The path's keys: (key, item index or None), parsed by ``parse_space``."""
        out = []
        for segment in _split(self.path):
            m = _SEGMENT.match(segment)
            assert m is not None  # parse_space checked it
            out.append((m.group(1), int(m.group(2)) if m.group(2) is not None else None))
        return out


@dataclass(frozen=True)
class Space:
    ttft_ms: float
    itl_ms: float
    share: float
    input_len: int
    output_len: int
    num_prompts: int
    rate_low: float
    rate_high: float
    precision: float
    engine_load_secs: float
    search: Literal["auto", "grid", "one-at-a-time"]
    max_grid: int
    levers: tuple[Lever, ...]
    repeats: int = DEFAULT_REPEATS  # the baseline and the best are measured this many times

    @property
    def grid_size(self) -> int:
        return math.prod(len(lv.values) for lv in self.levers)

    @property
    def strategy(self) -> Literal["grid", "one-at-a-time"]:
        """What ``search: auto`` means for this space (and why: ``strategy_why``)."""
        if self.search == "auto":
            return "grid" if self.grid_size <= self.max_grid else "one-at-a-time"
        return self.search

    @property
    def strategy_why(self) -> str:
        if self.search != "auto":
            return f"search: {self.search}"
        how = "≤" if self.strategy == "grid" else ">"
        return (f"search: auto, and the grid has {self.grid_size} candidates ({how} max_grid "
                f"{self.max_grid})")


@dataclass(frozen=True)
class Candidate:
    """One config to measure: the baseline's, with ``changes`` (lever path -> value)."""

    name: str  # "baseline", or c1, c2, … in the order generated
    changes: tuple[tuple[str, Value], ...] = field(default=())

    def describe(self) -> str:
        return ", ".join(f"{p}={_show(v)}" for p, v in self.changes) or "the current config"


def _show(v: Value) -> str:
    if isinstance(v, (dict, list)):  # a layout: as YAML's flow style writes it, one line
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=1 << 16).strip()
    return "unset" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _split(path: str) -> list[str]:
    """``decode.args.cuda-graph-max-bs`` -> [decode, args, cuda-graph-max-bs]: a key after
    ``args``/``env`` is the flag or variable whole (dots and all)."""
    head, *rest = path.split(".")
    out = [head]
    for i, seg in enumerate(rest):
        if out[-1] in ("args", "env"):
            out.append(".".join(rest[i:]))
            break
        out.append(seg)
    return out


def _error(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: {problem}")


def _number(doc: dict, key: str, where: str, default: float | None, *, lo: float = 0.0,
            integer: bool = False) -> float:
    value = doc.get(key, default)
    if value is None:
        raise _error(f"{where}.{key}", "is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            integer and not isinstance(value, int)) or value <= lo:
        kind = "a whole number" if integer else "a number"
        raise _error(f"{where}.{key}", f"must be {kind} > {lo:g}, got {value!r}")
    return float(value)


def parse_space(text: str, source: str) -> Space:
    """The search space from its YAML text; one-line errors naming the key (ConfigError:
    exit 2)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: not YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(doc, dict):
        raise _error(source, "must be a mapping (slo, workload, levers, …)")
    known = {"slo", "workload", "rates", "engine_load_secs", "search", "max_grid", "levers",
             "repeats"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise _error(f"{source}: {unknown[0]}",
                     f"unknown key; the keys are {', '.join(sorted(known))}")
    slo, work, rates = (doc.get(k) or {} for k in ("slo", "workload", "rates"))
    for key, part in (("slo", slo), ("workload", work), ("rates", rates)):
        if not isinstance(part, dict):
            raise _error(f"{source}: {key}", "must be a mapping")
    share = _number(slo, "share", f"{source}: slo", 0.99)
    if share > 1:
        raise _error(f"{source}: slo.share", f"a share of requests, ≤ 1, got {share:g}")
    low = _number(rates, "low", f"{source}: rates", 0.5)
    high = _number(rates, "high", f"{source}: rates", 32.0)
    if high <= low:
        raise _error(f"{source}: rates.high", f"must be above rates.low ({low:g})")
    repeats = int(_number(doc, "repeats", source, DEFAULT_REPEATS, integer=True))
    if repeats > MAX_REPEATS:
        raise _error(f"{source}: repeats", f"at most {MAX_REPEATS} (each is a whole SLO "
                     f"search), got {repeats}")
    search = doc.get("search", "auto")
    if search not in SEARCHES:
        raise _error(f"{source}: search", f"one of {', '.join(SEARCHES)}, got {search!r}")
    return Space(
        ttft_ms=_number(slo, "ttft_ms", f"{source}: slo", None),
        itl_ms=_number(slo, "itl_ms", f"{source}: slo", None),
        share=share,
        input_len=int(_number(work, "input_len", f"{source}: workload", 1024, integer=True)),
        output_len=int(_number(work, "output_len", f"{source}: workload", 256, integer=True)),
        num_prompts=int(_number(work, "num_prompts", f"{source}: workload", 200,
                                integer=True)),
        rate_low=low, rate_high=high,
        precision=_number(rates, "precision", f"{source}: rates", 0.1),
        engine_load_secs=_number(doc, "engine_load_secs", source, 600.0),
        search=search,
        max_grid=int(_number(doc, "max_grid", source, 16, integer=True)),
        levers=_levers(doc.get("levers"), source),
        repeats=repeats,
    )


def _levers(raw: Any, source: str) -> tuple[Lever, ...]:
    if not isinstance(raw, dict) or not raw:
        raise _error(f"{source}: levers", "must map config paths to the values to try, e.g. "
                     "decode.args.cuda-graph-max-bs: [16, 32, 64]")
    out = []
    for path, values in raw.items():
        where = f"{source}: levers.{path}"
        segments = _split(str(path))
        if not isinstance(values, list) or not values:
            raise _error(where, "must be a list of the values to try")
        whole_role = len(segments) == 1 and segments[0] in ROLES
        if segments[0].split("[")[0] not in ROOTS or not all(
                _SEGMENT.match(s) or i and segments[i - 1] in ("args", "env")
                for i, s in enumerate(segments)) or (len(segments) < 2 and not whole_role):
            raise _error(where, f"not a config path; start with one of {', '.join(ROOTS)} "
                         "(e.g. decode.args.cuda-graph-max-bs, prefill[1].env.NCCL_ALGO; "
                         f"or {' or '.join(ROLES)} alone, its values layouts)")
        for v in values:
            _check_value(v, where, whole_role)
        if len({_canonical(v) for v in values}) != len(values):
            raise _error(where, "lists a value twice")
        out.append(Lever(str(path), tuple(values)))
    return tuple(out)


def _check_value(v: Any, where: str, whole_role: bool) -> None:
    """A lever's value: a YAML scalar, or a layout made of scalars, lists and mappings with
    string keys (never a YAML date or set); at a role's own path, a mapping or a list of
    mappings (the role's engines)."""
    if whole_role and not (isinstance(v, dict) or (
            isinstance(v, list) and v and all(isinstance(x, dict) for x in v))):
        raise _error(where, f"{_canonical(v)}: a value at a role's path is a mapping merged "
                     "into it, or a list of mappings (its engines, laid out anew)")
    if isinstance(v, dict):
        for key, item in v.items():
            if not isinstance(key, str):
                raise _error(where, f"{key!r}: a key of a layout is a string")
            _check_value(item, where, False)
    elif isinstance(v, list):
        for item in v:
            _check_value(item, where, False)
    elif not (v is None or isinstance(v, (str, int, float, bool))):
        raise _error(where, f"{v!r}: a value is a string, number, boolean, null, or a layout "
                     "(a list or mapping of those)")


def _canonical(v: Value) -> str:
    """A value as one canonical string (mappings' keys sorted): equal values, equal strings."""
    return json.dumps(v, sort_keys=True, separators=(",", ":"), default=repr)


# ------------------------------------------------------------------ the candidates
def current(config: dict, lever: Lever) -> Value:
    """The config's value at the lever's path (the first item's, for a role's list below the
    role's own path); None when it is not set."""
    node: Any = config
    for key, index in lever.parts():
        if isinstance(node, list):
            node = node[0] if node else {}
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
        if index is not None:
            if not isinstance(node, list) or index >= len(node):
                return None
            node = node[index]
    return copy.deepcopy(node)


def apply_changes(config: dict, changes: tuple[tuple[str, Value], ...],
                  levers: tuple[Lever, ...]) -> dict:
    """A copy of ``config`` with each change made (None: the key removed); a role given as a
    list takes it on every item unless the path names one."""
    out = copy.deepcopy(config)
    by_path = {lv.path: lv for lv in levers}
    for path, value in changes:
        _set(out, by_path[path].parts(), value)
    return out


def _set(node: Any, parts: list[tuple[str, int | None]], value: Value) -> None:
    if isinstance(node, list):  # a role's list form: every item
        for item in node:
            _set(item, parts, value)
        return
    (key, index), rest = parts[0], parts[1:]
    if index is not None:
        items = node.get(key)
        if not isinstance(items, list) or index >= len(items):
            raise ConfigError(f"{key}[{index}]: the config has no such item")
        if rest:
            _set(items[index], rest, value)
        else:
            items[index] = value
        return
    if not rest:
        if value is None:
            node.pop(key, None)
        elif isinstance(value, dict):
            node[key] = _merged(node.get(key), value)
        elif isinstance(value, list) and key in ROLES and value and all(
                isinstance(x, dict) for x in value):
            node[key] = _laid_out(node.get(key), value)
        else:
            node[key] = copy.deepcopy(value)
        return
    child = node.get(key)
    if child is None:
        if value is None:
            return  # unset under a section that is not there: nothing to remove
        child = node[key] = {}
    _set(child, rest, value)


def _merged(node: Any, value: dict[str, Any]) -> Any:
    """``value`` merged into ``node``: a mapping's keys over the node's, recursively (a role
    in list form: into every engine); anything else is replaced by ``value``."""
    if isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        return [_merged(x, value) for x in node]
    if not isinstance(node, dict):
        return copy.deepcopy(value)
    out = copy.deepcopy(node)
    for key, item in value.items():
        out[key] = _merged(out.get(key), item) if isinstance(item, dict) else \
            copy.deepcopy(item)
    return out


def _laid_out(role: Any, engines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A role's engines laid out anew: each the role's (first) engine less PER_ENGINE_KEYS,
    the item's keys merged over it."""
    first = role[0] if isinstance(role, list) and role else role
    engine = {k: v for k, v in (first if isinstance(first, dict) else {}).items()
              if k not in PER_ENGINE_KEYS}
    return [_merged(engine, item) for item in engines]


def is_baseline(config: dict, changes: tuple[tuple[str, Value], ...],
                levers: tuple[Lever, ...]) -> bool:
    """Whether the changes leave the config as it is (a layout equal to the config's own)."""
    return apply_changes(config, changes, levers) == config


def candidates(space: Space, config: dict) -> list[Candidate]:
    """The baseline first, then the strategy's candidates (module docstring); a value equal
    to the baseline's is the baseline, not a candidate."""
    base = {lv.path: current(config, lv) for lv in space.levers}
    out = [Candidate("baseline")]
    if space.strategy == "grid":
        combos = itertools.product(*(lv.values for lv in space.levers))
        changes = [tuple((lv.path, v) for lv, v in zip(space.levers, combo, strict=True)
                         if v != base[lv.path]) for combo in combos]
    else:
        changes = [((lv.path, v),) for lv in space.levers for v in lv.values
                   if v != base[lv.path]]
    seen: set[str] = set()
    for c in changes:
        key = _canonical([list(x) for x in c])
        if c and key not in seen and not is_baseline(config, c, space.levers):
            seen.add(key)
            out.append(Candidate(f"c{len(out)}", c))
    return out
