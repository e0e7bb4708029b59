"""One half of doctor's KV-path check, run under runtime.python exactly as the engine's unit
runs (its user, CPUs, environment): NIXL moves a KV-sized batch of blocks from a prefill-side
initiator to a decode-side target, as SGLang's NIXL connector does (RDMA WRITE from prefill
into decode memory, then a notification; sglang/srt/disaggregation/nixl/conn.py).

    target     allocate and register the blocks (GPU memory when torch sees a GPU, else host
               memory), serve the agent metadata and block descriptors over HTTP on --listen,
               wait for the initiator's notification and check every byte it wrote.
    initiator  fetch them (retrying until the target is up: across hosts the two halves start
               apart), write --rounds times, time each write, ask the target to verify.

Standard library, nixl and numpy (torch when present): the packages the SGLang venv has.
The result is one line on stderr, ``pdsvc-doctor-result {json}``; the target first prints
``pdsvc-doctor-kv-listen PORT`` there. UCX's own output (UCX_PROTO_INFO=y names the
transports it picked) goes to stdout, for the caller to read.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

RESULT_PREFIX = "pdsvc-doctor-result "
LISTEN_PREFIX = "pdsvc-doctor-kv-listen "
AGENT = "pdsvc-kv-{role}-{pair}"  # one name per half of each pair: NIXL refuses a second
# remote agent of a name it already has (NIXL_ERR_NOT_ALLOWED)


def say(prefix: str, payload: object) -> None:
    """On stderr, whole: UCX writes its own lines to stdout, from its own threads."""
    sys.stderr.write(prefix + (payload if isinstance(payload, str) else json.dumps(payload))
                     + "\n")
    sys.stderr.flush()


def cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


class Blocks:
    """The KV blocks: one buffer cut into equal blocks, in GPU memory (cuda:0, the first GPU
    of the unit's CUDA_VISIBLE_DEVICES) when torch sees one, else in host memory. The bytes
    follow a pattern a seed picks, so a block written in the wrong place, or not at all, fails
    the check."""

    def __init__(self, total: int, blocks: int, mem: str) -> None:
        import numpy as np

        self.np = np
        self.block = total // blocks
        self.count = blocks
        self.torch = None
        # no /dev/nvidiactl: no GPU is visible here (none, or a device policy hides them), and
        # importing torch to learn that would cost seconds
        if mem == "vram" or (mem == "auto" and os.path.exists("/dev/nvidiactl")
                             and os.environ.get("CUDA_VISIBLE_DEVICES") != ""):
            try:
                import torch

                if torch.cuda.is_available():
                    self.torch = torch
            except ImportError:
                pass
            if mem == "vram" and self.torch is None:
                raise RuntimeError("--mem vram: torch sees no GPU in this environment")
        self._base = self._arange()
        if self.torch is not None:
            self.buf = self.torch.zeros(self.block * blocks, dtype=self.torch.uint8,
                                        device="cuda:0")
            self.addr = self.buf.data_ptr()
            self.kind, self.device = "VRAM", 0
            self.where = f"GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0]}"
        else:
            self.buf = np.zeros(self.block * blocks, dtype=np.uint8)
            self.addr = int(self.buf.ctypes.data)
            self.kind, self.device, self.where = "DRAM", 0, "host memory"

    def descs(self) -> list[tuple[int, int, int]]:
        return [(self.addr + i * self.block, self.block, self.device) for i in range(self.count)]

    def _arange(self):  # noqa: ANN202 - numpy or torch, whichever is here
        """i * 131 mod 251 for each byte of a block, made once (as int16: room to add to)."""
        if self.torch is not None:
            t = self.torch
            return (t.arange(self.block, dtype=t.int64, device="cuda:0") * 131 % 251).to(t.int16)
        return (self.np.arange(self.block, dtype=self.np.int64) * 131 % 251).astype(
            self.np.int16)

    def _pattern(self, seed: int, i: int):  # noqa: ANN202
        """Block i's bytes: the base shifted by a step that seed and i pick."""
        shifted = (self._base + (seed + i * 7919) % 251) % 251
        return (shifted.to(self.torch.uint8) if self.torch is not None
                else shifted.astype(self.np.uint8))

    def fill(self, seed: int) -> None:
        for i in range(self.count):
            self.buf[i * self.block:(i + 1) * self.block] = self._pattern(seed, i)

    def first_bad_block(self, seed: int) -> int | None:
        for i in range(self.count):
            got = self.buf[i * self.block:(i + 1) * self.block]
            same = (self.torch.equal(got, self._pattern(seed, i)) if self.torch is not None
                    else bool(self.np.array_equal(got, self._pattern(seed, i))))
            if not same:
                return i
        return None

    def sync(self) -> None:
        if self.torch is not None:
            self.torch.cuda.synchronize()


def make_agent(name: str, backend: str):  # noqa: ANN201 - nixl's type
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=[backend]))


