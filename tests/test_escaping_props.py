"""systemd escaping and property tests: random valid configs render units systemd accepts;
random broken configs always end in a clean PdsvcError (never another exception)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from analyze import missing, scratch_root, verify
from conftest import REPO, require
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdsvc.config.load import parse_config
from pdsvc.config.sections import MetricsConfig
from pdsvc.errors import PdsvcError
from pdsvc.plan.build import build_plan
from pdsvc.render.bundle import write_bundle
from pdsvc.render.kit import sd_env, sd_exec
from pdsvc.render.systemd import render_systemd
from pdsvc.topology import load_topology_file
from units import exec_words

SEED = load_topology_file(REPO / "etc/seed-host.topology.json")
PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=20)


@pytest.mark.parametrize(("argv", "line"), [
    (["/bin/x", "a b"], '/bin/x "a b"'),
    (["/bin/x", "100%"], "/bin/x 100%%"),
    (["/bin/x", "$HOME"], '/bin/x "$$HOME"'),
    (["/bin/x", 'say "hi"'], r'/bin/x "say \"hi\""'),
    (["/bin/x", ";"], '/bin/x ";"'),
    (["/bin/x", ""], '/bin/x ""'),
])
def test_exec_words(argv: list[str], line: str) -> None:
    assert sd_exec(argv) == line


def test_env_quoting() -> None:
    assert sd_env("A", "x y %n") == '"A=x y %%n"'
    assert sd_env("A", 'q"\\') == r'"A=q\"\\"'


@given(st.lists(PRINTABLE, min_size=1, max_size=6))
def test_exec_round_trips_through_a_systemd_style_split(words: list[str]) -> None:
    assert exec_words(sd_exec(["/bin/x", *words]))[1:] == words


def _config(draw_ports, gpus_p, gpus_d, name, policy, backend, path, extra_env) -> dict:
    p, d, r, prom, di_p, di_d, bp = draw_ports
    return {
        "name": name, "model": {"path": path},
        "runtime": {"env": extra_env, "pinning": policy},
        "transfer": {"backend": backend},
        "prefill": {"gpus": gpus_p, "port": p, "dist_init_port": di_p, "bootstrap_port": bp},
        "decode": {"gpus": gpus_d, "port": d, "dist_init_port": di_d},
        "router": {"port": r, "prometheus_port": prom},
    }


@st.composite
def valid_configs(draw) -> dict:
    node = draw(st.sampled_from([[0, 1, 2, 3], [4, 5, 6, 7]]))
    k = draw(st.integers(1, 4))
    gpus_p = sorted(draw(st.permutations(node)))[:k]
    other = [4, 5, 6, 7] if node == [0, 1, 2, 3] else [0, 1, 2, 3]
    gpus_d = other[: draw(st.integers(1, 4))]
    # every port distinct from node_exporter's too (metrics.node_exporter_port, in the clash
    # check), whose default these configs keep
    taken = MetricsConfig.model_fields["node_exporter_port"].default // 100
    bases = draw(st.lists(st.integers(2, 600).filter(lambda b: b != taken), min_size=7,
                          max_size=7, unique=True))
    ports = [b * 100 for b in bases]  # ≥100 apart, so dist-init spans never cover another
    return _config(
        ports, gpus_p, gpus_d,
        draw(st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)),
        draw(st.sampled_from(["numa", "strict", "off"])),
        draw(st.sampled_from(["nixl", "mooncake"])),
        "/srv/" + draw(PRINTABLE),
        draw(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True)
                             .filter(lambda k: not k.startswith(("CUDA", "SGLANG_SET"))),
                             PRINTABLE, max_size=3)),
    )


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cfg=valid_configs())
def test_random_valid_configs_render_units_systemd_accepts(cfg: dict, tmp_path_factory) -> None:
    require(missing())
    tmp = tmp_path_factory.mktemp("prop")
    text = yaml.safe_dump(cfg)
    plan = build_plan(parse_config(text), SEED, config_source="prop.yaml", config_text=text)
    write_bundle(render_systemd(plan, "test"), tmp / "bundle")
    scratch_root(tmp / "root", plan, tmp / "bundle")
    assert verify(tmp / "root", plan) == ""
    service = (tmp / "bundle" / plan.engines[0].unit).read_text()
    line = next(ln for ln in service.replace("\\\n", " ").splitlines()
                if ln.startswith("ExecStart="))
    words = exec_words(line.removeprefix("ExecStart="))
    assert words[words.index("--") + 1:] == list(plan.engines[0].argv)


def _mutate(cfg: dict, data) -> dict:
    """Break a valid config in one random way."""
    kind = data.draw(st.sampled_from(["typo", "type", "gpu", "port", "numa", "drop-model"]))
    if kind == "typo":
        section = data.draw(st.sampled_from(["prefill", "decode", "router", "runtime"]))
        cfg[section] = dict(cfg.get(section, {}), **{data.draw(PRINTABLE) + "_x": 1})
    elif kind == "type":
        cfg["prefill"]["port"] = data.draw(st.sampled_from(["x", -1, 1.5, [1], None, 70000]))
    elif kind == "gpu":
        bad = [[99], [], [-1], ["a"], cfg["prefill"]["gpus"]]
        cfg["decode"]["gpus"] = data.draw(st.sampled_from(bad))
    elif kind == "port":
        cfg["router"]["port"] = cfg["decode"]["port"]
    elif kind == "numa":
        wrong_node = 1 if cfg["prefill"]["gpus"][0] < 4 else 0
        cfg["prefill"]["numa_node"] = data.draw(st.sampled_from([7, -3, "x", wrong_node]))
    else:
        del cfg["model"]
    return cfg


@settings(max_examples=150, deadline=None)
@given(cfg=valid_configs(), data=st.data())
def test_random_broken_configs_fail_cleanly(cfg: dict, data) -> None:
    text = yaml.safe_dump(_mutate(cfg, data))
    with pytest.raises(PdsvcError) as err:
        build_plan(parse_config(text, "b.yaml"), SEED, config_source="b.yaml", config_text=text)
    assert err.value.exit_code in (2, 3)
    assert "\n" not in str(err.value) and str(err.value)


def test_random_broken_cli_message_is_one_line(runner, tmp_path: Path) -> None:
    from pdsvc.cli.commands import main
    (tmp_path / "c.yaml").write_text("model: {path: /m}\nprefill: {gpus: [0, 9]}\n")
    res = runner.invoke(main, ["validate", "-c", str(tmp_path / "c.yaml"), "--topology",
                               str(REPO / "etc/seed-host.topology.json")])
    assert res.exit_code == 3 and shlex.split(res.stderr) and res.stderr.count("\n") == 1
