"""The installer's pure parts, without root or systemd: install.list parsing, the command line
and its refusals, the manifest, the ownership test it shares with the bundle writer, and a
DESTDIR staging (and its --dry-run --json plan) through install.sh as a packager runs it.
Under a real systemd: tests/test_e2e_install.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdsvc.ship.install.cli import config_candidates, parse_args, refuse_host
from pdsvc.ship.install.errors import Refused, Usage
from pdsvc.ship.install.listfile import load, parse_list
from pdsvc.ship.install.manifest import Manifest, ownership, parse_manifest, sha256_bytes

REPO = Path(__file__).resolve().parent.parent
#: The seed bundle the golden test pins (tests/golden/regenerate.py).
GOLDEN = REPO / "tests" / "golden" / "seed"
SEED = ["--topology", str(REPO / "etc/seed-host.topology.json")]


# --------------------------------------------------------------------------- install.list


def test_the_seed_bundles_list_parses_into_what_it_says() -> None:
    b = load(GOLDEN)
    assert (b.name, b.target, b.user, b.group, b.home) == (
        "dsv4", "dsv4-pd.target", "sglang", "sglang", "/var/lib/dsv4")
    assert b.unit_names[0] == "dsv4-pd.target" and len(b.units) == 5
    assert {u.mode for u in b.units} == {"0644"}
    assert b.files[0].src == "runtime/__init__.py"
    assert b.files[0].dest == "/usr/local/lib/pdsvc/dsv4/runtime/__init__.py"
    assert [(d.dest, d.mode, d.owner) for d in b.dirs] == [
        ("/etc/dsv4", "0750", "root:sglang"), ("/var/cache/dsv4/jit", "0750", "sglang:sglang"),
        ("/var/lib/dsv4", "0750", "sglang:sglang")]
    assert b.secret_use() == ("make", "/etc/dsv4/router.key")
    assert b.manifest == "/var/lib/pdsvc/dsv4.manifest"
    assert (b.sysusers, b.tmpfiles) == ("sysusers.d/dsv4.conf", "tmpfiles.d/dsv4.conf")
    assert b.members == ["video", "render"]
    assert len(b.envfiles) == 3 and b.config_sha == hashlib.sha256(
        (REPO / "etc/pdsvc.yaml").read_bytes()).hexdigest()


def test_every_directory_and_env_file_is_in_the_tmpfiles_file_too() -> None:
    """install.list and tmpfiles.d come from one list of the plan: same paths, modes, owners."""
    b = load(GOLDEN)
    lines = [line.split() for line in (GOLDEN / b.tmpfiles).read_text().splitlines()
             if line and not line.startswith("#")]
    want = [["d", i.dest, i.mode, *i.owner.split(":"), "-"] for i in b.dirs]
    want += [["f", i.dest, i.mode, *i.owner.split(":"), "-"] for i in b.envfiles]
    assert lines == want


def test_an_unknown_or_incomplete_list_is_refused() -> None:
    with pytest.raises(Refused, match="unknown entry 'frobnicate'.*newer pdsvc"):
        parse_list("name\tx\nfrobnicate\ty\n", Path("b/install.list"))
    with pytest.raises(Refused, match="is incomplete; run `pdsvc render` again"):
        parse_list("name\tx\ntarget\tx.target\n", Path("b/install.list"))


def test_no_bundle_and_a_bundle_of_several_hosts_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(Refused, match=r"install.list not found: run `pdsvc render` first"):
        load(tmp_path)
    (tmp_path / "hosts.list").write_text("# header\nlb\t10.0.0.1\tx\ngpu-a\t10.0.0.2\ty\n")
    with pytest.raises(Refused, match=r"one bundle per host \(lb, gpu-a\): on each host run "
                       r"install.sh --bundle .*/HOST"):
        load(tmp_path)


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize(("argv", "dest", "message"), [
    (["--bogus"], "", "unknown option --bogus"),
    (["--bundle"], "", "--bundle needs a directory"),
    (["--purge"], "", "--purge only goes with --uninstall"),
    (["--uninstall", "--start"], "", "--start does not go with --uninstall or DESTDIR"),
    (["--start"], "/stage", "--start does not go with --uninstall or DESTDIR"),
    (["--uninstall", "--key-from", "k"], "", "--key-from does not go with --uninstall"),
    (["--json"], "", "--json goes with --dry-run"),
    ([], "relative", "DESTDIR must be an absolute path"),
])
def test_usage_errors(argv: list[str], dest: str, message: str) -> None:
    with pytest.raises(Usage, match=message):
        parse_args(argv, "units", dest)


def test_options_and_defaults() -> None:
    o = parse_args(["--bundle", "b", "--unit-dir", "/usr/lib/systemd/system/", "--dry-run",
                    "--json"], "units", "/stage/")
    assert (o.bundle, o.unit_dir, o.dest, o.dry_run, o.json) == (
        "b", "/usr/lib/systemd/system", "/stage", True, True)
    assert parse_args([], "here/units").bundle == "here/units"


def test_refusals_about_the_host(tmp_path: Path) -> None:
    systemd = tmp_path / "run-systemd"
    systemd.mkdir()
    with pytest.raises(Refused, match=r"must run as root \(sudo ./install.sh\)"):
        refuse_host(parse_args([], "u"), 1000, systemd)
    refuse_host(parse_args(["--dry-run"], "u"), 1000, systemd)  # a dry run needs no root
    with pytest.raises(Refused, match="systemd is not PID 1 here.*DESTDIR=DIR"):
        refuse_host(parse_args(["--dry-run"], "u"), 0, tmp_path / "none")
    refuse_host(parse_args([], "u", "/stage"), 1000, tmp_path / "none")  # DESTDIR needs neither


def test_the_config_is_looked_for_beside_the_script_the_bundle_and_here() -> None:
    assert config_candidates("etc/c.yaml", "/p/units", "/repo", "/cwd") == [
        "/repo/etc/c.yaml", "/p/etc/c.yaml", "/cwd/etc/c.yaml"]
    assert config_candidates("/abs/c.yaml", "/p/units", None, "/cwd") == [
        "/abs/c.yaml", "/p/c.yaml"]


# --------------------------------------------------------------------------- manifest


def test_manifest_round_trip_keeps_order_and_first_entry() -> None:
    m = Manifest(target="x.target", unit_dir="/etc/systemd/system")
    m.add("file", "/etc/systemd/system/x.target", "abc")
    m.add("user", "sglang")
    m.add("file", "/etc/systemd/system/x.target", "other")  # the first one wins
    text = m.format("x", "what install.sh created")
    assert text.splitlines() == [
        "# pdsvc install manifest for x: what install.sh created",
        "target\tx.target\t/etc/systemd/system",
        "file\t/etc/systemd/system/x.target\tabc", "user\tsglang\t-"]
    back = parse_manifest(text + "bogus\t/x\t-\n")
    assert back.entries == m.entries and back.unit_dir == "/etc/systemd/system"
    assert back.unknown == ["bogus"] and back.info("user", "sglang") == "-"


def test_ownership_tells_an_update_from_an_edit(tmp_path: Path) -> None:
    f = tmp_path / "x.service"
    assert ownership(f, b"new", None) == "absent"
    f.write_bytes(b"new")
    assert ownership(f, b"new", None) == "same"
    f.write_bytes(b"old")
    assert ownership(f, b"new", sha256_bytes(b"old")) == "ours"  # what we wrote: an update
    assert ownership(f, b"new", sha256_bytes(b"else")) == "edited"
    assert ownership(f, b"new", None) == "edited"  # not ours at all
    link = tmp_path / "link.service"
    link.symlink_to(f)
    assert ownership(link, b"old", sha256_bytes(b"old")) == "edited"


# --------------------------------------------------------------------------- shipped


def _render(tmp_path: Path) -> Path:
    out = tmp_path / "units"
    r = subprocess.run([sys.executable, "-m", "pdsvc.cli", "render", "-c",
                        str(REPO / "etc/pdsvc.yaml"), *SEED, "-o", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    return out


def _install(bundle: Path, stage: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The copied bundle's own install.sh-less way: `python3 BUNDLE/install`, no pdsvc."""
    return subprocess.run(["python3", str(bundle / "install"), *args],
                          capture_output=True, text=True, timeout=120, cwd=bundle.parent,
                          env={"PATH": os.environ["PATH"], "DESTDIR": str(stage)})


def test_a_copied_bundle_installs_itself_and_plans_as_json(tmp_path: Path) -> None:
    bundle, stage = _render(tmp_path), tmp_path / "stage"
    plan = _install(bundle, stage, "--dry-run", "--json", "--config",
                    str(REPO / "etc/pdsvc.yaml"))
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    assert doc["format"] == "pdsvc-install-plan/1" and doc["changes"] is True
    acts = {(s["verb"], s["what"]) for s in doc["steps"] if s["kind"] == "action"}
    assert ("would create", f"{stage}/etc/systemd/system/dsv4-decode.service") in acts
    assert not stage.exists()
    done = _install(bundle, stage, "--config", str(REPO / "etc/pdsvc.yaml"))
    assert done.returncode == 0, done.stderr
    assert (stage / "etc/systemd/system/dsv4-decode.service").read_bytes() == \
        (bundle / "dsv4-decode.service").read_bytes()
    again = _install(bundle, stage, "--dry-run", "--json", "--config",
                     str(REPO / "etc/pdsvc.yaml"))
    assert json.loads(again.stdout)["changes"] is False
    gone = _install(bundle, stage, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert list(stage.iterdir()) == []
