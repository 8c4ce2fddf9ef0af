"""SGLang: flags → effective configuration (with SGLang's silent rewrites) → checks → Layout, and back.

In SGLang `--tp-size` is the GPU count of one pipeline stage; EP, attention DP, attention CP, MoE DP and
DCP are carved out of it and add no GPUs. GPUs used = dp (replicas) × tp × pp.
"""

from __future__ import annotations

from functools import cache
from itertools import product
from typing import Any, ClassVar

from packaging.version import Version

from shardwise.engines.base import BenchLoad, Note, Rule, divisors, register_engine
from shardwise.engines.flag_engine import FlagEngine
from shardwise.engines.flags import HEAD_IP, flag_table, head_port
from shardwise.engines.layout import EngineOptions, Layout, SchedulerPolicy, SpecDecode
from shardwise.engines.sglang_graphs import prefill_graph_tokens
from shardwise.engines.sglang_memory import attn_dp_padding_mib, auto_mem_fraction, prefill_graph_on, vlm_factor
from shardwise.engines.sglang_rules import A2A_EP_SPANNING, EAGLE_FAMILY, EAGLE_WORKER, RULES, spec_handler
from shardwise.engines.sglang_state import state_pool
from shardwise.engines.sglang_support import mla_decode_backend
from shardwise.engines.sglang_swa import window_pool
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec

# how each of SGLang's speculative algorithms drafts (speculative/spec_info.py SpeculativeAlgorithm)
DRAFT_KINDS = {
    **dict.fromkeys(EAGLE_FAMILY, "eagle"),
    "STANDALONE": "draft_model",
    "DFLASH": "block",
    "DSPARK": "block",
    "NGRAM": "lookup",
}

V0521, V0522, V0523 = Version("0.5.21"), Version("0.5.22"), Version("0.5.23")
V055, V057, V058, V0511, V0513, V0514 = (Version(v) for v in ("0.5.5", "0.5.7", "0.5.8", "0.5.11", "0.5.13", "0.5.14"))


def memory_tier(table_tiers: tuple[dict[str, Any], ...], cluster: ClusterSpec, version: Version) -> dict[str, Any]:
    """SGLang's defaults by GPU size (the smallest GPU's nvidia-smi memory.total)."""
    gib = cluster.gpu.memory_bytes / 2**30
    tier = next(t for t in table_tiers if gib < float(t["below_gib"]))
    older = tier.get("older")
    if older and version <= Version(older["until"]):
        tier = {**tier, **older}
    return tier


def _attention_dp(f: dict[str, Any], version: Version) -> list[Note]:
    if not f.pop("enable_dp_attention", False):
        return []
    n = f["dp_size"]
    f["attn_dp_size"], f["dp_size"] = n, 1
    deprecated = version >= V0522
    return [
        Note(
            kind="deprecated" if deprecated else "rewrite",
            message=f"--dp-size {n} --enable-dp-attention means attention DP {n} inside tp, not {n} replicas"
            + ("; the spelling is deprecated, use --attn-dp-size" if deprecated else ""),
            source=f"sglang {version} arg_groups/parallel_hook.py handle_deprecated_dp_attention",
        )
    ]


def _dp_lm_head(f: dict[str, Any], version: Version) -> list[Note]:
    """With one DP rank (replicas × attention-DP groups) the flag is turned off; with replicas but no attention DP
    it stays on and the engine refuses it (rule dp_lm_head_needs_attn_dp)."""
    if not f.get("enable_dp_lm_head") or f["dp_size"] * f["attn_dp_size"] > 1:
        return []
    f["enable_dp_lm_head"] = False
    return [
        Note(
            kind="rewrite",
            message="--enable-dp-lm-head is turned off: without attention DP there is one DP rank",
            source=f"sglang {version} arg_groups/overrides.py _data_parallelism_defaults",
        )
    ]


