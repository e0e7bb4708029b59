"""`pdsvc doctor --kv`: prove the KV path of every prefill→decode pair with a real NIXL
transfer between two processes started as the two units start (kv_launch), and judge it:

* ✗ the transfer failed or the bytes arrived wrong;
* ! UCX moved GPU-host-local KV over TCP, or the rate is under transfer.kv_check_min_gbps;
* ✓ otherwise, with the rate and the transport UCX chose (UCX_PROTO_INFO=y, UCX >= 1.16).

Across hosts (`hosts:`) each host runs its halves: the decode's host serves the target on the
decode's address and port (free while the stack is stopped, and open between the hosts), the
prefill's host writes to it. Both go through the pairs in the plan's order, so
`pdsvc doctor --kv --host NAME` on each host at about the same time pairs them up.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pdsvc.plan.build import EnginePlan, Plan

from .host import Host
from .kv_launch import Launch, UnitSettingError, direct_launch, systemd_launch
from .probes import probe_source, result_line
from .rows import Row, fail, ok, warn

KV_MARKER = "pdsvc-doctor-kv"
LISTEN_PREFIX = "pdsvc-doctor-kv-listen "  # as the probe prints it
#: How long a half waits for the other (across hosts: for the other host's doctor to start).
PEER_WAIT_SECS = 120
#: How long a half may take to start (Python, NIXL's import, its agent, the memory
#: registered) before it listens: its own peer wait counts from then, never from the launch.
HALF_START_SECS = 120
GB = 1e9

#: UCX_PROTO_INFO's tables (ucx src/ucp/proto/proto_select.c): a line naming the endpoint's
#: configuration (``pdsvc-kv-initiator intra-node cfg#2``, ``… self cfg#0`` for the agent's
#: loopback to itself), the operation (``remote memory write by ucp_put*(multi) from
#: cuda/GPU0 to cuda/dev[1]``) and one row per message size range, the last ``N..inf``:
#: ``| 0..inf | zero-copy | cuda_ipc/cuda |``, or lanes: ``52% on tcp/lo and 48% on tcp/eth0``.
_CFG = re.compile(r"\|\s*\S+ (self|intra-node|inter-node) cfg#\d+")
_TITLE = re.compile(r"\|\s*remote memory write by \S+ from (.+?) to (.+?)\s*\|")
_ROW = re.compile(r"\|\s*[\d.]+\.\.inf\s*\|[^|]*\|\s*([^|]*?)\s*\|")
_TL = re.compile(r"\b([a-z][a-z0-9_]*/[\w:.\-\[\]]+)")
#: NIXL's own reason, logged through glog before it raises a bare NIXL_ERR_BACKEND:
#: ``E1201 05:46:48.131563  688 config.cpp:84] Invalid UCX_TLS=tcp for NIXL UCX backend: …``
_GLOG = re.compile(r"^[EF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] (.*)$")


def transports(ucx_stdout: str, src: str = "host", dst: str | None = None) -> list[str]:
    """The transports UCX chose for large remote writes between the two agents from ``src``
    memory ("host" or "cuda") into ``dst`` (default: the same kind), each once, in order:
    ``cuda_ipc/cuda``, ``cma/memory``, ``tcp/eth0``. An agent's writes to itself (``self``)
    are not the path."""
    memory = (src, dst or src)
    found: list[str] = []
    cfg, table = "", False
    for line in ucx_stdout.splitlines():
        if m := _CFG.search(line):
            cfg = m.group(1)
        elif m := _TITLE.search(line):
            sides = tuple("cuda" if side.startswith("cuda") else "host" for side in m.groups())
            table = cfg != "self" and sides == memory
        elif table and (m := _ROW.search(line)):
            # one lane ("cma/memory") or several ("52% on tcp/lo and 48% on tcp/eth0")
            for tl in _TL.findall(m.group(1)):
                if tl not in found:
                    found.append(tl)
            table = False
    return found


def nixl_reason(stderr: str) -> str | None:
    """The first error NIXL logged, without glog's prefix."""
    for line in stderr.splitlines():
        if m := _GLOG.match(line.strip()):
            return m.group(1)
    return None


@dataclass(frozen=True)
class HalfResult:
    """What one half printed: its result (None: it printed none) and everything else."""

    result: dict | None
    stdout: str
    stderr: str
    returncode: int | None  # None: killed at the bound

    def error(self) -> str:
        if self.result and self.result.get("error"):
            why = nixl_reason(self.stderr)
            return str(self.result["error"]) + (f" ({why[:200]})" if why else "")
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        if self.returncode is None:
            return "timed out"
        return (lines[-1].strip() if lines else f"exit status {self.returncode}")[-240:]


