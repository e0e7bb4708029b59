"""The stand-in's profiler (tests/support/standin/profiler.py), as SGLang 0.5.23 answers
/start_profile and /stop_profile: the reply before the file, N steps counted only under load,
one real trace per TP rank named as SGLang names it, growing through a scheduler freeze that
stalls generations and /health, and SGLang's errors."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import standin_client
from standin_client import request, status_or_none, wait_until

from pdsvc.profile.trace import TraceError, incomplete, rank_of, read_trace

engines, model_dir = standin_client.engines, standin_client.model_dir
BODY = {"num_steps": 5, "activities": ["GPU"], "with_stack": False, "record_shapes": False,
        "profile_id": "run1"}


def load(port: int, stop: threading.Event, codes: list[int]) -> threading.Thread:
    """Paced generations one after another until ``stop``: requests in flight, so steps run."""

    def run() -> None:
        while not stop.is_set():
            body = {"text": "hi", "sampling_params": {"max_new_tokens": 20},
                    "fake_itl_ms": 20}
            codes.append(request(port, "POST", "/generate", body, timeout=60)[0])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_capture_replies_first_then_writes_one_whole_trace_per_rank_through_a_freeze(
        engines, tmp_path: Path) -> None:
    eng = engines("null", args=["--tp", "4"], env={"FAKE_SGLANG_PROFILE_WRITE_SECS": "2.5",
                                                   "SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    eng.wait_healthy()
    out = tmp_path / "traces"
    assert request(eng.port, "POST", "/start_profile", {**BODY, "output_dir": str(out),
                                                        "unknown_field": 1})[1] == \
        b"Start profiling.\n"
    time.sleep(0.5)
    assert not out.exists()  # no request, no forward step: nothing captured yet
    stop, codes = threading.Event(), []
    worker = load(eng.port, stop, codes)
    files = wait_until(lambda: sorted(out.glob("*.trace.json.gz")), 10, "the trace files")
    assert [f.name for f in files] == [f"run1-TP-{r}.trace.json.gz" for r in range(4)]
    assert any(incomplete(f) for f in files)  # they appear first, and grow
    # the scheduler is frozen: /health answers 503 after its timeout, no token flows
    t0 = time.monotonic()
    assert status_or_none(eng.port, "/health", timeout=5) == 503
    assert time.monotonic() - t0 >= 0.9
    assert request(eng.port, "GET", "/v1/models")[0] == 200  # the HTTP side answers
    wait_until(lambda: all(incomplete(f) is None for f in files), 10, "whole traces")
    assert status_or_none(eng.port) == 200
    stop.set()
    worker.join(30)
    assert codes and set(codes) == {200}  # the freeze delayed requests, failed none
    for f in files:
        t = read_trace(f)
        assert t.rank == rank_of(f.name)[0]
        assert any(e.name == "_tiled_sparse_decode_kernel" for e in t.events)
    ctl = standin_client.get_json(eng.port, "/_fake/control")
    assert ctl["profile"]["last"]["with_stack"] is False
    assert ctl["profile"]["state"] == "idle"


def test_by_stage_names_the_stage_and_a_prefix_goes_first(engines, tmp_path: Path) -> None:
    eng = engines("prefill", env={"FAKE_SGLANG_PROFILE_WRITE_SECS": "0.2"})
    eng.wait_healthy()
    out = tmp_path / "t"
    body = {**BODY, "output_dir": str(out), "profile_by_stage": True, "profile_prefix": "pdsvc"}
    assert request(eng.port, "POST", "/start_profile", body)[0] == 200
    stop, codes = threading.Event(), []
    worker = load(eng.port, stop, codes)
    f = wait_until(lambda: [f for f in out.glob("*.gz") if incomplete(f) is None], 10, "a trace")
    stop.set()
    worker.join(30)  # its request ends before the engine does (teardown): none cut off
    assert not worker.is_alive() and codes
    assert [x.name for x in f] == ["pdsvc-run1-TP-0-EXTEND.trace.json.gz"]
    assert read_trace(f[0]).stage == "EXTEND"


def test_a_cpu_only_capture_writes_a_trace_without_kernels(engines, tmp_path: Path) -> None:
    eng = engines("decode", env={"FAKE_SGLANG_PROFILE_WRITE_SECS": "0.1"})
    eng.wait_healthy()
    out = tmp_path / "cpu"
    assert request(eng.port, "POST", "/start_profile",
                   {"output_dir": str(out), "activities": ["CPU"]})[0] == 200
    assert request(eng.port, "POST", "/stop_profile", timeout=10)[1] == \
        b"Stop profiling. This will take some time.\n"  # after the write
    (f,) = out.glob("*-TP-0.trace.json.gz")
    assert incomplete(f) is None
    with pytest.raises(TraceError, match="no kernel events"):
        read_trace(f)


def test_sglangs_errors_a_running_capture_a_stop_without_one_a_bad_field_and_404(
        engines, tmp_path: Path) -> None:
    eng = engines("decode")
    eng.wait_healthy()
    assert request(eng.port, "POST", "/stop_profile")[:2] == (500, b"Internal Server Error")
    assert "RuntimeError: Profiling is not in progress. Call /start_profile first." in \
        eng.stderr
    assert request(eng.port, "POST", "/start_profile", {"output_dir": str(tmp_path)})[0] == 200
    assert request(eng.port, "POST", "/start_profile", {"output_dir": str(tmp_path)})[0] == 500
    assert "RuntimeError: Profiling is already in progress. Call /stop_profile first." in \
        eng.stderr
    status, raw = request(eng.port, "POST", "/start_profile", {"num_steps": "five"})
    assert status == 400 and b"num_steps" in raw
    gone = engines("decode", env={"FAKE_SGLANG_NO_PROFILE": "1"})
    gone.wait_healthy()
    assert request(gone.port, "POST", "/start_profile", {})[0] == 404


def test_the_admin_key_guards_the_profiler_and_the_api_key_the_rest(engines) -> None:
    eng = engines("null", args=["--api-key", "user", "--admin-api-key", "admin"])
    eng.wait_healthy()
    user, admin = {"Authorization": "Bearer user"}, {"Authorization": "Bearer admin"}
    assert request(eng.port, "POST", "/stop_profile", headers=user)[0] == 401
    assert request(eng.port, "POST", "/stop_profile", headers=admin)[0] == 500  # past auth
    assert request(eng.port, "GET", "/server_info", headers=user)[0] == 200


def test_a_truncated_write_never_completes(engines, tmp_path: Path) -> None:
    eng = engines("decode", env={"FAKE_SGLANG_PROFILE_WRITE_SECS": "0.2",
                                 "FAKE_SGLANG_PROFILE_TRUNCATE": "1"})
    eng.wait_healthy()
    request(eng.port, "POST", "/start_profile", {"output_dir": str(tmp_path)})
    assert request(eng.port, "POST", "/stop_profile", timeout=10)[0] == 200
    (f,) = tmp_path.glob("*.gz")
    assert "truncated" in (incomplete(f) or "")