def _moe_backend(f: dict[str, Any], version: Version) -> list[Note]:
    notes = []
    if f.get("enable_ep_moe") and f["ep_size"] != f["tp_size"]:
        notes.append(
            Note(
                kind="rewrite",
                message=f"the deprecated --enable-ep-moe sets ep {f['ep_size']} to the tensor parallel size "
                f"{f['tp_size']}",
                source="sglang 0.5.2 server_args.py ServerArgs.__post_init__",
            )
        )
        f["ep_size"] = f["tp_size"]
    if f["moe_a2a_backend"] in A2A_EP_SPANNING and f["ep_size"] != f["tp_size"]:
        notes.append(
            Note(
                kind="rewrite",
                message=f"--moe-a2a-backend {f['moe_a2a_backend']} sets ep {f['ep_size']} "
                f"to the tensor parallel size {f['tp_size']}",
                source=f"sglang {version} _a2a_ep_size",
            )
        )
        f["ep_size"] = f["tp_size"]
    if f.get("enable_eplb"):
        algorithm = "dynamic" if f["moe_a2a_backend"] == "none" else "static"
        notes.append(
            Note(
                kind="rewrite",
                message=f"--enable-eplb records expert statistics and dispatches with the '{algorithm}' algorithm",
                source=f"sglang {version} handle_eplb_and_dispatch",
            )
        )
    return notes


def _cuda_graph(f: dict[str, Any], tier: dict[str, Any], version: Version) -> list[Note]:
    notes = []
    # the decode backend as chosen, else --disable-decode-cuda-graph, else --disable-cuda-graph (both phases)
    decode = f.pop("cuda_graph_backend_decode", None)
    if decode is None:
        off = f.pop("disable_decode_cuda_graph", False) or f.get("disable_cuda_graph")
        decode = "disabled" if off else "full"
    on = decode != "disabled"
    if on and f["moe_a2a_backend"].startswith("deepep") and f["deepep_mode"] == "normal":
        on = False
        notes.append(
            Note(
                kind="rewrite",
                message="--deepep-mode normal turns CUDA graphs off",
                source=f"sglang {version} handle_a2a_moe",
            )
        )
    f["cuda_graph"] = on
    # the decode graph's max batch is sized whether or not graphs run: the attention-DP reserve reads it
    # (memory_hook.py handle_gpu_memory_settings, reserve_for_graph_mb)
    if f.get("cuda_graph_max_bs") is None:
        f["cuda_graph_max_bs"] = tier["cuda_graph_max_bs"][0 if f["tp_size"] < 4 else 1]
        if version >= V0523 and f.get("max_running_requests"):
            f["cuda_graph_max_bs"] = min(f["cuda_graph_max_bs"], f["max_running_requests"])
    return notes


def _scheduling(f: dict[str, Any], tier: dict[str, Any], version: Version) -> list[Note]:
    notes = []
    if f.get("chunked_prefill_size") is None:
        f["chunked_prefill_size"] = tier["chunked_prefill_size"]
    f["chunked_prefill_undivided"] = f["chunked_prefill_size"]  # the memory rule reads it before the DP split
    if f["attn_dp_size"] > 1:
        f["chunked_prefill_size"] //= f["attn_dp_size"]  # -1 (chunking off) stays -1
    if f["attn_dp_size"] > 1 and f["chunked_prefill_size"] > 0:
        notes.append(
            Note(
                kind="rewrite",
                message=f"attention DP divides the chunked-prefill size by "
                f"{f['attn_dp_size']}, to {f['chunked_prefill_size']} tokens per rank",
                source=f"sglang {version} handle_data_parallelism",
            )
        )
    if f["pp_size"] > 1:
        notes.append(
            Note(
                kind="rewrite",
                message="pipeline parallelism turns the overlap scheduler off",
                source=f"sglang {version} _pipeline_parallel_overlap_disable",
            )
        )
    return notes


