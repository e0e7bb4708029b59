"""``--nnodes N > 1``: one engine over several hosts (torch.distributed's rendezvous).

Rank 0 listens at ``--dist-init-addr`` (a TCP store on rank 0's host) and waits for ranks
1…N-1 (each says ``rank R``); the others connect, retrying, and stay connected. A lost peer
afterwards is fatal on both sides, as an NCCL communicator error is (exit 1).
``FAKE_SGLANG_RENDEZVOUS_TIMEOUT`` (600 s) bounds the wait, as SGLang's dist timeout does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable

from .engine import Engine
from .util import emit, log


class Rendezvous:
    def __init__(self, engine: Engine, tick: Callable[[float], None]) -> None:
        self.engine = engine
        self.tick = tick  # the lifecycle's sleep: SIGTERM and the lifetime limit still apply
        a = engine.args
        host, _, port = a.dist_init_addr.rpartition(":")
        self.addr = (host.strip("[]"), int(port))
        self.rank, self.nnodes = a.node_rank, a.nnodes
        self.timeout = engine.knobs.rendezvous_timeout

    def join(self) -> int:
        log(f"Init torch distributed begin. rank={self.rank} nnodes={self.nnodes} "
            f"dist_init_addr={self.addr[0]}:{self.addr[1]}", tag="TP0")
        peers = self._lead() if self.rank == 0 else self._follow()
        if peers is None:
            return 1
        for rank, conn in peers:
            threading.Thread(target=self._watch, args=(rank, conn), daemon=True).start()
        log(f"Init torch distributed ends. {self.nnodes} nodes joined", tag="TP0")
        return 0

    def _lead(self) -> list[tuple[int, socket.socket]] | None:
        try:
            srv = socket.create_server(self.addr, reuse_port=False)
        except OSError as e:
            emit(f"RuntimeError: The server socket has failed to listen on any local network "
                 f"address. port: {self.addr[1]}, useIpv6: 0, code: -{e.errno}, name: "
                 f"EADDRINUSE, message: {(e.strerror or str(e)).lower()}")
            return None
        srv.settimeout(0.2)
        peers: list[tuple[int, socket.socket]] = []
        deadline = time.monotonic() + self.timeout
        while len(peers) < self.nnodes - 1:
            self.tick(0)
            if time.monotonic() > deadline:
                emit(f"torch.distributed.DistStoreError: Timed out after {self.timeout:g} s "
                     f"waiting for {self.nnodes - 1 - len(peers)} node(s) to join")
                return None
            try:
                conn, (ip, _) = srv.accept()
            except OSError:
                continue
            conn.settimeout(5)
            try:
                rank = int(conn.recv(64).decode().split()[1])
            except (OSError, ValueError, IndexError):
                conn.close()
                continue
            conn.settimeout(None)
            log(f"node rank {rank} joined from {ip}", tag="TP0")
            peers.append((rank, conn))
        srv.close()
        return peers

    def _follow(self) -> list[tuple[int, socket.socket]] | None:
        deadline = time.monotonic() + self.timeout
        while True:
            self.tick(0)
            try:
                conn = socket.create_connection(self.addr, timeout=2)
                conn.sendall(f"rank {self.rank}\n".encode())
                conn.settimeout(None)
                log(f"connected to rank 0 at {self.addr[0]}:{self.addr[1]}", tag="TP0")
                return [(0, conn)]
            except OSError as e:
                if time.monotonic() > deadline:
                    emit(f"torch.distributed.DistNetworkError: cannot connect to "
                         f"{self.addr[0]}:{self.addr[1]} after {self.timeout:g} s: {e}")
                    return None
                time.sleep(0.2)

    def _watch(self, rank: int, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(64):
                pass
        if self.engine.term_requested or self.engine.graceful_exit:
            return  # our own shutdown closed it
        emit(f"[rank{self.rank}] NCCL error: connection to node rank {rank} lost "
             f"(remote process exited or there was a network error); exiting with status 1")
        os._exit(1)
