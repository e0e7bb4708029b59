"""The engines' sections of the config: `prefill` and `decode`, each one mapping (one engine)
or a list of instances (xPyD), the ports an instance gets from its index, and Instance: one
engine of the config with every port resolved.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator

from pdsvc.config.fields import (
    ArgValue,
    EnvName,
    EnvValue,
    FlagName,
    GpuIndex,
    Port,
    Strict,
    TpSize,
    dotted,
    no_repeats,
)
from pdsvc.config.owned import OWNED_ENGINE_FLAGS, check_arg_values, check_env, check_flags
from pdsvc.sglang import DIST_INIT_SPAN

#: Ports of instance i of a role, when the config does not give them (i = 0 is also the
#: single-mapping default): HTTP ports interleave (prefill even, decode odd), each prefill gets
#: its own bootstrap port (sglang #20952), and the dist-init bases step by 200 so that every
#: base, prefill's and decode's, is 100 from the next and no other port falls in a base's span.
PREFILL_PORT, DECODE_PORT, PORT_STEP = 30000, 30001, 2
BOOTSTRAP_PORT = 8998
PREFILL_DIST_INIT, DECODE_DIST_INIT, DIST_INIT_STEP = 30335, 30435, 2 * DIST_INIT_SPAN


#: the keys each engine of a role's list form has for itself: its GPUs, their NUMA node and
#: where it listens. The others (tp, args, env, …) say what the engine is; `pdsvc tune` lays a
#: role out anew (a list as a lever's value) by keeping those and dropping these.
PER_ENGINE_KEYS = ("gpus", "numa_node", "port", "dist_init_port", "bootstrap_port")


class RoleConfig(Strict):
    gpus: list[GpuIndex] = Field(min_length=1, max_length=1024)
    numa_node: Literal["auto"] | int = Field(
        "auto", description="auto: the node of the role's GPUs, read from the host; or a node id."
    )
    port: Port
    tp: TpSize | None = Field(
        None, description="Default: len(gpus) × the number of hosts that run the engine."
    )
    dist_init_port: Port
    args: dict[FlagName, ArgValue] = Field(
        default_factory=dict,
        description="Extra launch_server flags, `flag-name: value` (true: bare flag).",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="Env for this role only."
    )

    @field_validator("numa_node", mode="before")
    @classmethod
    def _numa(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1024):
            return v
        raise ValueError(f"must be 'auto' or a NUMA node number (0, 1, … 1023), got {v!r}")

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        return no_repeats(v, "GPU ")

    @field_validator("args")
    @classmethod
    def _not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_arg_values(check_flags(v, OWNED_ENGINE_FLAGS, "launch_server"))

    @field_validator("env")
    @classmethod
    def _env_not_owned(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_env(v)


class PrefillConfig(RoleConfig):
    gpus: list[GpuIndex] = Field(
        [0, 1, 2, 3], min_length=1, max_length=1024,
        description="GPU indices (nvidia-smi / PCI bus order).",
    )
    port: Port = Field(PREFILL_PORT, description="HTTP port (bound on 127.0.0.1).")
    dist_init_port: Port = Field(
        PREFILL_DIST_INIT, description="--dist-init-addr port; base+1…+99 stay free for SGLang."
    )
    bootstrap_port: Port = Field(
        BOOTSTRAP_PORT,
        description="KV bootstrap server; the same value goes to decode and the router.",
    )


class DecodeConfig(RoleConfig):
    gpus: list[GpuIndex] = Field(
        [4, 5, 6, 7], min_length=1, max_length=1024,
        description="GPU indices (nvidia-smi / PCI bus order).",
    )
    port: Port = Field(DECODE_PORT, description="HTTP port (bound on 127.0.0.1).")
    dist_init_port: Port = Field(DECODE_DIST_INIT, description="≥100 from prefill's.")
    restart_with_prefill: Literal["auto"] | bool = Field(
        "auto",
        description="Restart decode whenever prefill restarts — any prefill, when there are "
        "several (auto: on for nixl with one prefill, sglang #33789; with several, a stale "
        "pair is healed by the pair canary instead, one engine at a time).",
    )


# List form: `prefill: [{gpus: …}, {gpus: …}]` runs one engine per item (xPyD on one host). An
# item takes the keys of the single mapping; it must name its GPUs, and the ports it leaves out
# are allocated from its index. Each item has its own args/env (no role-level defaults). A
# decode item's restart_with_prefill: true couples it to *every* prefill (a decode holds
# transfer state per prefill, sglang #33789); `auto` couples only to a single prefill.


class PrefillInstance(PrefillConfig):
    """One item of `prefill:` in list form. Its ports may be left out (None: allocated from
    the index, then set on the PrefillConfig made of it), so their type widens the base's:
    mypy's [assignment] on each says so and is silenced there, for that reason only."""

    gpus: list[GpuIndex] = Field(
        min_length=1, max_length=1024,
        description="List form, `prefill: [{gpus: …}, …]`: one engine per item (units "
        "NAME-prefill-0, NAME-prefill-1, … when several), each with its own GPUs (required, "
        "disjoint), args and env; ports left out are allocated from the index i.",
    )
    port: Port | None = Field(  # type: ignore[assignment]
        None, description=f"Default: {PREFILL_PORT} + {PORT_STEP}×i."
    )
    dist_init_port: Port | None = Field(  # type: ignore[assignment]
        None, description=f"Default: {PREFILL_DIST_INIT} + {DIST_INIT_STEP}×i."
    )
    bootstrap_port: Port | None = Field(  # type: ignore[assignment]
        None,
        description=f"Default: {BOOTSTRAP_PORT} + i; one per prefill (sglang #20952). The router "
        "gets each with its URL; every decode's --disaggregation-bootstrap-port is prefill[0]'s.",
    )


