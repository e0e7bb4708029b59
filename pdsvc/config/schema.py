"""The config schema (pydantic, strict) and its loader with file:line error messages.

The config says *what* the user wants; pdsvc/plan/build.py turns it into every concrete value.
This module holds the top-level model and parse_config; the sections are in roles.py
(prefill, decode) and sections.py (the others), built from fields.py. Checks across sections
are checks.py, error messages errors.py; checks that need the host are the plan's
(pdsvc/plan/pinning.py). Every name other modules use is importable from here.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationError, field_validator

from pdsvc.config import yamlload
from pdsvc.config.checks import cross_field_problems
from pdsvc.config.errors import describe, line_index, nearest_line
from pdsvc.config.fields import Strict, Text, dotted
from pdsvc.config.owned import OWNED_ENV  # noqa: F401  (re-exported: the config's owned names)
from pdsvc.config.roles import (  # noqa: F401  (re-exported)
    BOOTSTRAP_PORT,
    DECODE_DIST_INIT,
    DECODE_PORT,
    DIST_INIT_STEP,
    PORT_STEP,
    PREFILL_DIST_INIT,
    PREFILL_PORT,
    DecodeConfig,
    DecodeInstance,
    DecodeSpec,
    Instance,
    PrefillConfig,
    PrefillInstance,
    PrefillSpec,
    RoleConfig,
    model_forms,
    role_instances,
)
from pdsvc.config.sections import (  # noqa: F401  (re-exported)
    RUN_REF,
    HealthCheckConfig,
    HostConfig,
    K8sConfig,
    LifecycleConfig,
    MetricsConfig,
    ModelConfig,
    RouterConfig,
    RuntimeConfig,
    SupervisordConfig,
    TransferConfig,
    expand_ref,
)
from pdsvc.encode import one_line
from pdsvc.errors import ConfigError

HostName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


class Config(Strict):
    name: Text = Field("dsv4", description="Prefix of every unit name.")
    format: Literal["systemd", "supervisord", "k8s"] = Field(
        "systemd",
        description="What `pdsvc render` writes by default (--format overrides): systemd units, "
        "a supervisord config for hosts and containers without systemd, or k8s manifests.",
    )
    model: ModelConfig
    runtime: RuntimeConfig = RuntimeConfig()
    transfer: TransferConfig = TransferConfig()
    prefill: PrefillSpec = PrefillConfig()
    decode: DecodeSpec = DecodeConfig()
    router: RouterConfig = RouterConfig()
    lifecycle: LifecycleConfig = LifecycleConfig()
    metrics: MetricsConfig = MetricsConfig()
    supervisord: SupervisordConfig = SupervisordConfig()
    k8s: K8sConfig = K8sConfig()
    hosts: dict[HostName, HostConfig] | None = Field(
        None,
        description="Several hosts: NAME → address, what runs there. `pdsvc render` then writes "
        "one bundle per host (units/NAME/) with its own target. Absent: everything on this "
        "host, engines on 127.0.0.1.",
    )

    @field_validator("hosts")
    @classmethod
    def _some_hosts(cls, v: dict | None) -> dict | None:
        if v is not None and not v:
            raise ValueError("must list at least one host (or leave `hosts` out for one host)")
        return v

    @field_validator("name")
    @classmethod
    def _unit_prefix(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}[a-z0-9]", v):
            raise ValueError(
                f"must be 2-32 lowercase letters, digits and dashes, starting with a letter, "
                f"got {v!r} (it names the units: NAME-prefill.service, …)"
            )
        return v

    def instances(self, role: Literal["prefill", "decode"]) -> tuple[Instance, ...]:
        """The role's engines, each with every port resolved (allocated from its index when
        the list form leaves one out)."""
        return role_instances(role, self.prefill if role == "prefill" else self.decode)

    @property
    def engines(self) -> tuple[Instance, ...]:
        """Every engine instance: the prefills, then the decodes."""
        return self.instances("prefill") + self.instances("decode")

    def placement(self) -> dict[str, tuple[str, ...]]:
        """Where each engine (by key: `prefill`, `decode[1]`) and the `router` run: host names
        in the order of `hosts` (an engine's first host is its node-rank 0). Empty without
        `hosts`. References that name nothing are left out (cross_field_problems reports them)."""
        out: dict[str, list[str]] = {}
        if not self.hosts:
            return {}
        by_role = {role: self.instances(role) for role in ("prefill", "decode")}
        for host, hc in self.hosts.items():
            for ref in hc.run:
                for key in expand_ref(ref, by_role):
                    out.setdefault(key, []).append(host)
        return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


# --------------------------------------------------------------------------- loading


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
