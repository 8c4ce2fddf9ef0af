"""Which collectives a forward step runs: over which group, how often, and how many bytes per token.

One builder per parallel dimension (attention TP, attention DP, the MoE, dense MLPs, the vocabulary, decode context
parallel, pipeline stages) reads the layout and the model and returns its collectives; `comm_steps` lists them all.
Sizes follow nccl-tests: an all-gather's bytes are its gathered output, a reduce-scatter's its input, an
all-to-all's one rank's send buffer. The link model (cost/comm.py) turns them into time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from shardwise.engines.layout import Layout, with_kv_dtype
from shardwise.hardware.collectives import Collective
from shardwise.spec.model import ModelSpec

ACT_BYTES = 2  # activations travel in BF16
LSE_BYTES = 4  # a log-sum-exp per head and token, in FP32

Per = Literal["layer", "attention_layer", "moe_layer", "dense_layer", "step", "stage_boundary"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CommStep:
    """One collective in a forward step: where, over which group, how often, and its bytes per token."""

    where: str
    op: Collective
    group: str
    group_size: int
    per: Per
    count: int = 1
    bytes_per_token: float  # message bytes per token of the batch on one GPU
    phase: Literal["decode", "prefill"] | None = None  # the only phase it runs in; None: both
    sized_by: Literal["new", "cached"] = "new"  # the tokens it scales with: the step's new ones, or those cached

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes_per_token", float(self.bytes_per_token))  # a size in bytes, whatever it came as


def comm_steps(layout: Layout, model: ModelSpec) -> list[CommStep]:
    """The collectives of one forward step (sizes scale with the tokens; `phase` marks those of one phase)."""
    return [step for build in BUILDERS for step in build(layout, model)]


def _on(group: str, size: int, per: Per) -> Callable[..., CommStep]:
    """A maker of the collectives one group of `size` GPUs runs `per` layer (or step, or stage boundary): each then
    needs its `where`, `op` and `bytes_per_token` (and any other field)."""
    return partial(CommStep, group=group, group_size=size, per=per)


def _attention_tp(layout: Layout, model: ModelSpec) -> list[CommStep]:
    if layout.attn_tp == 1:
        return []
    layer = _on("attn_tp", layout.attn_tp, "layer")
    return [layer(where="attention output (o_proj)", op=Collective.ALL_REDUCE, bytes_per_token=_hidden(model))]


def _attention_dp(layout: Layout, model: ModelSpec) -> list[CommStep]:
    """An MLP split wider than attention sees the tokens of every attention-DP group: gather, then scatter back."""
    if layout.attn_dp == 1 or layout.moe_comm == "all2all":
        return []
    split: list[Per] = []
    if model.moe is not None and layout.moe_ep * layout.moe_tp > 1:
        split.append("moe_layer")
    if model.layer_mlp.count("dense") and layout.dense_tp > 1:
        split.append("dense_layer")
    return [
        _on("stage", layout.stage_gpus, per)(where=where, op=op, bytes_per_token=_hidden(model))
        for per in split
        for where, op in (
            ("gather attention-DP tokens before the MLP", Collective.ALL_GATHER),
            ("reduce-scatter MLP output to attention-DP ranks", Collective.REDUCE_SCATTER),
        )
    ]


def _moe(layout: Layout, model: ModelSpec) -> list[CommStep]:
    width = layout.moe_ep * layout.moe_tp
    if model.moe is None or width == 1:
        return []
    if layout.moe_comm == "all2all":  # every token goes to (and comes back from) the GPUs of its top-k experts
        routed = _on("moe_ep", layout.moe_ep, "moe_layer")
        sent = _hidden(model) * model.moe.top_k
        return [
            routed(where=w, op=Collective.ALL_TO_ALL, bytes_per_token=sent) for w in ("MoE dispatch", "MoE combine")
        ]
    if layout.attn_dp > 1:  # the attention-DP reduce-scatter sums the partial outputs
        return []
    summed = _on("stage", width, "moe_layer")
    where = "MoE output (partial sums over EP and MoE-TP)"
    return [summed(where=where, op=Collective.ALL_REDUCE, bytes_per_token=_hidden(model))]


def _dense_mlp(layout: Layout, model: ModelSpec) -> list[CommStep]:
    if not model.layer_mlp.count("dense") or layout.dense_tp == 1 or layout.attn_dp > 1:
        return []
    layer = _on("stage", layout.dense_tp, "dense_layer")
    return [layer(where="dense MLP output", op=Collective.ALL_REDUCE, bytes_per_token=_hidden(model))]


def _vocabulary(layout: Layout, model: ModelSpec) -> list[CommStep]:
    if layout.lm_head_tp == 1:
        return []
    step = _on("stage", layout.lm_head_tp, "step")
    return [
        step(where="embedding lookup (vocab-parallel)", op=Collective.ALL_REDUCE, bytes_per_token=_hidden(model)),
        step(
            where="logits (vocab-parallel lm_head)",
            op=Collective.ALL_GATHER,
            bytes_per_token=model.vocab_size * ACT_BYTES,
        ),
    ]


def _hidden(model: ModelSpec) -> float:
    """Bytes of one token's hidden state as activations travel."""
    return model.hidden_size * ACT_BYTES


