"""The flow of `pdsvc apply`, once the command has the bundle to apply (a fresh render, or the
kept previous one for --rollback): compare it with the bundle in OUTPUT (the running one),
plan the rollout, print it (--dry-run stops there), ask before an outage, keep the running
bundle and install the new one, run this host's steps one at a time (holds leased while they
run, every one released at the end), then say how to go back and, across hosts, what runs
next. The command (cli/apply.py) parses the options and gives the flow its Frontend: where it
prints and asks, how it shows a path, where install.sh lies."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pdsvc.apply import events
from pdsvc.apply.bounds import DRAIN_SECS, STEP_SECS, Bounds
from pdsvc.apply.bundles import (
    APPLIED,
    PREVIOUS,
    as_bundle,
    install,
    keep_previous,
    read_bundle,
    running_config,
    save_applied,
)
from pdsvc.apply.events import ApplyEvent, InstallFailed, StepDone, StepStarted
from pdsvc.apply.execute import Executor, StepFailed
from pdsvc.apply.host import LocalHost
from pdsvc.apply.hosts import bundle_units, hosts_of
from pdsvc.apply.order import host_steps
from pdsvc.apply.order import plan as plan_apply
from pdsvc.apply.rollout import Rollout, Step, format_rollout
from pdsvc.apply.targets import (
    apply_command,
    format_hosts,
    host_commands,
    hosts_before,
    make_manager,
    manager_name,
    next_host,
)
from pdsvc.errors import ConfigError, OutputError
from pdsvc.render.bundle import Origin, write_bundle
from pdsvc.render.kit import File
from pdsvc.ship.runtime.hold import Hold, hold_path

#: Exit status when the operator declines (or cannot be asked about) an outage.
DECLINED = 3
#: Exit status when the install or a step failed (the rollout stopped there).
FAILED = 1

HostCommands = list[tuple[str, list[int], str]]  # (host, its global steps, its command)


class Frontend(Protocol):
    """What the command gives the flow."""

    def echo(self, text: str) -> None:
        """The plan (stdout)."""
        ...

    def say(self, text: str) -> None:
        """Progress (stderr)."""
        ...

    def event(self, e: ApplyEvent) -> None:
        """A step started, done or failed, the install failed (events.py): typed, for a
        program to decide on; a terminal prints ``words(e)``."""
        ...

    def confirm(self, question: str) -> bool | None:
        """The operator's answer; None without a terminal to ask on."""
        ...

    def shown(self, path: Path) -> str:
        """A path as the user types it from where they stand."""
        ...

    def installer(self) -> Path | None:
        """The install.sh that comes with this pdsvc; None when there is none."""
        ...


@dataclass(frozen=True)
class Options:
    """What the command line asks of the rollout."""

    output: Path
    sysfs_root: Path | None = None
    topology: Path | None = None
    dry_run: bool = False
    as_json: bool = False
    yes: bool = False
    drain_secs: float = DRAIN_SECS
    step_secs: float = STEP_SECS
    force: bool = False
    rollback: bool = False
    on_host: str | None = None
    socket: str | None = None


@dataclass(frozen=True)
class Source:
    """The bundle to apply: its files, the config file it is applied from (--rollback: the
    kept one) and the config its record names (`origin`)."""

    files: list[File]
    config: Path
    origin: Path


def _bound_options(opts: Options) -> tuple[str, ...]:
    """The bounds given on this command line that each host's command repeats (defaults are
    left out)."""
    out: list[str] = []
    for flag, value, default in (("--drain-timeout", opts.drain_secs, DRAIN_SECS),
                                 ("--step-timeout", opts.step_secs, STEP_SECS)):
        if value != default:
            out += [flag, f"{value:g}"]
    return tuple(out)


def _rollback_command(output: Path, shown: Callable[[Path], str],
                      on_host: str | None = None) -> str:
    """The command that goes back; across hosts one per host, OUTPUT as given (the same path
    on every host, as each host's apply command has it)."""
    if on_host:
        return shlex.join(["sudo", "pdsvc", "apply", "--rollback", "--output", str(output),
                           "--host", on_host])
    return f"sudo pdsvc apply --rollback --output {shown(output)}"


def _going_back(opts: Options, sequence: HostCommands, shown: Callable[[Path], str]) -> str:
    """The commands that go back: this host's; across hosts, then each host that ran its
    steps before this one, the latest first (each with its own copy of OUTPUT)."""
    if not opts.on_host:
        return _rollback_command(opts.output, shown)
    return "; then ".join(f"on {h}: {_rollback_command(opts.output, shown, h)}" for h in
                          [opts.on_host, *reversed(hosts_before(sequence, opts.on_host))])


