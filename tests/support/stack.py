"""An installed pdsvc stack inside a real systemd (nspawn), for the end-to-end tests/benchmarks.

`Stack.up(...)` renders a config with the real `pdsvc render`, boots a container in a network
namespace of its own (so the default ports are used and no traffic leaves it), installs the
bundle with the real `install.sh`, and exposes what a user would do: `systemctl`, `journalctl`,
`curl` through the router. Engines are `fake_sglang.py` (the only stand-in); the router is the
real sglang-router 0.3.2 from the serve venv; systemd is the container's real systemd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from nspawn import SystemdContainer

REPO = Path(__file__).resolve().parents[2]


def host_topology(gpus: int = 2) -> dict:
    """A topology matching this machine's real NUMA node 0 (so CPUAffinity=/NUMAMask= are
    valid here), with `gpus` made-up GPUs on it: the container has no GPU."""
    cpus = Path("/sys/devices/system/node/node0/cpulist").read_text().strip()
    return {
        "format": "pdsvc-topology/1",
        "source": "e2e: this machine's node 0 + stand-in GPUs",
        "gpus": [{"index": i, "pci_bus_id": f"0000:{6 + i:02x}:00.0", "numa_node": 0,
                  "local_cpulist": cpus} for i in range(gpus)],
        "numa_nodes": [{"id": 0, "cpulist": cpus}],
    }


def e2e_config(name: str, venv: Path, model_dir: str, **overrides: Any) -> dict:
    """The default layout (ports, roles, router) with lifecycle bounds short enough for tests."""
    cfg: dict[str, Any] = {
        "name": name,
        "model": {"path": model_dir, "served_name": "fake-model"},
        "runtime": {
            "python": str(venv / "bin" / "python"),
            "engine_module": "fake_sglang",
            "jit_cache": f"/var/cache/{name}/jit",
            "libexec_dir": "/opt/pdsvc",  # the container's /usr is the host's, read-only
            "env": {
                "PYTHONPATH": str(REPO / "tests" / "support"),
                "FAKE_SGLANG_LOAD_SECS": 1,
                "FAKE_SGLANG_COMPILE_COLD_SECS": 2,
                "FAKE_SGLANG_COMPILE_WARM_SECS": 0.1,
                "FAKE_SGLANG_MAX_LIFETIME": 900,
            },
        },
        "prefill": {"gpus": [0]},
        "decode": {"gpus": [1]},
        "router": {
            "health_check": {"interval_secs": 1, "timeout_secs": 1, "failure_threshold": 1,
                             "success_threshold": 1},
            "args": {"request-timeout-secs": 10},
            # never reach for a hub: the router's tokenizer autoload (the Rust hf_hub crate
            # reads HF_ENDPOINT)
            "env": {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": 1},
        },
        "lifecycle": {
            "start_timeout_secs": 120, "stop_timeout_secs": 20, "restart_secs": 1,
            "restart_backoff_max_secs": 8, "restart_reset_secs": 30, "start_attempts": 3,
            "gpu_wait_secs": 60,
            "liveness_interval_secs": 1, "liveness_timeout_secs": 1, "liveness_failures": 2,
            "canary_interval_secs": 1, "canary_failures": 3, "canary_timeout_secs": 5,
            "canary_heal_attempts": 4,
        },
    }
    for dotted, value in overrides.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def curl(c: SystemdContainer, url: str, body: dict | None = None,
         timeout: float = 15, key_file: str | None = None) -> tuple[int, str]:
    """HTTP from inside a container's network namespace; (status, body), status 0 if
    refused. ``key_file``: send the key in it as a bearer token (the router's control plane)."""
    cmd = ["curl", "-sS", "-m", str(timeout), "-o", "-", "-w", "\n%{http_code}", url]
    if key_file:
        cmd += ["-H", f"Authorization: Bearer {c.read_file(key_file).strip()}"]
    if body is not None:
        cmd += ["-H", "content-type: application/json", "-d", json.dumps(body)]
    proc = c.run(cmd, check=False, timeout=timeout + 10)
    text, _, code = proc.stdout.rpartition("\n")
    return int(code or 0), text


def engine_pid(c: SystemdContainer, unit: str) -> int:
    """A unit's engine process: the runtime's (MainPID's) child."""
    main = c.show(unit, "MainPID")["MainPID"]
    out = c.run(["pgrep", "-P", main], check=False).stdout.split()
    assert out, f"{unit}: runtime {main} has no child"
    return int(out[0])


def pdsvc_argv(work: Path, python: str, *args: str) -> list[str]:
    """`pdsvc ARGS` inside a container whose /srv/e2e is `work`: the serve venv's python with
    this checkout on the path, and the dashboard SDK (a dependency of pdsvc the serve venv
    lacks) from a copy in work/pylib."""
    pylib = work / "pylib"
    if not (pylib / "grafana_foundation_sdk").is_dir():
        import grafana_foundation_sdk as sdk

        shutil.copytree(Path(sdk.__file__).parent, pylib / "grafana_foundation_sdk")
    return ["env", f"PYTHONPATH={REPO}:/srv/e2e/pylib", python, "-m", "pdsvc.cli", *args]


#: Where `Stack.apply` keeps its writable copy of the config and bundle inside the container.
APPLY_DIR = "/var/lib/pdsvc-apply"


@dataclass
class Stack:
    c: SystemdContainer
    name: str
    work: Path
    netns: str
    plan: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def up(cls, work: Path, venv: Path, *, start: bool = True, gpus: int = 2,
           lifetime: int = 1500, **overrides: Any) -> Stack:
        """Render, boot, install (and by default `systemctl start` the target); ``gpus``: the
        stand-in GPUs of the topology (one per engine of an xPyD layout); ``lifetime``: the
        container's bound in seconds (a benchmark may need more than a test)."""
        name = overrides.pop("name", "e2e")
        netns = f"pdsvc-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", netns], check=True)
        model = work / "model"
        model.mkdir(parents=True, exist_ok=True)
        model.chmod(0o755)
        (work / "config.yaml").write_text(yaml.safe_dump(
            e2e_config(name, venv, "/srv/e2e/model", **overrides)))
        (work / "topology.json").write_text(json.dumps(host_topology(gpus)))
        render = subprocess.run(
            [sys.executable, "-m", "pdsvc.cli", "render", "-c", str(work / "config.yaml"),
             "--topology", str(work / "topology.json"), "-o", str(work / "units")],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )
        assert render.returncode == 0, render.stderr
        plan = json.loads(subprocess.run(
            [sys.executable, "-m", "pdsvc.cli", "plan", "-c", str(work / "config.yaml"),
             "--topology", str(work / "topology.json"), "--json"],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout)
        work.chmod(0o755)
        c = SystemdContainer(bind_ro=[str(REPO), str(venv), (str(work), "/srv/e2e")],
                             netns=netns, max_lifetime=lifetime)
        stack = cls(c=c, name=name, work=work, netns=netns, plan=plan)
        try:
            c.start()
            stack.install()
            if start:
                stack.start()
        except BaseException:
            stack.down()
            raise
        return stack

    def install(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.c.run(["bash", str(REPO / "install.sh"), "--bundle", "/srv/e2e/units", *args],
                          timeout=120)

    def pdsvc(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None,
              wrap: tuple[str, ...] = ()
              ) -> subprocess.CompletedProcess[str]:
        """`pdsvc ARGS` inside the container, as an operator on the host runs it: the serve
        venv's python with this checkout on the path, and the dashboard SDK (a dependency of
        pdsvc the serve venv lacks) from a copy beside the bundle; whatever its exit code.
        ``env``: more environment for it; ``wrap``: a command it runs under (zero_loss.STAMP:
        each stderr line timed)."""
        argv = pdsvc_argv(self.work, self.plan["python"], *args)  # env PYTHONPATH=… python …
        return self.c.run([*argv[:2], *wrap, *argv[2:]], check=False, timeout=timeout, env=env)

    def apply(self, config: dict, *args: str, timeout: float = 600,
              env: dict[str, str] | None = None, wrap: tuple[str, ...] = ()
              ) -> subprocess.CompletedProcess[str]:
        """`pdsvc apply` of CONFIG to the running stack, from a writable copy of the installed
        bundle (APPLY_DIR/units: /srv/e2e is read-only), as an operator would run it."""
        if not self.c.exists(f"{APPLY_DIR}/units"):
            self.c.run(["mkdir", "-p", APPLY_DIR])
            self.c.run(["cp", "-a", "/srv/e2e/units", f"{APPLY_DIR}/units"])
        self.c.write_file(f"{APPLY_DIR}/config.yaml", yaml.safe_dump(config))
        return self.pdsvc("apply", "-c", f"{APPLY_DIR}/config.yaml", "--topology",
                          "/srv/e2e/topology.json", "-o", f"{APPLY_DIR}/units", *args,
                          timeout=timeout, env=env, wrap=wrap)

    def start(self, timeout: float = 180) -> float:
        """`systemctl start <name>-pd.target`; returns how long it blocked."""
        t0 = time.monotonic()
        self.c.run(["systemctl", "start", self.target], timeout=timeout)
        return time.monotonic() - t0

    def stop(self, timeout: float = 120) -> float:
        """Stop the whole stack and wait for it: `systemctl stop TARGET` alone returns as soon
        as the target is down, which (being ordered after its services) is *first*; naming
        the services too makes systemctl wait for their stop jobs."""
        t0 = time.monotonic()
        self.c.run(["systemctl", "stop", self.target, *self.units], timeout=timeout)
        return time.monotonic() - t0

    @property
    def engines(self) -> list[str]:
        """The engines' instance names (``prefill``, or ``prefill-0``, ``prefill-1`` ... of an
        xPyD layout), as the plan names them, for `unit()` and the helpers that take a role."""
        if not self.plan:
            return ["prefill", "decode"]
        return [e["name"].removeprefix(f"{self.name}-") for e in self.plan["engines"]]

    @property
    def units(self) -> list[str]:
        """Every service of the plan: the engines, the router(s), the front if any."""
        return list(self.plan["units"])

    @property
    def router_ports(self) -> list[int]:
        """Each router's own port (router.replicas ≥ 2: behind the front on router.port)."""
        return [int(r["port"]) for r in self.plan["routers"]]

    def down(self) -> None:
        try:
            self.c.stop()
        finally:
            subprocess.run(["ip", "netns", "delete", self.netns], check=False)
            shutil.rmtree(self.work / "units", ignore_errors=True)

    # ------------------------------------------------------------------ names
    @property
    def target(self) -> str:
        return f"{self.name}-pd.target"

    def unit(self, role: str) -> str:
        return f"{self.name}-{role}.service"

    # ------------------------------------------------------------------ probing
    def curl(self, path: str, body: dict | None = None, port: int = 8000,
             timeout: float = 15) -> tuple[int, str]:
        return curl(self.c, f"http://127.0.0.1:{port}{path}", body, timeout)

    def workers(self, timeout: float = 15, port: int = 8000) -> tuple[int, str]:
        """A router's GET /workers (the one on ``port``), with the control-plane key
        install.sh made."""
        return curl(self.c, f"http://127.0.0.1:{port}/workers", None, timeout,
                    key_file=f"/etc/{self.name}/router.key")

    def listed(self, port: int = 8000, timeout: float = 3) -> set[str] | None:
        """The URLs of the workers a router lists healthy; None when it did not answer."""
        code, body = self.workers(timeout=timeout, port=port)
        if code != 200:
            return None
        return {w["url"] for w in json.loads(body).get("workers", []) if w.get("is_healthy")}

    def generate(self, timeout: float = 15) -> tuple[int, str]:
        return self.curl("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}},
                         timeout=timeout)

    def serves(self) -> bool:
        """Every unit is active (systemd says up) and a generation goes through the router."""
        if any(self.prop(u, "ActiveState") != "active" for u in self.units):
            return False
        code, body = self.generate(timeout=5)
        return code == 200 and "hello from fake engine" in body

    def wait_serving(self, timeout: float = 90, what: str = "the stack serves again") -> float:
        t0 = time.monotonic()
        try:
            self.c.wait_for(self.serves, timeout, interval=0.25, what=what)
        except AssertionError as e:
            states = {u: self.c.show(u, "ActiveState", "SubState", "NRestarts") for u in self.units}
            tails = "\n".join(f"--- {u}:\n" + "\n".join(self.c.journal(u).splitlines()[-25:])
                              for u in self.units)
            raise AssertionError(
                f"{e}\nunits: {states}\nlast generate: {self.generate(timeout=5)}\n"
                f"router /workers: {self.workers(timeout=5)}\n{tails}"
            ) from None
        return time.monotonic() - t0

    def prop(self, unit: str, name: str) -> str:
        return self.c.show(unit, name)[name]

    def engine_pid(self, role: str) -> int:
        return engine_pid(self.c, self.unit(role))

    def restarts(self, role: str) -> int:
        return int(self.prop(self.unit(role), "NRestarts"))

    def invocation(self, role: str) -> str:
        return self.prop(self.unit(role), "InvocationID")

    def processes_of_user(self, user: str = "sglang") -> list[str]:
        out = self.c.run(["pgrep", "-a", "-u", user], check=False).stdout
        return [line for line in out.splitlines() if line.strip()]
