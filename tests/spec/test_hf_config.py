"""Reading config.json files: families, nesting, generic fallback and every way a file can be wrong."""

import pytest

from shardwise import load_model, weight_ledger
from shardwise.errors import SpecError

LLAMA_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def test_path_to_file_and_folder(write_config):
    path = write_config(LLAMA_LIKE)
    by_file, by_folder = load_model(str(path)), load_model(str(path.parent))
    assert by_file == by_folder
    # 2 layers × (q 64×64 + k,v 2×(64×32) + o 64×64 + MLP 3×64×128 + 2 norms of 64) + embed + head + final norm
    assert weight_ledger(by_file).total_params == 2 * (4096 + 4096 + 4096 + 24576 + 128) + 2 * 6400 + 64


def test_unknown_architecture_with_standard_fields_is_generic(write_config):
    cfg = {**LLAMA_LIKE, "architectures": ["FancyNewForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 2}
    model = load_model(str(write_config(cfg)))
    assert model.generic and model.family == "generic"
    assert model.moe is not None and model.moe.num_experts == 4 and model.num_moe_layers == 2


def test_missing_fields_are_named(write_config):
    cfg = {k: v for k, v in LLAMA_LIKE.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(SpecError, match="lacks hidden_size, vocab_size"):
        load_model(str(write_config(cfg)))


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"architectures": ["LlamaForCausalLM"]}', "lacks"),
    ],
)
def test_malformed_files(write_config, content, message):
    with pytest.raises(SpecError, match=message):
        load_model(str(write_config(content)))


def test_unknown_name_suggests_close_ones():
    with pytest.raises(SpecError, match="did you mean kimi-k2.6"):
        load_model("kimi-k2.7")


def test_folder_without_config(tmp_path):
    with pytest.raises(SpecError, match="has no config.json"):
        load_model(str(tmp_path))


def test_moe_without_top_k_is_an_error(write_config):
    cfg = {**LLAMA_LIKE, "num_experts": 8}
    with pytest.raises(SpecError, match="top-k"):
        load_model(str(write_config(cfg)))


def test_text_config_nesting_and_prefix():
    model = load_model("kimi-k2.6")
    assert model.architecture == "DeepseekV3ForCausalLM" and model.names.prefix == "language_model."
    assert model.attention.kind == "mla" and model.layer_mlp.count("dense") == 1
    assert model.vision is not None and model.vision.num_layers == 27


def test_layer_kinds_from_fields(write_config):
    cfg = {**LLAMA_LIKE, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}
    model = load_model(str(write_config(cfg)))
    assert model.layer_attention == ("sliding", "full") and model.sliding_window == 16
    bad = {**LLAMA_LIKE, "layer_types": ["chunked_attention", "full_attention"]}
    with pytest.raises(SpecError, match="unknown layer_types"):
        load_model(str(write_config(bad)))


def test_deepseek_dense_prefix_and_moe_frequency(write_config):
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "intermediate_size": 128,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 2,
        "moe_layer_freq": 2,
    }
    model = load_model(str(write_config(cfg)))
    assert model.layer_mlp == ("dense", "dense", "moe", "dense", "moe", "dense")
    assert weight_ledger(model).component("attn.q").params == 6 * 4 * 12 * 64  # no q_lora: one q_proj
    assert model.kv_bytes_per_token == 6 * (16 + 4) * 2


def test_mistral_sliding_window_caps_every_layer(write_config):
    # Mistral-7B-v0.1: every layer attends over a 4096-token window
    cfg = {
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "sliding_window": 4096,
    }
    model = load_model(str(write_config(cfg)))
    assert model.family == "mistral" and set(model.layer_attention) == {"sliding"}
    per_token = 32 * 2 * 8 * 128 * 2  # 131,072 B while the context is inside the window
    assert model.kv_bytes_per_sequence(1000) == 1000 * per_token
    assert model.kv_bytes_per_sequence(32000) == 4096 * per_token
    assert model.kv_bytes_per_token == per_token
    assert model.kv_bytes_per_token_beyond_window == 0  # no layer keeps tokens beyond the window


def test_qwen2_moe_shared_expert_gate_and_qkv_bias(write_config):
    cfg = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 32,
    }
    ledger = weight_ledger(load_model(str(write_config(cfg))))
    # shared expert: 3 × 64 × 32 plus its 1 × 64 sigmoid gate, per layer
    assert ledger.component("shared_experts").params == 2 * (3 * 64 * 32 + 64)
    assert ledger.component("attn.q").params == 2 * (64 * 64 + 64)  # weight + bias
    assert ledger.component("attn.o").params == 2 * 64 * 64  # no bias on o_proj
