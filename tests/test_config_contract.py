"""The keys added after the string rules (membership, the control-plane key, smg, canary and
restart settings, the bundle's runtime files) reach every output intact, or are refused with one
line naming the key and the fix. (The property tests over every field: test_hostile_props.py.)"""

from __future__ import annotations

import io
import subprocess
import sys
import tokenize
from pathlib import Path

import argv_check
import pytest
import sdsyntax as sd
import yaml
from conftest import REPO
from test_hostile_values import refused

from pdsvc import routers
from pdsvc.cli.commands import main
from pdsvc.config.checks import is_loopback
from pdsvc.config.load import parse_config
from pdsvc.config.owned import OWNED_ROUTER_FLAGS
from pdsvc.config.schema import LifecycleConfig
from pdsvc.errors import ConfigError
from pdsvc.plan.build import Plan, build_plan
from pdsvc.render.kit import runtime_modules
from pdsvc.render.supervisord import render_supervisord
from pdsvc.render.systemd import render_systemd
from pdsvc.ship.runtime.cli import parse_args
from pdsvc.topology import load_topology_file

SEED_FILE = REPO / "etc/seed-host.topology.json"
SEED = load_topology_file(SEED_FILE)
BASE = "model: {path: /srv/m}\n"


def plan_of(text: str) -> Plan:
    return build_plan(parse_config(text, "t.yaml"), SEED, config_source="t.yaml",
                      config_text=text)


def runtime_argvs(plan: Plan) -> dict[str, list[str]]:
    """Each unit's runtime command line (mode, options, `--`, command), as systemd reads it."""
    files = {f.path: f.content for f in render_systemd(plan, "t")}
    units = [e.unit for e in plan.engines] + ([plan.router.unit] if plan.router else [])
    return {u: sd.exec_argv(sd.sections(files[u])["Service"]["ExecStart"][0])[2:]
            for u in units}


# --------------------------------------------------------------- 1. bounds: the runtime's own


def test_canary_heal_attempts_0_only_reports_and_the_runtime_takes_it() -> None:
    plan = plan_of(BASE + "lifecycle: {canary_heal_attempts: 0}\n")
    for unit, argv in runtime_argvs(plan).items():
        args, _ = parse_args(argv)
        if args.mode == "engine":
            assert args.canary_heals == 0, unit
    conf = render_supervisord(plan, "t")[0].content
    assert "--canary-heals 0" in conf


def test_a_negative_heal_budget_is_refused_by_the_runtimes_own_bound() -> None:
    with pytest.raises(ConfigError, match=r"lifecycle.canary_heal_attempts: expected a whole "
                       r"number >= 0, got '-1'.*--canary-heals"):
        plan_of(BASE + "lifecycle: {canary_heal_attempts: -1}\n")


def _runtime_flag(field: str) -> str | None:
    """The runtime option a lifecycle field is passed as (its runtime_flag), or None."""
    for meta in LifecycleConfig.model_fields[field].metadata:
        flag = getattr(getattr(meta, "func", None), "runtime_flag", None)
        if flag:
            return flag
    return None


#: options whose runtime default is "no bound of its own" on purpose: a unit that does not pass
#: it (the router under systemd, for --stop-timeout) keeps its process manager's bound
UNBOUNDED_WITHOUT_IT = {"--stop-timeout"}
#: lifecycle fields the runtime gets inside another option, not as one of its own: the
#: port of --fleet-listen and of each --fleet ADDR:PORT (one per engine host, several hosts only)
NOT_AN_OPTION = {"cascade_port"}


def test_the_config_and_the_runtime_agree_on_every_default_the_config_owns() -> None:
    """A knob the config passes has one default: the runtime's (options.Options) equals the
    config's, so a unit started by hand behaves as a rendered one; and every knob the runtime
    marks as the config's is passed by exactly one lifecycle field."""
    import dataclasses

    from pdsvc.ship.runtime.options import Options

    options = {"--" + f.name.replace("_", "-"): f for f in dataclasses.fields(Options)}
    passed = {}
    for name, info in LifecycleConfig.model_fields.items():
        flag = _runtime_flag(name)
        if name in NOT_AN_OPTION:
            assert flag is None, f"lifecycle.{name} is passed as {flag}: take it off NOT_AN_OPTION"
            continue
        assert flag in options, f"lifecycle.{name}: no runtime option {flag}"
        if flag in UNBOUNDED_WITHOUT_IT:
            assert options[flag].default is None and not options[flag].metadata["config"]
            continue
        opt = options[flag]
        assert opt.metadata["config"], f"{flag}: the config owns it; mark it config=True"
        assert opt.default == info.default, (
            f"{flag}: runtime default {opt.default!r}, config's lifecycle.{name} "
            f"{info.default!r}")
        passed[flag] = name
    owned = {flag for flag, f in options.items() if f.metadata.get("config")}
    assert owned == set(passed), f"marked config=True but not passed: {owned - set(passed)}"


