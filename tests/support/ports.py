"""Free loopback ports for tests that start servers (the one helper every such test uses)."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all kept bound until every one is chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One free port on 127.0.0.1 (nothing listens on it: connections are refused)."""
    return free_ports(1)[0]
