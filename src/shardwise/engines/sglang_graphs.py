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
    if not f["cuda_graph"] or _trtllm_mla_off(f, model, version, rule):
        return 0
    if version >= Version(rule["breakable_since"]):
        return rule["breakable_max_tokens"] if f.get("prefill_cuda_graph") else 0
    if not Version(rule["piecewise_asked_since"]) <= version <= Version(rule["piecewise_until"]):
        return 0
    if version < Version(rule["piecewise_default_since"]):
        on = bool(f.get("enable_piecewise_cuda_graph"))  # asked for; no release before the default turned it off
    else:
        on = not f.get("disable_piecewise_cuda_graph") and (
            f.get("enforce_piecewise_cuda_graph") or not _piecewise_off(f, model, cluster, version, rule)
        )
    if not on:
        return 0
    if f.get("piecewise_cuda_graph_max_tokens"):
        return f["piecewise_cuda_graph_max_tokens"]
    default = max((e for e in rule["piecewise_max_tokens"] if Version(e["since"]) <= version), key=_since)
    if model.attention.kind == "mla" and "mla" in default:
        return default["mla"]
    return f["chunked_prefill_size"] if default["tokens"] == "chunk" else default["tokens"]


def _piecewise_off(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version, rule: dict) -> bool:
    """Whether the default piecewise graph turns itself off for this configuration (0.5.10-0.5.19)."""
    return (
        cluster.gpu.vendor != "nvidia"
        or any(f.get(option) for option in rule["off_with"])
        or f["attn_dp_size"] > 1
        or f["pp_size"] > 1
        or f["attn_cp_size"] > 1
        or f["moe_a2a_backend"] != "none"
        or model.vision is not None
        or model.architecture in rule["off_archs"]
        or (bool(f.get("speculative_algorithm")) and version <= Version(rule["speculative_off_until"]))
    )


def _trtllm_mla_off(f: dict[str, Any], model: ModelSpec, version: Version, rule: dict) -> bool:
    """DeepSeek-V3's architecture with trtllm_mla prefill attention runs prefill eager from 0.5.15."""
    return (
        version >= Version(rule["trtllm_mla_off_since"])
        and f.get("attention_backend") == "trtllm_mla"
        and model.architecture in rule["trtllm_mla_off_archs"]
    )


def _since(entry: dict[str, Any]) -> Version:
    return Version(entry["since"])