def _bounds(field: str) -> tuple[int, int]:
    """The least and the greatest value the schema accepts for a lifecycle field."""
    top = LifecycleConfig.model_json_schema()["properties"][field]["maximum"]
    for low in range(-1, 3):
        try:
            LifecycleConfig.model_validate({field: low})
        except ValueError:
            continue
        return low, top
    raise AssertionError(f"{field}: no small value accepted")


@pytest.mark.parametrize("field", sorted(LifecycleConfig.model_fields))
@pytest.mark.parametrize("end", [0, 1], ids=["least", "greatest"])
def test_every_lifecycle_bound_renders_a_command_the_runtime_accepts(field: str,
                                                                     end: int) -> None:
    value = _bounds(field)[end]
    lc = {field: value}
    if field == "restart_backoff_max_secs":
        lc["restart_secs"] = 1  # the backoff cap is at least the first pause
    try:
        plan = plan_of(BASE + yaml.safe_dump({"lifecycle": lc}))
    except ConfigError as e:  # a cross-field check of the schema: refused, one line
        assert "\n" not in str(e)
        return
    for argv in runtime_argvs(plan).values():
        parse_args(argv)  # exits 2 (SystemExit) on a value the runtime refuses



# --------------------------------------------------------------- one-line refusals, via the CLI


# --------------------------------------------------------------- 2. a key path's last backslash


def test_a_key_path_ending_in_a_backslash_is_refused(runner, tmp_path: Path) -> None:
    line = refused(runner, tmp_path, BASE + "router: {control_plane_key: '/srv/keys/k\\'}\n")
    assert "router.control_plane_key" in line and "ends with a backslash" in line
    assert "remove the trailing backslash" in line


@pytest.mark.parametrize("key", ["/srv/keys/k\\\\", "/srv/a\\b/k", "/srv/my keys/100%"])
def test_a_key_path_with_backslashes_reaches_load_credential_exactly(key: str) -> None:
    plan = plan_of(BASE + yaml.safe_dump({"router": {"control_plane_key": key}}))
    files = {f.path: f.content for f in render_systemd(plan, "t")}
    for unit in [e.unit for e in plan.engines] + [plan.router.unit]:
        (cred,) = sd.sections(files[unit])["Service"]["LoadCredential"]
        assert sd.plain(cred) == f"router-key:{key}"


# --------------------------------------------------------------- 3. paths in the shipped sources


def shipped_tokens(source: str) -> tuple[str, list[tuple[int, str]]]:
    """What Python's tokenizer reads in a shipped module: its encoding (PEP 263) and its
    tokens but comments (type, text)."""
    data = source.encode("utf-8")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    tokens = tokenize.tokenize(io.BytesIO(data).readline)
    return encoding, [(t.type, t.string) for t in tokens
                      if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]


@pytest.mark.parametrize("libexec", [
    "/opt/pdsvc-coding:ascii", "/opt/x-coding:unicode_escape\\n", "/opt/-*- coding: latin-1 -*-",
    "/opt/a\\b\"'", "/opt/é→"])
