"""The operations of one engine step on one GPU, as data: what each reads, computes and sends.

`Compute` is a kernel (or a few fused ones) with its FLOPs and the bytes it moves through memory;
`Comm` is a collective over a group of GPUs. Both are per execution, with `count` executions per step
(one per layer, usually). Costing them is the cost layer's job; these only describe the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from shardwise.hardware.collectives import Collective
from shardwise.hardware.kernel_tables import GemmShape, GQADecodeShape, MLADecodeShape, MLAPrefillShape, MoEShape


class Phase(str, Enum):
    DECODE = "decode"
    PREFILL = "prefill"


class OpClass(str, Enum):
    """What a report groups step time by."""

    GEMM = "gemm"  # dense projections: attention, dense MLP, shared experts, router, lm_head
    EXPERTS = "experts"  # routed-expert grouped GEMMs
    ATTENTION = "attention"  # the attention kernel proper: reads the KV cache
    ELEMENTWISE = "elementwise"  # norms, rotary, activation, residual adds, top-k, embedding lookup
    SAMPLING = "sampling"
    COMM = "comm"


@dataclass(frozen=True, kw_only=True, slots=True)
class Compute:
    name: str
    op_class: OpClass
    stage: int
    count: int  # executions per step
    flops: float  # per execution
    bytes: float  # memory traffic per execution (weights + activations + KV)
    weight_bytes: float  # the weights among `bytes`
    dtype: str  # tensor-core dtype that sets the FLOP rate: "bf16", "fp8", "fp4"
    kernels: int = 1  # kernel launches per execution
    moe: MoEShape | None = None  # routed experts: the shape measured kernel tables are keyed by
    mla_decode: MLADecodeShape | None = None  # absorbed MLA decode attention: likewise
    mla_prefill: MLAPrefillShape | None = None  # MLA prefill attention of whole prompts: likewise
    gqa_decode: GQADecodeShape | None = None  # multi-head / grouped-query decode attention: likewise
    gemms: tuple[GemmShape, ...] = ()  # dense projections: the GEMMs the op runs, likewise
    untimed_kernels: int = 0  # kernels of a GEMM op that no GEMM table times (an MLP's activation)
    tokens: int = 0  # tokens the op processes per execution (what a measured table is looked up at)
    context: int = 0  # attention: tokens cached per request, this step's included (before any window)
    new_tokens: int = 0  # prefill attention: the tokens each request adds this step (`context` holds them too)


@dataclass(frozen=True, kw_only=True, slots=True)
class Comm:
    name: str
    stage: int
    count: int
    collective: Collective
    group: tuple[int, ...]  # GPU ids of one instance of the group
    size_bytes: float  # nccl-tests convention: the buffer each GPU contributes or receives
    impl: str = "nccl"  # "nccl", or "custom" for the engines' own all-reduce kernels
    overlapped: bool = False  # hidden behind compute (two-batch overlap)
    kernels: int = 1


Op = Compute | Comm
