"""The systemd-nspawn harness (tests/support/nspawn.py) against a real systemd.

Skipped where nspawn can't be used (not root, no systemd-nspawn), unless PDSVC_REQUIRE_E2E=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import nspawn  # tests/support is on the path (pyproject.toml: pythonpath)
import pytest
from nspawn import ContainerCommandError, ContainerError, SystemdContainer, wait_for
from ports import free_port

systemd_container = nspawn.systemd_container  # the fixture (an import would trip ruff F811)

pytestmark = pytest.mark.e2e

PY = "/usr/bin/python3"  # the container has the host's /usr, not the pyenv Python


def http_get_inside(c: SystemdContainer, url: str) -> str:
    """GET ``url`` from inside the container (Debian's python3 + urllib); body or ''."""
    code = (
        "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=5)"
        ".read().decode())"
    )
    r = c.run([PY, "-c", code, url], check=False, timeout=15)
    return r.stdout if r.returncode == 0 else ""


def procs_mentioning(name: str) -> list[str]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if name.encode() in cmdline:
                out.append(f"{entry.name}: {cmdline.decode(errors='replace')}")
    return out


# --------------------------------------------------------------------------- no container


def test_wait_for_returns_value_and_names_what_on_timeout():
    calls = iter([0, "", "ok"])
    assert wait_for(lambda: next(calls), timeout=5, interval=0.01, what="x") == "ok"

    def boom():
        raise ValueError("nope")

    with pytest.raises(AssertionError, match=r"waiting for the frobnicator.*nope"):
        wait_for(boom, timeout=0.2, interval=0.05, what="the frobnicator")


def test_require_nspawn_skips_or_fails_under_ci(monkeypatch):
    monkeypatch.setattr(nspawn, "nspawn_available", lambda: "no nspawn here")
    monkeypatch.delenv("PDSVC_REQUIRE_E2E", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no nspawn here"):
        nspawn.require_nspawn()
    monkeypatch.setenv("PDSVC_REQUIRE_E2E", "1")
    with pytest.raises(pytest.fail.Exception, match="no nspawn here"):
        nspawn.require_nspawn()
    monkeypatch.setattr(nspawn, "nspawn_available", lambda: None)
    nspawn.require_nspawn()  # available: neither


# --------------------------------------------------------------------------- real systemd


def test_boots_to_running_and_tools_work(systemd_container):
    c = systemd_container()
    assert c.name.startswith("pdsvc-")
    assert c.boot_state in ("running", "degraded"), c.diagnostics()
    assert c.boot_state == "running", f"failed units: {c.failed_units}"
    assert c.systemctl("is-system-running").stdout.strip() == "running"
    assert c.run("systemd-analyze").stdout.startswith("Startup finished")
    # /etc is a writable tmpfs in --volatile=yes; /usr is the host's, read-only
    c.write_file("/etc/pdsvc/probe.conf", "a=1\n", mode=0o600)
    assert c.read_file("/etc/pdsvc/probe.conf") == "a=1\n"
    assert c.run(["stat", "-c", "%a", "/etc/pdsvc/probe.conf"]).stdout.strip() == "600"
    assert c.exists("/etc/pdsvc/probe.conf") and not c.exists("/etc/pdsvc/nope")
    r = c.run("touch /usr/pdsvc-probe", check=False)
    assert r.returncode != 0 and "Read-only" in r.stderr
    with pytest.raises(ContainerCommandError, match="exited 3"):
        c.run("echo to-stdout; exit 3")


def test_exec_service_http_journal_and_stop(systemd_container):
    c = systemd_container()
    port = free_port()
    c.install_unit(
        "pdsvc-probe-http.service",
        textwrap.dedent(
            f"""\
            [Unit]
            Description=pdsvc harness probe (http.server)

            [Service]
            Type=exec
            ExecStart={PY} -u -m http.server --bind 127.0.0.1 {port} --directory /srv/probe
            """
        ),
    )
    c.write_file("/srv/probe/index.html", "hello from the container\n")
    verify = c.run(
        ["systemd-analyze", "verify", "--man=no", "pdsvc-probe-http.service"], check=False
    )
    assert verify.returncode == 0, verify.stderr

    c.systemctl("start", "pdsvc-probe-http.service")
    props = c.show("pdsvc-probe-http.service", "ActiveState", "SubState", "MainPID", "Type")
    assert props["ActiveState"] == "active" and props["Type"] == "exec", props
    assert int(props["MainPID"]) > 0

    body = c.wait_for(
        lambda: http_get_inside(c, f"http://127.0.0.1:{port}/"),
        timeout=20,
        what=f"http.server on 127.0.0.1:{port} inside the container",
    )
    assert body == "hello from the container\n"
    log = c.wait_for(
        lambda: (j := c.journal("pdsvc-probe-http.service")) and '"GET / HTTP/1.1" 200' in j and j,
        timeout=10,
        what="the request line in the unit's journal",
    )
    assert f"Serving HTTP on 127.0.0.1 port {port}" in log

    c.systemctl("stop", "pdsvc-probe-http.service")
    assert c.unit_state("pdsvc-probe-http.service") == "inactive"
    assert http_get_inside(c, f"http://127.0.0.1:{port}/") == ""


def test_unit_runs_as_user_created_inside(systemd_container):
    c = systemd_container()
    c.useradd("pdsvc-probe")
    ids = c.run(["id", "pdsvc-probe"]).stdout
    assert "(pdsvc-probe)" in ids.split()[1], ids  # its own group (--user-group)
    code = (
        "import os, pwd, time; print('running as', pwd.getpwuid(os.getuid()).pw_name); "
        "time.sleep(300)"
    )
    c.install_unit(
        "pdsvc-probe-user.service",
        f'[Service]\nType=exec\nUser=pdsvc-probe\nExecStart={PY} -u -c "{code}"\n',
    )
    c.systemctl("start", "pdsvc-probe-user.service")
    c.wait_for(
        lambda: "running as pdsvc-probe" in c.journal("pdsvc-probe-user.service"),
        timeout=15,
        what="the User= service's output in the journal",
    )
    pid = c.show("pdsvc-probe-user.service", "MainPID")["MainPID"]
    assert c.run(["ps", "-o", "user=", "-p", pid]).stdout.strip() == "pdsvc-probe"
    c.systemctl("stop", "pdsvc-probe-user.service")


def test_bind_mounted_debian_venv_runs_inside(systemd_container, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("from the host\n")
    c = systemd_container(bind_ro=[str(venv), (str(tmp_path / "data"), "/srv/data")])
    out = c.run([f"{venv}/bin/python", "-c", "import sys; print(sys.prefix)"]).stdout
    assert out.strip() == str(venv)
    assert c.read_file("/srv/data/x.txt") == "from the host\n"
    assert c.run("echo x > /srv/data/y.txt", check=False).returncode != 0  # read-only


def test_stop_leaves_nothing_behind():
    nspawn.require_nspawn()
    with SystemdContainer() as c:
        name, init, nsp = c.name, c.pid, c.nspawn_pid
        assert c.is_running() and procs_mentioning(name)
        cgroups = list(c._cgroups)
    assert not c.is_running()
    assert not Path(f"/proc/{init}").exists() and not Path(f"/proc/{nsp}").exists()
    assert procs_mentioning(name) == []
    assert [d for d in cgroups if d.exists()] == []
    assert c.name not in [x.name for x in nspawn.live_containers()]
    c.stop()  # idempotent
    with pytest.raises(ContainerError, match="not running"):
        c.run("true")


def test_two_containers_do_not_share_cgroups(systemd_container):
    # With the host's PID 1 not being systemd, nspawn --keep-unit would put every container
    # under the same <cgroup>/payload; stopping a unit in one would then kill the other's.
    a, b = systemd_container(), systemd_container()
    unit = f"[Service]\nType=exec\nExecStart={PY} -c 'import time; time.sleep(300)'\n"
    for c in (a, b):
        c.install_unit("pdsvc-probe-same.service", unit)
        c.systemctl("start", "pdsvc-probe-same.service")
    pid_b = b.show("pdsvc-probe-same.service", "MainPID")["MainPID"]
    a.systemctl("stop", "pdsvc-probe-same.service")
    assert a.unit_state("pdsvc-probe-same.service") == "inactive"
    assert b.unit_state("pdsvc-probe-same.service") == "active"
    assert b.show("pdsvc-probe-same.service", "MainPID")["MainPID"] == pid_b
    cg_a = Path(f"/proc/{a.pid}/cgroup").read_text()
    assert a.name in cg_a and b.name not in cg_a


def test_network_namespace_variant(systemd_container):
    nspawn.require_nspawn()
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) not installed")
    ns = f"pdsvc-test-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        c = systemd_container(netns=ns)
        host_net = os.readlink("/proc/self/ns/net")
        inside_net = c.run(["readlink", "/proc/self/ns/net"]).stdout.strip()
        assert inside_net == os.readlink(f"/proc/{c.pid}/ns/net") != host_net
        # lo is up (the harness does that: the container's PID 1 has no CAP_NET_ADMIN)
        assert "127.0.0.1/8" in c.run(["ip", "-br", "addr", "show", "lo"]).stdout
        c.stop()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
