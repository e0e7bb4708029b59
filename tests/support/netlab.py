"""A private multi-host network on this one machine, built from network namespaces only.

For end-to-end tests where several hosts (router, prefill, decode ...) must reach each other
over routable addresses - not 127.0.0.1 - while everything runs on one machine. Stdlib only.

Topology of ``NetLab(["lb", "gpu-a", "gpu-b"])`` (``T`` = a random 6-hex tag per lab)::

    netns pdsvc-nl-T-lb      netns pdsvc-nl-T-gpu-a     netns pdsvc-nl-T-gpu-b
      lo up, eth0 10.213.X.1   lo up, eth0 10.213.X.2     lo up, eth0 10.213.X.3
           |  (veth)                |  (veth)                  |  (veth)
      v0-T ---------------+--- v1-T ----------------+--- v2-T
                          |   netns pdsvc-nl-T: bridge br-T (no address, no uplink)

* One "hub" namespace holds a Linux bridge; per host a namespace with one end of a veth pair
  (named :attr:`NetLab.device`, ``eth0``), the other end in the hub, enslaved to the bridge.
  Addresses are ``.1, .2, ...`` of a /24 the lab picks (``10.213.X.0/24``, ``X`` random and
  not on any interface of the root namespace), in the order the hosts were given.
* Nothing is ever created in the root (initial) namespace: each veth pair is made by
  ``ip -n HUB link add vI-T type veth peer name eth0 netns HOST``, i.e. born in the hub
  with its peer born in the host's namespace. No namespace has a default route and the hub
  has no uplink, so traffic cannot leave the lab's namespaces.
* ``lo`` is brought up in every host namespace too (connections to a host's own lab address,
  like 127.0.0.1, go through ``lo``).
* A systemd container joins a host with ``SystemdContainer(netns=lab.netns(host))``. The
  container's PID 1 has no CAP_NET_ADMIN, so it could not configure ``eth0`` itself; it
  does not need to: the address and link state are set from outside before it boots.
* :meth:`NetLab.close` deletes every namespace the lab made (which destroys the bridge and
  the veth pairs); it is idempotent, runs on ``__exit__``, after a failed construction, and
  at interpreter exit for labs still open. A SIGKILLed test process leaves ``pdsvc-nl-*``
  entries in ``ip netns list``; ``ip netns del NAME`` removes them.
* Stop containers before closing their lab: a namespace deleted while a container still
  runs in it only disappears from /run/netns; it lives on until the container is gone.

Using it (``tests/support`` is on the path: pyproject.toml's pytest ``pythonpath``)::

    import netlab, nspawn
    net_lab, systemd_container = netlab.net_lab, nspawn.systemd_container  # the fixtures

    def test_x(net_lab, systemd_container):   # net_lab first: torn down after the containers
        lab = net_lab(["lb", "gpu-a"])
        a = systemd_container(netns=lab.netns("gpu-a"))
        ...  # a service in `a` bound to lab.address("gpu-a") is reachable from the "lb" host
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence

import pytest

__all__ = ["NetLab", "NetLabError", "close_all", "net_lab", "netlab_available"]

DEVICE = "eth0"
NETNS_PREFIX = "pdsvc-nl-"
CMD_TIMEOUT = 30.0
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


class NetLabError(RuntimeError):
    """The lab could not be built (whatever had been made is already removed)."""


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run one ``ip`` command; NetLabError (with its stderr) if it fails. Every step goes
    through here (tests patch it to inject failures)."""
    try:
        r = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=CMD_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetLabError(f"{' '.join(argv)}: {e}") from None
    if r.returncode != 0:
        raise NetLabError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def _del_netns(name: str) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["ip", "netns", "del", name], capture_output=True, timeout=CMD_TIMEOUT, check=False
        )


