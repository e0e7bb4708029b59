"""Free loopback ports for tests that start servers (the one helper every such test uses).

The ports come from below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
32768-60999 by default): a port there is only ever taken by a process that names it, never by
an outgoing connection or by a server binding port 0. Each xdist worker draws from a slice of
its own, so two tests running at once never get the same port. Before, ports came from
binding port 0: a port chosen and released by one test was once taken by another worker's
server a moment later, and a test that expected nothing to answer there got that server's
404 (CI, tests/test_fake_sglang_lifecycle.py).

doctor's port blocks (tests/support/doctor_box.py free_block) start at HIGH, above these.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator

LOW, HIGH = 10000, 21000  # [LOW, HIGH): below doctor's blocks and the ephemeral range
SLICES = 8  # xdist workers beyond 8 share a slice with worker n % 8 (bindable is still checked)


def worker_slice() -> int:
    """This xdist worker's slice, 0..SLICES-1 (0 outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(worker) % SLICES if worker.isdigit() else 0


def _slice() -> range:
    width = (HIGH - LOW) // SLICES
    return range(LOW + worker_slice() * width, LOW + (worker_slice() + 1) * width)


def bindable(port: int) -> bool:
    """Nothing holds the port, not even a connection in TIME_WAIT (no SO_REUSEADDR)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cursor() -> Iterator[int]:
    """This process's walk over its slice: from a random start (a second pytest run beside
    this one, or a helper process of this test, starts elsewhere), then round and round, so
    that a port comes back only after every other one of the slice was handed out."""
    ports = list(_slice())
    start = random.randrange(len(ports))
    return itertools.cycle(ports[start:] + ports[:start])


_walk = _cursor()


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1, from this worker's slice."""
    chosen: list[int] = []
    for _ in range(len(_slice())):
        port = next(_walk)
        if bindable(port):
            chosen.append(port)
            if len(chosen) == n:
                return chosen
    raise RuntimeError(f"fewer than {n} free ports in {_slice()} on 127.0.0.1")


def free_port() -> int:
    """One free port on 127.0.0.1 (nothing listens on it: connections are refused)."""
    return free_ports(1)[0]