def _show_plan(opts: Options, new: dict[str, str], rollout: Rollout, sequence: HostCommands,
               fe: Frontend) -> None:
    """The plan, as text or (--json) as JSON, with each host's command across hosts."""
    if opts.as_json:
        doc = {"format": "pdsvc-apply/1", "output": str(opts.output), "dry_run": opts.dry_run,
               "manager": manager_name(new), **rollout.to_dict()}
        if hosts_of(new):
            doc["hosts"] = [{"host": h, "steps": n, "command": c} for h, n, c in sequence]
        fe.echo(json.dumps(doc, indent=2))
        return
    fe.echo(format_rollout(rollout))
    for line in format_hosts(sequence):
        fe.echo(line)


def _confirm_outage(rollout: Rollout, fe: Frontend) -> int:
    """0 when the operator accepts the outage the plan states; else DECLINED."""
    steps = ", ".join(f"{rollout.steps.index(s) + 1} ({s.action} {', '.join(s.units)})"
                      for s in rollout.outage)
    fe.say(f"pdsvc apply: serving stops during step {steps}: requests fail until the engines "
           "are loaded again (their load time) or the router is back")
    answer = fe.confirm("Go ahead?")
    if answer is None:
        fe.say("pdsvc apply: not confirmed (no terminal): pass --yes to accept the outage")
        return DECLINED
    if not answer:
        fe.say("pdsvc apply: declined; nothing changed")
        return DECLINED
    return 0


def _keep_running(opts: Options, source: Source, old: dict[str, str], fe: Frontend) -> Path:
    """Keep the running bundle and its config for the way back; the config the installer
    records (a rollback's: the kept one, made the applied one first)."""
    if opts.rollback:
        save_applied(opts.output, source.config.read_bytes())
        return opts.output / APPLIED
    previous_config = running_config(opts.output, old, source.config)
    keep_previous(opts.output, previous_config)
    if previous_config is None:
        fe.say(f"pdsvc apply: note: the config of the running bundle is not kept (edited "
               f"since it was rendered): --rollback will need it in "
               f"{fe.shown(opts.output / PREVIOUS)}/config.yaml")
    return source.config


def _install(opts: Options, source: Source, old: dict[str, str], manager: str, back: str,
             fe: Frontend) -> int:
    """Keep the running bundle, write the new one (recorded as `origin`'s), install it (no
    restart): install.sh for systemd (this host's bundle of several); a supervisord bundle
    runs where it lies, and its supervisord re-reads it at each step. 0, or FAILED."""
    script = fe.installer()
    if script is None and manager == "systemd":
        raise OutputError("install.sh not found beside pdsvc", hint="run from a pdsvc checkout")
    config = _keep_running(opts, source, old, fe)
    # a rollback's bundle comes from another config file than the one its record names
    write_bundle(source.files, opts.output, origin=Origin(manager, source.origin),
                 force=opts.force or opts.rollback)
    if manager != "systemd" or script is None:
        fe.say(f"pdsvc apply: wrote {fe.shown(opts.output)}; supervisord re-reads it at each "
               "step")
        return 0
    bundle = opts.output / opts.on_host if opts.on_host else opts.output
    fe.say(f"pdsvc apply: installing {fe.shown(bundle)} "
           f"({shlex.join([str(script), '--bundle', str(bundle)])})")
    rc, lines = install(script, bundle, config, force=opts.force)
    for line in lines:
        fe.say(f"  {line}")
    if rc != 0:
        fe.event(InstallFailed(rc))
        fe.say(f"pdsvc apply: to go back: {back}")
        return FAILED
    return 0


def _run_steps(executor: Executor, mine: list[tuple[int, Step]], total: int, back: str,
               fe: Frontend) -> bool:
    """Each step in turn; False once one failed (the rest left as they were)."""
    for i, step in mine:
        fe.event(StepStarted(i, total, step.action, tuple(step.units), tuple(step.takes)))
        try:
            secs = executor.run_step(step)
        except StepFailed as e:
            left = [u for j, s in mine if j > i for u in s.units]
            fe.event(events.StepFailed(i, total, tuple(step.units), str(e)))
            if left:
                fe.say(f"pdsvc apply: stopped; not restarted (still the previous definition): "
                       f"{', '.join(left)}")
            fe.say(f"pdsvc apply: to go back: {back}")
            return False
        fe.event(StepDone(i, total, secs))
    return True


def _numbers(mine: list[tuple[int, Step]]) -> str:
    return ", ".join(str(i) for i, _ in mine) or "none"