def pairs(plan: Plan) -> list[tuple[EnginePlan, EnginePlan]]:
    """Every prefill→decode pair, by their serving processes (rank 0), in plan order."""
    heads = [e for e in plan.engines if e.node_rank == 0]
    return [(p, d) for p in heads if p.role == "prefill" for d in heads if d.role == "decode"]


def _probe_args(plan: Plan, role: str, pair: str, wait: float, **opts: str) -> list[str]:
    kv = plan.kv_check
    args = [KV_MARKER, role, "--pair", pair, "--bytes", str(kv.bytes), "--blocks",
            str(kv.blocks), "--timeout", f"{wait:g}"]
    for k, v in opts.items():
        args += [f"--{k}", v]
    return args


def _parse_result(stderr: str) -> dict | None:
    """The half's result line (None: it printed none, or half of one)."""
    try:
        return result_line(stderr)
    except ValueError:
        return None


class Half:
    """A running half: its output goes to files (no pipe to fill up), read when it ends."""

    def __init__(self, launch: Launch, workdir: Path, name: str) -> None:
        self.launch = launch
        self.out = workdir / f"{name}.out"
        self.err = workdir / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(list(launch.argv), stdin=subprocess.PIPE, stdout=out,
                                         stderr=err, env=launch.env, start_new_session=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(probe_source("kvpath.py").encode())
        self.proc.stdin.close()

    def listen_port(self, bound: float) -> int | None:
        """The port the target serves on, once it says so; None when it ended first."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            for line in self.err.read_text(errors="replace").splitlines():
                at = line.find(LISTEN_PREFIX)
                if at >= 0:
                    return int(line[at + len(LISTEN_PREFIX):].split()[0])
            if self.proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def kill(self) -> None:
        """The half and, under systemd, its transient unit: killing systemd-run (the client)
        would leave the probe holding the GPU memory and the port (systemd-run(1))."""
        if self.launch.unit:
            subprocess.run(["systemctl", "kill", "--signal=SIGKILL", self.launch.unit],
                           capture_output=True, timeout=30, check=False)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def finish(self, bound: float) -> HalfResult:
        try:
            rc: int | None = self.proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        err = self.err.read_text(errors="replace")
        return HalfResult(_parse_result(err), self.out.read_text(errors="replace"), err, rc)


def choose_launcher(host: Host, asked: str) -> str:
    """systemd when asked, or (auto) when this is root on a host booted with systemd."""
    if asked != "auto":
        return asked
    booted = host.systemd_run_dir.is_dir() and shutil.which("systemd-run") is not None
    return "systemd" if booted and os.geteuid() == 0 else "direct"


def _launcher(plan: Plan, how: str, seq: int, wait: float,
              ) -> Callable[[EnginePlan, list[str], dict], Launch]:
    def launch(e: EnginePlan, args: list[str], extra_env: dict[str, str]) -> Launch:
        if how == "systemd":
            unit = f"{e.name}-kvcheck-{os.getpid()}-{seq}.service"
            return systemd_launch(plan, e, args, unit, int(wait * 3 + 30), extra_env)
        return direct_launch(plan, e, args, extra_env)
    return launch


def check_kv(whole: Plan, here: Plan, host: Host, how: str = "auto",
             gpus_here: bool | None = None, keep: Path | None = None,
             progress: Callable[[str], None] = lambda line: None,
             peer_wait: float = PEER_WAIT_SECS) -> list[Row]:
    """One row per pair this host takes part in, after running its half or both.
    ``gpus_here``: whether this host has NVIDIA GPUs (default: /dev/nvidiactl exists);
    ``keep``: a directory to copy each half's output into (UCX's own lines included);
    ``progress``: told what is being waited for, a line at a time; ``peer_wait``: how long
    a half waits for the other (seconds)."""
    if whole.transfer_backend != "nixl":
        return [ok("kv path", f"transfer.backend is {whole.transfer_backend}: "
                   "the KV check runs NIXL only")]
    mine = {e.name for e in here.engines}
    todo = [(p, d) for p, d in pairs(whole) if p.name in mine or d.name in mine]
    if not todo:
        return []
    how = choose_launcher(host, how)
    if gpus_here is None:
        gpus_here = Path("/dev/nvidiactl").exists()
    rows = []
    for seq, (p, d) in enumerate(todo):
        halves = ("both halves" if p.name in mine and d.name in mine
                  else f"the {'decode' if d.name in mine else 'prefill'}-side half, "
                  f"with {(p if d.name in mine else d).machine}'s doctor (up to "
                  f"{peer_wait:g} s)")
        progress(f"kv {p.name}→{d.name}: {halves} ({how}), "
                 f"{whole.kv_check.bytes / 2**20:.0f} MiB…")
        rows.append(_check_pair(whole, p, d, p.name in mine, d.name in mine,
                                _launcher(here, how, seq, peer_wait), how, gpus_here,
                                keep / f"{seq}-{p.name}-{d.name}" if keep else None,
                                peer_wait))
    return rows


def _check_pair(plan: Plan, p: EnginePlan, d: EnginePlan, run_p: bool, run_d: bool,
                launch: Callable[[EnginePlan, list[str], dict], Launch], how: str,
                gpus_here: bool, keep: Path | None, wait: float) -> Row:
    """One pair's row; a half that cannot be started as its unit is one too."""
    try:
        return _run_pair(plan, p, d, run_p, run_d, launch, how, gpus_here, keep, wait)
    except UnitSettingError as err:
        return fail(f"kv {p.name}→{d.name}", f"a half cannot be started as its unit: {err}",
                    "write the value out in the drop-in (systemd-run -p expands no "
                    "specifiers), or run with --kv-as direct")


