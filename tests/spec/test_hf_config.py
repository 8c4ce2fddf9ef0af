"""Reading config.json files: families, nesting, generic fallback and every way a file can be wrong."""

import pytest

from shardwise import load_model, weight_ledger
from shardwise.errors import SpecError

LLAMA_LIKE = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


def test_path_to_file_and_folder(write_config):
    path = write_config(LLAMA_LIKE)
    by_file, by_folder = load_model(str(path)), load_model(str(path.parent))
    assert by_file == by_folder
    # 2 layers × (q 64×64 + k,v 2×(64×32) + o 64×64 + MLP 3×64×128 + 2 norms of 64) + embed + head + final norm
    assert weight_ledger(by_file).total_params == 2 * (4096 + 4096 + 4096 + 24576 + 128) + 2 * 6400 + 64


def test_unknown_architecture_with_standard_fields_is_generic(write_config):
    cfg = {**LLAMA_LIKE, "architectures": ["FancyNewForCausalLM"], "num_local_experts": 4,
           "num_experts_per_tok": 2}
    model = load_model(str(write_config(cfg)))
    assert model.generic and model.family == "generic"
    assert model.moe is not None and model.moe.num_experts == 4 and model.num_moe_layers == 2


def test_missing_fields_are_named(write_config):
    cfg = {k: v for k, v in LLAMA_LIKE.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(SpecError, match="lacks hidden_size, vocab_size"):
        load_model(str(write_config(cfg)))


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"architectures": ["LlamaForCausalLM"]}', "lacks"),
])
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
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 6,
           "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128, "kv_lora_rank": 16,
           "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
           "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
           "first_k_dense_replace": 2, "moe_layer_freq": 2}
    model = load_model(str(write_config(cfg)))
    assert model.layer_mlp == ("dense", "dense", "moe", "dense", "moe", "dense")
    assert weight_ledger(model).component("attn.q").params == 6 * 4 * 12 * 64  # no q_lora: one q_proj
    assert model.kv_bytes_per_token == 6 * (16 + 4) * 2
