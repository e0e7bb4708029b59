"""pdsvc/profile/trace.py: a rank's trace is read whole or refused, with one line saying why.

The traces under tests/fixtures/traces are real: captured on an H200 by capture.py beside
them, exported by torch.profiler as SGLang's scheduler exports them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pdsvc.profile.trace import TraceError, incomplete, rank_of, read_trace

TRACES = Path(__file__).parent / "fixtures" / "traces"


def test_sglang_file_names_give_the_tp_rank_and_the_stage() -> None:
    assert rank_of("1733500000.12-TP-3.trace.json.gz") == (3, None)
    assert rank_of("pdsvc-decode-abc-TP-0-DECODE.trace.json.gz") == (0, "DECODE")
    assert rank_of("x-TP-1-DP-0-PP-1-EP-2-EXTEND.trace.json.gz") == (1, "EXTEND")
    assert rank_of("merged-1733.trace.json.gz") is None
    assert rank_of("x-TP-1.trace.json") is None  # not gzipped: not SGLang's


def test_a_real_cuda_graph_decode_trace_holds_its_kernels_in_time_order() -> None:
    t = read_trace(TRACES / "decode-TP-2.trace.json.gz")
    assert t.rank == 2 and t.stage is None
    kernels = [e for e in t.events if e.kind == "kernel"]
    assert len(kernels) == 20 * 16  # 20 graph replays of 16 kernels
    assert [e.ts for e in t.events] == sorted(e.ts for e in t.events)
    assert {e.name for e in kernels} >= {"_tiled_sparse_decode_kernel", "fused_moe_kernel"}
    assert t.cpu_events > 0  # the CUDA runtime's calls: counted, not GPU activity


def test_an_eager_trace_with_cpu_ops_keeps_memcpy_and_memset_as_memory_events() -> None:
    t = read_trace(TRACES / "prefill-TP-0.trace.json.gz")
    kinds = {e.kind for e in t.events}
    assert kinds == {"kernel", "memcpy", "memset"}
    assert t.cpu_events > 100  # aten ops and runtime calls, none of them counted as GPU time


def test_the_rank_comes_from_distributed_info_when_the_name_is_not_sglangs(
        tmp_path: Path) -> None:
    path = tmp_path / "renamed.json.gz"
    path.write_bytes((TRACES / "decode-TP-3.trace.json.gz").read_bytes())
    assert read_trace(path).rank == 3


def test_a_capture_of_the_cpu_only_is_refused_naming_what_it_lacks() -> None:
    with pytest.raises(TraceError, match=r"no kernel events .*activities \[\"CPU\"\] only"):
        read_trace(TRACES / "cpu-only-TP-0.trace.json.gz")


def test_a_truncated_file_is_incomplete_until_its_gzip_stream_ends(tmp_path: Path) -> None:
    whole = (TRACES / "decode-TP-0.trace.json.gz").read_bytes()
    path = tmp_path / "p-TP-0.trace.json.gz"
    for cut in (10, len(whole) // 2, len(whole) - 9):  # the gzip trailer is 8 bytes
        path.write_bytes(whole[:cut])
        why = incomplete(path)
        assert why is not None and "truncated" in why, cut
        with pytest.raises(TraceError, match="truncated"):
            read_trace(path)
    path.write_bytes(whole)
    assert incomplete(path) is None


@pytest.mark.parametrize(("content", "why"), [
    (b"not gzip at all", "not a gzipped trace"),
    (gzip.compress(b'{"traceEvents": [ {"ph": "X"'), "not JSON"),
    (gzip.compress(json.dumps([1, 2]).encode()), "no traceEvents list"),
    (gzip.compress(json.dumps({"traceEvents": []}).encode()), "no kernel events"),
], ids=["not-gzip", "not-json", "no-list", "no-kernels"])  # gzip bytes hold a time: no ids
def test_a_corrupt_trace_is_refused_in_one_line(tmp_path: Path, content: bytes,
                                                 why: str) -> None:
    path = tmp_path / "x-TP-0.trace.json.gz"
    path.write_bytes(content)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value) and err.value.exit_code == 1


def test_a_file_that_cannot_be_read_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing-TP-0.trace.json.gz")
