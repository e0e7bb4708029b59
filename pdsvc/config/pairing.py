"""Prefill and decode that could never pair: a check across the roles' `args` and `env`.

A decode refuses a prefill whose page size, KV cache dtype or KV layout differs from its own
when it first connects (pdsvc.sglang.PAIR_FLAGS / PAIR_ENV, from SGLang's
`try_ensure_parallel_info`). The model and the transfer backend are one setting for both
roles here, so only the roles' own `args` and `env` can make them differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdsvc.sglang import PAIR_ENV, PAIR_FLAGS

if TYPE_CHECKING:
    from pdsvc.config.roles import Instance
    from pdsvc.config.schema import Config


def _shown(value: Any) -> str:
    return "true" if value is True else str(value)


def _pair_values(inst: Instance, runtime_env: dict[str, Any]) -> dict[tuple, tuple]:
    """Key path of each setting -> (the value SGLang sees, None when neither set nor known;
    how to say it)."""
    out: dict[tuple, tuple] = {}
    env = {**runtime_env, **inst.cfg.env}
    given = [(("args", f.removeprefix("--")), inst.cfg.args.get(f.removeprefix("--")), d)
             for f, d in PAIR_FLAGS.items()]
    given += [(("env", v), env.get(v), d) for v, d in PAIR_ENV.items()]
    for key, value, default in given:
        if value is not None:
            out[key] = (_shown(value), f"is {_shown(value)!r}")
        else:
            out[key] = (default, "is not set" + (f" (SGLang's default: {default!r})"
                                                 if default is not None else ""))
    return out


def pair_problems(config: Config) -> list[tuple[tuple, str]]:
    """Each decode setting that no prefill of the config could pair with, as (key path,
    problem); every prefill×decode pair is checked (the router pairs any with any)."""
    runtime_env = dict(config.runtime.env)
    prefills = [(p, _pair_values(p, runtime_env)) for p in config.instances("prefill")]
    problems: list[tuple[tuple, str]] = []
    for d in config.instances("decode"):
        mine = _pair_values(d, runtime_env)
        for p, theirs in prefills:
            for key, value in mine.items():
                if theirs[key][0] == value[0]:
                    continue
                kind, name = key
                what = f"--{name}" if kind == "args" else name
                problems.append((d.loc + key, (
                    f"{value[1]} but {p.key}.{kind}.{name} {theirs[key][1]}: "
                    f"a decode refuses a prefill of another {what} when they connect (SGLang "
                    f"checks it), so they could never pair; give both the same {kind} value")))
                break
            else:
                continue
            break
    return problems
