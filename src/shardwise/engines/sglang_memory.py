"""SGLang's automatic `--mem-fraction-static`: the share of GPU memory for weights plus KV cache.

SGLang reserves memory for activations (in proportion to the chunked-prefill size), CUDA graphs (decode
batch sizes, attention DP padding, MLA prefill graphs), parallel slack and DeepEP buffers, and gives the rest
to weights and the KV pool:  mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3), with
gpu_mem the smallest GPU's total memory in MiB. Source: sglang 0.5.23
arg_groups/memory_hook.py (handle_gpu_memory_settings, reserve_for_graph_mb, reserve_for_deepep_a2a_mb,
adjust_mem_fraction_for_vlm); 0.5.9 server_args.py _handle_gpu_memory_settings for the older form.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from shardwise.engines.flags import flag_table
from shardwise.engines.sglang_graphs import prefill_backend
from shardwise.memo import Memo
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec

V0523 = Version("0.5.23")


def prefill_graph_on(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> bool:
    """Whether 0.5.23 captures prefill CUDA graphs for this configuration, as its memory rule sees it (before
    DeepSeek-V3's trtllm_mla check turns them off; cuda_graph_hook.py): only that release's reserve is read."""
    if version < V0523:
        return False
    return prefill_backend(f, model, cluster, version, trtllm_mla_rule=False) != "disabled"


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """Token counts captured for prefill graphs (generate_prefill_cuda_graph_batch_sizes)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_tokens + 1, 512),
    ]
    return [s for s in sizes if s <= max_tokens]


def attn_dp_padding_mib(f: dict[str, Any]) -> float:
    """What SGLang reserves for attention DP's padded batches, graphs or not (reserve_for_graph_mb: max_bs ×
    attn_dp × 3 MiB, × 1.5 more above a max batch of 300); memory the ledger does not size otherwise."""
    if f["attn_dp_size"] == 1:
        return 0.0
    max_bs = f.get("cuda_graph_max_bs") or 0
    return max_bs * f["attn_dp_size"] * (4.5 if max_bs > 300 else 3)


def graph_reserve_mib(f: dict[str, Any], model: ModelSpec, version: Version) -> float:
    reserved = 0.0
    max_bs = f.get("cuda_graph_max_bs") or 0
    if f["cuda_graph"]:
        reserved += max_bs * 2
    reserved += attn_dp_padding_mib(f)
    if f.get("prefill_cuda_graph"):
        if model.attention.kind == "mla":
            reserved += 1536
        else:
            reserved += len(prefill_graph_sizes(f["chunked_prefill_undivided"])) * 8
        if f["moe_a2a_backend"] == "deepep":
            reserved += 1024
    if version < V0523 and f.get("speculative_algorithm"):
        reserved += 6144 if f["speculative_algorithm"] == "STANDALONE" else 2048
    return reserved


_VLM_FACTORS = Memo(16)  # per model


def vlm_factor(model: ModelSpec) -> float:
    """adjust_mem_fraction_for_vlm: 0.95, scaled by the vision tower's size against a ViT-L/14 (24 × 1024²).
    The size is what SGLang's own config class reads: the checkpoint's num_hidden_layers / hidden_size, else the
    class's defaults (data: `models.*.vision_config`), else getattr's 24 and 1024. Remembered per model."""
    if model.vision is None:
        return 1.0
    return _VLM_FACTORS.get((model,), None, lambda: _vlm_factor(model))


def _vlm_factor(model: ModelSpec) -> float:
    assert model.vision is not None
    defaults = flag_table("sglang").support(model.architecture, model.wrapper_architecture).vision_config or {}
    layers = model.vision.hf_num_hidden_layers or defaults.get("num_hidden_layers", 24)
    hidden = model.vision.hf_hidden_size or defaults.get("hidden_size", 1024)
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def auto_mem_fraction(
    f: dict[str, Any], *, model: ModelSpec, gpu_mem_mib: float, version: Version
) -> tuple[float, float]:
    """(mem_fraction_static, reserved MiB) as SGLang chooses them when --mem-fraction-static is unset."""
    chunk = f["chunked_prefill_undivided"]
    activation_tokens = max(chunk if chunk > 0 else f["max_prefill_tokens"], 2048)  # unchunked: the prefill budget
    reserved = 512 + activation_tokens * 1.5  # attention-backend metadata + activations
    reserved += f["tp_size"] * f["pp_size"] / 8 * 1024  # slack for large parallel groups
    reserved += graph_reserve_mib(f, model, version)
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if f["cuda_graph"] and f["moe_a2a_backend"] == "deepep":
        reserved += 2048  # DeepEP buffers captured in the decode graph
    fraction = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    multimodal = not f.get("language_model_only")  # the flag loads the language model alone (is_vlm off)
    return fraction * (vlm_factor(model) if multimodal else 1.0), reserved