def _decode_context_parallel(layout: Layout, model: ModelSpec) -> list[CommStep]:
    """DCP: each of `dcp` attention-TP ranks holds every dcp-th token of each request's KV. Every attention layer
    gathers the group's queries (each rank then attends with all of them over its share of the KV, unless the
    queries are projected on every rank) and combines the partial outputs by their log-sum-exp: one all-to-all of
    outputs with the LSE packed in, or an all-gather of the LSE and a reduce-scatter of the outputs (SGLang
    layers/dcp/comm.py all_gather_q_for_mla_decode, dcp_a2a_lse_reduce, cp_lse_ag_out_rs_mla; vLLM
    v1/attention/ops/dcp.py cp_lse_ag_out_rs, dcp_a2a_lse_reduce). MLA attends in the latent space: its queries
    are latent + RoPE wide, its outputs latent wide, and in prefill the ranks gather the cached prefix's latent KV
    instead (SGLang all_gather_kv_cache_for_mla_extend; vLLM mla_attention.py kv_gather). GQA gathers queries in
    prefill as in decode (vLLM flash_attn.py)."""
    d = layout.dcp
    if d == 1:
        return []
    att = model.attention
    heads = att.num_heads / layout.attn_tp * d  # the query heads each rank attends with once gathered
    mla = att.mla if att.kind == "mla" else None
    q_width = mla.kv_lora_rank + mla.qk_rope_head_dim if mla else att.head_dim
    out_width = mla.kv_lora_rank if mla else att.head_dim
    phase = "decode" if mla else None

    layer = _on("attn_tp", d, "attention_layer")

    def step(where: str, op: Collective, bytes_per_token: float, **kw: object) -> CommStep:
        return layer(where=where, op=op, bytes_per_token=bytes_per_token, **{"phase": phase, **kw})

    steps = []
    if not layout.dcp_q_replicate:
        steps.append(step("DCP query gather", Collective.ALL_GATHER, heads * q_width * ACT_BYTES))
    if layout.dcp_comm == "a2a":
        steps.append(
            step(
                "DCP partial outputs and LSE exchange",
                Collective.ALL_TO_ALL,
                heads * (out_width * ACT_BYTES + LSE_BYTES),
            )
        )
    else:
        steps.append(step("DCP LSE gather", Collective.ALL_GATHER, d * heads * LSE_BYTES))
        steps.append(
            step(
                "DCP partial outputs reduce-scatter",
                Collective.REDUCE_SCATTER,
                heads * out_width * layout.dcp_partial_bytes,
            )
        )
    if mla:
        kv_bytes = with_kv_dtype(model, layout).kv_bytes_per_token_per_layer()  # the cache's own dtype
        steps.append(
            step("DCP cached-prefix KV gather", Collective.ALL_GATHER, kv_bytes, phase="prefill", sized_by="cached")
        )
    return steps


def _pipeline(layout: Layout, model: ModelSpec) -> list[CommStep]:
    if layout.pp == 1:
        return []
    boundary = _on("pp", 2, "stage_boundary")
    where = "activations to the next stage"
    return [boundary(where=where, op=Collective.SEND_RECV, count=layout.pp - 1, bytes_per_token=_hidden(model))]


BUILDERS: tuple[Callable[[Layout, ModelSpec], list[CommStep]], ...] = (
    _attention_tp,
    _attention_dp,
    _moe,
    _dense_mlp,
    _vocabulary,
    _decode_context_parallel,
    _pipeline,
)