def netlab_available() -> str | None:
    """None if a lab can be built here, else why not (probes a throw-away netns + bridge +
    veth pair, deleted again)."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (platform is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespace labs need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) not found on PATH"
    ns = f"{NETNS_PREFIX}probe-{uuid.uuid4().hex[:6]}"
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "add", "br-probe", "type", "bridge"])
        _run(["ip", "-n", ns, "link", "add", "vp0", "type", "veth", "peer", "name", "vp1"])
        _run(["ip", "-n", ns, "link", "set", "vp0", "master", "br-probe"])
    except NetLabError as e:
        return f"cannot build a bridge + veth network namespace here: {e}"
    finally:
        _del_netns(ns)
    return None


_LIVE: dict[str, NetLab] = {}
_LIVE_LOCK = threading.Lock()


def close_all() -> None:
    """Close every lab this process still has open (registered with atexit)."""
    with _LIVE_LOCK:
        labs = list(_LIVE.values())
    for lab in labs:
        lab.close()


atexit.register(close_all)


def _pick_subnet() -> ipaddress.IPv4Network:
    """A random 10.213.X.0/24 that no interface of the root namespace is in."""
    out = _run(["ip", "-o", "-4", "addr", "show"]).stdout
    used = {ipaddress.ip_interface(w).network for w in re.findall(r"inet (\S+)", out)}
    for x in random.sample(range(256), 256):
        net = ipaddress.IPv4Network(f"10.213.{x}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetLabError("every 10.213.X.0/24 is in use in the root namespace")


class NetLab:
    """Hosts on a private bridge, one network namespace each (see the module docstring).

    ``NetLab(hosts, subnet=None)`` builds it at once; use it as a context manager or call
    :meth:`close`. ``subnet`` (an IPv4 network, e.g. ``"10.9.8.0/24"``) overrides the
    random pick.
    """

    device: str = DEVICE  #: the lab's interface inside every host namespace

    def __init__(self, hosts: Iterable[str], subnet: str | None = None) -> None:
        self.hosts: list[str] = list(hosts)
        if not self.hosts:
            raise ValueError("a NetLab needs at least one host")
        for h in self.hosts:
            if not _HOST_RE.fullmatch(h):
                raise ValueError(f"bad host name {h!r} (want [A-Za-z0-9][A-Za-z0-9_.-]{{0,31}})")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"duplicate host names: {self.hosts}")
        net = ipaddress.IPv4Network(subnet) if subnet else _pick_subnet()
        if net.num_addresses - 2 < len(self.hosts):
            raise ValueError(f"{net} has no room for {len(self.hosts)} hosts")
        self.subnet: str = str(net)
        self.prefixlen: int = net.prefixlen
        self.tag: str = uuid.uuid4().hex[:6]
        self.hub: str = f"{NETNS_PREFIX}{self.tag}"  #: the hub's netns name
        self.bridge: str = f"br-{self.tag}"
        self._addr = {h: str(net[i + 1]) for i, h in enumerate(self.hosts)}
        self._netns = {h: f"{NETNS_PREFIX}{self.tag}-{h}" for h in self.hosts}
        self._made: list[str] = []  # namespaces created so far, for close()
        self._closed = False
        with _LIVE_LOCK:
            _LIVE[self.tag] = self
        try:
            self._build()
        except BaseException as e:
            self.close()
            if isinstance(e, NetLabError):
                raise NetLabError(f"building NetLab {self.hosts} failed: {e}") from e
            raise

    def _add_netns(self, name: str) -> None:
        self._made.append(name)  # before: a half-made one is deleted too (harmless if absent)
        _run(["ip", "netns", "add", name])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _build(self) -> None:
        self._add_netns(self.hub)
        bridge = ["ip", "-n", self.hub, "link", "add", self.bridge, "type", "bridge"]
        _run([*bridge, "forward_delay", "0"])  # no STP: ports forward at once
        _run(["ip", "-n", self.hub, "link", "set", self.bridge, "up"])
        for i, host in enumerate(self.hosts):
            ns, port = self._netns[host], f"v{i}-{self.tag}"
            self._add_netns(ns)
            # born in the hub, its peer born in the host's namespace: never in the root one
            peer = ["peer", "name", self.device, "netns", ns]
            _run(["ip", "-n", self.hub, "link", "add", port, "type", "veth", *peer])
            _run(["ip", "-n", self.hub, "link", "set", port, "master", self.bridge, "up"])
            cidr = f"{self._addr[host]}/{self.prefixlen}"
            _run(["ip", "-n", ns, "addr", "add", cidr, "dev", self.device])
            _run(["ip", "-n", ns, "link", "set", self.device, "up"])

    # ------------------------------------------------------------------ queries

    def _check(self, host: str) -> None:
        if host not in self._addr:
            raise KeyError(f"no host {host!r} in this lab (hosts: {self.hosts})")

    def address(self, host: str) -> str:
        """The host's address on the lab network, e.g. ``10.213.7.2``."""
        self._check(host)
        return self._addr[host]

    def spare_address(self) -> str:
        """An address of the lab's subnet that no host has (the last one before broadcast):
        for a moving address (keepalived's) that one host of the lab adds to its device."""
        return str(ipaddress.IPv4Network(self.subnet)[-2])

    def cut(self, host: str, up: bool = False) -> None:
        """Take the host off the lab's network, or put it back (``up``): its port on the hub's
        bridge goes down, as a host lost by power or a switch port would be; the host itself
        sees its own device up and goes on as it was (a keepalived there stays master)."""
        self._check(host)
        port = f"v{self.hosts.index(host)}-{self.tag}"
        _run(["ip", "-n", self.hub, "link", "set", port, "up" if up else "down"])

    def netns(self, host: str) -> str:
        """The host's network namespace name (under /run/netns; for ``SystemdContainer``)."""
        self._check(host)
        return self._netns[host]

    def exec_argv(self, host: str, *argv: str) -> list[str]:
        """``ip netns exec NS ARGV...``: run a command on the host's network from the root
        mount namespace (e.g. a probe before any container is up)."""
        return ["ip", "netns", "exec", self.netns(host), *argv]

    @property
    def namespaces(self) -> list[str]:
        """Every netns name of the lab, the hub first (whether or not already made)."""
        return [self.hub, *self._netns.values()]

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Delete every namespace the lab made (bridge and veths go with them). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for ns in reversed(self._made):
            _del_netns(ns)
        self._made.clear()
        with _LIVE_LOCK:
            _LIVE.pop(self.tag, None)

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<NetLab {self.tag} {self.subnet} {self._addr} {state}>"


@pytest.fixture
def net_lab() -> Iterator[Callable[..., NetLab]]:
    """Factory ``(hosts, subnet=None) -> NetLab``; every lab it made is closed at teardown.
    Skips (fails under PDSVC_REQUIRE_E2E=1) where no lab can be built. Request it before
    ``systemd_container`` so the containers are stopped before their namespaces go."""
    from conftest import require  # tests/conftest.py: the skip-or-fail rule

    require(netlab_available())
    labs: list[NetLab] = []

    def factory(hosts: Iterable[str], subnet: str | None = None) -> NetLab:
        labs.append(NetLab(hosts, subnet))
        return labs[-1]

    yield factory
    for lab in reversed(labs):
        lab.close()
