"""Config values as a command line and an environment: what the engines' and the routers'
plans both need (build.py, routing.py)."""

from __future__ import annotations


def env_str(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def flag_args(args: dict) -> list[str]:
    """`{flag: value}` -> argv: true -> bare flag, false -> omitted, list -> several values."""
    out: list[str] = []
    for flag, value in args.items():
        if value is False:
            continue
        out.append(f"--{flag}")
        if value is True:
            continue
        out += [env_str(v) for v in value] if isinstance(value, list) else [env_str(value)]
    return out
