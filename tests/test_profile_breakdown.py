"""pdsvc/profile/breakdown.py and groups.py on real traces, against the ground truth taken in
the capturing process (tests/fixtures/traces/truth.json: torch.profiler's key_averages()),
and on small traces made here whose every number is known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pdsvc.profile.breakdown import IMBALANCE, breakdown, speedup, union
from pdsvc.profile.groups import GROUPS, RULES, rule_for
from pdsvc.profile.trace import GpuEvent, RankTrace, read_trace

TRACES = Path(__file__).parent / "fixtures" / "traces"
TRUTH = json.loads((TRACES / "truth.json").read_text())


def traces(kind: str, engine: str = "dsv4-decode") -> list[tuple[str, RankTrace]]:
    return [(engine, read_trace(TRACES / f"{kind}-TP-{r}.trace.json.gz")) for r in range(4)]


def truth_share(kind: str, name: str, ranks: range = range(4)) -> float:
    """A device event's share of all device time, pooled over the ranks, by key_averages."""
    devs = [TRUTH["traces"][f"{kind}-TP-{r}"]["device"] for r in ranks]
    return sum(d.get(name, {"us": 0})["us"] for d in devs) / sum(
        e["us"] for d in devs for e in d.values())


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_the_top_kernel_and_its_share_match_key_averages_within_a_point(kind: str) -> None:
    b = breakdown(kind, traces(kind))
    devs = [TRUTH["traces"][f"{kind}-TP-{r}"]["device"] for r in range(4)]
    pooled: dict[str, float] = {}
    for d in devs:
        for name, e in d.items():
            pooled[name] = pooled.get(name, 0.0) + e["us"]
    truth_top = max(pooled, key=lambda n: pooled[n])
    assert b.kernels[0].name == truth_top  # the name exact
    assert abs(b.kernels[0].share - truth_share(kind, truth_top)) < 0.01
    # every kernel's calls and time, not only the top one's
    for k in b.kernels:
        assert k.count == sum(d[k.name]["count"] for d in devs if k.name in d), k.name
        assert k.us == pytest.approx(pooled[k.name], rel=1e-6), k.name


def test_the_cuda_graph_decode_is_dominated_by_the_sparse_decode_kernel_in_attention() -> None:
    b = breakdown("decode", traces("decode"))
    top = b.kernels[0]
    assert top.name == "_tiled_sparse_decode_kernel" and top.group == "attention"
    assert top.share == pytest.approx(truth_share("decode", top.name), abs=0.01)
    assert top.share > 0.8
    groups = {g.name: g for g in b.groups}
    assert list(groups) == list(GROUPS)
    assert sum(g.share for g in b.groups) == pytest.approx(1.0)
    assert groups["attention"].share == pytest.approx(top.share)  # it is attention's only one
    assert groups["communication"].us == 0  # one GPU, no NCCL in the capture
    assert groups["memory"].us > 0  # the graph's memcpy node runs as memcpy32_post


def test_the_imbalanced_rank_is_named_and_no_other() -> None:
    b = breakdown("decode", traces("decode"))
    assert [label for label, _ in b.outliers] == [f"dsv4-decode/TP{TRUTH['slow_rank']}"]
    (_, over), = b.outliers
    assert over > IMBALANCE
    assert breakdown("prefill", traces("prefill")).outliers == ()  # balanced


def test_the_window_busy_time_and_the_ceiling_are_consistent_on_a_real_trace() -> None:
    b = breakdown("decode", traces("decode"))
    assert 0 < b.busy_share < 1  # the host gap between replays: the GPU idles
    gpu_per_rank = [r.gpu_us for r in b.ranks]
    assert all(r.busy_us <= r.window_us + 1e-6 for r in b.ranks)
    assert b.gpu_us == pytest.approx(sum(gpu_per_rank))
    top = b.kernels[0]
    # one stream: the kernel's time over the window, and the ceiling from it
    assert top.window_share == pytest.approx(top.us / b.window_us)
    c = top.ceiling(100.0)
    assert c["zero"] == pytest.approx(100.0 / (1 - top.window_share))
    assert c["2x"] < c["4x"] < c["zero"]
    assert top.ceiling(None) == {"2x": None, "4x": None, "zero": None}


def _trace(rank: int, *events: tuple[str, float, float, int]) -> RankTrace:
    return RankTrace(f"t-TP-{rank}.trace.json.gz", rank, None,
                     tuple(GpuEvent(n, "kernel", ts, d, s) for n, ts, d, s in events), 0)


def test_overlapping_streams_count_once_in_busy_time_and_in_the_ceiling() -> None:
    # window 0..100; attention on stream 1 at 0..60, a gemm on stream 2 at 40..80 (overlap 20)
    t = _trace(0, ("flash_fwd_kernel", 0, 60, 1), ("sm90_xmma_gemm", 40, 40, 2),
               ("flash_fwd_kernel", 90, 10, 1))
    b = breakdown("decode", [("e", t)])
    assert b.window_us == 100 and b.gpu_us == 110
    assert b.busy_share == pytest.approx(0.9)  # 0..80 and 90..100
    attn = b.kernels[0]
    assert attn.name == "flash_fwd_kernel" and attn.us == 70 and attn.count == 2
    assert attn.share == pytest.approx(70 / 110) and attn.window_share == pytest.approx(0.7)
    assert speedup(0.7, None) == pytest.approx(1 / 0.3)


def test_union_and_amdahl() -> None:
    assert union([]) == 0
    assert union([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert speedup(0.0, 2) == 1.0 and speedup(0.5, 2) == pytest.approx(4 / 3)
    assert speedup(0.63, None) == pytest.approx(1 / 0.37)  # the motivating case's 2.7x
    assert math.isinf(speedup(1.0, None))


@pytest.mark.parametrize(("name", "group"), [
    ("_tiled_sparse_decode_kernel", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>", "attention"),
    ("void flash::flash_fwd_splitkv_mla_kernel<...>", "attention"),
    ("fused_moe_kernel", "moe/gemm"),
    ("nvjet_sm90_tst_64x16_64x16_2x1_v_bz_splitK_NNT", "moe/gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "moe/gemm"),
    ("void marlin::Marlin<...>", "moe/gemm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 4>", "communication"),
    ("memcpy32_post", "memory"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "other"),
    ("some_kernel_nobody_knows", "other"),
])
def test_each_kernel_name_falls_in_its_group_by_a_shown_rule(name: str, group: str) -> None:
    rule = rule_for(name)
    assert rule.group == group
    if group != "other":
        assert rule in RULES or rule.pattern.startswith("(")


def test_memory_events_are_memory_whatever_their_name() -> None:
    assert rule_for("Memcpy DtoD (Device -> Device)", "memcpy").group == "memory"
    assert rule_for("anything", "memset").group == "memory"
