"""The stand-in's capacity and latency from its own flags and environment (for `pdsvc tune`,
whose candidates change them: tests/support/fake_latency.py's designed rule), and a start it
refuses for a MoE runner, as SGLang refuses some at start."""

from __future__ import annotations

import fake_latency
import pytest
from standin.cli import main


def model(monkeypatch: pytest.MonkeyPatch, **env: str) -> fake_latency.LatencyModel:
    for name in ("FAKE_SGLANG_KNEE_RATE", "FAKE_SGLANG_SLOT_RATE", "FAKE_SGLANG_SLOTS",
                 "FAKE_SGLANG_ITL_SLOTS", "FAKE_SGLANG_ITL_BY_NCCL_PROTO", "NCCL_PROTO",
                 "FAKE_SGLANG_ITL_MS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return fake_latency.LatencyModel()


FLAGS = {"--max-running-requests": None, "--cuda-graph-max-bs-decode": None,
         "--cuda-graph-max-bs": None}


def test_the_smallest_capacity_flag_sets_the_knee(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model(monkeypatch, FAKE_SGLANG_SLOT_RATE="0.5")
    m.configure({**FLAGS, "--max-running-requests": 64, "--cuda-graph-max-bs-decode": 16})
    assert (m.slots, m.knee, m.itl) == (16, 8.0, 0.010)  # no ITL rule: 10 ms as before
    m = model(monkeypatch, FAKE_SGLANG_SLOT_RATE="0.5", FAKE_SGLANG_SLOTS="4")
    m.configure(FLAGS)
    assert (m.slots, m.knee) == (4, 2.0)


def test_more_slots_cost_itl_and_the_nccl_protocol_scales_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"FAKE_SGLANG_SLOT_RATE": "1", "FAKE_SGLANG_ITL_SLOTS": "32",
           "FAKE_SGLANG_ITL_BY_NCCL_PROTO": "LL128=0.5,Simple=1.5"}
    itl = {}
    for bs, proto in ((32, None), (64, None), (32, "LL128"), (32, "Simple"), (32, "LL")):
        m = model(monkeypatch, **env, **({"NCCL_PROTO": proto} if proto else {}))
        m.configure({**FLAGS, "--cuda-graph-max-bs-decode": bs})
        itl[(bs, proto)] = round(m.itl * 1000, 3)
    assert itl == {(32, None): 20.0, (64, None): 30.0, (32, "LL128"): 10.0,
                   (32, "Simple"): 30.0, (32, "LL"): 20.0}


def test_without_a_slot_rate_the_flags_play_no_part(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model(monkeypatch, FAKE_SGLANG_KNEE_RATE="6")
    m.configure({**FLAGS, "--max-running-requests": 2})
    assert (m.slots, m.knee, m.itl) == (0, 6.0, 0.010)


def test_a_refused_moe_runner_exits_1_before_serving(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("FAKE_SGLANG_REFUSE_MOE_BACKENDS", "flashinfer_trtllm, cutlass")
    argv = ["--model-path", "/srv/m", "--port", "1", "--moe-runner-backend"]
    assert main([*argv, "flashinfer_trtllm"]) == 1
    said = capsys.readouterr()
    assert "ValueError: --moe-runner-backend flashinfer_trtllm cannot run this model" in (
        said.out + said.err)
