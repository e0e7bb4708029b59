"""`pdsvc apply` across hosts in the host lab: the 2P1D lab over four real systemd containers
(tests/support/host_labs.py, shared with tests/test_e2e_hosts.py: lb runs the real router,
gpu-a and gpu-b a prefill each, gpu-c the decode) under steady load through the router.

A pair-compatible change of both prefills touches two hosts. The dry run on lb prints the
global plan and each host's command in order (docs/apply.md, "Several hosts"); each command
is run on its host as printed, one after the other, each with that host's own copy of the
config and of the running bundle. Checked, from each container's systemd: only the two
prefills restarted, in the printed order, one at a time (the second stopped only once the
first was active again), the router and the decode not at all, and no request failed. The
commands that go back, as the last host printed them, are run too, the same way.
"""

from __future__ import annotations

import re
import shlex
import time

import pytest
import yaml
from fleet import Fleet
from loadgen import Load, failures
from stack import engine_pid

pytestmark = pytest.mark.e2e

APPLY = "/var/lib/pdsvc-apply"  # each host's copy: /srv/e2e is the lab's read-only share
PREFILLS = {"gpu-a": "e2e-prefill-0.service", "gpu-b": "e2e-prefill-1.service"}
BOUNDS = ("--drain-timeout", "20", "--step-timeout", "120")
TIMES = ("InvocationID", "ActiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")


def run_printed(lab: Fleet, host: str, command: str):
    """A command pdsvc printed, on HOST as printed (root there: no sudo; `pdsvc` is this
    checkout's, Fleet.cli)."""
    words = shlex.split(command)
    assert words[:2] == ["sudo", "pdsvc"], command
    return lab.cli(host, *words[2:], timeout=400)


def host_lines(out: str) -> list[tuple[str, str]]:
    """(host, command) of each `  N. on HOST (steps …): COMMAND` line, in order."""
    return re.findall(r"^  \d+\. on (\S+) \(steps [\d, ]+\): (.+)$", out, re.M)


def going_back(err: str) -> list[tuple[str, str]]:
    """(host, command) of the last `to go back: on HOST: CMD; then on HOST: CMD` apply said."""
    said = re.findall(r"to go back: (.+)\)$", err, re.M)[-1]
    return [tuple(p.split(": ", 1)) for p in said.removeprefix("on ").split("; then on ")]


def restarts(lab: Fleet) -> dict[str, dict[str, str]]:
    """HOST/UNIT -> its InvocationID and when (CLOCK_MONOTONIC, µs: one clock for every
    container of the lab) it last left and entered active, for every unit of every host."""
    return {f"{h}/{u}": lab.hosts[h].show(u, *TIMES) for h in lab.hosts for u in lab.units_on(h)}


def roll(lab: Fleet, commands: list[tuple[str, str]]) -> list[str]:
    """Run each host's command on it, in order; the stderr of each."""
    said = []
    for host, command in commands:
        r = run_printed(lab, host, command)
        assert r.returncode == 0, f"on {host}: {command}\n{r.stdout}{r.stderr}"
        said.append(r.stderr)
    return said


def check_order(lab: Fleet, before: dict, hosts: list[str]) -> float:
    """Only the prefills of `hosts` restarted, in that order, one at a time; the seconds from
    the first one's stop to the last one's return."""
    after = restarts(lab)
    changed = [n for n in after if after[n]["InvocationID"] != before[n]["InvocationID"]]
    assert sorted(changed) == sorted(f"{h}/{PREFILLS[h]}" for h in hosts), changed
    times = [(int(after[f"{h}/{PREFILLS[h]}"]["ActiveExitTimestampMonotonic"]),
              int(after[f"{h}/{PREFILLS[h]}"]["ActiveEnterTimestampMonotonic"])) for h in hosts]
    for (went, back), (went_next, _) in zip(times, times[1:], strict=False):
        assert went < back < went_next, times  # the next one stopped only once this one was back
    return (times[-1][1] - times[0][0]) / 1e6


