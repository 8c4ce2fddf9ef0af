"""ModelSpec: what is served, normalised from a Hugging Face config.json into one engine-free shape.

Every architecture family (DeepSeek-V3/Kimi MLA+MoE, Qwen3-MoE, Llama, Mixtral, gpt-oss, GLM-4.5,
MiniMax-M2, Qwen3-Next, ...) is read into the same description: an attention block (MLA or GQA, per
layer full / sliding-window / linear), an MLP block per layer (dense or MoE), embeddings, and the
checkpoint's quantization. Weight counts and bytes are derived from it in `weights.py`; reading the
config files is `hf_config.py`'s job.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shardwise.spec.quant import OverriddenScheme, QuantScheme, kv_dtype_bytes, parse_weight_override

LayerAttention = Literal["full", "sliding", "linear"]
LayerMlp = Literal["dense", "moe"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class MlaSpec(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): low-rank Q and a shared compressed KV."""

    q_lora_rank: int | None = Field(description="rank of the Q down-projection; None = full-rank q_proj")
    kv_lora_rank: int = Field(description="width of the cached KV latent")
    qk_nope_head_dim: int
    qk_rope_head_dim: int = Field(description="width of the decoupled RoPE key, cached beside the latent")
    v_head_dim: int


class SparseIndexSpec(Frozen):
    """DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer scores every cached token for each
    query token with `num_heads` small heads, and the MLA attention then reads only the `top_k` best. Layers that
    run an indexer cache a key per token for it; the others (GLM-5.2's "shared" layers) reuse the last indexer's
    choice."""

    num_heads: int = Field(description="indexer heads (index_n_heads)")
    head_dim: int = Field(description="indexer head width (index_head_dim)")
    top_k: int = Field(description="cached tokens each query attends to (index_topk)")
    layers: tuple[int, ...] = Field(description="the decoder layers that run their own indexer")

    @property
    def key_bytes(self) -> float:
        """Bytes of one token's indexer key: FP8 with one FP32 scale per 128 values, whatever the KV cache stores
        (SGLang mem_cache/index_key_cache.py IndexKeyCache: 128 + 4; vLLM DeepseekV32IndexerCache head_size 132)."""
        return self.head_dim + math.ceil(self.head_dim / 128) * 4


class AttentionSpec(Frozen):
    kind: Literal["mla", "gqa"]
    num_heads: int
    num_kv_heads: int
    head_dim: int = Field(description="query/key head width (MLA: nope + rope)")
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: Literal["none", "per_head", "per_layer"] = "none"
    output_gate: bool = Field(False, description="q_proj also emits a sigmoid gate per head (Qwen3-Next)")
    sinks: bool = Field(False, description="one learned attention-sink logit per head (gpt-oss)")
    mla: MlaSpec | None = None
    sparse: SparseIndexSpec | None = Field(None, description="DeepSeek Sparse Attention's indexer, if any")


class LinearAttentionSpec(Frozen):
    """Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): a fixed-size state per sequence, no KV cache."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str | None = Field(
        None, description="dtype of the recurrent state the config names (mamba_ssm_dtype); None: not named"
    )


class MoESpec(Frozen):
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_intermediate_size: int = Field(0, description="width of one shared expert")
    shared_expert_gate: bool = Field(False, description="sigmoid gate on the shared expert (Qwen3-Next)")
    router_bias: bool = False
    score_correction_bias: bool = Field(False, description="aux-loss-free routing bias (noaux_tc)")
    expert_bias: bool = Field(False, description="biases on the expert projections (gpt-oss)")


class VisionSpec(Frozen):
    """A ViT encoder plus projector in front of the language model (Kimi K2.5/K2.6 MoonViT)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    patch_size: int
    temporal_patch: int = Field(1, description="frames per patch (Qwen-VL's Conv3d patch embedding)")
    pos_emb_positions: int
    merge_tokens: int = Field(description="patches merged into one language-model token")
    text_hidden_size: int
    num_heads: int | None = Field(None, description="attention heads of the vision transformer")
    hf_num_hidden_layers: int | None = Field(None, description="the config's own num_hidden_layers, if it has one")
    hf_hidden_size: int | None = Field(None, description="the config's own hidden_size, if it has one")


class ModuleNames(Frozen):
    """Module-name templates of the checkpoint, used to match quantization ignore lists."""

    prefix: str = ""
    layer: str = "model.layers.{layer}"
    attention: str = "self_attn"
    linear_attention: str = "linear_attn"
    mlp: str = "mlp"
    experts: str = "mlp.experts.{expert}"
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    shared_experts: str = "mlp.shared_experts"
    router: str = "mlp.gate"
    embed: str = "model.embed_tokens"
    norm: str = "model.norm"
    lm_head: str = "lm_head"


