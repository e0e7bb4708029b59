"""tests/support/netlab.py: several hosts on one machine, reachable only inside the lab.

Needs root and iproute2 (skipped otherwise, failed under PDSVC_REQUIRE_E2E=1); the container
test also needs systemd-nspawn.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys

import netlab  # tests/support is on the path (pyproject.toml: pythonpath)
import nspawn
import pytest
from conftest import require
from netlab import NetLab, NetLabError, netlab_available

net_lab = netlab.net_lab  # the fixtures (an import would trip ruff F811)
systemd_container = nspawn.systemd_container

PY = "/usr/bin/python3"  # what the containers have (the host's /usr)

# Serves one line per connection on ADDR:PORT; gives up after 60 s.
SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
s.settimeout(60)
while True:
    conn, peer = s.accept()
    conn.sendall(f"hello {peer[0]} from {sys.argv[3]}".encode())
    conn.close()
"""
# Connects to ADDR:PORT (retrying for up to 15 s while the server comes up); prints the reply.
CLIENT = """
import socket, sys, time
end = time.monotonic() + 15
while True:
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as c:
            print(c.recv(200).decode())
            break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.1)
"""
# GET a URL with retries for up to 20 s (inside a container: Debian's python3).
FETCH = """
import sys, time, urllib.request as u
end = time.monotonic() + 20
while True:
    try:
        sys.stdout.write(u.urlopen(sys.argv[1], timeout=3).read().decode())
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.2)
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def netns_list() -> set[str]:
    return {line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()}


def root_links() -> set[str]:
    lines = sh("ip", "-o", "link").splitlines()
    return {line.split(":")[1].strip().split("@")[0] for line in lines}


@pytest.fixture(autouse=True)
def _needs_netlab() -> None:
    require(netlab_available())


def test_three_hosts_reach_each_other_and_nothing_else():
    links_before = root_links()
    lab = NetLab(["lb", "gpu-a", "gpu-b"])
    try:
        net = ipaddress.IPv4Network(lab.subnet)
        prefix = lab.subnet.rsplit(".", 1)[0] + "."  # "10.213.X."
        assert [lab.address(h) for h in lab.hosts] == [str(net[1]), str(net[2]), str(net[3])]
        assert set(lab.namespaces) <= netns_list()
        for h in lab.hosts:
            ns = lab.netns(h)
            addr = sh("ip", "-n", ns, "-o", "-4", "addr", "show", "dev", lab.device)
            assert f"inet {lab.address(h)}/24 " in addr
            assert "state UP" in sh("ip", "-n", ns, "link", "show", lab.device)
            assert "UP" in sh("ip", "-n", ns, "link", "show", "lo").split(">")[0]
            routes = sh("ip", "-n", ns, "route").splitlines()
            assert routes == [next(r for r in routes if r.startswith(f"{net} dev {lab.device}"))]
        # the root namespace has nothing of the lab: no address, route or new interface
        assert prefix not in sh("ip", "-o", "addr") and prefix not in sh("ip", "route")
        assert root_links() - links_before == set()

        server_addr = lab.address("gpu-b")
        server = subprocess.Popen(
            lab.exec_argv("gpu-b", sys.executable, "-c", SERVER, server_addr, "8080", "B"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for client in ("lb", "gpu-a", "gpu-b"):  # gpu-b to itself: through lo
                argv = lab.exec_argv(client, sys.executable, "-c", CLIENT, server_addr, "8080")
                out = sh(*argv)
                assert out.strip() == f"hello {lab.address(client)} from B"
        finally:
            server.kill()
            server.wait(timeout=10)
    finally:
        lab.close()
    assert not set(lab.namespaces) & netns_list()
    lab.close()  # idempotent


@pytest.mark.e2e
def test_service_in_one_container_reachable_from_another(net_lab, systemd_container):
    lab = net_lab(["gpu-a", "gpu-b"])
    a = systemd_container(netns=lab.netns("gpu-a"))
    b = systemd_container(netns=lab.netns("gpu-b"))
    addr_a = lab.address("gpu-a")
    # systemd inside sees the interface as the lab configured it (set from outside before boot)
    assert f"{lab.address('gpu-b')}/24" in b.run(["ip", "-br", "addr", "show", lab.device]).stdout
    a.write_file("/srv/www/hello.txt", "hello from gpu-a\n")
    serve = [PY, "-m", "http.server", "--bind", addr_a, "--directory", "/srv/www", "8080"]
    a.run(["systemd-run", "--unit=netlab-http", "--property=RuntimeMaxSec=120", *serve])
    out = b.run([PY, "-c", FETCH, f"http://{addr_a}:8080/hello.txt"], timeout=40).stdout
    assert out == "hello from gpu-a\n"
    assert a.unit_state("netlab-http.service") == "active"
    assert f"{lab.address('gpu-b')} - - " in a.journal("netlab-http.service")  # B's address
    a.systemctl("stop", "netlab-http.service")


@pytest.mark.parametrize(
    "fail_on, exc",
    [
        ("type veth", NetLabError),  # the second host's veth pair: `ip` fails
        ("addr add", RuntimeError),  # a bug (not an `ip` error) while configuring host 2
    ],
)
def test_failed_build_leaves_no_namespace(monkeypatch, fail_on, exc):
    made: list[str] = []
    seen = 0
    real_run = netlab._run

    def flaky(argv):
        nonlocal seen
        if argv[:3] == ["ip", "netns", "add"]:
            made.append(argv[3])
        if fail_on in " ".join(argv):
            seen += 1
            if seen == 2:
                raise exc(f"injected failure in {argv}")
        return real_run(argv)

    monkeypatch.setattr(netlab, "_run", flaky)
    live = dict(netlab._LIVE)  # the session's host lab may be up (tests/support/host_labs.py)
    with pytest.raises(exc, match="injected failure"):
        NetLab(["lb", "gpu-a", "gpu-b"])
    assert len(made) == 3  # hub, lb, gpu-a were made before the failure ...
    assert not set(made) & netns_list()  # ... and are gone again
    assert live == netlab._LIVE  # and the half-built lab is not left registered


def test_bad_arguments_create_nothing(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(netlab, "_run", lambda argv: calls.append(argv))
    for hosts in ([], ["a", "a"], ["bad/name"]):
        with pytest.raises(ValueError):
            NetLab(hosts)
    with pytest.raises(ValueError, match="no room"):
        NetLab(["a", "b", "c"], subnet="10.9.8.0/30")
    assert calls == []  # rejected before any `ip` command
    monkeypatch.undo()
    with NetLab(["x"], subnet="10.9.8.0/30") as lab:
        assert lab.address("x") == "10.9.8.1"
        with pytest.raises(KeyError, match="no host 'y'"):
            lab.netns("y")