class DecodeInstance(DecodeConfig):
    """One item of `decode:` in list form; its ports widen the base's as PrefillInstance's."""

    gpus: list[GpuIndex] = Field(
        min_length=1, max_length=1024,
        description="List form, `decode: [{gpus: …}, …]`: one engine per item (units "
        "NAME-decode-0, NAME-decode-1, … when several), each with its own GPUs (required, "
        "disjoint), args and env; ports left out are allocated from the index i.",
    )
    port: Port | None = Field(  # type: ignore[assignment]
        None, description=f"Default: {DECODE_PORT} + {PORT_STEP}×i."
    )
    dist_init_port: Port | None = Field(  # type: ignore[assignment]
        None, description=f"Default: {DECODE_DIST_INIT} + {DIST_INIT_STEP}×i."
    )
    restart_with_prefill: Literal["auto"] | bool = Field(
        "auto",
        description="Per decode instance: restart it whenever ANY prefill (re)starts "
        "(auto: on for nixl with one prefill, sglang #33789; true with several prefills takes "
        "this decode, and the other prefills' pairs with it, down with each of them).",
    )


def _form(value: Any) -> str:
    return "list" if isinstance(value, list) else "mapping"


#: A role is one mapping (one engine, units NAME-prefill / NAME-decode as before) or a list of
#: instances (NAME-prefill-0, NAME-prefill-1, … when there are several).
PrefillSpec = Annotated[
    Annotated[PrefillConfig, Tag("mapping")]
    | Annotated[list[PrefillInstance], Field(min_length=1), Tag("list")],
    Discriminator(_form),
]
DecodeSpec = Annotated[
    Annotated[DecodeConfig, Tag("mapping")]
    | Annotated[list[DecodeInstance], Field(min_length=1), Tag("list")],
    Discriminator(_form),
]
FORM_TAGS = ("mapping", "list")


def model_forms(annotation: Any) -> tuple[Any, Any]:
    """(model of the mapping form, model of a list item) of a role field's annotation; either
    is None when the field has no such form (the config reference and error hints use it)."""
    mapping = item = None
    for member in typing.get_args(annotation) or (annotation,):
        while typing.get_origin(member) is Annotated:
            member = typing.get_args(member)[0]
        if typing.get_origin(member) is list:
            item = typing.get_args(member)[0]
        elif isinstance(member, type) and issubclass(member, BaseModel):
            mapping = member
    return mapping, item


@dataclass(frozen=True)
class Instance:
    """One engine of the config: the role's single mapping, or item `index` of its list."""

    role: Literal["prefill", "decode"]
    index: int | None  # None: the role is one mapping
    loc: tuple  # the key path of its settings: ("prefill",) or ("prefill", 1)
    cfg: Any  # PrefillConfig | DecodeConfig with every port set
    allocated: frozenset[str] = frozenset()  # port keys allocated, not given

    @property
    def key(self) -> str:
        """How errors name it: `prefill` or `prefill[1]`."""
        return dotted(self.loc)


def role_instances(role: Literal["prefill", "decode"], spec: Any) -> tuple[Instance, ...]:
    """The engines of a role's section (``spec``: one mapping or a list), each with every port
    resolved (allocated from its index when the list form leaves one out)."""
    if not isinstance(spec, list):
        return (Instance(role, None, (role,), spec),)
    out = []
    for i, item in enumerate(spec):
        if role == "prefill":
            wanted = {"port": PREFILL_PORT + PORT_STEP * i,
                      "dist_init_port": PREFILL_DIST_INIT + DIST_INIT_STEP * i,
                      "bootstrap_port": BOOTSTRAP_PORT + i}
        else:
            wanted = {"port": DECODE_PORT + PORT_STEP * i,
                      "dist_init_port": DECODE_DIST_INIT + DIST_INIT_STEP * i}
        allocated = {k: v for k, v in wanted.items() if getattr(item, k) is None}
        out.append(Instance(role, i, (role, i), item.model_copy(update=allocated),
                            frozenset(allocated)))
    return tuple(out)
