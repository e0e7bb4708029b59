"""Config values, case by case: every config value reaches every output intact, or is refused at
load with one line naming the key, the character and why. (The property tests over every
string field are tests/test_hostile_props.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sdsyntax as sd
import yaml
from conftest import REPO
from consumers import install_list_rows

from pdsvc.cli.commands import main
from pdsvc.config.load import parse_config
from pdsvc.errors import ConfigError
from pdsvc.plan.build import build_plan
from pdsvc.render.systemd import render_systemd
from pdsvc.topology import load_topology_file

SEED_FILE = REPO / "etc/seed-host.topology.json"
SEED = load_topology_file(SEED_FILE)
BASE = "model: {path: /srv/m}\n"
HOSTS = ("hosts:\n  a: {address: 10.0.0.1, run: [router, prefill]}\n"
         "  b: {address: 10.0.0.2, run: [decode]}\n")


def refused(runner, tmp_path: Path, text: str | bytes, *args: str) -> str:
    """Render the config; it must fail with exit 2 and one stderr line, which is returned."""
    cfg = tmp_path / "pdsvc.yaml"
    (cfg.write_bytes if isinstance(text, bytes) else cfg.write_text)(text)
    out = tmp_path / "units"
    result = runner.invoke(main, ["render", "-c", str(cfg), "--topology", str(SEED_FILE),
                                  "-o", str(out), *args])
    assert result.exit_code == 2, (result.output, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert not out.exists()
    return lines[0]


# --------------------------------------------------------------------------- refused at load

CASES = [
    # newlines that would become directives
    ("user-newline", 'runtime: {user: "sglang\\nExecStartPre=/bin/touch /tmp/pwned"}',
     ["runtime.user", "must be a user/group name"]),
    ("group-newline", 'runtime: {group: "sglang\\nX=1"}', ["runtime.group"]),
    ("env-newline", 'runtime: {env: {A: "a\\nExecStartPre=/bin/evil"}}',
     ["runtime.env.A", "newline (U+000A)", "line-based"]),
    ("role-env-newline", 'decode: {env: {A: "x\\ny"}}', ["decode.env.A", "newline"]),
    ("router-env-newline", 'router: {env: {A: "x\\ny"}}', ["router.env.A", "newline"]),
    ("host-env-newline", HOSTS.replace("run: [decode]}", 'run: [decode], env: {A: "x\\ny"}}'),
     ["hosts.b.env.A", "newline"]),
    ("ucx-newline", HOSTS.replace("run: [decode]}", 'run: [decode], ucx_net_devices: "a\\nb"}'),
     ["hosts.b.ucx_net_devices"]),
    ("jit-newline", 'runtime: {jit_cache: "/var/cache/x\\nCacheDirectory=/"}',
     ["runtime.jit_cache", "newline"]),
    ("rw-newline", 'runtime: {read_write_paths: ["/srv/a\\nExecStartPre=/x"]}',
     ["runtime.read_write_paths[0]", "newline"]),
    ("router-host-newline", 'router: {host: "0.0.0.0\\n[Install]"}', ["router.host", "newline"]),
    ("served-name-newline", 'model: {path: /m, served_name: "a\\nb"}',
     ["model.served_name", "newline"]),
    # CR, NUL and friends
    ("args-cr", 'prefill: {args: {chat-template: "a\\rb"}}',
     ["prefill.args.chat-template", "carriage return (U+000D)"]),
    ("env-nul", 'runtime: {env: {A: "a\\0b"}}', ["runtime.env.A", "NUL (U+0000)"]),
    ("path-nul", 'model: {path: "/m\\0"}', ["model.path", "NUL"]),
    ("line-separator", 'model: {path: "/m\\u2028x"}', ["model.path", "line separator"]),
    ("c1-next-line", 'model: {path: "/m\\x85x"}', ["model.path", "U+0085"]),
    # a trailing backslash would join the next line
    ("user-backslash", 'runtime: {user: "sglang\\\\"}', ["runtime.user"]),
    # install.list: a tab would add a field that the root installer obeys
    ("user-tab", 'runtime: {user: "sglang\\troot"}', ["runtime.user"]),
    ("group-tab", 'runtime: {group: "g\\tx"}', ["runtime.group"]),
    ("jit-tab", 'runtime: {jit_cache: "/data/jit\\t-\\t0777"}',
     ["runtime.jit_cache", "tab (U+0009)", "install.list"]),
    ("libexec-tab", 'runtime: {libexec_dir: "/opt/x\\ty"}', ["runtime.libexec_dir", "tab"]),
    ("libexec-newline", 'runtime: {libexec_dir: "/opt/x\\ndir\\t/etc"}',
     ["runtime.libexec_dir", "newline"]),
    # CacheDirectory=: what systemd 254+ and older versions read differently
    ("cache-colon", "runtime: {jit_cache: '/var/cache/a:b'}", ["runtime.jit_cache", "':'"]),
    ("cache-backslash", "runtime: {jit_cache: '/var/cache/a\\b'}", ["runtime.jit_cache"]),
    ("path-not-normal", "runtime: {read_write_paths: [/srv/../etc]}", ["normalised"]),
    ("path-relative", "runtime: {read_write_paths: [srv]}", ["absolute"]),
    # owned flags: by value, and by abbreviation (argparse expands unique prefixes)
    ("flag-by-value", 'prefill: {args: {disable-radix-cache: "--port=31337"}}',
     ["prefill.args", "'--port=31337'", "starts with '-'"]),
    ("flag-in-list", 'prefill: {args: {x: [info, --tp-size, "8"]}}', ["'--tp-size'"]),
    ("router-prometheus-por", "router: {args: {prometheus-por: 1}}",
     ["router.args", "--prometheus-por is an abbreviation of --prometheus-port"]),
    ("router-hos", "router: {args: {hos: x}}", ["--hos is an abbreviation of --host"]),
    ("router-por", "router: {args: {por: 1}}", ["--por is an abbreviation of --port"]),
    ("router-polic", "router: {args: {polic: random}}", ["--polic is an abbreviation"]),
    ("router-health", "router: {args: {health-: 1}}", ["--health- is an abbreviation"]),
    ("engine-tp-siz", "prefill: {args: {tp-siz: 8}}", ["--tp-siz is an abbreviation"]),
    ("engine-model-pat", "decode: {args: {model-pat: /x}}", ["--model-pat"]),
    ("engine-dist-init-add", "decode: {args: {dist-init-add: x}}", ["--dist-init-add"]),
    ("engine-ambiguous", "decode: {args: {d: x}}", ["--d is an abbreviation of --dis"]),
    # env vars pdsvc derives
    ("env-home", "runtime: {env: {HOME: /root}}", ["runtime.env", "HOME is set by pdsvc"]),
    ("env-triton", "prefill: {env: {TRITON_CACHE_DIR: /tmp/t}}",
     ["TRITON_CACHE_DIR is set by pdsvc from runtime.jit_cache"]),
    # strict YAML and types
    ("duplicate-key", "model: {path: /a}\nmodel: {path: /b}\n",
     [":2: duplicate key 'model' (also on line 1)"]),
    ("duplicate-nested", "prefill:\n  port: 1\n  port: 2\n", [":4: duplicate key 'port'"]),
    ("port-bool", "prefill: {port: true}", ["prefill.port", "valid integer"]),
    ("gpu-bool", "prefill: {gpus: [0, true]}", ["prefill.gpus[1]", "valid integer"]),
    ("port-string", "prefill: {port: '30000'}", ["prefill.port"]),
    ("port-float", "prefill: {port: 30000.0}", ["prefill.port"]),
    # bounds
    ("start-timeout-huge", "lifecycle: {start_timeout_secs: 1e20}",
     ["lifecycle.start_timeout_secs"]),
    ("start-timeout-2days", "lifecycle: {start_timeout_secs: 172800}",
     ["lifecycle.start_timeout_secs", "less than or equal to 86400"]),
    ("stop-timeout-huge", "lifecycle: {stop_timeout_secs: 100000000000}",
     ["lifecycle.stop_timeout_secs"]),
    ("restart-huge", "lifecycle: {restart_secs: 99999999}", ["lifecycle.restart_secs"]),
    ("burst-huge", "lifecycle: {start_limit_burst: 4294967296}", ["start_limit_burst"]),
    ("liveness-huge", "lifecycle: {liveness_failures: 1000}", ["liveness_failures"]),
    ("health-huge", "router: {health_check: {interval_secs: 99999}}", ["interval_secs"]),
    ("served-name-long", f"model: {{path: /m, served_name: {'x' * 5000}}}",
     ["model.served_name", "at most 4096"]),
    # addresses
    ("host-multicast", HOSTS.replace("10.0.0.2", "224.0.0.9"),
     ["hosts.b.address", "multicast"]),
    ("host-broadcast", HOSTS.replace("10.0.0.2", "255.255.255.255"), ["broadcast"]),
    ("router-host-bracket", "router: {host: '0.0.0.0['}", ["router.host"]),
    ("router-host-multicast", "router: {host: 239.1.1.1}", ["router.host", "multicast"]),
    ("router-host-ipv6", "router: {host: '::1'}", ["router.host", "IPv6"]),
    # keys with line breaks: still one line
    ("env-key-newline", 'runtime: {env: {"A\\nB": 1}}', ["runtime.env.A\\nB"]),
    ("args-key-newline", 'prefill: {args: {"a\\nb": 1}}', ["prefill.args.a\\nb"]),
    ("host-name-newline", HOSTS.replace("  b:", '  "b\\nc":'), ["hosts.b\\nc"]),
    ("unknown-key-newline", '"prefill\\nx": 1', ["unknown key 'prefill\\nx'"]),
]


@pytest.mark.parametrize(("text", "wanted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_at_load_in_one_line(text: str, wanted: list[str], runner,
                                     tmp_path: Path) -> None:
    body = text if text.startswith("model:") else BASE + text + "\n"
    line = refused(runner, tmp_path, body)
    assert line.startswith(f"pdsvc: error: {tmp_path / 'pdsvc.yaml'}:"), line
    for part in wanted:
        assert part in line, line


@pytest.mark.parametrize(("data", "what"), [
    (b"model: {path: /m}\nname: \xff\n", "byte 0xff"),
    ("model: {path: /m}\nname: café\n".encode("latin-1"), "byte 0xe9"),
    ("model: {path: /m}\n".encode("utf-16"), "not UTF-8"),
], ids=["xff", "latin-1", "utf-16"])
def test_a_config_that_is_not_utf8_is_one_line(data: bytes, what: str, runner,
                                               tmp_path: Path) -> None:
    line = refused(runner, tmp_path, data)
    assert "the config is not UTF-8" in line and what in line, line


def test_an_alias_bomb_is_refused_at_once(runner, tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    bomb = BASE + "k8s:\n  node_selector:\n" + "".join(f"    {lv}\n" for lv in levels)
    assert len(bomb) < 700
    start = time.monotonic()
    line = refused(runner, tmp_path, bomb)
    assert time.monotonic() - start < 5
    assert "expands to more than" in line, line


def test_a_huge_config_is_refused(runner, tmp_path: Path) -> None:
    line = refused(runner, tmp_path, BASE + f"# {'x' * 300_000}\n")
    assert "at most 262144 are read" in line, line


def test_router_host_with_a_bracket_is_refused_before_k8s(runner, tmp_path: Path) -> None:
    line = refused(runner, tmp_path, BASE + "router: {host: '0.0.0.0['}\n", "--format", "k8s")
    assert "router.host" in line


# --------------------------------------------------------------------------- allowed, exact


def plan_of(text: str):
    return build_plan(parse_config(text, "t.yaml"), SEED, config_source="t.yaml",
                      config_text=text)


def test_a_path_with_a_space_is_one_path_in_read_write_paths() -> None:
    plan = plan_of(BASE + "runtime: {read_write_paths: ['/srv/my data', '/srv/100%', "
                          "'/srv/q\"\\x', '/srv/#;x']}\n")
    files = {f.path: f.content for f in render_systemd(plan, "t")}
    svc = sd.sections(files[plan.engines[0].unit])["Service"]
    assert [i for v in svc["ReadWritePaths"] for i in sd.list_items(v)] == [
        "/srv/my data", "/srv/100%", '/srv/q"\\x', "/srv/#;x"]


@pytest.mark.parametrize("jit", ["/data/my jit", "/data/q\"'x", "/data/#x;y", "/data/b\\s",
                                 "/var/cache/my jit", "/var/cache/100%"])
def test_a_jit_cache_with_odd_characters_reaches_every_place_intact(jit: str,
                                                                    tmp_path: Path) -> None:
    plan = plan_of(BASE + yaml.safe_dump({"runtime": {"jit_cache": jit}}))
    files = {f.path: f.content for f in render_systemd(plan, "t")}
    e = plan.engines[0]
    svc = sd.sections(files[e.unit])["Service"]
    env: dict[str, str] = {}
    for line in svc["Environment"]:
        env.update(sd.environment(line))
    assert env["TRITON_CACHE_DIR"] == f"{jit}/triton"
    argv = sd.exec_argv(svc["ExecStart"][0])
    assert argv[argv.index("--jit-cache") + 1] == jit
    if jit.startswith("/var/cache/"):
        assert sd.list_items(svc["CacheDirectory"][0]) == [jit.removeprefix("/var/cache/")]
    else:
        assert [i for v in svc["ReadWritePaths"] for i in sd.list_items(v)] == [jit]
    (tmp_path / "install.list").write_text(files["install.list"])
    assert ["dir", jit, "-", "0750", "sglang:sglang"] in install_list_rows(
        tmp_path / "install.list")


def test_a_tab_in_an_env_value_or_argument_is_encoded() -> None:
    plan = plan_of(BASE + 'runtime: {env: {A: "x\\ty"}}\nprefill: {args: {chat-template: '
                          '"a\\tb"}}\n')
    files = {f.path: f.content for f in render_systemd(plan, "t")}
    svc = sd.sections(files[plan.engines[0].unit])["Service"]
    assert "\t" not in files[plan.engines[0].unit]
    assert sd.environment(next(v for v in svc["Environment"] if "A=" in v)) == {"A": "x\ty"}
    assert sd.exec_argv(svc["ExecStart"][0])[-1] == "a\tb"


@pytest.mark.parametrize("text", [
    "prefill: {args: {chunked-prefill-size: 8192, mem-fraction-static: 0.8}}",
    "prefill: {args: {some-offset: '-1', other: -2.5}}",  # negative numbers are values
    "router: {args: {prefill-policy: random, log-level: info}}",  # longer than an owned flag
    "runtime: {env: {CUDA_CACHE_MAXSIZE: 1073741824, HF_HUB_OFFLINE: 0}}",  # the overrides
    "router: {host: router.example.com}",
    "router: {host: '::'}",
])
def test_what_stays_allowed(text: str) -> None:
    plan_of(BASE + text + "\n")


def test_an_error_about_a_huge_value_stays_short() -> None:
    with pytest.raises(ConfigError) as err:
        plan_of(BASE + f"prefill: {{port: '{'9' * 4000}'}}\n")
    assert len(str(err.value)) < 300


# --------------------------------------------------------------------------- provenance header


def test_a_config_path_or_topology_name_with_a_newline_injects_nothing(runner,
                                                                        tmp_path: Path) -> None:
    d = tmp_path / "odd\n[Install]\nWantedBy=evil.target\\"
    d.mkdir()
    cfg = d / "c\nExecStartPre=evil.yaml"
    cfg.write_text((REPO / "etc/pdsvc.yaml").read_text())
    topo = d / "topo\n[Install]\nWantedBy=evil.target.json"
    topo.write_text(SEED_FILE.read_text())
    for fmt in ("systemd", "supervisord", "k8s"):
        out = tmp_path / f"out-{fmt}"
        result = runner.invoke(main, ["render", "-c", str(cfg), "--topology", str(topo),
                                      "-o", str(out), "--format", fmt])
        assert result.exit_code == 0, (result.output, result.stderr)
        for f in out.iterdir():
            if f.is_dir():  # runtime/: the runtime's modules, whose header names no input
                continue
            if f.suffix == ".json":  # .pdsvc-bundle.json: JSON escapes the line break
                assert "\n[Install]" in json.loads(f.read_text())["config"]
                continue
            text = f.read_text()
            if f.suffix in (".service", ".target"):
                units = sd.sections(text)
                if f.name != "dsv4-pd-ready.service":  # Required by the target, not enabled
                    assert units["Install"]["WantedBy"] in (["multi-user.target"],
                                                            ["dsv4-pd.target"])
                assert "ExecStartPre" not in units["Service"] if "Service" in units else True
            elif f.suffix == ".yaml":
                list(yaml.safe_load_all(text))
            if f.suffix == ".py":  # the runtime's modules: their header names no input
                continue
            header = [ln for ln in text.splitlines() if "evil" in ln]
            # a comment, or install.list's config line (escaped: one line, one field)
            assert header and all(ln.startswith(("# ", "; ", "config\t")) for ln in header), (
                f, header)


def test_every_pdsvc_error_is_one_line(runner, tmp_path: Path) -> None:
    topo = tmp_path / "no\nsuch\r.json"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE)
    result = runner.invoke(main, ["validate", "-c", str(cfg), "--topology", str(topo)])
    assert result.exit_code != 0 and result.stderr.count("\n") == 1, result.stderr
    assert "no\\nsuch\\r.json" in result.stderr


def test_a_supervisord_bundle_in_a_percent_directory_is_refused(runner, tmp_path: Path) -> None:
    out = tmp_path / "100% units"
    result = runner.invoke(main, ["render", "--topology", str(SEED_FILE), "--format",
                                  "supervisord", "-o", str(out)])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "cannot live in a path with '%'" in result.stderr
    assert not out.exists()
