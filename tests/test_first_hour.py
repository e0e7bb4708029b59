"""A newcomer's first hour: each command does what it says from any directory, its
printed next step works as printed, and no render loses a file without being asked.

Each test runs the exact commands and checks their exit codes and first lines.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO
from status_stands import SEED_TOPOLOGY, Deployment

from pdsvc.cli.commands import main
from pdsvc.cli.status import status
from pdsvc.render.bundle import RECORD, write_bundle

SEED = ["--topology", str(REPO / "etc/seed-host.topology.json")]
SEED_HERE = ["--topology", "etc/seed-host.topology.json"]  # as the golden bundle is rendered
GOLDEN = REPO / "tests" / "golden" / "seed"


def run(cwd: Path, *args: str, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """`pdsvc ARGS` as a user runs it, in `cwd`."""
    return subprocess.run([sys.executable, "-m", "pdsvc.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, **(env or {})})


def next_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("next"))


def follow(step: str, cwd: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    """Run the printed `next: sudo install.sh …` where the user stands — staged under
    DESTDIR, so neither root nor systemd is needed: install.sh finds the bundle it names."""
    words = shlex.split(step.split("next: ", 1)[1].split("   (")[0])
    assert words[0] == "sudo", step
    return subprocess.run(["bash", *words[1:], "--dry-run"], cwd=cwd, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "DESTDIR": str(dest)})


def project(tmp: Path) -> Path:
    """A copy of the config files, as a user's checkout of their deployment holds them."""
    shutil.copytree(REPO / "etc", tmp / "proj" / "etc")
    return tmp / "proj"


# --------------------------------------------------------------------------- item 1


