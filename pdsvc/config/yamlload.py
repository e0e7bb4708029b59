"""Strict YAML loading of the config: UTF-8 only, bounded in size and in what aliases
expand to, no duplicate keys. Every refusal is a one-line ConfigError naming file:line.

PyYAML (like YAML 1.1 itself) keeps the last of two equal keys silently, and expands aliases
without limit: 446 bytes of nested aliases ("billion laughs") make tens of millions of nodes,
which pydantic would then walk for minutes. Both are caught on the composed node graph, before
anything is constructed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdsvc.encode import one_line
from pdsvc.errors import ConfigError

if TYPE_CHECKING:  # yaml is imported when a config is parsed, not when a cached plan is read
    import yaml

#: Largest config accepted: a real one is a few KiB; this keeps every rendered line (an
#: ExecStart= of all `args`, escaped) far below systemd's LONG_LINE_MAX (1 MiB).
MAX_CONFIG_BYTES = 256 * 1024
#: Most nodes the document may expand to, aliases counted at each use.
MAX_NODES = 50_000
MERGE_TAG = "tag:yaml.org,2002:merge"

def decode_config(data: bytes, source: str) -> str:
    """The config file's bytes as text: UTF-8, else a one-line error
    saying where the first undecodable byte is."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{one_line(source)}:{line}: the config is not UTF-8 (byte "
            f"0x{data[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None


def load(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """(the data, its node graph for line numbers) of one YAML document, strictly."""
    import yaml

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: the config is {size} bytes; at most {MAX_CONFIG_BYTES} "
                          "are read (a real one is a few KiB)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)  # libyaml: ~10x faster
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_graph(node, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML: {one_line(problem)}") from None
    finally:
        loader.dispose()
    return data, node


def _check_graph(root: yaml.Node, source: str) -> None:
    """Refuse duplicate keys and documents whose aliases expand past MAX_NODES."""
    import yaml

    count = 0
    stack = [root]
    checked: set[int] = set()  # mappings already checked for duplicates (an alias repeats one)
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(
                f"{source}:{node.start_mark.line + 1}: the config expands to more than "
                f"{MAX_NODES} values (through YAML aliases); write it out plainly")
        if isinstance(node, yaml.MappingNode):
            if id(node) not in checked:
                checked.add(id(node))
                _no_duplicate_keys(node, source)
            for key, value in node.value:
                stack += (key, value)
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def _no_duplicate_keys(node: yaml.MappingNode, source: str) -> None:
    import yaml

    seen: dict[tuple[str, str], int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
            continue  # `<<: *base` overrides by design; complex keys fail in the schema
        line = key.start_mark.line + 1
        ident = (key.tag, key.value)
        if ident in seen:
            raise ConfigError(
                f"{source}:{line}: duplicate key '{one_line(key.value)}' (also on line "
                f"{seen[ident]}); YAML would keep the last silently, so remove one")
        seen[ident] = line
