"""Several hosts, each a real systemd container in a network namespace of a NetLab, running
the per-host bundles `pdsvc render` writes for a config with `hosts:`.

`Fleet.up(work, venv, {"lb": ["router"], "gpu-a": ["prefill"], ...})` renders the e2e config
(tests/support/stack.py) with an inventory whose addresses are the lab's, boots one container
per host, and installs units/HOST/ on each with the real install.sh. Nothing leaves the lab's
namespaces: the engines bind the lab addresses, the router dials them.
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
from stack import REPO, curl, e2e_config, host_topology


@dataclass
class Fleet:
    lab: NetLab
    name: str
    work: Path
    hosts: dict[str, SystemdContainer] = field(default_factory=dict)
    plan: dict = field(default_factory=dict)

    @classmethod
    def up(cls, work: Path, venv: Path, run: dict[str, list[str]], **overrides: Any) -> Fleet:
        name = overrides.pop("name", "e2e")
        lab = NetLab(list(run))
        fleet = cls(lab=lab, name=name, work=work)
        try:
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
            fleet.plan = json.loads(subprocess.run(
                [*base, "plan", *where, "--json"], capture_output=True, text=True, cwd=REPO,
                timeout=60, check=True).stdout)
            for p in (work, work / "model"):
                p.chmod(0o755)
            for host in run:
                c = SystemdContainer(bind_ro=[str(REPO), str(venv), (str(work), "/srv/e2e")],
                                     netns=lab.netns(host), max_lifetime=1500)
                fleet.hosts[host] = c
                c.start()
                fleet.install(host)
            fleet.share_key()
        except BaseException:
            fleet.down()
            raise
        return fleet

    def share_key(self) -> None:
        """What install.sh tells the admin of an engine host: copy the router host's
        control-plane key (the engines register with it), root:GROUP 0640."""
        path = f"/etc/{self.name}/router.key"
        key = self.hosts[self.router_host].read_file(path)
        for host, c in self.hosts.items():
            if host != self.router_host:
                c.write_file(path, key, mode=0o640)
                c.run(["chgrp", "sglang", path])

    def install(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.hosts[host].run(
            ["bash", str(REPO / "install.sh"), "--bundle", f"/srv/e2e/units/{host}", *args],
            timeout=120)

    def start(self, timeout: float = 180) -> float:
        """What the README says: engines' hosts first (not waiting), then the router's host,
        whose `systemctl start` returns once the router served one generation across hosts."""
        t0 = time.monotonic()
        router_host = self.router_host
        for host, c in self.hosts.items():
            if host != router_host:
                c.run(["systemctl", "start", "--no-block", self.target])
        self.hosts[router_host].run(["systemctl", "start", self.target], timeout=timeout)
        return time.monotonic() - t0

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
        return self.plan["router"]["machine"]

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
