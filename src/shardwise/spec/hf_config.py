"""Read a Hugging Face config.json into a ModelSpec.

One reader serves every decoder-only family: the fields are mostly shared, and where a family names or
builds something differently (Mixtral's `block_sparse_moe.experts.N.w1`, gpt-oss's attention sinks and
biases, Qwen3-Next's linear-attention layers) a row of `FAMILIES` says so. An architecture that is not in
the table but carries the standard fields is read as a generic dense or MoE model, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardwise.errors import SpecError
from shardwise.spec.model import (
    AttentionSpec,
    LinearAttentionSpec,
    MlaSpec,
    ModelSpec,
    ModuleNames,
    MoESpec,
    SparseIndexSpec,
    VisionSpec,
)
from shardwise.spec.quant import scheme_from_config

MIXTRAL_NAMES = ModuleNames(
    experts="block_sparse_moe.experts.{expert}", expert_projections=("w1", "w3", "w2"), router="block_sparse_moe.gate"
)
QWEN_SHARED_NAMES = ModuleNames(shared_experts="mlp.shared_expert")
# Qwen3.5 checkpoints keep the language model under model.language_model. (the vision tower under model.visual.)
QWEN3_5_NAMES = ModuleNames(
    layer="model.language_model.layers.{layer}",
    embed="model.language_model.embed_tokens",
    norm="model.language_model.norm",
    shared_experts="mlp.shared_expert",
)


@dataclass(frozen=True)
class Family:
    """What a family does differently from the common decoder layout."""

    name: str
    names: ModuleNames = field(default_factory=ModuleNames)
    qkv_bias: bool | None = None  # None: read `attention_bias`
    o_bias: bool = False
    qk_norm: str = "none"  # "none" | "per_head" | "per_layer" | "config" (read use_qk_norm / qk_norm_type)
    sinks: bool = False
    output_gate: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    shared_expert_gate: bool = False
    score_correction_bias: bool = False  # always has one, whatever the config says (GLM-4.5)


_DEEPSEEK = Family("deepseek")
FAMILIES: dict[str, Family] = {
    "DeepseekV3ForCausalLM": _DEEPSEEK,
    "DeepseekV2ForCausalLM": _DEEPSEEK,
    "KimiK2ForCausalLM": _DEEPSEEK,
    "DeepseekV32ForCausalLM": _DEEPSEEK,  # DeepSeek-V3 with DeepSeek Sparse Attention
    # GLM-5 / 5.1 / 5.2: DeepSeek-V3's MLA + MoE layout with DeepSeek Sparse Attention
    "GlmMoeDsaForCausalLM": Family("glm_moe_dsa"),
    "Glm4MoeForCausalLM": Family("glm4_moe", qk_norm="config", score_correction_bias=True),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", names=QWEN_SHARED_NAMES, qk_norm="per_head"),
    "Qwen2MoeForCausalLM": Family("qwen2_moe", names=QWEN_SHARED_NAMES, qkv_bias=True, shared_expert_gate=True),
    "Qwen3NextForCausalLM": Family(
        "qwen3_next", names=QWEN_SHARED_NAMES, qk_norm="per_head", output_gate=True, shared_expert_gate=True
    ),
    # Qwen3.5: Qwen3-Next's layers (Gated DeltaNet beside gated full attention) in a vision-language wrapper
    "Qwen3_5MoeForConditionalGeneration": Family(
        "qwen3_5_moe", names=QWEN3_5_NAMES, qk_norm="per_head", output_gate=True, shared_expert_gate=True
    ),
    "Qwen3_5ForConditionalGeneration": Family("qwen3_5", names=QWEN3_5_NAMES, qk_norm="per_head", output_gate=True),
    "LlamaForCausalLM": Family("llama"),
    "MistralForCausalLM": Family("mistral"),
    "Qwen2ForCausalLM": Family("qwen2", qkv_bias=True),
    "Qwen3ForCausalLM": Family("qwen3", qk_norm="per_head"),
    "MixtralForCausalLM": Family("mixtral", names=MIXTRAL_NAMES),
    "MiniMaxM2ForCausalLM": Family("minimax_m2", names=MIXTRAL_NAMES, qk_norm="config"),
    "GptOssForCausalLM": Family(
        "gpt_oss",
        names=ModuleNames(experts="mlp.experts", router="mlp.router"),
        o_bias=True,
        sinks=True,
        router_bias=True,
        expert_bias=True,
    ),
}
# Multimodal wrappers whose language model sits under `text_config` and `language_model.` in the checkpoint.
WRAPPERS = {"KimiK25ForConditionalGeneration"}

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


OBJECT_FIELDS = ("text_config", "vision_config", "quantization_config", "rope_scaling")


def _check_shapes(config: dict[str, Any], name: str) -> None:
    """The fields every reader below relies on have the JSON types a Hugging Face config gives them."""
    for key in OBJECT_FIELDS:
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise SpecError(f"{name}: config.json field {key} must be an object, not {type(config[key]).__name__}")
    arch = config.get("architectures")
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise SpecError(f'{name}: config.json field architectures must be a list of names, e.g. ["LlamaForCausalLM"]')


def model_from_config(config: dict[str, Any], *, name: str) -> ModelSpec:
    """Normalise a parsed config.json (a dict) into a ModelSpec named `name`; a config whose fields have the
    wrong types is one SpecError, whichever field it is."""
    if not isinstance(config, dict):
        raise SpecError(f"{name}: config.json must hold a JSON object, not {type(config).__name__}")
    _check_shapes(config, name)
    if isinstance(config.get("text_config"), dict):
        _check_shapes(config["text_config"], name)
    try:
        return _model_from_config(config, name=name)
    except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError, OverflowError) as exc:
        raise SpecError(
            f"{name}: config.json has a field of the wrong type or value ({type(exc).__name__}: {exc}); "
            "expected a Hugging Face decoder config"
        ) from exc


def _model_from_config(config: dict[str, Any], *, name: str) -> ModelSpec:
    outer_arch = (config.get("architectures") or ["?"])[0]
    text = config.get("text_config") or config
    arch = (text.get("architectures") or [outer_arch])[0] if "text_config" in config else outer_arch
    missing = [key for key in REQUIRED if text.get(key) is None]
    if missing:
        raise SpecError(
            f"{name}: config.json lacks {', '.join(missing)}; a decoder config needs "
            f"{', '.join(REQUIRED)} (and intermediate_size or expert fields)"
        )
    if text.get("compress_ratios") is not None:
        raise SpecError(
            f"{name}: {arch}'s compressed attention (compress_ratios: sliding-window layers beside KV compressed 4× "
            "with an indexer or 128×) is not modelled yet; a model with MLA, sparse (indexed) MLA, GQA, sliding-window "
            "or linear-attention layers would be read"
        )
    family = FAMILIES.get(arch) or (_DEEPSEEK if outer_arch in WRAPPERS else None)
    generic = family is None
    family = family or Family("generic")
    names = family.names
    if outer_arch in WRAPPERS:
        names = names.model_copy(update={"prefix": "language_model."})
    quant = scheme_from_config(config.get("quantization_config") or text.get("quantization_config"))
    dtype = DTYPE_NAMES.get(
        str(
            _first(text, "torch_dtype", "dtype", default=None)
            or _first(config, "torch_dtype", "dtype", default="bfloat16")
        ),
        "bf16",
    )
    layers = int(text["num_hidden_layers"])
    layer_attention = _layer_attention(text, layers)
    return ModelSpec(
        name=name,
        architecture=arch,
        wrapper_architecture=outer_arch if "text_config" in config or outer_arch in WRAPPERS else None,
        family=family.name,
        generic=generic,
        hidden_size=int(text["hidden_size"]),
        num_layers=layers,
        vocab_size=int(text["vocab_size"]),
        tie_word_embeddings=bool(_first(text, "tie_word_embeddings", default=config.get("tie_word_embeddings", False))),
        max_position_embeddings=_first(text, "max_position_embeddings"),
        dtype=dtype,
        attention=_attention(text, family, layers),
        layer_attention=layer_attention,
        sliding_window=_first(text, "sliding_window") if "sliding" in layer_attention else None,
        linear_attention=_linear_attention(text) if "linear" in layer_attention else None,
        layer_mlp=_layer_mlp(text, layers),
        intermediate_size=int(_first(text, "intermediate_size", default=0)),
        moe=_moe(text, family),
        num_mtp_layers=_mtp_layers(text),
        vision=_vision(config.get("vision_config")),
        quant=quant,
        kv_dtype=quant.kv_dtype or dtype,
        names=names,
        remote_code=bool(config.get("auto_map") or text.get("auto_map")),
    )


def _attention(cfg: dict[str, Any], family: Family, layers: int) -> AttentionSpec:
    heads = int(cfg["num_attention_heads"])
    if cfg.get("kv_lora_rank"):
        mla = MlaSpec(
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
            qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
            v_head_dim=int(cfg["v_head_dim"]),
        )
        return AttentionSpec(
            kind="mla",
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
            mla=mla,
            sparse=_sparse_index(cfg, layers) if cfg.get("index_topk") else None,
        )
    head_dim = int(_first(cfg, "head_dim", default=int(cfg["hidden_size"]) // heads))
    qkv_bias = family.qkv_bias if family.qkv_bias is not None else bool(cfg.get("attention_bias", False))
    return AttentionSpec(
        kind="gqa",
        num_heads=heads,
        num_kv_heads=int(_first(cfg, "num_key_value_heads", default=heads)),
        head_dim=head_dim,
        qkv_bias=qkv_bias,
        o_bias=family.o_bias and qkv_bias,
        qk_norm=_qk_norm(cfg, family),
        output_gate=family.output_gate,
        sinks=family.sinks,
    )


def _sparse_index(cfg: dict[str, Any], layers: int) -> SparseIndexSpec:
    """The indexer of DeepSeek Sparse Attention, and the layers that run one: those `indexer_types` calls "full"
    (GLM-5.2), else those index_topk_freq / index_skip_topk_offset keep (SGLang configs/model_config.py
    dsa_layer_skips_topk), else every layer."""
    missing = [k for k in ("index_n_heads", "index_head_dim") if cfg.get(k) is None]
    if missing:
        raise SpecError(f"sparse attention (index_topk) needs {', '.join(missing)} to size its indexer")
    types = cfg.get("indexer_types")
    freq = int(cfg.get("index_topk_freq") or 1)
    if types:
        own = tuple(i for i, t in enumerate(types[:layers]) if t != "shared")
    elif freq > 1:
        offset = cfg.get("index_skip_topk_offset")
        start = (lambda i: i - int(offset) + 1) if offset is not None else (lambda i: i - 1)
        own = tuple(i for i in range(layers) if max(start(i), 0) % freq == 0)
    else:
        own = tuple(range(layers))
    return SparseIndexSpec(
        num_heads=int(cfg["index_n_heads"]),
        head_dim=int(cfg["index_head_dim"]),
        top_k=int(cfg["index_topk"]),
        layers=own,
    )


def _qk_norm(cfg: dict[str, Any], family: Family) -> str:
    if family.qk_norm != "config":
        return family.qk_norm
    if not cfg.get("use_qk_norm"):
        return "none"
    return "per_layer" if cfg.get("qk_norm_type") == "per_layer" else "per_head"


def _layer_attention(cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    """Per layer: "full", "sliding" (window-capped KV) or "linear" (fixed state, no KV)."""
    if cfg.get("layer_types"):
        kinds = {
            "full_attention": "full",
            "sliding_attention": "sliding",
            "linear_attention": "linear",
            "deepseek_sparse_attention": "full",  # keeps every token; attends to the indexer's top-k
        }
        unknown = {t for t in cfg["layer_types"] if t not in kinds}
        if unknown:
            raise SpecError(f"unknown layer_types {sorted(unknown)}; known: {', '.join(kinds)}")
        return tuple(kinds[t] for t in cfg["layer_types"][:layers])
    if cfg.get("full_attention_interval"):  # Qwen3-Next: every Nth layer is full attention, the rest linear
        step = int(cfg["full_attention_interval"])
        return tuple("full" if (i + 1) % step == 0 else "linear" for i in range(layers))
    if cfg.get("attn_type_list"):  # MiniMax: 1 = softmax attention, 0 = linear (lightning) attention
        return tuple("full" if t == 1 else "linear" for t in cfg["attn_type_list"][:layers])
    sliding = cfg.get("sliding_window") and cfg.get("use_sliding_window", True)
    return ("sliding" if sliding else "full",) * layers


def _num_experts(cfg: dict[str, Any]) -> int:
    return int(_first(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)


def _layer_mlp(cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    if _num_experts(cfg) == 0:
        return ("dense",) * layers
    first_dense = int(_first(cfg, "first_k_dense_replace", default=0))
    freq = int(_first(cfg, "moe_layer_freq", default=1))
    sparse_step = int(_first(cfg, "decoder_sparse_step", default=1))
    dense_only = set(cfg.get("mlp_only_layers") or ())
    kinds = []
    for i in range(layers):
        moe = i >= first_dense and i % freq == 0 and (i + 1) % sparse_step == 0 and i not in dense_only
        kinds.append("moe" if moe else "dense")
    return tuple(kinds)


def _moe(cfg: dict[str, Any], family: Family) -> MoESpec | None:
    experts = _num_experts(cfg)
    if experts == 0:
        return None
    top_k = _first(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk")
    expert_size = _first(cfg, "moe_intermediate_size", "intermediate_size")
    if top_k is None or expert_size is None:
        raise SpecError("MoE config lacks num_experts_per_tok (top-k) or moe_intermediate_size")
    shared = int(_first(cfg, "n_shared_experts", default=0) or 0)
    shared_size = int(expert_size) if shared else 0
    qwen_shared = int(_first(cfg, "shared_expert_intermediate_size", "shared_intermediate_size", default=0) or 0)
    if qwen_shared:
        shared, shared_size = 1, qwen_shared
    return MoESpec(
        num_experts=experts,
        top_k=int(top_k),
        expert_intermediate_size=int(expert_size),
        num_shared_experts=shared,
        shared_intermediate_size=shared_size,
        shared_expert_gate=family.shared_expert_gate and shared > 0,
        router_bias=family.router_bias,
        score_correction_bias=(
            family.score_correction_bias or cfg.get("topk_method") == "noaux_tc" or bool(cfg.get("use_routing_bias"))
        ),
        expert_bias=family.expert_bias,
    )


def _linear_attention(cfg: dict[str, Any]) -> LinearAttentionSpec:
    keys = (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    )
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise SpecError(f"linear-attention layers need {', '.join(missing)} to size their state")
    return LinearAttentionSpec(
        num_key_heads=cfg[keys[0]],
        num_value_heads=cfg[keys[1]],
        key_head_dim=cfg[keys[2]],
        value_head_dim=cfg[keys[3]],
        conv_kernel=cfg[keys[4]],
        ssm_dtype=DTYPE_NAMES.get(str(cfg["mamba_ssm_dtype"])) if cfg.get("mamba_ssm_dtype") else None,
    )


def _mtp_layers(cfg: dict[str, Any]) -> int:
    if cfg.get("use_mtp") is False:
        return 0
    return int(_first(cfg, "num_nextn_predict_layers", "num_mtp_modules", "mtp_num_hidden_layers", default=0) or 0)


def _vision(cfg: dict[str, Any] | None) -> VisionSpec | None:
    if not cfg:
        return None
    if cfg.get("depth") is not None and cfg.get("out_hidden_size") is not None:
        return _qwen_vision(cfg)
    if cfg.get("vt_hidden_size") is None:
        return None
    merge = cfg.get("merge_kernel_size") or [1, 1]
    return VisionSpec(
        hidden_size=cfg["vt_hidden_size"],
        num_layers=cfg["vt_num_hidden_layers"],
        intermediate_size=cfg["vt_intermediate_size"],
        patch_size=cfg.get("patch_size", 14),
        pos_emb_positions=cfg.get("init_pos_emb_height", 0) * cfg.get("init_pos_emb_width", 0),
        merge_tokens=merge[0] * merge[1],
        text_hidden_size=cfg.get("text_hidden_size", 0),
        num_heads=cfg.get("vt_num_attention_heads"),
        hf_num_hidden_layers=cfg.get("num_hidden_layers"),
        hf_hidden_size=cfg.get("hidden_size"),
    )


def _qwen_vision(cfg: dict[str, Any]) -> VisionSpec:
    """A Qwen3-VL-style vision tower (Qwen3.5): `depth` blocks of `hidden_size`, patches of
    temporal_patch_size × patch_size², a learned position table of num_position_embeddings, and a merger of
    spatial_merge_size² patches into one token of out_hidden_size."""
    merge = int(cfg.get("spatial_merge_size", 2))
    return VisionSpec(
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["depth"],
        intermediate_size=cfg["intermediate_size"],
        patch_size=cfg.get("patch_size", 16),
        temporal_patch=cfg.get("temporal_patch_size", 1),
        pos_emb_positions=cfg.get("num_position_embeddings", 0),
        merge_tokens=merge * merge,
        text_hidden_size=cfg["out_hidden_size"],
        num_heads=cfg.get("num_heads"),
        hf_num_hidden_layers=cfg.get("num_hidden_layers"),
        hf_hidden_size=cfg.get("hidden_size"),
    )
