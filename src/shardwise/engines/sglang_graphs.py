"""Which of SGLang's prefill steps run under a CUDA graph: the largest prefill, in tokens, it replays from one.

A step under a graph costs the host one replay; an eager one, a launch per kernel (cost/step.py). The rule by
release is data (data/engines/sglang.yaml `prefill_graph`, with the files it was read from): the piecewise graph,
asked for from 0.5.4 and on by default in 0.5.10-0.5.13, then from 0.5.14 one prefill backend (tc_piecewise, then
breakable) with checks of its own in each release.
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
    if version >= Version(rule["backends_since"]):
        if prefill_backend(f, model, cluster, version) == "disabled":
            return 0
        return _backend_max_tokens(f, model, version, rule)
    arch = _architecture(model)
    if not Version(rule["piecewise_asked_since"]) <= version <= Version(rule["piecewise_until"]):
        return 0
    if version < Version(rule["piecewise_default_since"]):
        on = bool(f.get("enable_piecewise_cuda_graph"))  # asked for; no release before the default turned it off
    else:
        trtllm_moe = (
            _sm100(cluster)
            and arch in rule["trtllm_moe_archs"]
            and f["moe_a2a_backend"] == "none"
            and version <= Version(rule["trtllm_moe_off_until"])
        )
        off = trtllm_moe or _piecewise_off(f, model, cluster, version, rule)
        if version <= Version(rule["speculative_off_until"]) and f.get("speculative_algorithm"):
            off = True
        # --enforce-piecewise-cuda-graph skips every check, --disable-piecewise-cuda-graph's too; not the runner's
        on = bool(f.get("enforce_piecewise_cuda_graph")) or not (f.get("disable_piecewise_cuda_graph") or off)
        on = on and not _eagle_target(f, version, rule)
    if not on:
        return 0
    if f.get("piecewise_cuda_graph_max_tokens"):
        return f["piecewise_cuda_graph_max_tokens"]
    default = flag_table("sglang").since(rule["piecewise_max_tokens"], version)
    if model.attention.kind == "mla" and "mla" in default:
        return default["mla"]
    return f["chunked_prefill_size"] if default["tokens"] == "chunk" else default["tokens"]


def prefill_backend(
    f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version, *, trtllm_mla_rule: bool = True
) -> str:
    """The prefill graph backend of 0.5.14 and later: tc_piecewise, breakable, full or disabled. A backend the
    command chose is kept as chosen; the default is checked against what it cannot run with. `trtllm_mla_rule`
    False: as the configuration stands before DeepSeek-V3's trtllm_mla check (where 0.5.23 sizes its memory)."""
    rule = flag_table("sglang").prefill_graph
    if f["moe_a2a_backend"].startswith("deepep") and f["deepep_mode"] == "normal":
        return "disabled"  # DeepEP's normal mode runs no graph, whatever was chosen
    if f.get("enable_prefill_cp") and model.attention.kind == "mla":
        return "disabled"  # prefill context parallelism of an MLA model runs no prefill graph, whatever was chosen
    chosen = _chosen_backend(f)
    if chosen is not None:
        return "disabled" if _eagle_target(f, version, rule, chosen) else chosen
    if cluster.gpu.vendor != "nvidia":  # tc_piecewise's platform check, then (0.5.22) no default off CUDA
        return "disabled"
    backend = "breakable" if version >= Version(rule["breakable_default_since"]) else "tc_piecewise"
    if backend == "breakable" and _takes_tc_piecewise(f, model, version, rule):
        backend = "tc_piecewise"
    if backend == "tc_piecewise":
        off = _piecewise_off(f, model, cluster, version, rule) or (
            model.vision is not None
            and _architecture(model) not in flag_table("sglang").since(rule["tc_multimodal"], version)["archs"]
        )
    else:
        off = _breakable_off(f, model, version, rule)
    if off or _eagle_target(f, version, rule, backend):
        return "disabled"
    if trtllm_mla_rule and version >= Version(rule["trtllm_mla_since"]) and _deepseek_on_trtllm_mla(f, model, cluster):
        return "disabled"
    return backend


def _chosen_backend(f: dict[str, Any]) -> str | None:
    """The backend the command set. --cuda-graph-backend-prefill and its piecewise aliases (0.5.14-0.5.19) write one
    field, where argparse keeps the last given (shardwise takes them in this order), which outranks
    --disable-prefill-cuda-graph, which outranks --disable-cuda-graph (server_args.py _parse_cuda_graph_config)."""
    aliases = (
        ("cuda_graph_backend_prefill", None),
        ("enforce_piecewise_cuda_graph", "tc_piecewise"),
        ("enable_breakable_cuda_graph", "breakable"),
        ("disable_piecewise_cuda_graph", "disabled"),
    )
    for option, backend in aliases:
        if f.get(option):
            return backend or f[option]
    if f.get("disable_prefill_cuda_graph") or f.get("disable_cuda_graph"):  # the global switch sets both phases
        return "disabled"
    return None