class ModelSpec(Frozen):
    """An LLM as the serving stack sees it. Sizes in elements; bytes come from `weights.py`."""

    name: str
    architecture: str = Field(description="HF architectures[0] of the language model")
    wrapper_architecture: str | None = Field(None, description="multimodal wrapper around it, if any")
    family: str = Field(description="the reader that understood it: 'deepseek', 'qwen3_moe', 'llama', ...")
    generic: bool = Field(False, description="read by the generic reader: an unknown architecture")
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    dtype: str = Field("bf16", description="dtype of unquantized weights")
    attention: AttentionSpec
    layer_attention: tuple[LayerAttention, ...]
    sliding_window: int | None = None
    linear_attention: LinearAttentionSpec | None = None
    layer_mlp: tuple[LayerMlp, ...]
    intermediate_size: int = Field(0, description="width of the dense MLP")
    moe: MoESpec | None = None
    num_mtp_layers: int = Field(0, description="multi-token-prediction layers (loaded only for MTP drafting)")
    vision: VisionSpec | None = None
    quant: QuantScheme | OverriddenScheme = QuantScheme()
    kv_dtype: str = Field("bf16", description="KV-cache element dtype")
    names: ModuleNames = ModuleNames()
    remote_code: bool = Field(
        False, description="the checkpoint ships its own code (config auto_map): engines need --trust-remote-code"
    )

    @property
    def num_moe_layers(self) -> int:
        return sum(kind == "moe" for kind in self.layer_mlp)

    @property
    def kv_bytes_per_element(self) -> float:
        return kv_dtype_bytes(self.kv_dtype)

    def kv_bytes_per_token_per_layer(self) -> float:
        """Bytes one token adds to the cache of one attention layer (MLA: latent + RoPE key; GQA: K and V)."""
        att = self.attention
        if att.kind == "mla" and self.kv_dtype == "fp8_ds_mla":
            assert att.mla is not None  # FP8 latent, an FP32 scale per 128 of it, the RoPE key in BF16
            rank = att.mla.kv_lora_rank
            return rank + math.ceil(rank / 128) * 4 + att.mla.qk_rope_head_dim * 2
        if att.kind == "mla":
            assert att.mla is not None
            elements = att.mla.kv_lora_rank + att.mla.qk_rope_head_dim  # one shared latent, no per-head K/V
        else:
            elements = 2 * att.num_kv_heads * att.head_dim  # 2: one K and one V per KV head
        return elements * self.kv_bytes_per_element

    def index_bytes_per_token(self, layers: range | None = None) -> float:
        """Bytes one token adds to the sparse-attention indexer's key caches of `layers` (default all)."""
        sparse = self.attention.sparse
        if sparse is None:
            return 0.0
        span = layers if layers is not None else range(self.num_layers)
        return sum(layer in span for layer in sparse.layers) * sparse.key_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes one token adds to the cache while it is inside every window: all full and sliding layers, and the
        indexer keys of sparse attention."""
        caching = sum(kind != "linear" for kind in self.layer_attention)
        return caching * self.kv_bytes_per_token_per_layer() + self.index_bytes_per_token()

    @property
    def kv_bytes_per_token_beyond_window(self) -> float:
        """Bytes per token once the context is past the sliding window: only full-attention layers keep it."""
        full = sum(kind == "full" for kind in self.layer_attention)
        return full * self.kv_bytes_per_token_per_layer() + self.index_bytes_per_token()

    def kv_bytes_per_sequence(self, context_tokens: int) -> float:
        """Cache bytes one sequence holds at `context_tokens`: full layers grow with context, sliding-window
        layers stop at the window, linear-attention layers hold a fixed state."""
        per_layer = self.kv_bytes_per_token_per_layer()
        window = min(context_tokens, self.sliding_window or context_tokens)
        full = sum(kind == "full" for kind in self.layer_attention)
        sliding = sum(kind == "sliding" for kind in self.layer_attention)
        index = self.index_bytes_per_token() * context_tokens
        return full * per_layer * context_tokens + index + sliding * per_layer * window + self.linear_state_bytes

    @property
    def linear_state_bytes(self) -> float:
        """Fixed per-sequence state of all linear-attention layers (`linear_state_bytes_of`)."""
        return self.linear_state_bytes_of(sum(kind == "linear" for kind in self.layer_attention))

    def linear_state_bytes_of(self, layers: int) -> float:
        """The state of `layers` linear-attention layers of one sequence: the conv window in the model dtype plus
        the recurrent state (value heads × key dim × value dim) in the dtype the config names (mamba_ssm_dtype),
        else the model dtype. Both engines keep the conv window in the model dtype whatever the KV cache stores
        (SGLang configs/mamba_utils.py mamba2_state_dtype; vLLM layers/mamba/mamba_utils.py _mamba_state_dtype,
        whose "auto" is the model dtype) and take the config's mamba_ssm_dtype for the recurrent state (vLLM
        model_executor/models/config.py for Qwen3.5); where the config names none vLLM keeps the model dtype and
        SGLang FP32, which its layouts set (engines/sglang_state.py, `with_overrides(ssm_dtype=...)`)."""
        lin = self.linear_attention
        if lin is None:
            return 0.0
        conv_channels = 2 * lin.num_key_heads * lin.key_head_dim + lin.num_value_heads * lin.value_head_dim
        conv = (lin.conv_kernel - 1) * conv_channels * kv_dtype_bytes(self.dtype)
        recurrent_elements = lin.num_value_heads * lin.key_head_dim * lin.value_head_dim
        recurrent = recurrent_elements * kv_dtype_bytes(lin.ssm_dtype or self.dtype)
        return layers * (conv + recurrent)

    def with_overrides(
        self, *, weight_dtype: str | None = None, kv_dtype: str | None = None, ssm_dtype: str | None = None
    ) -> ModelSpec:
        """A what-if copy: weights forced to a format ("fp8", "experts=int4,attention=fp8"), KV dtype changed, the
        linear-attention recurrent state's dtype set."""
        update: dict[str, object] = {}
        if ssm_dtype and self.linear_attention is not None:
            kv_dtype_bytes(ssm_dtype)  # validates the name
            update["linear_attention"] = self.linear_attention.model_copy(update={"ssm_dtype": ssm_dtype})
        if weight_dtype:
            base = self.quant.base if isinstance(self.quant, OverriddenScheme) else self.quant
            update["quant"] = parse_weight_override(weight_dtype, base)
        if kv_dtype:
            kv_dtype_bytes(kv_dtype)  # validates the name
            update["kv_dtype"] = kv_dtype
        return self.model_copy(update=update)