def test_a_path_in_the_shipped_runtime_header_is_only_a_comment(libexec: str,
                                                                tmp_path: Path) -> None:
    plan = plan_of(BASE + yaml.safe_dump({"runtime": {"libexec_dir": libexec}}))
    shipped = [f for f in render_systemd(plan, "t") if f.path.startswith("runtime/")]
    package = dict(runtime_modules())
    for f in shipped:
        encoding, tokens = shipped_tokens(f.content)
        assert encoding == "utf-8", f.path
        assert tokens == shipped_tokens(package[f.path.removeprefix("runtime/")])[1], f.path
        (tmp_path / f.path).parent.mkdir(exist_ok=True)
        (tmp_path / f.path).write_text(f.content, encoding="utf-8")
    done = subprocess.run([sys.executable, str(tmp_path / "runtime"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: runtime"), done.stderr


# --------------------------------------------------------------- 4. owned router flags, any prefix


@pytest.mark.parametrize("package", ["sglang-router", "smg"])
def test_every_prefix_the_routers_parser_expands_to_an_owned_flag_is_refused(
        package: str, serve_python: Path) -> None:
    """Ask the router's own argparse what each prefix of each of its options means; whatever
    it reads as a flag pdsvc sets (an alias of one too) must be refused in router.args."""
    pkg = routers.package(package)
    plan = plan_of(BASE + yaml.safe_dump({"router": {"package": package}}))
    argv = list(plan.router.argv[3:])
    kind = {"sglang-router": "router", "smg": "smg"}[package]
    dests = argv_check.resolve_options(serve_python, kind, argv, [])["dests"]
    owned = {dests[f"--{f}"] for f in [*OWNED_ROUTER_FLAGS, *pkg.owned] if f"--{f}" in dests}
    assert len(owned) >= len(OWNED_ROUTER_FLAGS) - 2  # prefill/decode may share a dest
    words = sorted({o[:n] for o, d in dests.items() if d in owned and o.startswith("--")
                    for n in range(3, len(o) + 1)})
    resolved = argv_check.resolve_options(serve_python, kind, argv, words)["resolved"]
    expands = [w for w, r in resolved.items() if r and r.get("dest") in owned]
    assert "--remove" in expands or package != "smg"
    accepted = []
    for word in expands:
        try:
            parse_config(BASE + yaml.safe_dump({"router": {"package": package,
                                                           "args": {word[2:]: "x"}}}))
        except ConfigError as e:
            assert "router.args" in str(e) and "\n" not in str(e)
        else:
            accepted.append((word, resolved[word]["option"]))
    assert not accepted, f"{package} would expand these to a flag pdsvc sets: {accepted}"


# --------------------------------------------------------------- 5. what other hosts must reach

THREE_HOSTS = (REPO / "etc/examples/three-hosts.yaml").read_text()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.0.1.1"])
def test_a_loopback_router_host_across_hosts_is_refused(host: str, runner,
                                                       tmp_path: Path) -> None:
    data = yaml.safe_load(THREE_HOSTS)
    data["router"]["host"] = host
    line = refused(runner, tmp_path, yaml.safe_dump(data))
    assert "router.host" in line and "loopback" in line and "gpu-a, gpu-b" in line
    assert "use 0.0.0.0" in line


@pytest.mark.parametrize(("host", "url"), [("0.0.0.0", "http://10.0.0.1:8000"),
                                           ("10.0.0.1", "http://10.0.0.1:8000")])
def test_a_wildcard_or_routable_router_host_is_what_the_engines_dial(host: str,
                                                                    url: str) -> None:
    data = yaml.safe_load(THREE_HOSTS)
    data["router"]["host"] = host
    plan = plan_of(yaml.safe_dump(data))
    for e in plan.engines:
        assert e.router_urls == (url,)
        assert not is_loopback(e.url.split("//")[1].split(":")[0])


def test_hosts_that_are_all_loopback_are_one_machine_and_keep_a_loopback_router() -> None:
    data = yaml.safe_load(THREE_HOSTS)
    for i, hc in enumerate(data["hosts"].values()):
        hc["address"] = f"127.0.0.{i + 1}"
    data["router"]["host"] = "127.0.0.1"
    plan_of(yaml.safe_dump(data))


# --------------------------------------------------------------- 6. the supervisord bundle's dir


@pytest.mark.parametrize(("name", "char"), [("out it's here", "'"), ("100% units", "%"),
                                            ("units[1]", "["), ("u*", "*")])
def test_a_supervisord_bundle_dir_supervisord_cannot_read_back_is_refused(
        name: str, char: str, runner, tmp_path: Path) -> None:
    out = tmp_path / name
    result = runner.invoke(main, ["render", "--topology", str(SEED_FILE), "--format",
                                  "supervisord", "-o", str(out)])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert f"cannot live in a path with {char!r}" in result.stderr
    assert "--output DIR" in result.stderr
    assert not out.exists()


# --------------------------------------------------------------- 7. --force: exactly the new one

ONE_HOST = REPO / "etc/pdsvc.yaml"
THREE = REPO / "etc/examples/three-hosts.yaml"


def _tree(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): p.read_text() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != ".pdsvc-bundle.json"}


@pytest.mark.parametrize(("before", "after"), [
    ((ONE_HOST, "systemd"), (ONE_HOST, "k8s")),
    ((ONE_HOST, "supervisord"), (ONE_HOST, "k8s")),
    ((ONE_HOST, "systemd"), (THREE, "systemd")),
    ((ONE_HOST, "supervisord"), (THREE, "supervisord")),
    ((THREE, "systemd"), (ONE_HOST, "k8s")),
    ((ONE_HOST, "k8s"), (ONE_HOST, "systemd")),
], ids=["systemd>k8s", "supervisord>k8s", "one>three", "one>three-supervisord", "three>k8s",
        "k8s>systemd"])
def test_force_leaves_exactly_the_new_bundle(before: tuple[Path, str], after: tuple[Path, str],
                                             runner, tmp_path: Path) -> None:
    def render(config: Path, fmt: str, out: Path, *more: str) -> None:
        result = runner.invoke(main, ["render", "-c", str(config), "--topology", str(SEED_FILE),
                                      "--format", fmt, "-o", str(out), *more])
        assert result.exit_code == 0, (result.output, result.stderr)

    render(*before, tmp_path / "out")
    refusal = runner.invoke(main, ["render", "-c", str(after[0]), "--topology", str(SEED_FILE),
                                   "--format", after[1], "-o", str(tmp_path / "out")])
    assert refusal.exit_code == 1 and "--force" in refusal.stderr
    render(*after, tmp_path / "out", "--force")
    render(*after, tmp_path / "fresh")
    assert _tree(tmp_path / "out") == _tree(tmp_path / "fresh")
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == sorted(
        p.name for p in (tmp_path / "fresh").iterdir() if p.is_dir())


# --------------------------------------------------------------- 6. router retries and breaker


@pytest.mark.parametrize("package", ["sglang-router", "smg"])
@pytest.mark.parametrize("retry", [
    {"attempts": 1, "initial_backoff_ms": 1, "max_backoff_ms": 1},
    {"attempts": 100, "initial_backoff_ms": 60000, "max_backoff_ms": 1},  # cap below the first
    {},
])
@pytest.mark.parametrize("breaker", [True, False])
def test_router_retry_and_breaker_reach_both_routers_parsers(
        package: str, retry: dict, breaker: bool, serve_python: Path) -> None:
    """router.retry.* and router.circuit_breaker render flags each router generation's own
    argparse reads as the option meant, with the value given (the backoff cap never below
    the first pause)."""
    plan = plan_of(BASE + yaml.safe_dump({"router": {
        "package": package, "retry": retry, "circuit_breaker": breaker}}))
    argv = list(plan.router.argv[3:])
    kind = {"sglang-router": "router", "smg": "smg"}[package]
    dests = argv_check.resolve_options(serve_python, kind, argv, [])["dests"]
    want = {"--retry-max-retries": str(retry.get("attempts", 6)),
            "--retry-initial-backoff-ms": str(retry.get("initial_backoff_ms", 200)),
            "--retry-max-backoff-ms": str(max(retry.get("max_backoff_ms", 3000),
                                              retry.get("initial_backoff_ms", 200))),
            "--retry-backoff-multiplier": "2"}
    for flag, value in want.items():
        assert flag in dests, (package, flag)
        assert argv[argv.index(flag) + 1] == value
    assert ("--disable-circuit-breaker" in argv) is not breaker
    assert "--disable-circuit-breaker" in dests


@pytest.mark.parametrize("flag", ["disable-circuit-breaker", "retry-max-retries",
                                  "disable-retries"])
def test_router_args_may_not_reach_around_retry_or_breaker(flag: str) -> None:
    with pytest.raises(ConfigError, match="router"):
        parse_config(BASE + yaml.safe_dump({"router": {"args": {flag: True}}}))
