"""Every weight tensor of a model, its storage format and bytes, and the per-component ledger.

`model_weights(model)` lists each tensor of each layer once (the experts of a layer as one entry with a
count), with the format the checkpoint stores it in. `weight_ledger(model)` sums them by component —
embeddings, lm_head, each attention projection, dense MLP, routed experts, shared experts, router, norms —
into totals whose sum is the whole. Active parameters per token count the top-k routed experts and every
other matrix a token passes through; the input embedding is a lookup and is not counted (the convention
behind the published "32B active" for Kimi K2 and "22B active" for Qwen3-235B-A22B).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from pydantic import BaseModel, ConfigDict

from shardwise.spec.model import MlaSpec, ModelSpec, SparseIndexSpec
from shardwise.spec.quant import WeightFormat, weight_format


@dataclass(frozen=True)
class Weight:
    """One tensor (or `count` identical tensors, e.g. the experts of one layer)."""

    component: str  # ledger line: "attn.q_a", "routed_experts", "norms", ...
    role: str  # what the quantization config sees: "attention", "routed_experts", "norm", ...
    module: str  # checkpoint module name of the first instance, for ignore-list matching
    shape: tuple[int, ...]  # (out_features, in_features) for matrices, (n,) for vectors
    layer: int | None  # decoder layer index; None for embeddings, lm_head, final norm, vision
    count: int = 1
    active_fraction: float = 1.0  # share of the `count` copies one token uses
    format: WeightFormat | None = None  # filled by model_weights

    @property
    def params(self) -> int:
        size = 1
        for dim in self.shape:
            size *= dim
        return size * self.count

    @cached_property
    def bytes(self) -> float:
        assert self.format is not None
        if len(self.shape) == 2:
            return self.format.matrix_bytes(*self.shape) * self.count
        return self.params * self.format.element_bits / 8


class Component(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    params: int
    bytes: float
    active_params: float
    formats: tuple[str, ...]


class WeightLedger(BaseModel):
    """Weights by component; totals are sums of the components."""

    model_config = ConfigDict(frozen=True)

    components: tuple[Component, ...]
    mtp_params: int
    mtp_bytes: float

    @property
    def total_params(self) -> int:
        return sum(c.params for c in self.components)

    @property
    def total_bytes(self) -> float:
        return sum(c.bytes for c in self.components)

    @property
    def active_params(self) -> float:
        return sum(c.active_params for c in self.components)

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(f"no component {name!r}; this model has {', '.join(c.name for c in self.components)}")


_RESOLVED: dict[tuple[int, bool], tuple[ModelSpec, tuple[Weight, ...]]] = {}


def model_weights(model: ModelSpec, *, mtp: bool = False) -> list[Weight]:
    """All weight tensors with their storage format (MTP layers instead, with `mtp=True`). Remembered for the
    last few models: every layout of a model reads the same tensors."""
    key = (id(model), mtp)
    held = _RESOLVED.get(key)
    if held is None or held[0] is not model:
        if len(_RESOLVED) >= 16:
            _RESOLVED.pop(next(iter(_RESOLVED)))
        held = _RESOLVED[key] = (model, tuple(_resolve(model, mtp=mtp)))
    return list(held[1])


def _resolve(model: ModelSpec, *, mtp: bool) -> list[Weight]:
    dense = weight_format(model.dtype)
    raw = _mtp_weights(model) if mtp else list(_all_weights(model))
    resolved = []
    for w in raw:
        fmt = model.quant.format_for(module=w.module, role=w.role, dense=dense) if len(w.shape) == 2 else dense
        resolved.append(Weight(**{**w.__dict__, "format": fmt}))
    return resolved


def weight_ledger(model: ModelSpec) -> WeightLedger:
    """Sum the weights by component, in first-seen order."""
    groups: dict[str, list[Weight]] = {}
    for w in model_weights(model):
        groups.setdefault(w.component, []).append(w)
    components = tuple(
        Component(
            name=name,
            params=sum(w.params for w in ws),
            bytes=sum(w.bytes for w in ws),
            active_params=sum(w.params * w.active_fraction for w in ws),
            formats=tuple(dict.fromkeys(w.format.name for w in ws if w.format)),
        )
        for name, ws in groups.items()
    )
    mtp = model_weights(model, mtp=True)
    return WeightLedger(
        components=components, mtp_params=sum(w.params for w in mtp), mtp_bytes=sum(w.bytes for w in mtp)
    )


def _all_weights(model: ModelSpec) -> Iterator[Weight]:
    n = model.names
    h, vocab = model.hidden_size, model.vocab_size
    yield Weight("embeddings", "embedding", n.prefix + n.embed, (vocab, h), None, active_fraction=0.0)
    for layer in range(model.num_layers):
        yield from _layer_weights(model, layer)
    yield Weight("norms", "norm", n.prefix + n.norm, (h,), None)
    if not model.tie_word_embeddings:
        yield Weight("lm_head", "lm_head", n.prefix + n.lm_head, (vocab, h), None)
    if model.vision is not None:
        yield from _vision_weights(model)


def _layer_weights(model: ModelSpec, layer: int) -> Iterator[Weight]:
    h = model.hidden_size
    base = model.names.prefix + model.names.layer.format(layer=layer)
    yield Weight("norms", "norm", f"{base}.input_layernorm", (2 * h,), layer)  # pre-attention + pre-MLP norms
    if model.layer_attention[layer] == "linear":
        yield from _linear_attention_weights(model, layer, base)
    elif model.attention.kind == "mla":
        yield from _mla_weights(model, layer, base)
    else:
        yield from _gqa_weights(model, layer, base)
    if model.layer_mlp[layer] == "moe":
        yield from _moe_weights(model, layer, base)
    else:
        yield from _swiglu("dense_mlp", "dense_mlp", f"{base}.{model.names.mlp}", model.intermediate_size, h, layer)


def _mla_weights(model: ModelSpec, layer: int, base: str) -> Iterator[Weight]:
    att, h = model.attention, model.hidden_size
    mla = att.mla
    assert mla is not None
    p = f"{base}.{model.names.attention}"
    q_width = att.num_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    if mla.q_lora_rank:
        yield Weight("attn.q_a", "attention", f"{p}.q_a_proj", (mla.q_lora_rank, h), layer)
        yield Weight("norms", "norm", f"{p}.q_a_layernorm", (mla.q_lora_rank,), layer)
        yield Weight("attn.q_b", "attention", f"{p}.q_b_proj", (q_width, mla.q_lora_rank), layer)
    else:
        yield Weight("attn.q", "attention", f"{p}.q_proj", (q_width, h), layer)
    yield Weight(
        "attn.kv_a", "attention", f"{p}.kv_a_proj_with_mqa", (mla.kv_lora_rank + mla.qk_rope_head_dim, h), layer
    )
    yield Weight("norms", "norm", f"{p}.kv_a_layernorm", (mla.kv_lora_rank,), layer)
    yield Weight(
        "attn.kv_b",
        "attention",
        f"{p}.kv_b_proj",
        (att.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
        layer,
    )
    yield Weight("attn.o", "attention", f"{p}.o_proj", (h, att.num_heads * mla.v_head_dim), layer)
    if att.sparse is not None and layer in att.sparse.layers:
        yield from _indexer_weights(att.sparse, mla, h, layer, f"{p}.indexer")


def _indexer_weights(sparse: SparseIndexSpec, mla: MlaSpec, h: int, layer: int, p: str) -> Iterator[Weight]:
    """The lightning indexer of DeepSeek Sparse Attention (SGLang layers/attention/dsa/dsa_indexer.py Indexer): its
    queries from the Q latent, one key per token from the hidden state, a LayerNorm on the key, and a weight per
    head from the hidden state. Replicated on every attention-TP rank."""
    width = sparse.num_heads * sparse.head_dim
    yield Weight("attn.indexer", "attention", f"{p}.wq_b", (width, mla.q_lora_rank or h), layer)
    yield Weight("attn.indexer", "attention", f"{p}.wk", (sparse.head_dim, h), layer)
    yield Weight("norms", "norm", f"{p}.k_norm", (2 * sparse.head_dim,), layer)  # weight and bias
    yield Weight("attn.indexer", "attention", f"{p}.weights_proj", (sparse.num_heads, h), layer)


def _gqa_weights(model: ModelSpec, layer: int, base: str) -> Iterator[Weight]:
    att, h = model.attention, model.hidden_size
    p = f"{base}.{model.names.attention}"
    q_out = att.num_heads * att.head_dim * (2 if att.output_gate else 1)
    kv_out = att.num_kv_heads * att.head_dim
    for name, out in (("q", q_out), ("k", kv_out), ("v", kv_out)):
        yield Weight(f"attn.{name}", "attention", f"{p}.{name}_proj", (out, h), layer)
        if att.qkv_bias:
            yield Weight(f"attn.{name}", "attention", f"{p}.{name}_proj.bias", (out,), layer)
    yield Weight("attn.o", "attention", f"{p}.o_proj", (h, att.num_heads * att.head_dim), layer)
    if att.o_bias:
        yield Weight("attn.o", "attention", f"{p}.o_proj.bias", (h,), layer)
    if att.qk_norm == "per_head":
        yield Weight("norms", "norm", f"{p}.q_norm", (2 * att.head_dim,), layer)  # q_norm + k_norm, shared by heads
    elif att.qk_norm == "per_layer":
        yield Weight("norms", "norm", f"{p}.q_norm", (q_out + kv_out,), layer)  # over all of q and all of k
    if att.sinks:
        yield Weight("attn.sinks", "attention", f"{p}.sinks", (att.num_heads,), layer)


def _linear_attention_weights(model: ModelSpec, layer: int, base: str) -> Iterator[Weight]:
    lin, h = model.linear_attention, model.hidden_size
    assert lin is not None
    p = f"{base}.{model.names.linear_attention}"
    key_dim, value_dim = lin.num_key_heads * lin.key_head_dim, lin.num_value_heads * lin.value_head_dim
    yield Weight(
        "linear_attn.in_proj", "linear_attention", f"{p}.in_proj_qkvz", (2 * key_dim + 2 * value_dim, h), layer
    )
    yield Weight("linear_attn.in_proj", "linear_attention", f"{p}.in_proj_ba", (2 * lin.num_value_heads, h), layer)
    yield Weight(
        "linear_attn.conv1d", "linear_attention", f"{p}.conv1d", ((2 * key_dim + value_dim) * lin.conv_kernel,), layer
    )
    yield Weight("linear_attn.decay", "linear_attention", f"{p}.A_log", (2 * lin.num_value_heads,), layer)  # + dt_bias
    yield Weight("norms", "norm", f"{p}.norm", (lin.value_head_dim,), layer)
    yield Weight("linear_attn.out_proj", "linear_attention", f"{p}.out_proj", (h, value_dim), layer)


def _swiglu(
    component: str,
    role: str,
    prefix: str,
    inner: int,
    h: int,
    layer: int | None,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    count: int = 1,
    active: float = 1.0,
) -> Iterator[Weight]:
    gate, up, down = names
    yield Weight(component, role, f"{prefix}.{gate}", (inner, h), layer, count, active)
    yield Weight(component, role, f"{prefix}.{up}", (inner, h), layer, count, active)
    yield Weight(component, role, f"{prefix}.{down}", (h, inner), layer, count, active)


def _moe_weights(model: ModelSpec, layer: int, base: str) -> Iterator[Weight]:
    moe, h, n = model.moe, model.hidden_size, model.names
    assert moe is not None
    active = moe.top_k / moe.num_experts
    experts = f"{base}.{n.experts.format(expert=0)}"
    yield from _swiglu(
        "routed_experts",
        "routed_experts",
        experts,
        moe.expert_intermediate_size,
        h,
        layer,
        n.expert_projections,
        moe.num_experts,
        active,
    )
    if moe.expert_bias:
        yield Weight(
            "routed_experts",
            "routed_experts",
            f"{experts}.bias",
            (2 * moe.expert_intermediate_size + h,),
            layer,
            moe.num_experts,
            active,
        )
    yield Weight("router", "router", f"{base}.{n.router}", (moe.num_experts, h), layer)
    extra_bias = int(moe.router_bias) + int(moe.score_correction_bias)
    if extra_bias:
        yield Weight("router", "router", f"{base}.{n.router}.bias", (extra_bias * moe.num_experts,), layer)
    if moe.num_shared_experts:
        yield from _swiglu(
            "shared_experts",
            "shared_experts",
            f"{base}.{n.shared_experts}",
            moe.shared_intermediate_size,
            h,
            layer,
            count=moe.num_shared_experts,
        )
        if moe.shared_expert_gate:
            yield Weight("shared_experts", "shared_experts", f"{base}.mlp.shared_expert_gate", (1, h), layer)


def _vision_weights(model: ModelSpec) -> Iterator[Weight]:
    """A ViT encoder (attention qkv + out, a two-matrix GELU MLP, two LayerNorms, biases) and a patch-merger
    projector (LayerNorm, Linear(d·m → d·m), GELU, Linear(d·m → text hidden)), kept in the model dtype."""
    v = model.vision
    assert v is not None
    d, i = v.hidden_size, v.intermediate_size
    per_layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d  # qkv+o with biases, MLP with biases, 2 LayerNorms
    embed = 3 * v.temporal_patch * v.patch_size**2 * d + d + v.pos_emb_positions * d
    merged = d * v.merge_tokens
    projector = 2 * d + merged * merged + merged + merged * v.text_hidden_size + v.text_hidden_size
    yield Weight(
        "vision", "vision", "vision_tower", (v.num_layers * per_layer + embed + projector,), None, active_fraction=0.0
    )


def _mtp_weights(model: ModelSpec) -> list[Weight]:
    """Multi-token-prediction layers (DeepSeek-V3 NextN, GLM, MiniMax): each one decoder layer like the last,
    plus the projection of [embedding; hidden] (2h → h) and its two norms. Embeddings and head are shared."""
    h, weights = model.hidden_size, []
    last = model.num_layers - 1
    for k in range(model.num_mtp_layers):
        layer = model.num_layers + k
        weights.extend(Weight(**{**w.__dict__, "layer": layer}) for w in _layer_weights(model, last))
        weights.append(Weight("mtp", "attention", f"model.layers.{layer}.eh_proj", (h, 2 * h), layer))
        weights.append(
            Weight("norms", "norm", f"model.layers.{layer}.enorm", (3 * h,), layer)
        )  # enorm, hnorm, head norm
    return weights


_BLOCKS: dict[int, tuple[ModelSpec, dict[str, tuple[int, int]]]] = {}


def block_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """Scale-block shape (rows, cols) of each role stored in a block-quantized format (FP8 128×128)."""
    held = _BLOCKS.get(id(model))
    if held is None or held[0] is not model:
        if len(_BLOCKS) >= 16:
            _BLOCKS.pop(next(iter(_BLOCKS)))
        shapes: dict[str, tuple[int, int]] = {}
        for w in model_weights(model):
            if w.format is not None and w.format.block_shape is not None:
                shapes.setdefault(w.role, w.format.block_shape)
        held = _BLOCKS[id(model)] = (model, shapes)
    return dict(held[1])
