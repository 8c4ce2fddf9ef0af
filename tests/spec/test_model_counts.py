"""Parameter, byte and KV counts of each architecture family, against hand-computed sums and published totals.

Published totals: shared/reference/specs.md §1 (model cards and the calc there) and the issue's targets.
"""

import json

import pytest

from shardwise import load_model, weight_ledger
from shardwise.errors import SpecError
from shardwise.spec.catalog import _models_dir
from shardwise.spec.hf_config import model_from_config

GB, GiB = 1e9, 2**30


def within(value: float, target: float, rel: float = 0.01) -> bool:
    return abs(value - target) <= rel * target


def test_kimi_k26_matches_published_totals():
    model = load_model("kimi-k2.6")
    ledger = weight_ledger(model)
    assert within(ledger.total_params, 1026.4e9)  # "1T", 1026.4B calc
    assert within(ledger.active_params, 31.7e9)  # "32B active"
    assert within(ledger.total_bytes, 594.2 * GB)  # INT4 checkpoint ≈ 594 GB
    assert model.kv_bytes_per_token == 70_272  # (512 + 64) × 61 layers × 2 B


def test_kimi_k26_components_by_hand():
    ledger = weight_ledger(load_model("kimi-k2.6"))
    h, layers, moe_layers = 7168, 61, 60
    experts = moe_layers * 384 * 3 * h * 2048  # 1,014,686,023,680
    assert ledger.component("routed_experts").params == experts
    # INT4: 4 bits per weight + one BF16 scale per 32 weights along the input dim = 4.5 bits exactly here
    assert ledger.component("routed_experts").bytes == experts * 4.5 / 8
    assert ledger.component("attn.q_a").params == layers * 1536 * h
    assert ledger.component("attn.q_b").params == layers * 64 * (128 + 64) * 1536
    assert ledger.component("attn.kv_a").params == layers * (512 + 64) * h
    assert ledger.component("attn.kv_b").params == layers * 64 * (128 + 128) * 512
    assert ledger.component("attn.o").params == layers * h * 64 * 128
    assert ledger.component("dense_mlp").params == 1 * 3 * h * 18432
    assert ledger.component("shared_experts").params == moe_layers * 3 * h * 2048
    # router weight plus the noaux_tc score-correction bias per expert
    assert ledger.component("router").params == moe_layers * (384 * h + 384)
    assert ledger.component("embeddings").params == ledger.component("lm_head").params == 163840 * h
    # norms: 2 per layer (h) + q_a (1536) + kv_a (512) per layer + final
    assert ledger.component("norms").params == layers * (2 * h + 1536 + 512) + h
    for name in ("attn.o", "shared_experts", "dense_mlp", "lm_head"):
        assert ledger.component(name).formats == ("bf16",)


def test_kimi_k26_vision_tower_is_counted_separately():
    ledger = weight_ledger(load_model("kimi-k2.6"))
    vision = ledger.component("vision")
    assert 0.3e9 < vision.params < 0.6e9  # MoonViT ≈ 0.4B (27 layers, hidden 1152) plus its projector
    assert vision.active_params == 0


