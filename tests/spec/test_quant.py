"""Storage formats and quantization configs: bytes by hand, and which modules each config quantizes."""

import json

import pytest

from shardwise.errors import SpecError
from shardwise.spec.catalog import _models_dir
from shardwise.spec.quant import FORMATS, parse_weight_override, scheme_from_config, weight_format

BF16 = FORMATS["bf16"]


def test_matrix_bytes_by_hand():
    # int4 group 32, BF16 scales: 2048×7168 × ½ B + 2048 × 224 groups × 2 B
    assert FORMATS["int4-g32"].matrix_bytes(2048, 7168) == 7_340_032 + 917_504
    # FP8 128×128 blocks, FP32 scales: 7168×2048 × 1 B + 56 × 16 blocks × 4 B
    assert FORMATS["fp8-block"].matrix_bytes(7168, 2048) == 14_680_064 + 3_584
    # MXFP4: ½ B per weight + one E8M0 byte per 32: 2880×2880 × ½ + 2880 × 90
    assert FORMATS["mxfp4"].matrix_bytes(2880, 2880) == 4_147_200 + 259_200
    # NVFP4: ½ B per weight + one FP8 scale per 16 + two FP32 per-tensor scales
    assert FORMATS["nvfp4"].matrix_bytes(2048, 7168) == 7_340_032 + 2048 * 448 + 8
    # a ragged edge still needs a whole scale block
    assert FORMATS["fp8-block"].matrix_bytes(130, 130) == 130 * 130 + 4 * 4
    assert BF16.matrix_bytes(10, 10) == 200


def test_bits_per_weight():
    assert FORMATS["int4-g32"].bits_per_weight == pytest.approx(4.5)
    assert FORMATS["mxfp4"].bits_per_weight == pytest.approx(4.25)
    assert FORMATS["bf16"].bits_per_weight == 16


KIMI_INT4 = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
}


@pytest.mark.parametrize(
    "module, role, quantized",
    [
        ("model.layers.1.mlp.experts.0.gate_proj", "routed_experts", True),
        ("model.layers.1.mlp.experts.0.down_proj", "routed_experts", True),
        ("model.layers.0.mlp.gate_proj", "dense_mlp", False),  # the dense layer-0 MLP stays BF16
        ("model.layers.5.mlp.shared_experts.up_proj", "shared_experts", False),
        ("model.layers.5.self_attn.q_a_proj", "attention", False),
        ("lm_head", "lm_head", False),
        ("language_model.lm_head", "lm_head", False),
        ("model.layers.5.mlp.gate", "router", False),  # MoEGate is not a Linear
    ],
)
def test_compressed_tensors_ignore_list(module, role, quantized):
    scheme = scheme_from_config(KIMI_INT4)
    fmt = scheme.format_for(module=module, role=role, dense=BF16)
    assert (fmt.name == "int4-g32") is quantized
    assert fmt.activation_bits == 16 or not quantized  # W4A16: input_activations is null


def test_fp8_name_list_matches_whole_dotted_parts():
    # MiniMax-M2 lists 'gate': it must hit block_sparse_moe.gate, not an expert's w1 or a gate_proj
    scheme = scheme_from_config(
        {
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
        }
    )
    assert scheme.format_for(module="model.layers.0.block_sparse_moe.gate", role="routed_experts", dense=BF16) is BF16
    assert scheme.format_for(module="model.layers.0.mlp.gate_proj", role="dense_mlp", dense=BF16).name == "fp8-block"
    assert scheme.format_for(module="lm_head", role="lm_head", dense=BF16) is BF16


def test_modelopt_nvfp4_glob_and_fp8_kv():
    config = json.loads((_models_dir() / "kimi-k2.6-nvfp4" / "config.json").read_text())
    scheme = scheme_from_config(config["quantization_config"])
    assert scheme.kv_dtype == "fp8"
    expert = "language_model.model.layers.1.mlp.experts.3.gate_proj"
    assert scheme.format_for(module=expert, role="routed_experts", dense=BF16).name == "nvfp4"
    layer0 = "language_model.model.layers.0.mlp.gate_proj"
    assert scheme.format_for(module=layer0, role="dense_mlp", dense=BF16) is BF16
    attn = "language_model.model.layers.7.self_attn.o_proj"
    assert scheme.format_for(module=attn, role="attention", dense=BF16) is BF16