# the architectures SGLang drafts 5 steps of a top-4 tree (8 draft tokens) for when none of the three is given; every
# other takes a chain of 3 (server_args.py auto_choose_speculative_params; arg_groups/speculative_hook.py
# _auto_choose_speculative_params from 0.5.13)
WIDE_TREE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})


def _speculative(f: dict[str, Any], version: Version, model: ModelSpec) -> list[Note]:
    algorithm = f.get("speculative_algorithm")
    notes: list[Note] = []
    if algorithm == "NEXTN":
        f["speculative_algorithm"] = algorithm = "EAGLE"
        notes.append(Note(kind="rewrite", message="NEXTN is an alias of EAGLE", source=f"sglang {version} spec_info"))
    chosen = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    if algorithm in EAGLE_WORKER and all(f.get(k) is None for k in chosen):
        architecture = model.wrapper_architecture or model.architecture  # hf_config.architectures[0]
        wide = algorithm != "STANDALONE" and architecture in WIDE_TREE_ARCHITECTURES
        f.update(zip(chosen, (5, 4, 8) if wide else (3, 1, 4), strict=True))
        notes.append(
            Note(
                kind="rewrite",
                message=f"{algorithm} without steps, top-k or draft tokens drafts "
                f"{f['speculative_num_steps']} steps, top-{f['speculative_eagle_topk']}, "
                f"{f['speculative_num_draft_tokens']} draft tokens",
                source=f"sglang {version} {spec_handler(algorithm, version)} (auto_choose_speculative_params)",
            )
        )
    if algorithm in DRAFT_KINDS and f.get("max_running_requests") is None:  # each of their handlers (not UNO's)
        f["max_running_requests"] = 48
        notes.append(
            Note(
                kind="rewrite",
                message="speculative decoding caps max running requests at 48 when unset",
                source=f"sglang {version} _handle_eagle_family, _handle_ngram, _handle_dflash",
            )
        )
    if algorithm in EAGLE_FAMILY and f.get("speculative_eagle_topk") == 1 and f.get("speculative_num_steps"):
        f["speculative_num_draft_tokens"] = f["speculative_num_steps"] + 1
    if algorithm == "DFLASH":
        f.update(
            speculative_num_steps=1,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=f.get("speculative_dflash_block_size"),
        )
    if algorithm:
        f["enable_mixed_chunk"] = False
        overlap, why = _spec_overlap(f, algorithm, version)
        if overlap is not None:
            f["disable_overlap_schedule"] = not overlap
        if not f.get("disable_overlap_schedule"):
            how = "under the overlap scheduler (spec v2)"
        elif version >= V0514 or (version >= V0513 and algorithm in EAGLE_WORKER):
            how = f"without the overlap scheduler (spec v2's synchronous path{why})"
        else:
            how = f"without the overlap scheduler (spec v1{why})"
        message = f"speculative decoding runs {how}; mixed chunked prefill off"
        source = f"sglang {version} {spec_handler(algorithm, version)}"
        notes.append(Note(kind="rewrite", message=message, source=source))
    return notes


