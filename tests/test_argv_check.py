"""SGLang's and sglang-router's OWN parsers accept good command lines and reject bad ones.

These tests check the checker (tests/support/argv_check.py) that the rendering tests rely on:
a command line it accepts is one ``python -m sglang.launch_server`` / ``python -m
sglang_router.launch_router`` would accept, and a typo is caught with the parser's own message.

Needs the serve venv (tests/support/make_serve_venv.sh). Without it the tests skip, unless
PDSVC_REQUIRE_E2E=1, where a missing venv is a failure. PDSVC_SERVE_VENV points elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SUPPORT = REPO_ROOT / "tests" / "support"


def _load_argv_check() -> ModuleType:
    # By path, so the client helpers load whatever the test import layout is.
    spec = importlib.util.spec_from_file_location("pdsvc_argv_check", SUPPORT / "argv_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


argv_check = _load_argv_check()


PREFILL = shlex.split(
    "--model-path /srv/m --disaggregation-mode prefill --disaggregation-transfer-backend nixl "
    "--disaggregation-bootstrap-port 8998 --tp 4 --port 30000 --host 127.0.0.1 "
    "--dist-init-addr 127.0.0.1:30335 --mem-fraction-static 0.70 --chunked-prefill-size 8192 "
    "--moe-runner-backend marlin"
)
DECODE = shlex.split(
    "--model-path /srv/m --disaggregation-mode decode --disaggregation-transfer-backend nixl "
    "--disaggregation-bootstrap-port 8998 --tp 4 --base-gpu-id 4 --port 30001 "
    "--host 127.0.0.1 --dist-init-addr 127.0.0.1:30336 --mem-fraction-static 0.80"
)
ROUTER = shlex.split(
    "--pd-disaggregation --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001 "
    "--host 0.0.0.0 --port 8000 --prometheus-host 127.0.0.1 --prometheus-port 29000 "
    "--policy cache_aware --health-check-interval-secs 5"
)


def _replace(argv: list[str], old: str, new: str) -> list[str]:
    assert old in argv
    return [new if arg == old else arg for arg in argv]


# name -> (kind, argv); all checked in ONE subprocess (the ~3 s import is paid once).
CASES: dict[str, tuple[str, list[str]]] = {
    "prefill": ("sglang", PREFILL),
    "decode": ("sglang", DECODE),
    "sglang_typo_choice": ("sglang", _replace(PREFILL, "prefill", "prefil")),
    "sglang_unknown_flag": ("sglang", [*PREFILL, "--no-such-flag", "1"]),
    "sglang_bad_int": ("sglang", _replace(PREFILL, "4", "four")),
    "sglang_missing_model": ("sglang", PREFILL[2:]),
    "router": ("router", ROUTER),
    "router_no_bootstrap": (
        "router",
        [
            "--pd-disaggregation",
            "--prefill",
            "http://127.0.0.1:30000",
            "none",
            "--decode",
            "http://127.0.0.1:30001",
        ],
    ),
    "router_unknown_flag": ("router", [*ROUTER, "--no-such-router-flag"]),
    "router_typo_choice": ("router", _replace(ROUTER, "cache_aware", "cache-aware")),
    "router_bad_bootstrap": ("router", _replace(ROUTER, "8998", "89x8")),
}

# name -> (exit code the real launcher would give, fragment of the parser's message)
REJECTED = {
    "sglang_typo_choice": (
        2,
        "sglang serve: error: argument --disaggregation-mode: invalid choice: 'prefil'",
    ),
    "sglang_unknown_flag": (2, "sglang serve: error: unrecognized arguments: --no-such-flag 1"),
    "sglang_bad_int": (
        2,
        "argument --tp-size/--tensor-parallel-size: invalid int value: 'four'",
    ),
    "sglang_missing_model": (2, "the following arguments are required: --model-path"),
    "router_unknown_flag": (
        2,
        "launch_router.py: error: unrecognized arguments: --no-such-router-flag",
    ),
    "router_typo_choice": (2, "argument --policy: invalid choice: 'cache-aware'"),
    "router_bad_bootstrap": (1, "ValueError: Invalid bootstrap port: 89x8"),
}


def _run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), str(SUPPORT / "argv_check.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def results(serve_python: Path) -> dict[str, dict[str, Any]]:
    names = list(CASES)
    out = argv_check.run_checks(serve_python, [CASES[name] for name in names])
    assert [r["argv"] for r in out] == [CASES[name][1] for name in names]
    return dict(zip(names, out, strict=True))


def _accepted(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"], f"rejected: {result['error']}"
    assert result["exit_code"] == 0
    record: dict[str, Any] = result["record"]
    return record


def test_prefill_line_parses(results: dict[str, dict[str, Any]]) -> None:
    record = _accepted(results["prefill"])
    assert record["model_path"] == "/srv/m"
    assert record["disaggregation_mode"] == "prefill"
    assert record["disaggregation_transfer_backend"] == "nixl"
    assert record["disaggregation_bootstrap_port"] == 8998
    assert record["tp_size"] == 4
    assert (record["host"], record["port"]) == ("127.0.0.1", 30000)
    assert record["dist_init_addr"] == "127.0.0.1:30335"
    assert record["mem_fraction_static"] == pytest.approx(0.70)
    assert record["chunked_prefill_size"] == 8192
    assert record["moe_runner_backend"] == "marlin"
    # The raw namespace is there too (argparse dests), e.g. for flags with no record field.
    assert results["prefill"]["namespace"]["tp_size"] == 4


def test_prefix_abbreviations_are_reported(results: dict[str, dict[str, Any]]) -> None:
    # SGLang has no --tp option: argparse accepts it as the unique prefix of --tp-size.
    assert results["prefill"]["abbreviated"] == [{"given": "--tp", "option": "--tp-size"}]
    assert results["router"]["abbreviated"] == []


def test_decode_line_parses(results: dict[str, dict[str, Any]]) -> None:
    record = _accepted(results["decode"])
    assert record["disaggregation_mode"] == "decode"
    assert record["disaggregation_bootstrap_port"] == 8998
    assert (record["tp_size"], record["base_gpu_id"], record["port"]) == (4, 4, 30001)


def test_router_pd_line_parses(results: dict[str, dict[str, Any]]) -> None:
    record = _accepted(results["router"])
    assert record["pd_disaggregation"] is True
    assert record["prefill_urls"] == [["http://127.0.0.1:30000", 8998]]
    assert record["decode_urls"] == ["http://127.0.0.1:30001"]
    assert (record["host"], record["port"]) == ("0.0.0.0", 8000)
    assert (record["prometheus_host"], record["prometheus_port"]) == ("127.0.0.1", 29000)
    assert record["policy"] == "cache_aware"
    assert record["health_check_interval_secs"] == 5


def test_router_bootstrap_port_none(results: dict[str, dict[str, Any]]) -> None:
    record = _accepted(results["router_no_bootstrap"])
    assert record["prefill_urls"] == [["http://127.0.0.1:30000", None]]


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_bad_lines_fail_with_the_parsers_message(
    results: dict[str, dict[str, Any]], name: str
) -> None:
    exit_code, message = REJECTED[name]
    result = results[name]
    assert not result["ok"]
    assert result["record"] is None
    assert result["exit_code"] == exit_code
    assert message in result["error"]
    if exit_code == 2:  # argparse errors carry the usage text, as the launcher prints it
        assert result["usage"].startswith("usage: ")


def test_single_mode_accepts_with_json_on_stdout(serve_python: Path) -> None:
    proc = _run(serve_python, "router", "--", *ROUTER)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["record"]["prefill_urls"] == [["http://127.0.0.1:30000", 8998]]


def test_single_mode_rejects_with_exit_2_and_message(serve_python: Path) -> None:
    bad = _replace(PREFILL, "prefill", "prefil")
    proc = _run(serve_python, "sglang", "--", *bad)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "sglang serve: error: argument --disaggregation-mode: invalid choice: 'prefil'" in (
        proc.stderr
    )


def test_batch_file_and_usage_errors(serve_python: Path, tmp_path: Path) -> None:
    batch = tmp_path / "batch.json"
    batch.write_text("[]")  # entries are exercised through stdin by the `results` fixture
    proc = _run(serve_python, "batch", str(batch))
    assert (proc.returncode, json.loads(proc.stdout)) == (0, []), proc.stderr

    batch.write_text(json.dumps([{"kind": "vllm", "argv": []}]))
    for args in (["batch", str(batch)], ["sglang", "--model-path", "x"], []):
        proc = _run(serve_python, *args)
        assert proc.returncode == argv_check.EX_USAGE, (args, proc.stderr)
