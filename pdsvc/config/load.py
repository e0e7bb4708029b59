"""Loading a config: YAML text -> the validated model, every error on one line with its file
and line.

The model is schema.py's; the checks across sections are checks.py's (they read the model, so
they live apart from it: the model imports neither).
"""

from __future__ import annotations

from pydantic import ValidationError

from pdsvc.config import yamlload
from pdsvc.config.checks import cross_field_problems
from pdsvc.config.errors import describe, line_index, nearest_line
from pdsvc.config.fields import dotted
from pdsvc.config.schema import Config
from pdsvc.encode import one_line
from pdsvc.errors import ConfigError


def parse_config(text: str, source: str = "<config>") -> Config:
    """Validate YAML text against the schema; errors name the key, the line and the fix, on
    one line whatever the config holds (keys and values are shown escaped)."""
    source = one_line(source)
    # one parse: the node tree gives line numbers, the same tree gives the data
    data, node = yamlload.load(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of keys (name, model, …)")
    lines = line_index(node)
    try:
        config = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(describe(e.errors()[0], lines, source, Config))) from None
    for loc, problem in cross_field_problems(config):
        line = nearest_line(loc, lines)
        where = f"{source}:{line}" if line else source
        raise ConfigError(one_line(f"{where}: {dotted(loc)}: {problem}"))
    return config