def registered(agent, blocks: Blocks) -> None:  # noqa: ANN001
    reg = agent.get_reg_descs([(blocks.addr, blocks.block * blocks.count, blocks.device, "")],
                              blocks.kind)
    agent.register_memory(reg)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def run_target(args: argparse.Namespace) -> dict:
    """The decode-side half: register the blocks, serve their metadata, and once the
    initiator has written them, check them; the verdict, or where it failed."""
    stage = "agent"
    try:
        agent = make_agent(AGENT.format(role="target", pair=args.pair), args.backend)
        stage = "memory"
        blocks = Blocks(args.bytes, args.blocks, args.mem)
        registered(agent, blocks)
    except Exception as exc:  # noqa: BLE001 - every failure is the answer
        return {"ok": False, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}
    half = _TargetHalf(args, agent, blocks)
    host, _, port = args.listen.rpartition(":")
    try:
        server = _TargetServer((host.strip("[]"), int(port)), _TargetHandler)
    except OSError as exc:
        return {"ok": False, "stage": "listen", "error": f"{args.listen}: {exc}"}
    server.half = half
    say(LISTEN_PREFIX, str(server.server_address[1]))
    server.timeout = 0.5
    deadline = time.monotonic() + args.timeout
    while not half.verdict:
        server.handle_request()
        if not half.peer and time.monotonic() > deadline:
            half.verdict.update(ok=False, stage="peer",
                                error=f"no prefill-side half came in {args.timeout:g} s")
    server.server_close()
    return half.verdict


class _TargetHalf:
    """The target's side of the exchange: its metadata, the initiator's agent once it said
    hello, and the verdict once it asked for one."""

    def __init__(self, args: argparse.Namespace, agent: Any, blocks: Blocks) -> None:
        self.args, self.agent, self.blocks = args, agent, blocks
        self.verdict: dict = {}
        self.peer: list[str] = []  # the initiator's agent name, once it said hello
        # the block descriptors as plain numbers: NIXL's own serialized form is a pickle, and
        # nothing read from the network is unpickled here
        self.meta = {"pair": args.pair, "metadata": b64(agent.get_agent_metadata()),
                     "descs": blocks.descs(), "kind": blocks.kind, "where": blocks.where,
                     "block": blocks.block, "blocks": blocks.count}

    def get(self, path: str) -> tuple[dict, int]:
        """The metadata, to this pair's initiator only (another pair's, across hosts, a host
        ahead or behind, is told it is not its peer)."""
        if path != f"/meta/{self.args.pair}":
            return {"pair": self.args.pair}, 409
        return self.meta, 200

    def post(self, path: str, asked: dict) -> tuple[dict, int]:
        """/hello: the initiator's agent; /verify: the blocks checked once it notified."""
        if asked.get("pair") != self.args.pair:
            return {"pair": self.args.pair}, 409
        if path != "/hello" and not self.peer:  # a verify before any hello: not our peer
            return {"pair": self.args.pair}, 409
        if path == "/hello":
            name = self.agent.add_remote_agent(base64.b64decode(asked["metadata"]))
            # bytes from NIXL 1.5's binding; notifications are filed under str names
            self.peer.append(name.decode() if isinstance(name, bytes) else name)
            return {"ok": True}, 200
        self._verify(asked)
        return self.verdict, 200

    def _verify(self, asked: dict) -> None:
        """Wait for the initiator's notification, then check the blocks it wrote."""
        deadline = time.monotonic() + self.args.timeout
        notif = asked["notif"].encode()
        while not self.agent.check_remote_xfer_done(self.peer[-1], notif):
            if time.monotonic() > deadline:
                self.verdict.update(
                    ok=False, stage="notify",
                    error=f"no notification from the initiator in {self.args.timeout} s")
                return
            time.sleep(0.001)
        self.blocks.sync()
        bad = self.blocks.first_bad_block(int(asked["seed"]))
        self.verdict.update(ok=True, intact=bad is None, first_bad_block=bad,
                            kind=self.blocks.kind, where=self.blocks.where)


class _TargetServer(HTTPServer):
    half: _TargetHalf


