"""Which of SGLang's prefill steps run under a CUDA graph: the largest prefill, in tokens, it replays from one.

A step under a graph costs the host one replay; an eager one, a launch per kernel (cost/step.py). The rule by
release is data (data/engines/sglang.yaml `prefill_graph`, with the files it was read from).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from shardwise.engines.flags import flag_table
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


def prefill_graph_tokens(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> int:
    """The most prompt tokens of one prefill step that SGLang runs under a CUDA graph (0: every prefill runs eager),
    from its effective configuration `f`."""
    rule = flag_table("sglang").prefill_graph
    arch = model.wrapper_architecture or model.architecture  # the first of the checkpoint's config, as SGLang reads
    sm100 = cluster.gpu.compute_capability.value.startswith("10.")
    mla = model.attention.kind == "mla"
    if version >= Version(rule["breakable_since"]):
        trtllm_mla = f.get("attention_backend") == "trtllm_mla" or (
            sm100 and not f.get("attention_backend") and not f.get("decode_attention_backend")
        )
        if not f.get("prefill_cuda_graph") or (arch in rule["trtllm_mla_archs"] and trtllm_mla):
            return 0
        return min(rule["breakable_mla_max_tokens"], f["chunked_prefill_size"]) if mla else f["chunked_prefill_size"]
    if not Version(rule["piecewise_asked_since"]) <= version <= Version(rule["piecewise_until"]):
        return 0
    if version < Version(rule["piecewise_default_since"]):
        on = bool(f.get("enable_piecewise_cuda_graph"))  # asked for; no release before the default turned it off
    else:
        trtllm_moe = (
            sm100
            and arch in rule["trtllm_moe_archs"]
            and f["moe_a2a_backend"] == "none"
            and version <= Version(rule["trtllm_moe_off_until"])
        )
        off = trtllm_moe or _piecewise_off(f, model, cluster, version, rule, arch)
        # --enforce-piecewise-cuda-graph skips every check, --disable-piecewise-cuda-graph's too
        on = bool(f.get("enforce_piecewise_cuda_graph")) or not (f.get("disable_piecewise_cuda_graph") or off)
    if not on:
        return 0
    if f.get("piecewise_cuda_graph_max_tokens"):
        return f["piecewise_cuda_graph_max_tokens"]
    default = max((e for e in rule["piecewise_max_tokens"] if Version(e["since"]) <= version), key=_since)
    if mla and "mla" in default:
        return default["mla"]
    return f["chunked_prefill_size"] if default["tokens"] == "chunk" else default["tokens"]


def _piecewise_off(
    f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version, rule: dict, arch: str
) -> bool:
    """Whether the default piecewise graph turns itself off for this configuration (0.5.10-0.5.13)."""
    return (
        cluster.gpu.vendor != "nvidia"
        or any(f.get(option) for option in rule["off_with"])
        or f["attn_dp_size"] > 1
        or f["pp_size"] > 1
        or f["attn_cp_size"] > 1
        or f["moe_a2a_backend"] != "none"
        or model.vision is not None
        or arch in rule["off_archs"]
        or (bool(f.get("speculative_algorithm")) and version <= Version(rule["speculative_off_until"]))
    )


def _since(entry: dict[str, Any]) -> Version:
    return Version(entry["since"])