def test_render_from_the_parent_directory_prints_a_next_step_that_works_there(
        tmp_path: Path) -> None:
    proj = project(tmp_path)
    r = run(tmp_path, "render", "-c", "proj/etc/pdsvc.yaml", *SEED)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "units" / "dsv4-decode.service").is_file()
    step = next_line(r.stdout)
    assert step == (f"next: sudo {REPO / 'install.sh'} --bundle units   "
                    "(then: systemctl start dsv4-pd.target)")
    done = follow(step, tmp_path, tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == \
        f">>> bundle units is current (rendered from {tmp_path}/proj/etc/pdsvc.yaml)"
    assert ">>> installing dsv4 from units (dry run: nothing changes)" in done.stdout
    assert proj.is_dir()


def test_render_with_output_names_that_bundle_in_the_next_step(tmp_path: Path) -> None:
    project(tmp_path)
    cwd = tmp_path / "proj"
    r = run(cwd, "render", *SEED, "-o", "other/")
    assert r.returncode == 0, r.stderr
    step = next_line(r.stdout)
    assert "--bundle other " in step, step  # not the units/ beside install.sh
    done = follow(step, cwd, tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    assert "installing dsv4 from other" in done.stdout


def test_the_default_render_in_the_checkout_needs_no_bundle_flag(monkeypatch) -> None:
    from pdsvc.cli.kit import load_plan
    from pdsvc.cli.render import next_step

    monkeypatch.chdir(REPO)
    plan = load_plan(Path("etc/pdsvc.yaml"), None, Path("etc/seed-host.topology.json"))
    assert next_step("systemd", plan, Path("units")) == \
        "next: sudo ./install.sh   (then: systemctl start dsv4-pd.target)"
    assert next_step("systemd", plan, Path("elsewhere")).startswith(
        "next: sudo ./install.sh --bundle elsewhere ")


def test_next_step_of_several_hosts_names_the_output(tmp_path: Path) -> None:
    r = run(tmp_path, "render", "-c", str(REPO / "etc/examples/three-hosts.yaml"), *SEED,
            "-o", "three")
    assert r.returncode == 0, r.stderr
    steps = r.stdout[r.stdout.index("next, "):].splitlines()
    script = REPO / "install.sh"
    assert steps == [  # the router's host first: its install makes the one control-plane key
        f"next, on lb (it makes the router's control-plane key): sudo {script} --bundle three/lb",
        "then on gpu-a, gpu-b (HOST), with that key: scp root@10.0.0.1:/etc/dsv4/router.key "
        f"router.key && sudo {script} --bundle three/HOST --key-from router.key && rm router.key",
        "then: on lb systemctl start --no-block dsv4-pd.target; on each other host pdsvc "
        "doctor -c CONFIG --host HOST, then systemctl start --no-block dsv4-pd.target; on lb "
        "systemctl start dsv4-pd.target (returns once the stack serves)"]


# --------------------------------------------------------------------------- item 2


def seed_units(tmp: Path) -> Path:
    """A copy of the repository's etc/ and the seed bundle rendered into units/ (with its
    record), as a checkout has them after `pdsvc render --topology etc/seed-host.topology.json`."""
    shutil.copytree(REPO / "etc", tmp / "etc")
    r = run(tmp, "render", *SEED_HERE)
    assert r.returncode == 0, r.stderr
    return tmp


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_rendering_another_config_into_the_seed_units_is_refused(tmp_path: Path) -> None:
    cwd = seed_units(tmp_path)
    before = tree(cwd / "units")
    r = run(cwd, "render", "-c", "etc/examples/2p1d.yaml", *SEED)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "pdsvc: error: units holds the systemd bundle of etc/pdsvc.yaml; rendering the "
        "systemd bundle of etc/examples/2p1d.yaml there would remove 1 of its files "
        "(dsv4-prefill.service); replace 10 of its files (dsv4-pd.target, dsv4-pd-ready.service,"
        " dsv4-decode.service, dsv4-router.service and 6 more); render into another directory "
        "(--output DIR), or pass --force to replace it"]
    assert tree(cwd / "units") == before
    forced = run(cwd, "render", "-c", "etc/examples/2p1d.yaml", *SEED, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "    removed  units/dsv4-prefill.service" in forced.stdout.splitlines()


def test_another_format_into_the_systemd_bundle_is_refused(tmp_path: Path) -> None:
    cwd = seed_units(tmp_path)
    r = run(cwd, "render", "--format", "k8s", "-o", "units")
    assert r.returncode == 1
    assert r.stderr.startswith("pdsvc: error: units holds the systemd bundle of etc/pdsvc.yaml;"
                               " rendering the k8s bundle of etc/pdsvc.yaml there would remove ")
    assert (cwd / "units" / "dsv4-decode.service").is_file()


def test_a_hand_edit_is_never_overwritten_without_force(tmp_path: Path) -> None:
    cwd = seed_units(tmp_path)
    unit = cwd / "units" / "dsv4-decode.service"
    unit.write_text(unit.read_text().replace("RestartSec=", "RestartSec=77\n#was "))
    edited = unit.read_text()
    r = run(cwd, "render", *SEED_HERE)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "pdsvc: error: units: dsv4-decode.service edited since pdsvc wrote it; this render "
        "would lose the edit (see it with --diff); keep changes in drop-ins (systemctl edit "
        "UNIT) or in the config, or pass --force to replace the file"]
    assert unit.read_text() == edited
    diff = run(cwd, "render", *SEED_HERE, "--diff")
    assert diff.returncode == 1 and "-RestartSec=77" in diff.stdout
    forced = run(cwd, "render", *SEED_HERE, "--force")
    assert forced.returncode == 0
    assert "overwritten  units/dsv4-decode.service" in forced.stdout
    assert unit.read_text() == (GOLDEN / "dsv4-decode.service").read_text()


def test_an_edited_file_that_a_render_would_remove_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "u"
    cfg = tmp_path / "two.yaml"
    shutil.copy(REPO / "etc/examples/2p1d.yaml", cfg)
    assert run(tmp_path, "render", "-c", str(cfg), *SEED, "-o", "u").returncode == 0
    gone = out / "dsv4-prefill-1.service"
    gone.write_text(gone.read_text() + "# mine\n")
    one = yaml.safe_load(cfg.read_text())
    one["prefill"] = one["prefill"][:1]
    cfg.write_text(yaml.safe_dump(one))
    r = run(tmp_path, "render", "-c", str(cfg), *SEED, "-o", "u")
    assert r.returncode == 1 and "dsv4-prefill-1.service edited since" in r.stderr
    assert gone.read_text().endswith("# mine\n")
    r = run(tmp_path, "render", "-c", str(cfg), *SEED, "-o", "u", "--force")
    assert "  discarded  u/dsv4-prefill-1.service" in r.stdout.splitlines()


def test_the_documented_examples_never_render_into_units() -> None:
    """Every render of another config in README.md and docs/ names its own output directory."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in re.findall(r"pdsvc render[^`\n]*", doc.read_text()):
            if "-c " in line:
                assert re.search(r"(-o|--output) (?!units\b)", line), (doc.name, line)


# --------------------------------------------------------------------------- the walk-through


def first_hour_session() -> list[tuple[str, list[str]]]:
    """The first-hour session of docs/first-hour.md: (command, the output lines it shows)."""
    readme = (REPO / "docs" / "first-hour.md").read_text()
    block = re.search(r"<!-- first-hour:start -->\n```console\n(.*?)```", readme, re.S)
    assert block, "docs/first-hour.md lost its first-hour session"
    session: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            session.append((line[2:], []))
        else:
            session[-1][1].append(line)
    return session


def shows(expected: list[str], output: str) -> bool:
    """The shown lines are the output's, in order; `…` stands for what is left out."""
    pattern = "\n".join(".*?" if line == "…" else re.escape(line).replace("…", ".*?")
                        for line in expected)
    return re.fullmatch(pattern + ("\n" if expected else ""), output, re.S) is not None


def test_the_documented_first_hour_runs_as_printed(tmp_path: Path) -> None:
    """From a directory of one's own, with -o: each command as the docs print it (sudo
    aside; install.sh stages under DESTDIR, as no systemd runs here), each output as shown —
    so the printed next steps stay true."""
    cwd = tmp_path
    prelude = f"pdsvc() {{ {shlex.quote(sys.executable)} -m pdsvc.cli \"$@\"; }}\n"
    for command, expected in first_hour_session():
        script = command.replace("~/pdsvc", shlex.quote(str(REPO)))
        script = script.removeprefix("sudo ")
        r = subprocess.run(["bash", "-c", prelude + script], cwd=cwd, text=True,
                           capture_output=True, timeout=120,
                           env={**os.environ, "DESTDIR": str(tmp_path / "dest")})
        output = (r.stdout + r.stderr).replace(str(REPO), "~/pdsvc")
        failed = bool(expected) and expected[0].startswith("pdsvc: error")
        assert (r.returncode != 0) == failed, (command, r.returncode, output)
        assert shows(expected, output), (command, expected, output)
        if " cd " in f" {command}":
            cwd = cwd / command.split("cd ", 1)[1].split()[0]


# --------------------------------------------------------------------------- concurrent renders


def test_concurrent_renders_into_one_directory_end_consistent(tmp_path: Path) -> None:
    """One render at a time per directory: 20 at once, two configs, forced — every one
    succeeds and the directory holds exactly one whole bundle, no orphans, no staging files."""
    out = tmp_path / "u"
    configs = [REPO / "etc/pdsvc.yaml", REPO / "etc/examples/2p1d.yaml"]
    procs = [subprocess.Popen([sys.executable, "-m", "pdsvc.cli", "render", "-c",
                               str(configs[i % 2]), *SEED, "-o", str(out), "--force"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(20)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert [rc for rc, _ in results] == [0] * 20, results
    record = json.loads((out / RECORD).read_text())
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert files == {*record["files"], RECORD}  # no orphan of the other config, no temp file
    assert record["config"] in {os.path.relpath(c, out) for c in configs}


def test_concurrent_renders_in_threads_never_crash(tmp_path: Path) -> None:
    from pdsvc.cli.kit import load_plan
    from pdsvc.render.systemd import render_systemd

    plan = load_plan(REPO / "etc/pdsvc.yaml", None, REPO / "etc/seed-host.topology.json")
    files = render_systemd(plan, "test")
    out = tmp_path / "u"
    errors: list[BaseException] = []

    def one() -> None:
        try:
            write_bundle(files, out)
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".") and
                  p.name != RECORD) == []


# --------------------------------------------------------------------------- item 3


def test_status_shows_the_units_when_a_gpu_fell_off_the_bus(dep: Deployment,  # noqa: F811
                                                            tmp_path: Path) -> None:
    topo = json.loads(Path(SEED_TOPOLOGY).read_text())
    topo["gpus"] = topo["gpus"][:7]  # GPU 7 gone
    seven = tmp_path / "seven.json"
    seven.write_text(json.dumps(topo))
    result = CliRunner().invoke(status, ["-c", str(dep.config), "--topology", str(seven),
                                         "--systemctl", str(dep.systemctl)])
    out = result.output
    assert result.exit_code == 0, out  # it serves: that is what status says first
    assert out.splitlines()[0] == "dsv4 PD stack (systemd)"
    assert [line.split()[0] for line in out.splitlines() if line.startswith("dsv4-")] == [
        "dsv4-pd.target", "dsv4-prefill.service", "dsv4-decode.service", "dsv4-router.service"]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("serving, but: the plan does not fit this host: decode.gpus")
    dep.unit("dsv4-decode.service", "failed", "failed", result="exit-code")
    result = CliRunner().invoke(status, ["-c", str(dep.config), "--topology", str(seven),
                                         "--systemctl", str(dep.systemctl), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["format"] == "pdsvc-status/1" and not doc["serving"]
    assert any(p.startswith("the plan does not fit this host") for p in doc["problems"])


# --------------------------------------------------------------------------- item 4


def test_diff_exits_like_diff(tmp_path: Path) -> None:
    r = run(tmp_path, "render", "-c", str(REPO / "etc/pdsvc.yaml"), *SEED, "--diff")
    assert r.returncode == 1 and r.stdout.startswith("--- /dev/null\n+++ b/dsv4-pd.target\n")
    assert run(tmp_path, "render", "-c", str(REPO / "etc/pdsvc.yaml"), *SEED).returncode == 0
    r = run(tmp_path, "render", "-c", str(REPO / "etc/pdsvc.yaml"), *SEED, "--diff")
    assert (r.returncode, r.stdout) == (0, "units: up to date\n")


# --------------------------------------------------------------------------- item 5


@pytest.mark.parametrize("port,other", [(8000, "router.port"),
                                        (29000, "router.prometheus_port")])
def test_a_clash_with_the_router_names_the_key_the_user_wrote(tmp_path: Path, port: int,
                                                             other: str) -> None:
    text = (REPO / "etc/pdsvc.yaml").read_text()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(re.sub(r"(?m)^(decode:\n(?:  .*\n)*?  port: )30001$", rf"\g<1>{port}", text))
    line = cfg.read_text().splitlines().index(f"  port: {port}") + 1
    r = run(tmp_path, "validate", "-c", str(cfg), *SEED)
    assert r.returncode == 2
    assert r.stderr == (f"pdsvc: error: {cfg}:{line}: decode.port: port {port} is also "
                        f"{other}; each service needs its own\n")


def test_a_clash_with_a_default_router_port_says_it_is_the_default(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {path: /srv/m}\ndecode:\n  port: 8000\n")
    r = run(tmp_path, "validate", "-c", str(cfg), *SEED)
    assert r.returncode == 2
    assert r.stderr == (f"pdsvc: error: {cfg}:3: decode.port: port 8000 is also router.port "
                        "(router.port is its default); each service needs its own\n")


# --------------------------------------------------------------------------- item 7


def test_status_on_a_gpu_host_sends_requests_to_the_routers_host(
        hosts_dep: Deployment) -> None:  # noqa: F811
    out = hosts_dep.invoke("--host", "gpu-a").output
    assert f"send requests to: http://127.0.0.3:{hosts_dep.router.port}/v1/chat/completions" \
        in out.splitlines()


# --------------------------------------------------------------------------- item 9


def test_no_color_and_colour_otherwise(runner) -> None:
    args = ["validate", "-c", "/nonexistent.yaml"]
    coloured = runner.invoke(main, args, color=True)
    assert "\x1b[" in coloured.stderr
    plain = runner.invoke(main, args, color=True, env={"NO_COLOR": "1"})
    assert plain.exit_code == 2 and "\x1b[" not in plain.stderr
    assert plain.stderr.startswith("pdsvc: error: /nonexistent.yaml: config file not found")


def test_pdsvc_alone_prints_help_and_exits_0(tmp_path: Path) -> None:
    r = run(tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("Usage: python -m pdsvc.cli [OPTIONS]")
    assert "render" in r.stdout and r.stderr == ""


def test_every_json_document_carries_a_schema_tag(tmp_path: Path, sysfs_hosts) -> None:
    config = ["-c", str(REPO / "etc/pdsvc.yaml"), *SEED]
    docs = {
        "render": run(tmp_path, "render", *config, "--json"),
        "render --dry-run": run(tmp_path, "render", *config, "--json", "--dry-run", "-o", "x"),
        "render --diff": run(tmp_path, "render", *config, "--json", "--diff"),
        "validate": run(tmp_path, "validate", *config, "--json"),
        "topology": run(tmp_path, "topology", "--sysfs-root", str(sysfs_hosts["seed"]),
                        "--json"),
    }
    tags = {name: json.loads(r.stdout)["format"] for name, r in docs.items()}
    assert tags == {"render": "pdsvc-render/1", "render --dry-run": "pdsvc-render/1",
                    "render --diff": "pdsvc-render/1", "validate": "pdsvc-validate/1",
                    "topology": "pdsvc-topology/1"}
    rendered = json.loads(docs["render"].stdout)
    assert {"path": "dsv4-decode.service", "status": "created"} in rendered["files"]
    assert rendered["next"].startswith("next: sudo ")
    assert json.loads(docs["render --diff"].stdout)["changed"] is False
    assert docs["render --diff"].returncode == 0
    plan = json.loads(run(tmp_path, "plan", *config, "--json").stdout)
    assert plan["schema"] == "pdsvc-plan/1" and plan["format"] == "systemd"


def test_install_start_shows_progress_while_it_waits(tmp_path: Path) -> None:
    """install.sh --start (the installer's start_with_progress): while `systemctl start`
    waits for the stack, a line per unit not yet up: elapsed time, its phase, the engine's
    last log line."""
    (tmp_path / "systemctl").write_text(
        "#!/bin/sh\ncase \"$1\" in start) sleep 3 ;; show) case \"$3\" in\n"
        "  ActiveState) echo activating ;; StatusText) echo 'loading weights' ;; esac ;;\n"
        "esac\n")
    (tmp_path / "journalctl").write_text("#!/bin/sh\necho 'Load weight end. mem=12.5 GB'\n")
    for tool in ("systemctl", "journalctl"):
        (tmp_path / tool).chmod(0o755)
    script = ("import sys; from pdsvc.ship.install.progress import start_with_progress; "
              "sys.exit(start_with_progress('x.target', ['x.target', 'x-decode.service']))")
    r = subprocess.run([sys.executable, "-c", script], text=True, capture_output=True,
                       timeout=60, cwd=REPO,
                       env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
                            "PDSVC_PROGRESS_SECS": "1", "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("... 1s  x-decode.service: loading weights | log: Load weight end. "
                        "mem=12.5 GB")
    assert lines[-1] == ">>> systemctl start x.target returned after 3s"


def test_install_sh_is_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (.ci/run installs it)")
    r = subprocess.run(["shellcheck", str(REPO / "install.sh")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout
