"""Property tests of config strings: a hostile string in any string field of the schema either is
refused with one line, or reaches every output exactly — read back the way each consumer reads
it: systemd's unquoting (sdsyntax), supervisor's own config reader, a YAML loader with
Kubernetes' `$` rules, and bash's `read` as install.sh splits install.list.

The example budget is fixed and derandomized, so CI time stays small and the same each run.
"""

from __future__ import annotations

import io
import re
import tempfile
import tokenize
from pathlib import Path

import pytest
import sdsyntax as sd
import yaml
from conftest import REPO, require, serve_venv
from consumers import install_list_rows, k8s_unescape, supervisord_reader
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pdsvc.config.load import parse_config
from pdsvc.config.reference import reference_markdown
from pdsvc.config.router import FrontConfig
from pdsvc.config.schema import LifecycleConfig
from pdsvc.config.sections import MetricsConfig
from pdsvc.encode import printable
from pdsvc.errors import ConfigError, OutputError, TopologyError
from pdsvc.plan.build import Plan, build_plan
from pdsvc.plan.runtime_argv import KEY_CREDENTIAL, router_command
from pdsvc.render.k8s import pod_argv, render_k8s
from pdsvc.render.kit import RUNTIME_DIR, runtime_modules
from pdsvc.render.supervisord import check_bundle_dir, render_supervisord
from pdsvc.render.systemd import render_systemd
from pdsvc.ship.runtime.cli import parse_args as runtime_parse_args
from pdsvc.topology import load_topology_file

SEED = load_topology_file(REPO / "etc/seed-host.topology.json")
BUDGET = settings(max_examples=150, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
SMALL_BUDGET = settings(BUDGET, max_examples=50)

#: Pieces that mean something to some consumer: line and field separators, quotes, escapes,
#: specifiers, variables, comments, option prefixes, supervisord's %(here)s.
NASTY = ["\n", "\r", "\x00", "\t", "\x0b", "\x85", "\u2028", "\\", '"', "'", "%", "%n", "$",
         "${X}", "$X", ";", " ;", " #", "#", " ", ":", "=", ",", "-", "--", "--port=1",
         "%(here)s", "[Install]", "ExecStartPre=/bin/evil", "é", "→", "*", "{", "}", "&"]
HOSTILE = st.one_of(
    st.lists(st.sampled_from(NASTY) | st.text("abc/.", min_size=1, max_size=3),
             min_size=1, max_size=6).map("".join),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
)

#: Where a hostile string goes: a dotted key path (a `*` is replaced by the string itself,
#: for keys), and how the string is shaped to be plausible there.
FIELDS: list[tuple[str, str]] = [
    ("model.path", "{}"), ("model.path", "/srv/{}"), ("model.served_name", "{}"),
    ("runtime.python", "/opt/{}/python"), ("runtime.user", "{}"), ("runtime.group", "{}"),
    ("runtime.jit_cache", "/var/cache/{}"), ("runtime.jit_cache", "/data/{}"),
    ("runtime.libexec_dir", "/opt/{}"), ("runtime.read_write_paths", "/srv/{}"),
    ("runtime.env.WEIRD", "{}"), ("prefill.env.WEIRD", "{}"), ("router.env.WEIRD", "{}"),
    ("decode.env.WEIRD", "{}"),
    ("runtime.env.*", "1"), ("prefill.args.*", "1"), ("router.args.*", "x"),
    ("prefill.args.chat-template", "{}"), ("decode.args.extra-words", "[{}]"),
    ("router.args.log-level", "{}"), ("router.host", "{}"), ("router.prometheus_host", "{}"),
    ("router.python", "/opt/{}/python"), ("supervisord.log_dir", "/var/log/{}"),
    ("supervisord.run_dir", "/run/{}"), ("supervisord.numactl", "/usr/bin/{}"),
    ("k8s.image", "{}"), ("k8s.python", "{}"), ("k8s.node_selector.gpu", "{}"),
    ("k8s.jit_cache_claim", "{}"), ("k8s.node_selector.*", "x"), ("name", "{}"),
    ("router.control_plane_key", "/srv/{}"), ("router.control_plane_key", "/srv/{}\\"),
    ("runtime.libexec_dir", "/opt/x-coding:{}"), ("runtime.engine_module", "{}"),
    ("runtime.router_module", "m.{}"), ("transfer.nixl_backend", "{}"), ("k8s.namespace", "{}"),
    ("k8s.router_image", "{}"), ("k8s.gpu_resource", "{}"), ("model.path", "/srv/{}\\"),
    ("router.front.haproxy", "/usr/sbin/{}"),
]
#: ... and in a config over two hosts (rendered per host, as `pdsvc render` does).
HOST_FIELDS: list[tuple[str, str]] = [
    ("hosts.b.env.WEIRD", "{}"), ("hosts.b.env.*", "1"), ("hosts.b.ucx_net_devices", "{}"),
    ("hosts.b.topology", "{}"), ("hosts.b.address", "{}"), ("hosts.*.address", "10.0.0.3"),
    ("hosts.b.run", "[{}]"), ("router.host", "{}"),
    # a router on each host behind the moving address (keepalived's config: render/vip.py)
    ("router.vip.address", "{}"), ("router.vip.interface", "{}"),
    ("router.vip.keepalived", "/usr/sbin/{}"),
]
#: a valid moving address, each of whose strings the properties above replace in turn
VIP = {"address": "10.0.0.100", "interface": "eth0"}


def _config(path: str, shape: str, hostile: str) -> dict:
    data: dict = {"model": {"path": "/srv/models/m"}}
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    value: object = shape.format(hostile)
    if shape == "[{}]":
        value = [hostile]
    if path == "runtime.read_write_paths":
        value = [value]
    if leaf == "*":
        node[hostile] = value
    else:
        node[leaf] = value
    return data


def _hosts_config(path: str, shape: str, hostile: str) -> dict:
    data = _config("model.path", "/srv/models/m", "")
    data["hosts"] = {"a": {"address": "10.0.0.1", "run": ["router", "prefill"]},
                     "b": {"address": "10.0.0.2", "run": ["decode"]}}
    if path == "hosts.*.address":  # a hostile host name
        data["hosts"][hostile] = {"address": "10.0.0.3", "run": ["decode"]}
        data["hosts"]["b"]["run"] = ["prefill"]
        return data
    if path == "router.host":  # what the engines on another host are told to dial
        data["router"] = {"host": hostile}
        return data
    if path.startswith("router.vip."):  # a router on each host, the address between them
        data["hosts"]["b"]["run"].append("router")
        data["router"] = {"vip": {**VIP, path.rsplit(".", 1)[1]: shape.format(hostile)}}
        return data
    leaf = path.rsplit(".", 1)[1]
    node = data["hosts"]["b"]
    if leaf == "run":
        node["run"] = [hostile]
        return data
    if path.startswith("hosts.b.env."):
        node = node.setdefault("env", {})
    node[hostile if leaf == "*" else leaf] = shape.format(hostile)
    return data


def _parse(data: dict) -> Plan | None:
    """The plan, or None when the config was refused (with one line)."""
    text = yaml.safe_dump(data, allow_unicode=True)
    try:
        config = parse_config(text, "hostile.yaml")
    except ConfigError as e:
        assert "\n" not in str(e) and "\r" not in str(e), repr(str(e))
        return None
    try:
        return build_plan(config, SEED, config_source="hostile.yaml", config_text=text)
    except TopologyError as e:  # the plan does not fit the host (a numa_node): one line too
        assert "\n" not in str(e) and "\r" not in str(e), repr(str(e))
        return None


# --------------------------------------------------------------------------- each consumer


KNOWN_SECTIONS = {"Unit", "Service", "Install"}


def check_systemd(plan: Plan, bundle: dict[str, str]) -> None:
    for unit in (plan.target, *plan.units):
        settings_ = sd.unit_settings(bundle[unit])
        assert {s for s, _, _ in settings_} <= KNOWN_SECTIONS
        units = sd.sections(bundle[unit])
        assert units["Install"] == {"WantedBy": [
            "multi-user.target" if unit == plan.target else plan.target]}
    for e in plan.engines:
        svc = sd.sections(bundle[e.unit])["Service"]
        _check_service(plan, svc, list(e.env), list(e.argv), plan.python)
        assert [sd.plain(v) for v in svc["LoadCredential"]] == [
            f"{KEY_CREDENTIAL}:{plan.paths.router_key}"]
        _check_runtime_argv(sd.exec_argv(svc["ExecStart"][0])[2:])
        cache = svc.get("CacheDirectory", [])
        assert [i for v in cache for i in sd.list_items(v)] == (
            [plan.paths.cache_directory] if plan.paths.cache_directory else [])
    for r in plan.routers:
        svc = sd.sections(bundle[r.unit])["Service"]
        _check_service(plan, svc, list(r.env), list(router_command(plan, r, "systemd")),
                       r.python)
        if plan.front:  # out of the front before a stop, back once ready
            for key, action in (("ExecStop", "drain"), ("ExecStartPost", "ready")):
                (line,) = svc[key]
                args, _ = runtime_parse_args(sd.exec_argv(line)[2:])
                assert (args.mode, args.action, args.server) == ("front", action, r.name)
    if plan.front:
        svc = sd.sections(bundle[plan.front.unit])["Service"]
        assert [sd.exec_argv(v) for v in svc["ExecStart"]] == [
            [plan.front.haproxy, "-Ws", "-f", plan.front.config_path]]
    if plan.vip and plan.router:  # keepalived's unit and config, as this router host's
        v = plan.vip
        svc = sd.sections(bundle[v.unit])["Service"]
        assert [sd.exec_argv(x)[:2] for x in svc["ExecStart"]] == [[v.keepalived, "--dont-fork"]]
        words = bundle["vip.conf"].split()  # keepalived reads whitespace-separated words
        for value in (v.address + "/32", v.interface):
            assert value in words
        assert words[words.index("interface") + 1] == v.interface


def _check_service(plan: Plan, svc: dict[str, list[str]], env: list, argv: list[str],
                   python: str) -> None:
    assert [sd.plain(v) for v in svc["User"]] == [plan.user]
    assert [sd.plain(v) for v in svc["Group"]] == [plan.group]
    got_env: dict[str, str] = {}
    for line in svc.get("Environment", []):
        got_env.update(sd.environment(line))
    assert got_env == dict(env)
    (exec_start,) = svc["ExecStart"]
    words = sd.exec_argv(exec_start)
    assert words[:2] == [python, plan.paths.runtime]
    assert words[words.index("--") + 1:] == argv
    paths = [i for v in svc.get("ReadWritePaths", []) for i in sd.list_items(v)]
    assert paths == list(plan.read_write_paths)


def _check_runtime_argv(argv: list[str]) -> None:
    """The runtime's own parser takes what the unit hands it (exit 2 at every start if not)."""
    runtime_parse_args(argv)


def check_runtime_sources(plan: Plan, files: dict[str, str]) -> None:
    """Python's tokenizer reads each shipped module as the package's own: utf-8 (PEP 263),
    and the same tokens once the comments (the provenance naming config paths) are left out."""
    package = dict(runtime_modules())
    shipped = {p.removeprefix(f"{RUNTIME_DIR}/"): c for p, c in files.items()
               if p.startswith(f"{RUNTIME_DIR}/")}
    assert shipped.keys() == package.keys()
    for name, source in shipped.items():
        encoding, tokens = _tokens(source)
        assert encoding == "utf-8", name
        assert tokens == _tokens(package[name])[1], name


def _tokens(source: str) -> tuple[str, list[tuple[int, str]]]:
    data = source.encode("utf-8")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return encoding, [(t.type, t.string) for t in tokenize.tokenize(io.BytesIO(data).readline)
                      if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]


def check_install_list(plan: Plan, path: Path) -> None:
    rows = install_list_rows(path)
    assert rows[:4] == [["name", plan.name],
                        ["config", printable(plan.config_source), plan.config_sha256],
                        ["target", plan.target],
                        ["user", plan.user, plan.group, plan.paths.state_dir]]
    assert ["file", "runtime/cli.py", f"{plan.paths.runtime}/cli.py", "0644", "root"] in rows
    assert ["dir", plan.paths.jit_cache, "-", "0750", f"{plan.user}:{plan.group}"] in rows
    assert ["secret", plan.paths.router_key, "make" if plan.router else "copy", "0640",
            f"root:{plan.group}"] in rows
    if not plan.router:  # where an engine host copies the key from
        assert ["keyhost", *plan.key_origin()] in rows
    assert {r[0] for r in rows} <= {"name", "config", "target", "user", "unit", "file", "dir",
                                    "envfile", "secret", "keyhost", "manifest", "sysusers",
                                    "tmpfiles", "member"}
    assert len([r for r in rows if r[0] == "dir"]) == 3


def check_supervisord(plan: Plan, read, conf: Path) -> None:
    out = read(conf)
    run_dir = plan.supervisord.run_dir.rstrip("/")
    assert out["pidfile"] == f"{run_dir}/{plan.name}-supervisord.pid"
    assert out["sockets"] == [f"{run_dir}/{plan.name}-supervisord.sock"]
    for e in plan.engines:
        prog = out["programs"][e.name]
        assert prog["argv"][prog["argv"].index("--") + 1:] == list(e.argv)
        assert prog["environment"] == dict(e.env)
        assert prog["uid"] == f"uid:{plan.user}"
    if plan.router is None:
        return
    router = out["programs"][plan.router.name]
    got = router["argv"][router["argv"].index("--") + 1:]
    assert got[0] == plan.router.argv[0] and got[1] == f"{conf.parent}/runtime"  # %(here)s
    assert got[2:] == list(router_command(plan, plan.router, "supervisord")[2:])
    assert got[got.index("--control-plane-key") + 1] == plan.paths.router_key
    assert router["environment"] == dict(plan.router.env)


def check_k8s(plan: Plan, files: dict[str, str]) -> None:
    for name, text in files.items():
        head = text.split("\n", 5)[:4]
        assert all(line.startswith("# ") for line in head), name
        list(yaml.safe_load_all(text))
    for e in plan.engines:
        docs = list(yaml.safe_load_all(files[f"{e.name}.yaml"]))
        pod = docs[0]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert [k8s_unescape(w) for w in container["command"]] == list(pod_argv(plan, e))
        got = {v["name"]: k8s_unescape(v["value"]) for v in container["env"] if "value" in v}
        want = {k: v for k, v in e.env if k not in ("CUDA_VISIBLE_DEVICES", "SGLANG_HOST_IP")}
        assert got == want
        assert pod.get("nodeSelector", {}) == plan.k8s.node_selector


def check_every_output(plan: Plan, read_supervisord) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = {f.path: f.content for f in render_systemd(plan, "pdsvc render")}
        check_systemd(plan, files)
        check_runtime_sources(plan, files)
        (Path(tmp) / "install.list").write_text(files["install.list"])
        check_install_list(plan, Path(tmp) / "install.list")
        try:
            sv = render_supervisord(plan, "pdsvc render --format supervisord")
        except ConfigError as e:  # a value supervisord alone cannot hold: refused, one line
            assert "\n" not in str(e)
        else:
            if read_supervisord is not None:
                conf = Path(tmp) / "sv" / "supervisord.conf"
                conf.parent.mkdir()
                conf.write_text(sv[0].content)
                check_supervisord(plan, read_supervisord, conf)
        if plan.hosts:
            return  # a host's view; Kubernetes places the engines itself (test_render_k8s)
        try:
            k8s = render_k8s(plan, "pdsvc render --format k8s")
        except ConfigError as e:  # e.g. a router host a pod cannot listen on
            assert "\n" not in str(e)
        else:
            check_k8s(plan, {f.path: f.content for f in k8s})


@pytest.fixture(scope="module")
def read_supervisord():
    read = supervisord_reader(serve_venv())
    if read is None:
        require("supervisor is neither importable nor in the serve venv "
                "(tests/support/make_serve_venv.sh)")
    return read


@BUDGET
@given(field=st.sampled_from(FIELDS), hostile=HOSTILE)
def test_a_hostile_string_is_refused_or_reaches_every_output_intact(
        field: tuple[str, str], hostile: str, read_supervisord) -> None:
    plan = _parse(_config(*field, hostile))
    event("refused" if plan is None else "rendered")
    if plan is not None:
        check_every_output(plan, read_supervisord)


@SMALL_BUDGET
@given(hostile=HOSTILE)
def test_the_default_values_survive_alongside_a_hostile_env_value(
        hostile: str, read_supervisord) -> None:
    data = _config("runtime.env.WEIRD", "{}", hostile)
    data["runtime"]["read_write_paths"] = ["/srv/my data", "/srv/100%", '/srv/q"\\']
    plan = _parse(data)
    if plan is not None:
        check_every_output(plan, read_supervisord)


@SMALL_BUDGET
@given(field=st.sampled_from(HOST_FIELDS), hostile=HOSTILE)
def test_a_hostile_string_in_a_host_is_refused_or_reaches_its_bundle_intact(
        field: tuple[str, str], hostile: str, read_supervisord) -> None:
    plan = _parse(_hosts_config(*field, hostile))
    event("refused" if plan is None else "rendered")
    if plan is not None:
        for host in plan.hosts:
            check_every_output(plan.for_host(host.name), read_supervisord)


#: A directory name (no `/` or NUL; not `.`/`..`) that supervisor's reader here, which takes one
#: config path a line, can be given (no line break).
DIR_NAME = re.compile(r"(?!\.\.?$)[^/\x00\n\r]+")


@SMALL_BUDGET
@given(hostile=HOSTILE.filter(DIR_NAME.fullmatch))
def test_a_supervisord_bundle_directory_is_refused_or_read_back_as_here(
        hostile: str, read_supervisord) -> None:
    """The bundle's own directory reaches supervisord as %(here)s: every program's runtime is
    `%(here)s/runtime` after supervisord's expansion and shlex, or the directory is refused."""
    plan = _parse(_config("model.path", "/srv/m", ""))
    assert plan is not None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / hostile
        try:
            check_bundle_dir(out)
        except OutputError as e:
            assert "\n" not in str(e)
            event("refused")
            return
        event("rendered")
        try:
            out.mkdir()
        except OSError:  # a name the file system cannot hold (too long in bytes)
            return
        conf = out / "supervisord.conf"
        conf.write_text(render_supervisord(plan, "t")[0].content)
        check_supervisord(plan, read_supervisord, conf)
        for prog in read_supervisord(conf)["programs"].values():
            assert f"{out}/runtime" in prog["argv"]


# --------------------------------------------------------------------- every other field

#: The schema's non-string fields (numbers, booleans, choices, lists) as the reference names
#: them (pdsvc.config.reference): each drawn from values in and out of range, of the right and the
#: wrong type; the config is refused with one line, or every output carries the plan (above),
#: the runtime's own parser included.
OTHER_FIELDS = [
    "format", "model.trust_remote_code", "runtime.pinning", "runtime.numa_policy",
    "transfer.backend", "transfer.kv_check_bytes", "transfer.kv_check_blocks",
    "transfer.kv_check_min_gbps", "prefill.gpus", "prefill.numa_node", "prefill.port",
    "prefill.tp", "prefill.dist_init_port", "prefill.bootstrap_port", "prefill[i].gpus",
    "prefill[i].port", "prefill[i].dist_init_port", "prefill[i].bootstrap_port",
    "decode.gpus", "decode.numa_node", "decode.port", "decode.tp", "decode.dist_init_port",
    "decode.restart_with_prefill", "decode[i].gpus", "decode[i].port",
    "decode[i].dist_init_port", "decode[i].restart_with_prefill", "router.package",
    "router.port", "router.prometheus_port", "router.policy",
    "router.health_check.interval_secs", "router.health_check.timeout_secs",
    "router.health_check.failure_threshold", "router.health_check.success_threshold",
    "router.retry.attempts", "router.retry.initial_backoff_ms", "router.retry.max_backoff_ms",
    "router.circuit_breaker", "router.replicas", "router.replica_port", "router.vip.vrrp_id",
    "router.vip.advert_ms",
    *(f"router.front.{f}" for f in FrontConfig.model_fields if f != "haproxy"),
    *(f"lifecycle.{f}" for f in LifecycleConfig.model_fields),
    *(f"metrics.{f}" for f in MetricsConfig.model_fields),
    "supervisord.logs", "supervisord.drop_privileges", "k8s.router_service_type",
    "k8s.host_network", "hosts",
]
ANY_VALUE = st.one_of(
    st.integers(-2, 10), st.integers(0, 1 << 40), st.sampled_from([0, 1, 8, 100, 3600, 86400]),
    st.booleans(), st.none(), st.floats(allow_nan=True), st.lists(st.integers(-1, 9), max_size=5),
    st.sampled_from(["numa", "strict", "off", "bind", "nixl", "mooncake", "smg", "random",
                     "files", "NodePort", "auto", "systemd", "k8s", "supervisord", "x", ""]),
)


def _set(data: dict, key: str, value: object) -> dict:
    """`key` (a reference key: `prefill[i].port`, `hosts`) set to `value` in a config."""
    if key == "hosts":
        data["hosts"] = value
        return data
    if "[i]." in key:  # the list form, one item
        role, leaf = key.split("[i].")
        data[role] = [{"gpus": [0, 1, 2, 3] if role == "prefill" else [4, 5, 6, 7], leaf: value}]
        return data
    *parents, leaf = key.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return data


@BUDGET
@given(key=st.sampled_from(OTHER_FIELDS), value=ANY_VALUE)
def test_any_value_of_any_other_field_is_refused_or_reaches_every_output(
        key: str, value: object, read_supervisord) -> None:
    plan = _parse(_set(_config("model.path", "/srv/m", ""), key, value))
    event("refused" if plan is None else "rendered")
    if plan is not None:
        check_every_output(plan, read_supervisord)


def _covered(path: str) -> str:
    """The reference key a property's field path stands for."""
    parts = path.split(".")
    if parts[0] == "hosts":
        return "hosts" if parts[1] == "*" else ".".join(["hosts", "NAME", parts[2]])
    if parts[-2:-1] and parts[-2] in ("env", "args", "node_selector"):
        return ".".join(parts[:-1])
    return path


def test_every_field_of_the_config_schema_has_a_property() -> None:
    """A field added to the schema without a property here fails: the contract covers it."""
    keys = re.findall(r"^\| `([^`]+)`", reference_markdown(), re.M)
    covered = {_covered(p) for p, _ in FIELDS + HOST_FIELDS} | set(OTHER_FIELDS)
    missing = [k for k in keys if k not in covered]
    assert not missing, f"schema fields without a property in {__file__}: {missing}"