def _eagle_target(f: dict[str, Any], version: Version, rule: dict[str, Any], backend: str = "tc_piecewise") -> bool:
    """Whether the target of this speculative algorithm prefills eagerly under `backend`: its drafter reads every
    hidden state of the prefill, which the piecewise graph does not record (0.5.12-0.5.13 at each step, whatever
    enforced it: piecewise_cuda_graph_runner.py; DFLASH's target too through 0.5.13), and from 0.5.14 the runner
    skips the graph for an EAGLE-style target unless it is breakable (model_runner.py / cuda_graph_setup.py
    init_prefill_cuda_graph; from 0.5.19 for tc_piecewise only)."""
    algorithm = f.get("speculative_algorithm")
    if version < Version(rule["eagle_target_eager_since"]) or f.get("enable_return_hidden_states"):
        return False
    if version < Version(rule["backends_since"]):
        return algorithm in rule["eagle_targets"] or algorithm in rule["hidden_state_targets_until_0513"]
    if algorithm not in rule["eagle_targets"]:
        return False
    if version < Version(rule["eagle_skip_tc_only_since"]):
        return backend != "breakable"
    return backend == "tc_piecewise"


def _takes_tc_piecewise(f: dict[str, Any], model: ModelSpec, version: Version, rule: dict[str, Any]) -> bool:
    """0.5.16-0.5.21: a multimodal model validated under tc_piecewise runs that instead of the breakable default
    (from 0.5.18 only one not validated under breakable, and not on trtllm_mla attention)."""
    first, last = rule["tc_switch"]
    if model.vision is None or not Version(first) <= version <= Version(last):
        return False
    arch = _architecture(model)
    if arch not in flag_table("sglang").since(rule["tc_multimodal"], version)["archs"]:
        return False
    if version >= Version(rule["tc_switch_breakable_kept_since"]):
        # the prefill attention backend as the command gives it: model defaults come after this check
        given = f.get("prefill_attention_backend") or f.get("attention_backend")
        return (
            arch not in flag_table("sglang").since(rule["breakable_multimodal"], version)["archs"]
            and given != "trtllm_mla"
        )
    return True


def _breakable_off(f: dict[str, Any], model: ModelSpec, version: Version, rule: dict[str, Any]) -> bool:
    """Whether the default breakable graph turns itself off for this configuration (0.5.15 on)."""
    checks = {
        "mla": model.attention.kind == "mla",
        "attn_dp": f["attn_dp_size"] > 1,
        "attn_cp": f["attn_cp_size"] > 1,
        "any_a2a": f["moe_a2a_backend"] != "none",
        "other_a2a": f["moe_a2a_backend"] not in rule["breakable_a2a"],
        "dcp": f["dcp_size"] > 1,
        "two_batch_overlap": bool(f.get("enable_two_batch_overlap")),
        "pp": f["pp_size"] > 1,
    }
    for check, (first, last) in rule["breakable_off"].items():
        if checks[check] and Version(first) <= version and (last is None or version <= Version(last)):
            return True
    arch = _architecture(model)
    if (
        model.vision is not None
        and arch not in flag_table("sglang").since(rule["breakable_multimodal"], version)["archs"]
    ):
        return True
    return arch in rule["breakable_off_archs"]


def _backend_max_tokens(f: dict[str, Any], model: ModelSpec, version: Version, rule: dict[str, Any]) -> int:
    """The largest prefill step captured: --cuda-graph-max-bs-prefill, else the chunked prefill size (each
    attention-DP rank's share of it, as `f` holds it; none when prefills are not chunked), 2048 for an MLA model,
    from 0.5.16 no more than that share with attention DP, from 0.5.23 8192 at most; from 0.5.19 a pipeline's
    8192 at most (arg_groups/memory_hook.py)."""
    if f.get("piecewise_cuda_graph_max_tokens"):
        return f["piecewise_cuda_graph_max_tokens"]
    chunk = f["chunked_prefill_size"]
    if model.attention.kind != "mla":
        tokens = max(chunk, 0)
    else:
        limit = flag_table("sglang").since(rule["max_tokens"], version)
        mla = limit["mla"]
        capped = limit.get("chunk_caps_mla", False) or (
            version >= Version(rule["attn_dp_share_since"]) and f["attn_dp_size"] > 1
        )
        tokens = max(min(mla, chunk), 0) if capped else mla
    if f["pp_size"] > 1 and version >= Version(rule["pp_max_tokens_since"]):
        tokens = min(tokens, rule["pp_max_tokens"])
    return tokens


def _piecewise_off(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version, rule) -> bool:
    """Whether the default piecewise graph turns itself off for this configuration (0.5.10-0.5.14; a multimodal
    model off too through 0.5.13)."""
    return (
        cluster.gpu.vendor != "nvidia"
        or any(f.get(option) for option in rule["off_with"])
        or f["attn_dp_size"] > 1
        or f["pp_size"] > 1
        or f["attn_cp_size"] > 1
        or f["moe_a2a_backend"] != "none"
        or (f["dcp_size"] > 1 and version >= Version(rule["tc_dcp_since"]))
        or (model.vision is not None and version < Version(rule["backends_since"]))
        or _architecture(model) in flag_table("sglang").since(rule["off_archs"], version)["archs"]
    )


def _deepseek_on_trtllm_mla(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec) -> bool:
    """DeepSeek-V3's architecture prefilling on trtllm_mla attention: asked for, or SM100's own choice for it when no
    attention backend is given (arg_groups/model_overrides/deepseek_v2.py)."""
    rule = flag_table("sglang").prefill_graph
    if _architecture(model) not in rule["trtllm_mla_archs"]:
        return False
    given = f.get("prefill_attention_backend") or f.get("attention_backend")
    if given:
        return given == "trtllm_mla"
    return _sm100(cluster) and not f.get("decode_attention_backend")


def _architecture(model: ModelSpec) -> str:
    return model.wrapper_architecture or model.architecture  # the first of the checkpoint's config, as SGLang reads


def _sm100(cluster: ClusterSpec) -> bool:
    return cluster.gpu.compute_capability.value.startswith("10.")
