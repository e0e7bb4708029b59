"""Plan -> the runtime's command line: the options of `python DIR/runtime engine|router …`,
composed once for every bundle (systemd, supervisord, k8s). Each service manager adds its own
(systemd: the poll interval; supervisord: the watchdog and kill bounds systemd has itself)."""

from __future__ import annotations

from pdsvc.plan.build import EnginePlan, Plan, RouterPlan


def engine_runtime_flags(plan: Plan, e: EnginePlan) -> list[str]:
    """What the runtime must know of an engine: name, health gate, GPUs, JIT cache."""
    return ["--name", e.name, "--health-url", e.health_url,
            "--gpus", ",".join(map(str, e.gpus)),
            "--jit-cache", plan.paths.jit_cache, "--jit-key", e.name]


def router_runtime_flags(plan: Plan, r: RouterPlan) -> list[str]:
    """What the runtime must know of the router: its readiness, generation and liveness URLs,
    and the engines of its host, whose giving up ends its wait for a generation."""
    engines = [x for e in plan.engines for x in ("--engine", e.name)]
    return ["--name", r.name, "--readiness-url", r.readiness_url,
            "--generate-url", r.generate_url, "--liveness-url", r.liveness_url, *engines]


def liveness_flags(plan: Plan) -> list[str]:
    lc = plan.lifecycle
    return ["--liveness-interval", str(lc.liveness_interval_secs),
            "--liveness-timeout", str(lc.liveness_timeout_secs)]


#: The name of the router's control-plane key among a unit's credentials (LoadCredential=).
KEY_CREDENTIAL = "router-key"


def key_spec(plan: Plan, manager: str) -> str:
    """How the runtime finds the control-plane key: a systemd credential (copied by systemd
    into the unit's private $CREDENTIALS_DIRECTORY, systemd.exec(5)), or the file itself."""
    return f"credential:{KEY_CREDENTIAL}" if manager == "systemd" else plan.paths.router_key


def policy_flags(plan: Plan, state_dir: str) -> list[str]:
    """The restart policy's knobs and where it keeps its state (every unit): a tmpfs directory
    that outlives a restart, not a reboot (a boot is a first start), and leaves no file behind
    on disk."""
    lc = plan.lifecycle
    textfile = ["--metrics-dir", metrics_dir(state_dir)] if plan.metrics.textfile else []
    return ["--state-dir", state_dir, "--deployment", plan.name,
            "--start-timeout", str(lc.start_timeout_secs),
            "--restart-delay", str(lc.restart_secs),
            "--restart-max-delay", str(lc.restart_backoff_max_secs),
            "--restart-reset", str(lc.restart_reset_secs),
            "--start-attempts", str(lc.start_attempts), *textfile]


def metrics_dir(state_dir: str) -> str:
    """Where the runtimes write their textfiles (node_exporter's --collector.textfile.directory)."""
    return f"{state_dir}/metrics"


def member_flags(plan: Plan, e: EnginePlan, manager: str) -> list[str]:
    """The busy-GPU wait, router membership, the pair canary and, with engines on several
    hosts, the heal cascade's channel between them of one engine (all but the first for rank 0
    only: the process serving HTTP)."""
    lc = plan.lifecycle
    flags = ["--gpu-wait", str(lc.gpu_wait_secs)]
    if not e.router_urls:
        return flags
    flags += routers_flags(e)
    flags += ["--role", e.role, "--advertise", e.url]
    if e.role == "prefill":
        flags += ["--bootstrap-port", str(e.bootstrap_port)]
    flags += ["--control-plane-key", key_spec(plan, manager)]
    for prefill, port, decode in e.pairs:
        flags += ["--pair", prefill, str(port), decode]
    for url in e.followers:
        flags += ["--follower", url]
    for url in e.siblings:  # engines of one role heal one at a time
        flags += ["--sibling", url]
    if e.siblings:
        flags += ["--heal-turn", str(e.heal_turn)]
    if e.pairs:
        flags += ["--canary-interval", str(lc.canary_interval_secs),
                  "--canary-failures", str(lc.canary_failures),
                  "--canary-timeout", str(lc.canary_timeout_secs),
                  "--canary-heals", str(lc.canary_heal_attempts),
                  "--restart-all", restart_all_command(plan, manager)]
    if e.fleet_listen:  # this host's heals and cures, served to the other engine hosts
        flags += ["--fleet-listen", e.fleet_listen]
    for address in e.fleet:  # and theirs, read (runtime/cascade.py)
        flags += ["--fleet", address]
    return flags


def leave_flags(plan: Plan, e: EnginePlan) -> list[str]:
    """`runtime leave`'s options (the unit's ExecStopPost=): the engine's entry in its router,
    taken out after any end of its runtime; [] for an engine that does not register. The key
    is read from its file (0640, the service's group), not from the unit's credentials: systemd
    gives those to the start commands only, never to ExecStop*= (systemd/systemd#24759,
    #32583)."""
    if not e.router_urls:
        return []
    return ["--name", e.name, *routers_flags(e), "--advertise", e.url,
            "--control-plane-key", plan.paths.router_key]


def routers_flags(e: EnginePlan) -> list[str]:
    """--router for each router the engine registers with."""
    return [x for url in e.router_urls for x in ("--router", url)]


def front_flags(plan: Plan, r: RouterPlan) -> list[str]:
    """`runtime front drain|ready`'s options for router ``r`` (its unit's ExecStop= and
    ExecStartPost=); [] without a front."""
    f = plan.front
    if f is None:
        return []
    return ["--name", r.name, "--socket", f.socket, "--backend", f.backend, "--server", r.name,
            "--timeout", str(f.drain_secs)]


def restart_all_command(plan: Plan, manager: str) -> str:
    """What an operator runs to restart every engine of the deployment at once (the cure of
    a heal cascade that came back, runtime/cascade.py): the target, or every engine program."""
    if manager == "systemd":
        return f"systemctl restart {plan.target}"
    names = " ".join(e.name for e in plan.engines)
    return f"supervisorctl -s unix://{plan.supervisord.control_socket} restart {names}"


def router_command(plan: Plan, r: RouterPlan, manager: str) -> tuple[str, ...]:
    """The router's command under the runtime: its launcher run by `runtime launch`, which adds
    the control-plane key in-process, with no workers: the engines register themselves."""
    return (r.argv[0], plan.paths.runtime, "launch", "--control-plane-key",
            key_spec(plan, manager), *r.argv[2:])


def peer_watch_flags(plan: Plan, e: EnginePlan) -> list[str]:
    """--restart-with for each prefill on another host (NIXL, sglang #33789): the recovery of
    one after liveness_failures failed probes is a restart."""
    flags: list[str] = []
    for url in e.peer_health:
        flags += ["--restart-with", url]
    if e.peer_health:
        flags += ["--peer-down-probes", str(plan.lifecycle.liveness_failures)]
    return flags
