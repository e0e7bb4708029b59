"""Several hosts, each a real systemd container in a network namespace of a NetLab, running
the per-host bundles `pdsvc render` writes for a config with `hosts:`.

`Fleet.up(work, venv, {"lb": ["router"], "gpu-a": ["prefill"], ...})` renders the e2e config
(tests/support/stack.py) with an inventory whose addresses are the lab's, boots one container
per host, and installs units/HOST/ on each with the real install.sh; `Fleet.start()` starts
them. Both follow docs/hosts.md's procedure for several hosts step by step ("Several hosts":
install on the router's host, which makes the control-plane key; copy that key to each host
whose install.list reads it and install there with --key-from; start the router without
waiting; on each other host `pdsvc doctor --host`, then start; on the router's host wait until
it serves, and `pdsvc status`). The lab does the copies (the bundle directory is bind-mounted,
the key goes as `scp` would take it). Nothing leaves the lab's namespaces: the engines bind the
lab addresses, the router dials them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from netlab import NetLab
from nspawn import SystemdContainer
from stack import REPO, curl, e2e_config, host_topology, pdsvc_argv


@dataclass
class Fleet:
    lab: NetLab
    name: str
    work: Path
    hosts: dict[str, SystemdContainer] = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    venv: Path = Path()
    #: each host's units' ActiveState right after start() returned
    started: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def up(cls, work: Path, venv: Path, run: dict[str, list[str]], **overrides: Any) -> Fleet:
        name = overrides.pop("name", "e2e")
        lab = NetLab(list(run))
        fleet = cls(lab=lab, name=name, work=work)
        try:
            if "router.vip" in overrides:  # the moving address: a free one of the lab's
                overrides["router.vip"] = {"address": lab.spare_address(),
                                           "interface": lab.device, **overrides["router.vip"]}
            inventory = {h: {"address": lab.address(h), "run": r,
                             "ucx_net_devices": lab.device} for h, r in run.items()}
            cfg = e2e_config(name, venv, "/srv/e2e/model", hosts=inventory, **overrides)
            (work / "model").mkdir(parents=True, exist_ok=True)
            (work / "config.yaml").write_text(yaml.safe_dump(cfg))
            (work / "topology.json").write_text(json.dumps(host_topology()))
            base = [sys.executable, "-m", "pdsvc.cli"]
            where = ["-c", str(work / "config.yaml"), "--topology", str(work / "topology.json")]
            render = subprocess.run([*base, "render", *where, "-o", str(work / "units")],
                                    capture_output=True, text=True, cwd=REPO, timeout=60)
            assert render.returncode == 0, render.stderr
            fleet.venv = venv
            fleet.plan = json.loads(subprocess.run(
                [*base, "plan", *where, "--json"], capture_output=True, text=True, cwd=REPO,
                timeout=60, check=True).stdout)
            for p in (work, work / "model"):
                p.chmod(0o755)
            for host in run:
                # keepalived adds the moving address in the router hosts' namespaces (the lab's)
                caps = (["--capability=CAP_NET_ADMIN"]
                        if "router.vip" in overrides and "router" in run[host] else [])
                c = SystemdContainer(bind_ro=[str(REPO), str(venv), (str(work), "/srv/e2e")],
                                     netns=lab.netns(host), max_lifetime=1500,
                                     extra_args=caps)
                fleet.hosts[host] = c
                c.start()
            # docs/hosts.md step 3: the router's host first; its install.sh makes the key
            fleet.install(fleet.router_host)
            for host in run:  # step 4: the other hosts, with that key where a unit reads it
                if host != fleet.router_host:
                    fleet.install_with_key(host)
        except BaseException:
            fleet.down()
            raise
        return fleet

    def install_with_key(self, host: str) -> subprocess.CompletedProcess[str]:
        """docs/hosts.md step 4 on one host: `scp root@ROUTER:/etc/NAME/router.key router.key &&
        install.sh --bundle HOST --key-from router.key && rm router.key` where the host's
        install.list has a `secret … copy` line; a plain install where it has none."""
        if not self.copies_key(host):
            return self.install(host)
        c = self.hosts[host]
        key = self.hosts[self.router_host].read_file(f"/etc/{self.name}/router.key")
        c.write_file("/root/router.key", key, mode=0o600)  # what scp brings
        done = self.install(host, "--key-from", "/root/router.key")
        c.run(["rm", "/root/router.key"])
        return done

    def copies_key(self, host: str) -> bool:
        """HOST's install.list has the router's key as a `secret … copy` line."""
        listing = (self.work / "units" / host / "install.list").read_text()
        return f"\nsecret\t/etc/{self.name}/router.key\tcopy\t" in listing

    def install(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.hosts[host].run(
            ["bash", str(REPO / "install.sh"), "--bundle", f"/srv/e2e/units/{host}", *args],
            timeout=120)

    def start(self, timeout: float = 180) -> float:
        """docs/hosts.md steps 5-7: the router's host without waiting; on each other host `pdsvc
        doctor --host` (its router key row must be ✓: the router takes the key copied there),
        then its target without waiting; on the router's host `systemctl start` again, which
        returns once the router served one generation across hosts, and `pdsvc status`."""
        t0 = time.monotonic()
        router = self.hosts[self.router_host]
        router.run(["systemctl", "start", "--no-block", self.target])
        for host, c in self.hosts.items():
            if host != self.router_host:
                rows = self.router_key_rows(host)
                assert [r["status"] for r in rows] == (["ok"] if self.copies_key(host) else []), (
                    host, rows)
                c.run(["systemctl", "start", "--no-block", self.target])
        router.run(["systemctl", "start", self.target], timeout=timeout)
        seconds = time.monotonic() - t0
        self.started = {h: {u: self.state(h, u) for u in self.units_on(h)} for h in self.hosts}
        status = self.pdsvc(self.router_host, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        return seconds

    def pdsvc(self, host: str, *args: str, timeout: float = 120
              ) -> subprocess.CompletedProcess[str]:
        """`pdsvc COMMAND -c CONFIG --topology FILE --host HOST ...` on one host, as root."""
        return self.cli(host, *args, "-c", "/srv/e2e/config.yaml", "--topology",
                        "/srv/e2e/topology.json", "--host", host, timeout=timeout)

    def cli(self, host: str, *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        """`pdsvc ARGS...` on one host, as root (this checkout's pdsvc, the serve venv's
        python: the `pdsvc` of a command pdsvc prints)."""
        return self.hosts[host].run(
            pdsvc_argv(self.work, str(self.venv / "bin" / "python"), *args), check=False,
            timeout=timeout)

    def router_key_rows(self, host: str, timeout: float = 60) -> list[dict]:
        """doctor's router key rows on HOST; while the router is still starting (the row's
        fix: start it, then run pdsvc doctor again) doctor is run again, as docs/hosts.md says."""
        deadline = time.monotonic() + timeout
        while True:
            rows = [r for r in self.doctor(host)["checks"] if r["check"] == "router key"]
            starting = [r for r in rows if r["status"] == "warning"
                        and r["detail"].startswith("cannot reach the router")]
            if not starting or time.monotonic() > deadline:
                return rows
            time.sleep(0.5)

    def doctor(self, host: str) -> dict:
        """`pdsvc doctor --host HOST --json` there (it exits 3 in the lab: no GPU driver)."""
        proc = self.pdsvc(host, "doctor", "--json")
        return json.loads(proc.stdout)

    def down(self) -> None:
        try:
            for c in self.hosts.values():
                c.stop()
        finally:
            self.lab.close()
            shutil.rmtree(self.work / "units", ignore_errors=True)

    # ------------------------------------------------------------------ names and probes
    @property
    def target(self) -> str:
        return f"{self.name}-pd.target"

    @property
    def router_host(self) -> str:
        return self.plan["routers"][0]["machine"]

    def units_on(self, host: str) -> list[str]:
        return next(h["units"] for h in self.plan["hosts"] if h["name"] == host)

    def state(self, host: str, unit: str) -> str:
        return self.hosts[host].show(unit, "ActiveState")["ActiveState"]

    def curl(self, path: str, body: dict | None = None, timeout: float = 15) -> tuple[int, str]:
        """HTTP to the router, from inside its host."""
        return curl(self.hosts[self.router_host],
                    f"http://127.0.0.1:{self.plan['router']['port']}{path}", body, timeout)

    def generate(self, text: str = "hello", timeout: float = 5) -> tuple[bool, dict | str]:
        code, body = self.curl("/generate", {"text": text,
                                             "sampling_params": {"max_new_tokens": 4}}, timeout)
        if code != 200 or "hello from fake engine" not in body:
            return False, body
        return True, json.loads(body)["meta_info"]

    def workers(self) -> list[tuple[str, str, int | None, bool]]:
        code, body = curl(self.hosts[self.router_host],
                          f"http://127.0.0.1:{self.plan['router']['port']}/workers",
                          timeout=5, key_file=f"/etc/{self.name}/router.key")
        assert code == 200, body
        return sorted((w["worker_type"], w["url"], w.get("bootstrap_port"), w["is_healthy"])
                      for w in json.loads(body)["workers"])
