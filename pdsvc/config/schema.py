"""The config schema (pydantic, strict): the model of what a config may say.

The config says *what* the user wants; pdsvc/plan/build.py turns it into every concrete value.
This module holds the top-level model; loading a config (YAML, the model, the checks across
sections, file:line errors) is load.py's parse_config. The sections are in roles.py
(prefill, decode), router.py (the router, its front and VIP) and sections.py (the others),
built from fields.py. Checks across sections are checks.py, error messages errors.py; checks
that need the host are the plan's
(pdsvc/plan/pinning.py). Every name other modules use is importable from here.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from pdsvc.config.fields import Strict, Text
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
from pdsvc.config.router import HealthCheckConfig, RouterConfig  # noqa: F401  (re-exported)
from pdsvc.config.sections import (  # noqa: F401  (re-exported)
    RUN_REF,
    HostConfig,
    K8sConfig,
    LifecycleConfig,
    MetricsConfig,
    ModelConfig,
    RuntimeConfig,
    SupervisordConfig,
    TransferConfig,
    expand_ref,
)

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

    def cascade_hosts(self) -> tuple[str, ...]:
        """The hosts an engine serves from (its node-rank 0 runs there), in the order of
        `hosts`, when there are two or more: their engine runtimes share the heals and cures of
        a heal cascade over lifecycle.cascade_port (pdsvc/ship/runtime/cascade.py). Empty on one
        host, whose runtimes share a state directory."""
        serving = {where[0] for key, where in self.placement().items() if key != "router"}
        hosts = tuple(h for h in self.hosts or {} if h in serving)
        return hosts if len(hosts) > 1 else ()