@pytest.mark.parametrize(("alias", "o_proj"), [("deepseek-r1-nvfp4-v1", "bf16"), ("deepseek-r1-nvfp4", "nvfp4")])
def test_deepseek_r1_nvfp4_keeps_attention_wide_and_v2_quantizes_its_output(alias, o_proj):
    """v1 excludes every self_attn module; v2 'additionally quantizes the wo module' (its model card): o_proj is FP4,
    the MLA input projections stay BF16; the dense MLP of layer 0, shared experts and experts are FP4; the MTP layer
    61 and lm_head are not."""
    config = json.loads((_models_dir() / alias / "config.json").read_text())
    scheme = scheme_from_config(config["quantization_config"])
    fmt = {
        (module, role): scheme.format_for(module=module, role=role, dense=BF16).name
        for module, role in [
            ("model.layers.7.self_attn.o_proj", "attention"),
            ("model.layers.7.self_attn.q_b_proj", "attention"),
            ("model.layers.0.mlp.gate_proj", "dense_mlp"),
            ("model.layers.7.mlp.shared_experts.up_proj", "shared_experts"),
            ("model.layers.7.mlp.experts.5.down_proj", "routed_experts"),
            ("model.layers.61.mlp.experts.5.down_proj", "routed_experts"),
            ("lm_head", "lm_head"),
        ]
    }
    assert list(fmt.values()) == [o_proj, "bf16", "nvfp4", "nvfp4", "nvfp4", "bf16", "bf16"]
    assert scheme.kv_dtype == "fp8"


def test_quark_mxfp4_w4a4_with_its_exclusions():
    """AMD's Quark export: weights and activations MXFP4 (group 32, E8M0), every MLA projection BF16 by name, the MTP
    layer by `re:` pattern, lm_head by name."""
    config = json.loads((_models_dir() / "deepseek-r1-mxfp4" / "config.json").read_text())
    scheme = scheme_from_config(config["quantization_config"])
    expert = scheme.format_for(module="model.layers.9.mlp.experts.17.gate_proj", role="routed_experts", dense=BF16)
    assert (expert.name, expert.activation_bits, expert.group_size) == ("mxfp4", 4, 32)
    for module, role in [
        ("model.layers.9.self_attn.o_proj", "attention"),
        ("model.layers.61.mlp.experts.17.gate_proj", "routed_experts"),
        ("lm_head", "lm_head"),
    ]:
        assert scheme.format_for(module=module, role=role, dense=BF16) is BF16
    assert scheme.format_for(module="model.layers.1.mlp.down_proj", role="dense_mlp", dense=BF16).name == "mxfp4"
    assert scheme.kv_dtype is None


def test_quark_other_than_mxfp4_is_one_clear_error():
    spec = {"dtype": "int8", "group_size": None, "scale_format": None}
    with pytest.raises(SpecError, match="unsupported Quark weight spec"):
        scheme_from_config({"quant_method": "quark", "global_quant_config": {"weight": spec}})
    mxfp4 = {"dtype": "fp4", "group_size": 32, "scale_format": "e8m0"}
    with pytest.raises(SpecError, match="quantized KV cache are not supported"):
        scheme_from_config(
            {"quant_method": "quark", "global_quant_config": {"weight": mxfp4}, "kv_cache_quant_config": {"*": {}}}
        )


def test_mxfp4_modules_to_not_convert():
    scheme = scheme_from_config(
        {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        }
    )
    assert (
        scheme.format_for(module="model.layers.3.mlp.experts.gate_up_proj", role="routed_experts", dense=BF16).name
        == "mxfp4"
    )
    assert scheme.format_for(module="model.layers.3.self_attn.q_proj", role="attention", dense=BF16) is BF16


def test_awq_and_gptq_group_formats():
    awq = scheme_from_config({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    assert awq.quantized.name == "int4-g128" and awq.quantized.zero_point_bits == 4
    # 4096×4096: ½ B per weight + (16-bit scale + 4-bit zero) per 128 weights
    assert awq.quantized.matrix_bytes(4096, 4096) == 4096 * 4096 / 2 + 4096 * 32 * 20 / 8
    gptq = scheme_from_config({"quant_method": "gptq", "bits": 8, "group_size": 64, "sym": True})
    assert gptq.quantized.name == "int8-g64" and gptq.quantized.zero_point_bits == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"quant_method": "bitsandbytes"},
        {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"},
        {"quant_method": "compressed-tensors"},
        "fp8",
    ],
)
def test_unsupported_quantization_is_a_clear_error(bad):
    with pytest.raises(SpecError):
        scheme_from_config(bad)


def test_weight_overrides():
    override = parse_weight_override("fp8,experts=int4", scheme_from_config(None))
    assert override.format_for(module="x", role="routed_experts", dense=BF16).name == "int4-g32"
    assert override.format_for(module="x", role="attention", dense=BF16).name == "fp8"
    assert override.format_for(module="x", role="embedding", dense=BF16) is BF16
    with pytest.raises(SpecError, match="unknown weight group"):
        parse_weight_override("moe=fp8", scheme_from_config(None))
    with pytest.raises(SpecError, match="unknown weight format"):
        weight_format("fp3")