class _TargetHandler(BaseHTTPRequestHandler):
    """HTTP for the target half: each request answered by the server's _TargetHalf."""

    server: _TargetServer

    def log_message(self, *a: object) -> None:  # no access log on stderr
        pass

    def _send(self, body: dict, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(*self.server.half.get(self.path))

    def do_POST(self) -> None:  # noqa: N802
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send(*self.server.half.post(self.path, asked))


def call(url: str, body: dict | None, timeout: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def fetch_meta(url: str, pair: str, timeout: float) -> dict:
    """The target's metadata; it may not be up yet, or still serve another pair (across hosts
    the halves start apart): asked again until the bound."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call(f"{url}/meta/{pair}", None, 5)
        except (OSError, urllib.error.URLError) as exc:  # HTTPError 409 is a URLError too
            if time.monotonic() > deadline:
                code = getattr(exc, "code", None)
                raise TimeoutError(f"{url} served another pair for {timeout:g} s"
                                   if code == 409 else f"{url}: {exc}") from None
            time.sleep(0.2)


def run_initiator(args: argparse.Namespace) -> dict:
    stage = "agent"
    try:
        agent = make_agent(AGENT.format(role="initiator", pair=args.pair), args.backend)
        stage = "memory"
        blocks = Blocks(args.bytes, args.blocks, args.mem)
        seed = int.from_bytes(os.urandom(2), "little")
        blocks.fill(seed)
        blocks.sync()
        registered(agent, blocks)
        stage = "connect"
        meta = fetch_meta(args.target, args.pair, args.timeout)
        if (meta["block"], meta["blocks"]) != (blocks.block, blocks.count):
            raise RuntimeError(f"the target has {meta['blocks']} blocks of {meta['block']} B")
        remote_name = agent.add_remote_agent(base64.b64decode(meta["metadata"]))
        call(args.target + "/hello", {"pair": args.pair,
                                      "metadata": b64(agent.get_agent_metadata())}, 30)
        remote = agent.get_xfer_descs([(int(a), int(n), int(d)) for a, n, d in meta["descs"]],
                                      meta["kind"])
        local = agent.get_xfer_descs(blocks.descs(), blocks.kind)
        stage = "transfer"
        rates, backend, notif = [], "", ""
        for r in range(args.rounds):
            notif = f"pdsvc-kv-{seed}-{r}"
            handle = agent.initialize_xfer("WRITE", local, remote, remote_name, notif.encode())
            start = time.perf_counter()
            state = agent.transfer(handle)
            while state not in ("DONE", "ERR"):
                if time.perf_counter() - start > args.timeout:
                    raise TimeoutError(f"write {r + 1} not done in {args.timeout} s")
                state = agent.check_xfer_state(handle)
            seconds = time.perf_counter() - start
            if state == "ERR":
                raise RuntimeError(f"write {r + 1} ended in ERR")
            backend = agent.query_xfer_backend(handle)
            agent.release_xfer_handle(handle)
            rates.append(blocks.block * blocks.count / seconds / 1e9)
        stage = "verify"
        verdict = call(args.target + "/verify", {"pair": args.pair, "notif": notif,
                                                 "seed": seed}, args.timeout + 30)
    except Exception as exc:  # noqa: BLE001 - every failure is the answer
        return {"ok": False, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}
    warm = sorted(rates[1:] or rates)
    return {"ok": bool(verdict.get("ok")), "intact": verdict.get("intact"),
            "first_bad_block": verdict.get("first_bad_block"), "stage": verdict.get("stage"),
            "error": verdict.get("error"), "backend": backend, "gbps": warm[len(warm) // 2],
            "cold_gbps": rates[0], "rounds": len(rates), "kind": blocks.kind,
            "where": blocks.where, "peer_where": verdict.get("where", meta.get("where")),
            "peer_kind": meta.get("kind"),
            "bytes": blocks.block * blocks.count, "blocks": blocks.count}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvpath")
    ap.add_argument("marker")
    ap.add_argument("role", choices=("target", "initiator"))
    ap.add_argument("--pair", required=True, help="PREFILL→DECODE: which pair this half is of")
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--target", default="")
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mem", choices=("auto", "vram", "dram"), default="auto")
    ap.add_argument("--backend", default=os.environ.get("SGLANG_DISAGGREGATION_NIXL_BACKEND",
                                                        "UCX"))
    ap.add_argument("--cpus", default="", help="pin to these CPUs (when no systemd does)")
    ap.add_argument("--memlock", action="store_true",
                    help="raise the locked-memory limit to its hard limit (the units have "
                    "LimitMEMLOCK=infinity; RDMA registration needs it)")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args(argv)
    # A bound of its own: a half whose peer never comes must not outlive the check.
    signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
    signal.alarm(int(args.timeout * 2 + 30))
    threading.current_thread().name = args.role
    try:
        if args.memlock:
            import resource

            _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        if args.cpus:
            os.sched_setaffinity(0, cpu_list(args.cpus))
    except (OSError, ValueError) as exc:
        result = {"ok": False, "stage": "pin", "error": f"{exc} (--cpus {args.cpus or '-'})"}
    else:
        result = run_target(args) if args.role == "target" else run_initiator(args)
    result["role"] = args.role
    result["cpus"] = sorted(os.sched_getaffinity(0))
    result["user"] = os.getuid()
    result["env"] = {k: v for k, v in os.environ.items()
                     if k.startswith("UCX_") or k in ("CUDA_VISIBLE_DEVICES",
                                                      "SGLANG_DISAGGREGATION_NIXL_BACKEND")}
    say(RESULT_PREFIX, result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
