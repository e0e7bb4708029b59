"""Read rendered Kubernetes manifests as the kubelet would run them: a container's env and
command with Kubernetes' $(VAR) expansion applied."""

from __future__ import annotations

from typing import Any


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command word or env value (k8s.io/kubernetes
    third_party/forked/golang/expansion): `$$` -> `$`, `$(NAME)` -> its value when defined
    (else kept verbatim), any other `$` kept."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The literal env as the container sees it (each value expanded over the ones before)."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
    return env


def command_of(container: dict[str, Any]) -> tuple[str, ...]:
    """The command the container runs; LWS's own variables (set by its webhook) stay as
    references."""
    env = container_env(container)
    return tuple(expand(word, env) for word in container["command"])