def _spec_overlap(f: dict[str, Any], algorithm: str, version: Version) -> tuple[bool | None, str]:
    """Whether SGLang keeps its overlap scheduler with this speculative algorithm (None: as the command set it), and
    why not. `spec_v2_env` is SGLANG_ENABLE_SPEC_V2 as the environment sets it (None: unset).
    - before 0.5.5: never (0.5.4's --enable-beta-spec is not read);
    - 0.5.5-0.5.10, the variable off by default: set, EAGLE forces it on (0.5.5-0.5.6; EAGLE3 and STANDALONE keep
      the command's), EAGLE and EAGLE3 (0.5.7), and STANDALONE (0.5.8-0.5.10); anything else turns it off;
    - 0.5.11-0.5.13, the variable on by default: the EAGLE family keeps the command's unless the variable is off or,
      before 0.5.13, top-k is above 1; DFLASH, NGRAM and Frozen-KV MTP turn it off;
    - from 0.5.14 the variable is gone and every algorithm keeps the command's."""
    env, topk = f.get("spec_v2_env"), f.get("speculative_eagle_topk") or 1
    if version >= V0514:
        return None, ""
    if version >= V0511:
        if algorithm in EAGLE_WORKER:
            if env is False:
                return False, ": SGLANG_ENABLE_SPEC_V2 is off"
            if topk > 1 and version < V0513:
                return False, ": spec v2 takes top-k 1 only"
            return None, ""
        return False, f": {algorithm} has no spec v2 in this release"
    if version >= V055 and env:
        forced = {"EAGLE"} if version < V057 else {"EAGLE", "EAGLE3"} if version < V058 else EAGLE_WORKER
        if algorithm in forced:
            return True, ""
        if version < V057 and algorithm in EAGLE_WORKER:
            return None, ""
    reason = ": SGLANG_ENABLE_SPEC_V2 is not set" if version >= V055 else ""
    return False, reason