def _run(opts: Options, new: dict[str, str], rollout: Rollout, back: str,
         fe: Frontend) -> bool:
    """This host's steps (all of them on one host), the holds leased while they run and
    released at the end, whatever the end (failed, interrupted, done). Whether all went
    through."""
    host = LocalHost()
    mine = host_steps(rollout, opts.on_host) if opts.on_host \
        else list(enumerate(rollout.steps, 1))
    executor = Executor(bundle_units(new), host, Bounds(opts.drain_secs, opts.step_secs),
                        fe.say, make_manager(new, opts.on_host, host, opts.output, opts.socket))
    total = len(rollout.steps)
    if opts.on_host:
        fe.say(f"pdsvc apply: on {opts.on_host}: steps {_numbers(mine)} of {total}")
    executor.lease.start()  # renews every hold while apply runs (pdsvc/apply/lease.py)
    try:
        return _run_steps(executor, mine, total, back, fe)
    finally:  # never leave a hold behind: failed, interrupted (Ctrl-C) or done
        executor.lease.stop()
        released = executor.release_all()
        if released:
            fe.say(f"pdsvc apply: released the hold on {', '.join(released)}")


def _done(opts: Options, source: Source, rollout: Rollout, sequence: HostCommands, back: str,
          fe: Frontend) -> None:
    """Record the config applied, say where the way back is and, across hosts, what next."""
    if not opts.rollback:
        save_applied(opts.output, Path(source.config).read_bytes())
    total = len(rollout.steps)
    done = f"steps {_numbers(host_steps(rollout, opts.on_host))} of {total}" \
        if opts.on_host else f"{total} steps"
    fe.say(f"pdsvc apply: applied ({done}); the previous bundle is in "
           f"{fe.shown(opts.output / PREVIOUS)} (to go back: {back})")
    following = next_host(sequence, opts.on_host) if opts.on_host else None
    if following:
        host_, steps_, command = following
        fe.say(f"pdsvc apply: next, on {host_} (steps {', '.join(map(str, steps_))}): "
               f"{command}")


def _compare(opts: Options, source: Source) -> tuple[dict[str, str], dict[str, str]]:
    """(the running bundle in OUTPUT, the new one); refused without a running one, or for a
    --host that is none of the deployment's."""
    old = read_bundle(opts.output)
    if not bundle_units(old):
        raise ConfigError(f"{opts.output}: no rendered bundle here to compare with",
                          hint="the first time: pdsvc render && sudo ./install.sh "
                          "--start; later: pdsvc apply")
    new = as_bundle(source.files)
    hosts = hosts_of(new)
    if opts.on_host and opts.on_host not in hosts:
        raise ConfigError(f"--host {opts.on_host}: not a host of this deployment",
                          hint=f"one of: {', '.join(hosts)}" if hosts else "drop --host")
    return old, new


def _refuse_profiled(bundles: list[dict[str, str]]) -> None:
    """A hold `pdsvc profile` keeps (an engine writing its trace, its runtime not judging
    it) is not apply's to replace: apply writes and removes the same NAME.hold.json."""
    for bundle in bundles:
        for u in bundle_units(bundle).values():
            name = u.option("--name", u.local_name.removesuffix(".service"))
            path = hold_path(u.option("--state-dir") or None, name) if u.kind == "engine" \
                else None
            found = Hold(path).profile() if path else None
            if found:
                run, until = found
                raise OutputError(f"{name} is held by pdsvc profile (run {run}, at most until "
                                  f"{time.strftime('%H:%M:%S', time.localtime(until))}): a "
                                  "rollout would replace its hold while it writes its trace",
                                  hint="wait for pdsvc profile to end, then apply")


def apply_rollout(opts: Options, source: Source, fe: Frontend) -> int:
    """The whole flow (the module's doc); the exit status (0, FAILED or DECLINED). Raises
    ConfigError or OutputError for what cannot be applied as asked."""
    old, new = _compare(opts, source)
    rollout = plan_apply(old, new)
    base = apply_command(None if opts.rollback else source.config, opts.output,
                         topology=opts.topology, sysfs_root=opts.sysfs_root,
                         options=_bound_options(opts))
    sequence = host_commands(rollout, base) if hosts_of(new) else []
    back = _going_back(opts, sequence, fe.shown)
    _show_plan(opts, new, rollout, sequence, fe)
    if opts.dry_run:
        return 0
    if hosts_of(new) and not opts.on_host:
        raise ConfigError(f"{source.config}: a deployment over several hosts: pdsvc apply runs "
                          "one host's steps where it runs (no remote execution)",
                          hint="run the commands above on each host, in that order "
                          "(--dry-run prints them)")
    same = {p: t for p, t in old.items() if p in new} == new and old.keys() <= new.keys()
    if rollout.nothing_to_do and same:
        fe.say("pdsvc apply: nothing to do")
        return 0
    if rollout.outage and not opts.yes and _confirm_outage(rollout, fe):
        return DECLINED
    _refuse_profiled([old, new])
    if _install(opts, source, old, manager_name(new), back, fe) or \
            not _run(opts, new, rollout, back, fe):
        return FAILED
    _done(opts, source, rollout, sequence, back, fe)
    return 0