def _run_pair(plan: Plan, p: EnginePlan, d: EnginePlan, run_p: bool, run_d: bool,
              launch: Callable[[EnginePlan, list[str], dict], Launch], how: str,
              gpus_here: bool, keep: Path | None, wait: float) -> Row:
    name = f"kv {p.name}→{d.name}"
    pair = f"{p.name}-to-{d.name}"
    same_host = run_p and run_d
    # one host: any free loopback port; across hosts: the decode's own address and port, as
    # the plan has them (what the prefill's host reaches)
    listen = "127.0.0.1:0" if same_host else urlsplit(d.url).netloc
    bound = wait * 2 + 30.0
    with tempfile.TemporaryDirectory(prefix="pdsvc-kv-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        target = initiator = None
        try:
            if run_d:
                target = Half(launch(d, _probe_args(plan, "target", pair, wait, listen=listen),
                                     {}), work, "target")
                port = target.listen_port(HALF_START_SECS)
                if port is None:
                    return _failed(name, "the decode-side half", target.finish(5), d, how)
            if not run_p:  # the prefill's host writes; this host only receives and checks
                assert target is not None
                return _judge_target(name, p, d, target.finish(bound), how)
            url = f"http://127.0.0.1:{port}" if same_host else d.url
            initiator = Half(launch(p, _probe_args(plan, "initiator", pair, wait, target=url),
                                    {"UCX_PROTO_INFO": "y"}), work, "initiator")
            got = initiator.finish(bound)
            if target is not None and got.result and got.result.get("stage") is None:
                target.finish(10)  # it answered /verify and ends on its own
            elif target is not None:
                target.kill()  # the initiator failed before: nobody will come
            return _judge(plan, name, p, got, same_host, how, gpus_here)
        finally:
            for half in (target, initiator):
                if half is not None and half.proc.poll() is None:
                    half.kill()
            if keep:
                shutil.copytree(work, keep, dirs_exist_ok=True)


def _env_of(result: HalfResult | None, e: EnginePlan) -> dict[str, str]:
    if result and result.result and isinstance(result.result.get("env"), dict):
        return result.result["env"]
    return dict(e.env)


def _fix_for(error: str, env: dict[str, str], e: EnginePlan, how: str) -> str:
    """The one thing to change, read from NIXL's error and the half's UCX_* settings."""
    where = f"the config's {e.role}.env (or the unit's drop-ins)"
    if "No module named" in error and "nixl" in error:
        return "install NIXL into runtime.python: `PY -m pip install nixl` (PY: runtime.python)"
    if "UCX_TLS" in error or ("UCX_TLS" in env and "BACKEND" in error):
        return (f"UCX_TLS={env.get('UCX_TLS', '…')} leaves out what this path needs: add "
                f"cuda_copy,cuda_ipc (GPU memory) or unset it, in {where}")
    if "UCX_NET_DEVICES" in env and ("BACKEND" in error or "device" in error.lower()):
        return (f"UCX_NET_DEVICES={env['UCX_NET_DEVICES']} names no usable device here: "
                f"`ucx_info -d` lists them; set one or unset it, in {where}")
    if "no prefill-side half came" in error:
        return ("run `pdsvc doctor --kv --host NAME` on the prefill's host at the same time "
                "(with the same config)")
    if "Connection refused" in error or "timed out" in error or "URLError" in error:
        return ("run `pdsvc doctor --kv --host NAME` on the decode's host at the same time, and "
                "open the decode's port between the hosts")
    if "Address already in use" in error:
        return (f"stop {e.unit} and the rest of the stack first: across hosts the check "
                "borrows the decode's address and port")
    if "another pair" in error:
        return ("the decode's host is at another pair: run `pdsvc doctor --kv` with the same "
                "config on every host at once")
    if "sees no GPU" in error:
        return ("the unit's device policy hides the GPUs (DevicePolicy=/PrivateDevices= in a "
                "drop-in): allow /dev/nvidia*")
    return f"run the half by hand to see NIXL's log: {how} launch, NIXL_LOG_LEVEL=DEBUG"


def _failed(name: str, which: str, got: HalfResult, e: EnginePlan, how: str) -> Row:
    error = got.error()
    stage = f" at {got.result['stage']}" if got.result and got.result.get("stage") else ""
    return fail(name, f"{which} failed{stage}: {error}", _fix_for(error, _env_of(got, e), e, how))


def _ran_as(r: dict, how: str) -> str:
    """Who the prefill-side half ran as, and how it was started: the unit's user, or not."""
    try:
        user = pwd.getpwuid(int(r["user"])).pw_name
    except (KeyError, TypeError, ValueError):
        user = f"uid {r.get('user')}"
    return f"ran as {user} ({how})"


def _judge_target(name: str, p: EnginePlan, d: EnginePlan, got: HalfResult, how: str) -> Row:
    r = got.result
    if not r or not r.get("ok"):
        return _failed(name, "the decode-side half", got, d, how)
    if not r.get("intact"):
        return fail(name, f"bytes from {p.name} arrived wrong (block {r.get('first_bad_block')})",
                    "a transport fault: rerun with UCX_TLS leaving out the transport "
                    "the prefill's host reports, and report it to NIXL")
    return ok(name, f"received from {p.name}'s host into {r.get('where')}: intact "
              "(the rate and transport are on the prefill's host)")


def _judge(plan: Plan, name: str, p: EnginePlan, got: HalfResult, same_host: bool, how: str,
           gpus_here: bool) -> Row:
    r = got.result
    if not r or not r.get("ok"):
        return _failed(name, "the transfer", got, p, how)
    size = f"{r['bytes'] / 2**20:.0f} MiB in {r['blocks']} blocks"
    kinds = [r["kind"], r.get("peer_kind") or r["kind"]]
    tls = transports(got.stdout, *("cuda" if k == "VRAM" else "host" for k in kinds))
    via = ", ".join(tls) if tls else "a transport UCX did not name (UCX_PROTO_INFO needs 1.16+)"
    what = (f"{r['gbps']:.1f} GB/s ({r['cold_gbps']:.1f} cold) over {via}, {size}, "
            f"{r['where']} → {r['peer_where']}")
    if not r.get("intact"):
        return fail(name, f"{what}: bytes arrived wrong (block {r.get('first_bad_block')})",
                    f"a transport fault: rerun with UCX_TLS leaving out {via}, and report it "
                    "to NIXL")
    if any(t.startswith("tcp") for t in tls) and same_host:
        env = _env_of(got, p)
        return warn(name, f"{what}: TCP between two processes of one host",
                    f"UCX_TLS={env.get('UCX_TLS', '(unset)')} keeps UCX off shared memory and "
                    "CUDA IPC: unset it or add sm,cuda_copy,cuda_ipc, in the roles' env")
    if any(t.startswith("tcp") for t in tls) and r["kind"] == "VRAM":
        return warn(name, f"{what}: GPU KV over TCP between hosts",
                    "set hosts.NAME.ucx_net_devices to the RDMA NIC beside the GPUs "
                    "(`pdsvc plan` lists them)")
    if "DRAM" in kinds and gpus_here and p.gpus:
        return warn(name, f"{what}: a half saw no GPU, though this host has them",
                    "the unit's device policy hides the GPUs (DevicePolicy=/PrivateDevices= in a "
                    "drop-in): allow /dev/nvidia*")
    floor = plan.kv_check.min_gbps
    if floor is not None and r["gbps"] < floor:
        return warn(name, f"{what}: under transfer.kv_check_min_gbps {floor:g}",
                    "check UCX_NET_DEVICES/NIC pairing and the GPUs' PCIe links "
                    "(`nvidia-smi topo -m`), or lower transfer.kv_check_min_gbps")
    return ok(name, f"{what}, intact; {_ran_as(r, how)}")