def test_deepseek_v3_total_and_fp8_blocks():
    ledger = weight_ledger(load_model("deepseek-v3"))
    assert within(ledger.total_params, 671.0e9)
    assert within(ledger.active_params, 37e9, rel=0.02)  # "37B activated"
    experts = 58 * 256 * 3 * 7168 * 2048  # first 3 of 61 layers are dense
    blocks = 58 * 256 * 3 * (7168 // 128) * (2048 // 128)  # one FP32 scale per 128×128 block
    assert ledger.component("routed_experts").bytes == experts + blocks * 4
    assert ledger.component("lm_head").formats == ("bf16",)  # FP8 checkpoints keep lm_head in BF16


def test_deepseek_v3_mtp_layer_is_separate():
    ledger = weight_ledger(load_model("deepseek-v3"))
    # one MoE decoder layer (≈11.5B) plus eh_proj (7168 × 14336); the card's "14B MTP" adds embed and head
    assert 11.4e9 < ledger.mtp_params < 11.8e9


def test_qwen3_235b_total_and_active():
    ledger = weight_ledger(load_model("qwen3-235b-a22b"))
    assert within(ledger.total_params, 235.1e9)
    assert within(ledger.active_params, 21.6e9)
    h = 4096
    attention = 94 * (h * 64 * 128 + 2 * h * 4 * 128 + 64 * 128 * h)
    assert sum(ledger.component(f"attn.{p}").params for p in "qkvo") == attention


def test_qwen3_235b_fp8_skips_router_and_lm_head():
    ledger = weight_ledger(load_model("qwen3-235b-a22b-fp8"))
    assert ledger.component("routed_experts").formats == ("fp8-block",)
    assert ledger.component("router").formats == ("bf16",)
    assert ledger.component("lm_head").formats == ("bf16",)
    assert within(ledger.total_bytes, 236e9, rel=0.01)  # about half of BF16's 470 GB


def test_llama_dense_gqa_exact():
    ledger = weight_ledger(load_model("llama-3.1-70b"))
    h, layers, vocab = 8192, 80, 128256
    per_layer = h * h + 2 * h * 1024 + h * h + 3 * h * 28672 + 2 * h  # q, k+v (8 KV heads × 128), o, MLP, 2 norms
    assert ledger.total_params == layers * per_layer + 2 * vocab * h + h  # 70,553,706,496
    assert ledger.total_params == 70_553_706_496
    assert weight_ledger(load_model("llama-3.1-8b")).total_params == 8_030_261_248  # published 8.03B
    assert load_model("llama-3.1-70b").kv_bytes_per_token == 2 * 8 * 128 * 80 * 2  # 327,680


def test_mixtral_moe_total_and_active():
    ledger = weight_ledger(load_model("mixtral-8x7b"))
    assert within(ledger.total_params, 46.7e9)
    assert within(ledger.active_params, 12.75e9)
    assert ledger.component("routed_experts").params == 32 * 8 * 3 * 4096 * 14336


def test_gpt_oss_120b_mxfp4_sinks_and_sliding_window():
    model = load_model("gpt-oss-120b")
    ledger = weight_ledger(model)
    assert within(ledger.total_params, 116.8e9)
    assert within(ledger.active_params, 5.1e9)
    assert within(ledger.total_bytes, 60.7 * GiB, rel=0.005)  # MXFP4 4.25 bit experts + BF16 rest
    assert ledger.component("routed_experts").formats == ("mxfp4", "bf16")  # matrices, then their biases
    assert ledger.component("attn.sinks").params == 36 * 64
    assert model.layer_attention.count("sliding") == 18 and model.sliding_window == 128
    per_layer = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, BF16
    assert model.kv_bytes_per_token == 36 * per_layer  # 73,728 B while inside the 128-token window
    assert model.kv_bytes_per_token_beyond_window == 18 * per_layer  # then only full layers grow
    assert model.kv_bytes_per_sequence(1000) == 18 * per_layer * 1000 + 18 * per_layer * 128


def test_gpt_oss_20b_weights():
    ledger = weight_ledger(load_model("gpt-oss-20b"))
    assert within(ledger.total_params, 20.9e9)
    assert within(ledger.total_bytes, 12.8 * GiB, rel=0.01)


def test_glm45_and_minimax_totals():
    glm = weight_ledger(load_model("glm-4.5"))
    assert within(glm.total_params, 352.8e9)  # + 1 MTP layer ≈ "355B"
    assert load_model("glm-4.5").kv_bytes_per_token == 2 * 8 * 128 * 92 * 2
    minimax = weight_ledger(load_model("minimax-m2"))
    assert within(minimax.total_params, 228.7e9)
    assert within(minimax.active_params, 10.4e9)
    assert minimax.component("routed_experts").formats == ("fp8-block",)
    assert minimax.component("router").formats == ("bf16",)


def test_qwen3_next_linear_attention_state():
    model = load_model("qwen3-next-80b-a3b")
    ledger = weight_ledger(model)
    assert within(ledger.total_params, 79.7e9)
    assert within(ledger.active_params, 3.6e9, rel=0.02)
    assert model.layer_attention.count("full") == 12 and model.layer_attention.count("linear") == 36
    assert model.kv_bytes_per_token == 2 * 2 * 256 * 12 * 2  # 24,576 B
    # per linear layer: conv window 3 × (2·16·128 + 32·128) + recurrent 32 × 128 × 128 elements, BF16
    assert model.linear_state_bytes == 36 * (3 * 8192 + 32 * 128 * 128) * 2


def test_qwen3_5_hybrid_layers_state_and_vision():
    model = load_model("qwen3.5-397b-a17b")
    ledger = weight_ledger(model)
    assert model.family == "qwen3_5_moe" and model.attention.output_gate and model.moe.shared_expert_gate
    assert model.layer_attention.count("full") == 15 and model.layer_attention.count("linear") == 45
    assert model.layer_attention[3] == "full" and model.layer_attention[:3] == ("linear",) * 3
    # 512 experts of 3 · 4096 · 1024 in each of 60 layers
    assert ledger.component("routed_experts").params == 60 * 512 * 3 * 4096 * 1024
    # gated queries: 32 heads · 256 · 2 per full layer
    assert ledger.component("attn.q").params == 15 * 32 * 256 * 2 * 4096
    assert model.kv_bytes_per_token == 2 * 2 * 256 * 15 * 2  # 30,720 B
    # per linear layer: conv window 3 × (2·16·128 + 64·128) in BF16 + recurrent 64 × 128 × 128 in FP32
    # (the config's mamba_ssm_dtype)
    assert model.linear_attention.ssm_dtype == "fp32"
    assert model.linear_state_bytes == 45 * (3 * 12288 * 2 + 64 * 128 * 128 * 4)
    # depth 27 of width 1152 (qkv, proj, MLP of 4304, with biases; two LayerNorms), Conv3d 2 × 16 × 16 patches,
    # 2304 positions, merger of 4 patches (LayerNorm, 4608 → 4608 → 4096)
    d, i = 1152, 4304
    block = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
    vision = 27 * block + 3 * 2 * 16 * 16 * d + d + 2304 * d + 2 * d + 4608 * 4608 + 4608 + 4608 * 4096 + 4096
    assert ledger.component("vision").params == vision
    assert within(ledger.total_params, 396.8e9)  # "397B" with the MTP layer outside
    assert model.num_mtp_layers == 1
    nvfp4 = weight_ledger(load_model("qwen3.5-397b-a17b-nvfp4"))
    assert nvfp4.component("routed_experts").formats == ("nvfp4",)
    assert nvfp4.component("linear_attn.in_proj").formats == ("bf16",)  # excluded by name in the ignore list
    assert nvfp4.component("attn.q").formats == ("bf16",)


def test_minimax_m2_5_is_minimax_m2s_architecture():
    m25, m2 = load_model("minimax-m2.5"), load_model("minimax-m2")
    assert weight_ledger(m25).total_params == weight_ledger(m2).total_params
    assert m25.kv_bytes_per_token == m2.kv_bytes_per_token == 2 * 8 * 128 * 62 * 2


@pytest.mark.parametrize("alias", ["kimi-k2.6", "qwen3-30b-a3b", "gpt-oss-120b", "llama-3.1-8b"])
def test_components_add_up(alias):
    ledger = weight_ledger(load_model(alias))
    assert ledger.total_bytes == sum(c.bytes for c in ledger.components)
    assert ledger.total_params == sum(c.params for c in ledger.components)
    assert 0 < ledger.active_params <= ledger.total_params


def test_what_if_overrides():
    base = weight_ledger(load_model("kimi-k2.6"))
    fp8 = weight_ledger(load_model("kimi-k2.6", weight_dtype="fp8"))
    assert fp8.component("routed_experts").formats == ("fp8",)
    assert fp8.component("embeddings").formats == ("bf16",)  # lookups are never quantized
    assert fp8.component("lm_head").formats == ("bf16",)
    assert fp8.total_bytes > base.total_bytes
    mixed = weight_ledger(load_model("kimi-k2.6", weight_dtype="fp8,experts=nvfp4"))
    assert mixed.component("routed_experts").formats == ("nvfp4",)
    assert mixed.component("attn.o").formats == ("fp8",)
    assert load_model("kimi-k2.6", kv_dtype="fp8").kv_bytes_per_token == 35_136


def test_glm5_sparse_attention_indexer_layers_keys_and_weights():
    glm51, glm52 = load_model("glm-5.1"), load_model("glm-5.2-nvfp4")
    # GLM-5.1: every one of 78 layers runs its indexer; BF16 latents 576 · 2 plus a 132-B indexer key per layer
    assert glm51.attention.sparse.layers == tuple(range(78))
    assert glm51.attention.sparse.top_k == 2048
    assert glm51.kv_bytes_per_token == 78 * 576 * 2 + 78 * (128 + 4)
    # GLM-5.2: indexer_types "full" in layers 0, 1, 2, then every fourth from 6; the others reuse its top-k
    assert glm52.attention.sparse.layers == (0, 1, 2, *range(6, 78, 4))
    assert glm52.kv_bytes_per_token == 78 * 576 + 21 * 132  # FP8 cache
    # without indexer_types, index_topk_freq 4 and index_skip_topk_offset 3 pick the same layers (SGLang
    # dsa_layer_skips_topk)
    config = json.loads((_models_dir() / "glm-5.2-nvfp4" / "config.json").read_text())
    del config["indexer_types"]
    assert model_from_config(config, name="x").attention.sparse.layers == glm52.attention.sparse.layers
    # the indexer: wq_b 2048 → 32 · 128, wk 6144 → 128, weights_proj 6144 → 32, in each layer that runs one
    per_layer = 2048 * 4096 + 6144 * 128 + 6144 * 32
    assert weight_ledger(glm52).component("attn.indexer").params == 21 * per_layer
    assert weight_ledger(glm51).component("attn.indexer").params == 78 * per_layer
    assert within(weight_ledger(glm51).total_params, 743.9e9)  # "744B" with the MTP layer outside


def test_deepseek_v4s_compressed_attention_is_refused_not_misread():
    config = json.loads((_models_dir() / "glm-5.1" / "config.json").read_text())
    config["compress_ratios"] = [0, 0, 4, 128]
    with pytest.raises(SpecError, match="compressed attention .* not modelled yet"):
        model_from_config(config, name="v4-like")
