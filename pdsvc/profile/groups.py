"""Which group a GPU activity belongs to: one ordered list of rules, shown with every result.

A kernel's name says what it does only by convention, so each group is a regular expression
over the name (case-insensitive, searched anywhere in it), the first rule that matches wins,
and a name no rule matches is "other": never guessed. `pdsvc profile` prints the rule each
kernel matched, and ``--json`` holds the whole list, so a reader can check every call.

The names come from the kernels SGLang's engines launch: FlashAttention, FlashInfer, FlashMLA,
cuDNN's SDPA and SGLang's own Triton attention (``decode_attention``,
``_tiled_sparse_decode_kernel``); its Triton and CUTLASS MoE kernels (``fused_moe_kernel``,
``moe_align_block_size``, DeepGEMM's grouped GEMMs) and Marlin; cuBLAS/cuBLASLt GEMMs
(``nvjet_*``, ``sm90_xmma_gemm_*``, ``cublasLt::splitKreduce_kernel``) and CUTLASS; NCCL and
SGLang's custom all-reduce (``cross_device_reduce``, sgl-kernel's ``custom_all_reduce``),
DeepEP; memory operations (Kineto's ``gpu_memcpy``/``gpu_memset`` events, and a memcpy node of
a CUDA graph, which runs as a kernel named ``memcpy32_post``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ATTENTION, MATMUL, COMMUNICATION, MEMORY, OTHER = (
    "attention", "moe/gemm", "communication", "memory", "other")
#: every group, in the order tables show them
GROUPS = (ATTENTION, MATMUL, COMMUNICATION, MEMORY, OTHER)


@dataclass(frozen=True)
class Rule:
    group: str
    pattern: str

    def matches(self, name: str) -> bool:
        return re.search(self.pattern, name, re.IGNORECASE) is not None


#: First match wins: communication before matrix work (an all-reduce fused with a GEMM is
#: still a wait on the other ranks), memory before the rest, attention before matrix work
#: (attention kernels are matrix work too, and their names say wgmma or gemm).
RULES = (
    Rule(COMMUNICATION, r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                        r"cross_device_reduce|deepep|mscclpp|symm_mem|multimem"),
    Rule(MEMORY, r"^(memcpy|memset)"),
    Rule(ATTENTION, r"attn|attention|flash|fmha|sdpa|mla_|_mla|sparse_decode|paged_|"
                    r"flashinfer|decode_kv|merge_state"),
    Rule(MATMUL, r"moe|expert|topk|grouped_gemm|deep_?gemm|gemm|gemv|cutlass|cublas|nvjet|"
                 r"xmma|matmul|marlin|dot_?product"),
)
#: memory operations are memory whatever their name (Kineto's gpu_memcpy / gpu_memset)
KIND_RULE = {"memcpy": Rule(MEMORY, "(a memcpy event)"),
             "memset": Rule(MEMORY, "(a memset event)")}
NO_RULE = Rule(OTHER, "(no rule matched)")


def rule_for(name: str, kind: str = "kernel") -> Rule:
    """The rule that puts this activity in its group (NO_RULE: "other")."""
    if kind in KIND_RULE:
        return KIND_RULE[kind]
    for rule in RULES:
        if rule.matches(name):
            return rule
    return NO_RULE


def described() -> list[dict[str, str]]:
    """The rules as data (``--json``), in the order they are tried."""
    return [{"group": r.group, "pattern": r.pattern}
            for r in (*KIND_RULE.values(), *RULES, NO_RULE)]