def test_apply_across_hosts_restarts_in_the_printed_order_while_serving(
        four_hosts: Fleet) -> None:
    lab = four_hosts
    lb = lab.hosts["lb"]
    lb.wait_for(lambda: [w[3] for w in lab.workers()] == [True] * 3, 90, interval=0.5,
                what="every worker healthy in the router")
    cfg = yaml.safe_load((lab.work / "config.yaml").read_text())
    for p in cfg["prefill"]:
        p["args"] = {"max-running-requests": 48}
    for c in lab.hosts.values():  # each host's copy of the running bundle and of the config
        c.run(["rm", "-rf", APPLY])  # it was rendered from (../config.yaml, as its record
        c.run(["mkdir", "-p", APPLY])  # says), edited there
        c.run(["cp", "-a", "/srv/e2e/units", APPLY])
        c.write_file(f"{APPLY}/config.yaml", yaml.safe_dump(cfg))
    where = ("-c", f"{APPLY}/config.yaml", "--topology", "/srv/e2e/topology.json",
             "-o", f"{APPLY}/units")

    # the router last: a change of it too puts lb's step after every engine host's (plan only)
    also = {**cfg, "router": {**cfg["router"], "policy": "round_robin"}}
    lb.write_file(f"{APPLY}/also.yaml", yaml.safe_dump(also))
    dry = lab.cli("lb", "apply", "-c", f"{APPLY}/also.yaml", *where[2:], "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert [h for h, _ in host_lines(dry.stdout)] == ["gpu-a", "gpu-b", "lb"], dry.stdout

    dry = lab.cli("lb", "apply", *where, *BOUNDS, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "serving: never stops" in dry.stdout, dry.stdout
    plan = host_lines(dry.stdout)
    order = [h for h, _ in plan]
    assert sorted(order) == ["gpu-a", "gpu-b"], dry.stdout  # lb and gpu-c: nothing changes

    before = restarts(lab)
    load = Load(f"http://127.0.0.1:{lab.plan['router']['port']}/generate", rate=6,
                netns=lab.lab.netns("lb"), timeout=20, seed=7)
    with load:
        time.sleep(2)
        t0 = time.monotonic()
        said = roll(lab, plan)
        seconds = time.monotonic() - t0
        rollout = check_order(lab, before, order)
        # each host ran only its own steps, numbered as in the global plan, and named the next
        for i, ((host, _), err) in enumerate(zip(plan, said, strict=True), 1):
            assert f"on {host}: steps {i} of 2" in err, err
            assert f"step {i}/2: restart {host}/{PREFILLS[host]}" in err, err
        assert f"next, on {plan[1][0]} (steps 2): {plan[1][1]}" in said[0], said[0]
        for host in order:
            pid = engine_pid(lab.hosts[host], PREFILLS[host])
            argv = lab.hosts[host].run(["cat", f"/proc/{pid}/cmdline"]).stdout
            assert "--max-running-requests\x0048" in argv, argv

        # the config the lab rendered from was edited in place: apply says the way back needs
        # it, and where; it goes there (the lab has it in /srv/e2e)
        for (host, _), err in zip(plan, said, strict=True):
            [kept] = re.findall(r"--rollback will need it in (\S+)$", err, re.M)
            lab.hosts[host].run(["sh", "-c", f"cd / && cp /srv/e2e/config.yaml {kept}"])
        # back, as the last host printed it: that host first, then the one before it
        back = going_back(said[-1])
        assert [h for h, _ in back] == order[::-1], back
        before = restarts(lab)
        t1 = time.monotonic()
        roll(lab, back)
        back_seconds = time.monotonic() - t1
        check_order(lab, before, order[::-1])
        time.sleep(2)
    for host in order:
        assert "max-running-requests" not in lab.hosts[host].show(
            PREFILLS[host], "ExecStart")["ExecStart"]
    failed = failures(load.results)
    print(f"\nBENCH [{lab.plan['router']['package']}] apply across hosts ({' then '.join(order)}"
          f", one prefill each): {len(load.results)} requests sent, {sum(failed.values())} "
          f"failed, {load.skipped} skipped; rollout {rollout:.1f} s by systemd ({seconds:.1f} s"
          f" of apply commands), back {back_seconds:.1f} s")
    assert len(load.results) > 60 and not failed and not load.skipped, failed
    lb.wait_for(lambda: [w[3] for w in lab.workers()] == [True] * 3, 60, interval=0.5,
                what="every worker healthy again")