def _memory(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> list[Note]:
    f["prefill_cuda_graph"] = prefill_graph_on(f, model, cluster, version)
    if f.get("mem_fraction_static") is not None:
        return []
    gpu_mem_mib = cluster.gpu.memory_bytes / 2**20
    multimodal = model.vision is not None and not f.get("language_model_only")
    fraction, reserved = auto_mem_fraction(f, model=model, gpu_mem_mib=gpu_mem_mib, version=version)
    f["mem_fraction_static"] = fraction
    vlm = f" × {vlm_factor(model):.4f} for a multimodal model" if multimodal else ""
    return [
        Note(
            kind="rewrite",
            message=f"--mem-fraction-static defaults to {fraction:.3f}: ({gpu_mem_mib:,.0f} − "
            f"{reserved:,.0f} MiB reserved for activations, CUDA graphs and slack) / {gpu_mem_mib:,.0f} MiB{vlm}",
            source=f"sglang {version} arg_groups/memory_hook.py handle_gpu_memory_settings",
        )
    ]


def _allreduce_fusion(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> list[Note]:
    """Whether each all-reduce runs fused with the residual add and RMSNorm after it (FlashInfer's kernel), as
    sglang.yaml's `allreduce_fusion` says: on by its flags or by itself, off by the switches that win over both; it
    runs only on SM90 / SM100 GPUs with TP > 1 and no attention DP, on steps of up to `max_tokens` tokens."""
    rule = flag_table("sglang").allreduce_fusion
    arch = model.wrapper_architecture or model.architecture
    capability = cluster.gpu.compute_capability.value
    auto = {a: e["capabilities"] for e in rule["auto"] if version >= Version(e["since"]) for a in e["archs"]}
    f["allreduce_norm_fusion_tokens"] = 0
    if f.get("enforce_disable_flashinfer_allreduce_fusion") or (
        f.get("enable_deterministic_inference") and version >= Version(rule["off_by_deterministic_since"])
    ):
        return []
    runs = capability in rule["capabilities"] and f["tp_size"] > 1 and f["attn_dp_size"] == 1
    fuses = arch in auto or version >= Version(rule["every_model_since"])  # the model's layers fuse at all
    notes = []
    on = bool(f.get("enable_flashinfer_allreduce_fusion") or f.get("flashinfer_allreduce_fusion_backend"))
    if not on and capability in auto.get(arch, ()) and runs:
        checked = version >= Version(rule["auto_checks_since"])  # the switch also asks for one node, no all-to-all
        nodes_ok = f.get("nnodes", 1) == 1 or (
            version >= Version(rule["multi_node_sm100_since"]) and capability.startswith("10.")
        )
        on = not checked or (nodes_ok and f["moe_a2a_backend"] == "none")
        if on:
            notes.append(
                Note(
                    kind="rewrite",
                    message=f"all-reduces run fused with the residual add and RMSNorm after them (FlashInfer), on "
                    f"by itself for {arch} on this GPU",
                    source=f"sglang {version} "
                    + (
                        "arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable"
                        if version >= Version(rule["multi_node_sm100_since"])
                        else "server_args.py _handle_model_specific_adjustments"
                    ),
                )
            )
    if on and runs and fuses:
        f["allreduce_norm_fusion_tokens"] = rule["max_tokens"]
    return notes


def effective_flags(f: dict[str, Any], *, version: Version, cluster: ClusterSpec, model: ModelSpec) -> list[Note]:
    """The configuration SGLang runs: its silent rewrites applied to `f` (its defaults with the command's options over
    them), each with a note."""
    table = flag_table("sglang")
    f.setdefault("attn_dp_size", 1)
    tier = memory_tier(table.memory_tiers, cluster, version)
    notes = [
        *_attention_dp(f, version),
        *_dp_lm_head(f, version),
        *_moe_backend(f, version),
        *_cuda_graph(f, tier, version),
        *_scheduling(f, tier, version),
        *_speculative(f, version, model),
    ]
    notes += _sparse_attention(f, model, cluster, version)
    notes += _memory(f, model, cluster, version)
    notes += _allreduce_fusion(f, model, cluster, version)
    f["prefill_graph_tokens"] = prefill_graph_tokens(f, model, cluster, version)
    return notes


def _sparse_attention(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> list[Note]:
    """DeepSeek Sparse Attention on CUDA: 64-token pages, the KV dtype an unset --kv-cache-dtype resolves to, and
    whether an FP8 cache keeps its scaled latent layout (data: sparse_attention)."""
    capability = cluster.gpu.compute_capability.value
    if model.attention.sparse is None or capability.startswith("gfx"):
        return []
    table, notes = flag_table("sglang"), []
    rule = table.sparse_attention
    source = f"sglang {version} arg_groups/model_overrides/deepseek_v2.py, arg_groups/overrides.py"
    if f["page_size"] != rule["page_size"]:
        f["page_size"] = rule["page_size"]
        notes.append(
            Note(kind="rewrite", message=f"sparse attention pages by {rule['page_size']} tokens", source=source)
        )
    if f["kv_cache_dtype"] == "auto":
        fp8 = int(capability.split(".")[0]) >= rule["fp8_from_major"]
        f["kv_cache_dtype"] = "fp8_e4m3" if fp8 else "bfloat16"
        notes.append(
            Note(kind="rewrite", message=f"sparse attention caches in {f['kv_cache_dtype']} here", source=source)
        )
    release = table.since(rule["releases"], version)
    archs = release["scaled"].get(capability, ())
    scaled = "*" in archs or (model.wrapper_architecture or model.architecture) in archs
    f["kv_layout_scaled"] = f["kv_cache_dtype"].startswith("fp8") and scaled
    f["index_keys_every_layer"] = release["index_keys_every_layer"]
    return notes


def layout_of(f: dict[str, Any], model: ModelSpec, version: Version) -> Layout:
    """The engine-neutral placement of an effective SGLang configuration."""
    tp, spanning = f["tp_size"], f["moe_a2a_backend"] in A2A_EP_SPANNING
    attn_tp = tp // f["attn_dp_size"] // f["attn_cp_size"]
    spec = None
    if f.get("speculative_algorithm"):
        spec = SpecDecode(
            algorithm=f["speculative_algorithm"],
            kind=DRAFT_KINDS.get(f["speculative_algorithm"]),
            num_steps=f.get("speculative_num_steps"),
            num_draft_tokens=f.get("speculative_num_draft_tokens"),
            topk=f.get("speculative_eagle_topk"),
            draft_model=f.get("speculative_draft_model_path"),
        )
    chunk = f["chunked_prefill_size"] if f["chunked_prefill_size"] > 0 else None  # <= 0: chunked prefill off
    windows = window_pool(f, model)
    states, no_overlap = state_pool(f, model, version)
    options = EngineOptions(
        cuda_graph=f["cuda_graph"],
        cuda_graph_max_bs=f["cuda_graph_max_bs"] if f["cuda_graph"] else None,
        two_batch_overlap=bool(f.get("enable_two_batch_overlap")),
        overlap_schedule=not f.get("disable_overlap_schedule") and f["pp_size"] == 1 and not no_overlap,
        eplb=bool(f.get("enable_eplb")),
        allreduce_norm_fusion_tokens=f.get("allreduce_norm_fusion_tokens", 0),
        kv_cache_dtype=_kv_dtype(f),
        chunked_prefill_tokens=chunk,
        max_running_requests=(
            max(1, f["max_running_requests"] // f["attn_dp_size"]) if f.get("max_running_requests") else None
        ),  # SGLang's limit is split per DP rank
        memory_fraction=f.get("mem_fraction_static"),
        fraction_reserve_bytes=attn_dp_padding_mib(f) * 2**20,
        fraction_scale=vlm_factor(model) if not f.get("language_model_only") else 1.0,
        memory_fraction_of="free_at_start",
        prefill_cuda_graph=bool(f.get("prefill_cuda_graph")),
        prefill_graph_tokens=f.get("prefill_graph_tokens", 0),
        page_size=f["page_size"],
        window_pool=windows,
        state_pool=states,
        index_keys_every_layer=bool(f.get("index_keys_every_layer")),
        spec=spec,
        scheduler=_scheduler(
            mixed_batches=bool(f.get("enable_mixed_chunk")) and chunk is not None,  # needs chunked prefill
            poll_decode_steps=max(1, f["scheduler_recv_interval"]),
            max_prefill_tokens=f["max_prefill_tokens"],
            whole_prompts=(version < V0513 or chunk is None) and not f.get("disable_radix_cache"),
            budget_first=version >= V0523,
            holds_whole_output=version >= V0522,
            admits_to_length=bool(f.get("disable_radix_cache")) and windows is None,
            admission_page_tokens=f["page_size"] if version >= V0521 else 0,
        ),
    )
    return Layout(
        engine="sglang",
        version=str(version),
        replicas=f["dp_size"],
        pp=f["pp_size"],
        stage_gpus=tp,
        attn_dp=f["attn_dp_size"],
        attn_cp=f["attn_cp_size"],
        dcp=f["dcp_size"],
        **_dcp_comm(f),
        moe_dp=f["moe_dp_size"],
        moe_ep=f["ep_size"],
        dense_tp=1 if f.get("moe_dense_tp_size") == 1 else tp,
        shared_tp=1 if spanning else tp,
        lm_head_tp=attn_tp if f.get("enable_dp_lm_head") else tp,
        redundant_experts=f["ep_num_redundant_experts"],
        moe_comm="all2all" if spanning else "allreduce",
        a2a_backend=f["moe_a2a_backend"],
        options=options,
    )


def _kv_dtype(f: dict[str, Any]) -> str | None:
    """The KV cache's element layout: the flag's, the scaled FP8 latents of sparse attention, or None for auto."""
    if f.get("kv_layout_scaled"):
        return "fp8_ds_mla"
    return None if f["kv_cache_dtype"] == "auto" else f["kv_cache_dtype"]


@cache
def _scheduler(**own: Any) -> SchedulerPolicy:
    """SGLang's scheduler policy: the release's table with this command's settings (`SchedulerPolicy`'s fields), one
    object per setting for every layout (a search holds thousands)."""
    return SchedulerPolicy(**{**flag_table("sglang").scheduler, **own})


def _dcp_comm(f: dict[str, Any]) -> dict[str, Any]:
    """How DCP ranks combine their partial outputs. Unset, with DCP, SGLang picks an all-to-all on CUDA and ROCm
    (FlashInfer's on SM100 where the DCP group fits in a node's TP ranks; an all-to-all either way); its
    all-gather/reduce-scatter path casts the partials to FP32 (0.5.23 arg_groups/overrides.py
    _dcp_comm_backend_default; layers/dcp/comm.py cp_lse_ag_out_rs_mla)."""
    backend = f.get("dcp_comm_backend") or ("a2a" if f["dcp_size"] > 1 else "ag_rs")
    ag_rs = backend == "ag_rs"
    return {
        "dcp_comm": "ag_rs" if ag_rs else "a2a",
        "dcp_partial_bytes": 4 if ag_rs else 2,
        "dcp_q_replicate": bool(f.get("dcp_replicate_q_proj")),
    }


@register_engine("sglang")
class SGLang(FlagEngine):
    display: ClassVar[str] = "SGLang"
    prog: ClassVar[str] = "sglang serve"  # server_args.py prepare_server_args: ArgumentParser(prog="sglang serve")
    parser_source: ClassVar[str] = "server_args.py (argparse, allow_abbrev on)"
    rules: ClassVar[list[Rule]] = RULES

    def parser_name(self, version: Version, message: str) -> str:
        """0.5.14 named the parser; before, argparse took the script's name (python -m sglang.launch_server)."""
        return self.prog if version >= Version("0.5.14") else "launch_server.py"

    kv_budget: ClassVar[str] = "of_total"  # mem_fraction_static × the GPU's memory at start-up
    option_variants: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = (
        ("CUDA graphs off", {"disable_cuda_graph": True}),
        ("FP8 KV cache", {"kv_cache_dtype": "fp8_e4m3"}),
    )
    what_if_options: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = (
        ("two-batch overlap", {"enable_two_batch_overlap": True}),
        ("DeepEP all-to-all", {"moe_a2a_backend": "deepep"}),
        ("DeepEP all-to-all, two-batch overlap", {"moe_a2a_backend": "deepep", "enable_two_batch_overlap": True}),
    )
    memory_fraction_option: ClassVar[str | None] = "mem_fraction_static"

    effective = staticmethod(effective_flags)

    def env_options(self, env: dict[str, str]) -> dict[str, Any]:
        """SGLANG_ENABLE_SPEC_V2 as SGLang reads it (environ.py EnvBool: a value it cannot read is the default)."""
        value = env.get("SGLANG_ENABLE_SPEC_V2", "").lower()
        on = {"true": True, "1": True, "yes": True, "y": True, "false": False, "0": False, "no": False, "n": False}
        return {"spec_v2_env": on[value]} if value in on else {}

    def launch_env(self, flags: dict[str, Any]) -> list[str]:
        """The variables `env_options` read, as the command must set them again."""
        on = flags.get("spec_v2_env")
        return [] if on is None else [f"SGLANG_ENABLE_SPEC_V2={int(on)}"]

    layout = staticmethod(layout_of)

    def gpus_used(self, flags: dict[str, Any]) -> int:
        return flags["dp_size"] * flags["tp_size"] * flags["pp_size"]

    def nodes(self, flags: dict[str, Any], cluster: ClusterSpec) -> int:
        return flags.get("nnodes", 1)

    def read(self, given: dict[str, Any]) -> dict[str, Any]:
        given.pop("model_path", None)
        return given

    def idle_note(self, flags: dict[str, Any], used: int, available: int) -> str:
        return (
            f"uses {used} of {available} GPUs (dp × tp × pp = {flags['dp_size']} × {flags['tp_size']} × "
            f"{flags['pp_size']}); EP and attention DP are carved out of tp and add no GPUs"
        )

    def render_values(self, given: dict[str, Any], version: Version) -> dict[str, Any]:
        values = dict(given)
        if version < V0522 and values.get("attn_dp_size", 1) > 1:
            values["dp_size"], values["enable_dp_attention"] = values.pop("attn_dp_size"), True
        return values

    def candidates(self, model: ModelSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
        return _candidates(model, cluster)

    def benchmark_command(self, load: BenchLoad, *, model_ref: str) -> list[str]:
        """sglang.bench_serving: ShareGPT, or random lengths (range ratio 1 for fixed: its default 0 draws lengths
        from 1 up); its default rate is inf and it has no cap unless given."""
        cmd = "python -m sglang.bench_serving --backend sglang --dataset-name".split()
        if load.sharegpt:
            return [*cmd, "sharegpt", *load.sending()]
        ratio = 1.0 if load.range_ratio is None else load.range_ratio
        lengths = ["--random-input-len", str(load.isl), "--random-output-len", str(load.osl)]
        return [*cmd, "random", *lengths, "--random-range-ratio", f"{ratio:g}", *load.sending()]

    def speculative_options(self, algorithm: str, *, draft_model: str | None = None) -> dict[str, Any]:
        """Options that turn on MTP (the checkpoint's own layers, 3 steps) or DFlash drafting."""
        if algorithm == "dflash":
            return {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": draft_model}
        return {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
        }

    def hand_tried(self, model: ModelSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
        """--tp-size with every --ep-size up to the GPUs (MoE models), and one pipeline stage per GPU."""
        n = cluster.num_gpus
        eps = divisors(n) if model.moe else [1]
        out = [{"tp_size": tp, **({"ep_size": ep} if ep > 1 else {})} for tp, ep in product(divisors(n), eps)]
        if 1 < n <= model.num_layers:
            out.append({"tp_size": 1, "pp_size": n})
        return out


def _candidates(model: ModelSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
    """Structural choices, widest stages first: pp, tp (replicas fill the rest), attention DP, EP, dense TP, DCP;
    attention DP and DCP only where the model's SGLang implementation has them (data: `models`)."""
    n = cluster.num_gpus
    support = flag_table("sglang").support(model.architecture, model.wrapper_architecture)
    dcp_ok = flag_table("sglang").mla_dcp_backends
    cuda = not cluster.gpu.compute_capability.value.startswith("gfx")
    out = []
    for pp in (p for p in divisors(n) if p <= model.num_layers):
        for tp in sorted(divisors(n // pp), reverse=True):
            replicas = n // (pp * tp)
            if replicas > 1 and cluster.nodes > 1:
                continue  # replicas are single-node only
            attn_dps = divisors(tp) if replicas == 1 and support.attention_dp else [1]
            eps = divisors(tp) if model.moe else [1]
            denses = [None, 1] if model.layer_mlp.count("dense") and tp > 1 else [None]
            for attn_dp, ep, dense in product(attn_dps, eps, denses):
                dcps = divisors(tp // attn_dp) if model.attention.kind == "mla" and support.mla_dcp else [1]
                for dcp in dcps:
                    capability = cluster.gpu.compute_capability.value
                    backend = mla_decode_backend({}, model, capability, tp) if dcp > 1 else ""
                    given = {
                        "tp_size": tp,
                        "pp_size": pp,
                        "dp_size": replicas,
                        "attn_dp_size": attn_dp,
                        "ep_size": ep,
                        "moe_dense_tp_size": dense,
                        "dcp_size": dcp,
                        # decode CP needs an LSE-returning MLA backend; flashinfer is one wherever it runs
                        "attention_backend": "flashinfer" if backend and backend not in dcp_ok and cuda else None,
                        "nnodes": cluster.nodes,  # the node flags last: the same in every command of a cluster
                        "dist_init_addr": f"{HEAD_IP}:{head_port(50000)}" if cluster.nodes > 1 else None,
                    }
                    defaults = {
                        "pp_size": 1,
                        "dp_size": 1,
                        "attn_dp_size": 1,
                        "ep_size": 1,
                        "dcp_size": 1,
                        "nnodes": 1,
                        "moe_dense_tp_size": None,
                        "dist_init_addr": None,
                        "attention_backend": None,
                    }
                    out.append({k: v for k, v in given.items() if defaults.get(k, object()) != v})
    return out
