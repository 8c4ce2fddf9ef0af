"""vLLM (V1): flags → effective configuration → checks → Layout, and back.

In vLLM, GPUs = dp × pp × tp (× pcp): `-tp` is the attention and dense-layer TP inside one DP rank and
DP ranks add GPUs. MoE layers are sharded over tp × dp (× pcp): by expert with `--enable-expert-parallel`
(EP = tp × dp, no partial EP), else by tensor slices. Each DP rank has its own scheduler and KV cache.
"""

from __future__ import annotations

import json
from functools import cache
from itertools import product
from typing import Any, ClassVar

from packaging.version import Version

from shardwise.engines.base import BenchLoad, Note, Rule, divisors, register_engine
from shardwise.engines.flag_engine import FlagEngine
from shardwise.engines.flags import HEAD_IP, EngineArgError, flag_table
from shardwise.engines.layout import EngineOptions, Layout, SchedulerPolicy, SpecDecode
from shardwise.engines.vllm_rules import RULES, gpus_used
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec

V014 = Version("0.14.0")  # async scheduling on by default from here
A2A_DISPATCH = ("deepep", "mori", "moonep", "nixl", "flashinfer")  # backends that send tokens to their experts
REMOVED_A2A = {"pplx", "naive"}

# how each of vLLM's speculative methods drafts (config/speculative.py SpeculativeConfig.method)
DRAFT_KINDS = {
    "eagle": "eagle",
    "eagle3": "eagle",
    "mtp": "eagle",
    "draft_model": "draft_model",
    "dflash": "block",
    "dspark": "block",
    "ngram": "lookup",
}


def effective_flags(f: dict[str, Any], *, version: Version, cluster: ClusterSpec, model: ModelSpec) -> list[Note]:
    """The configuration vLLM runs: its silent rewrites applied to `f` (its defaults with the command's options over
    them), each with a note."""
    table = flag_table("vllm")
    notes = []
    if f["all2all_backend"] in REMOVED_A2A:
        notes.append(
            Note(
                kind="rewrite",
                message=f"--all2all-backend {f['all2all_backend']} was removed; vLLM falls "
                "back to allgather_reducescatter",
                source=f"vllm {version} config/parallel.py",
            )
        )
        f["all2all_backend"] = "allgather_reducescatter"
    gib = cluster.gpu.memory_bytes / 2**30
    tier = next(t for t in table.memory_tiers if gib < float(t["below_gib"]))
    if cluster.gpu.family in tier.get("not_for_family", ()):
        tier = table.memory_tiers[0]  # these GPUs keep the small defaults
    f.setdefault("max_num_seqs", tier["max_num_seqs"])
    f.setdefault("max_num_batched_tokens", tier["max_num_batched_tokens"])
    if f.get("max_model_len") == -1:
        notes.append(
            Note(
                kind="rewrite",
                message="--max-model-len auto (-1): vLLM fits the longest request to what the KV cache holds",
                source=f"vllm {version} config/model.py _get_and_verify_max_len",
            )
        )
    notes += _sparse_attention(f, model, cluster, version)
    notes += _kv_sizing(f, table.since(table.kv_sizing, version), cluster=cluster, version=version)
    f["cuda_graph"] = not f.get("enforce_eager")
    f["allreduce_norm_fusion_tokens"] = _allreduce_fusion_tokens(f, model, cluster, version)
    datacenter_blackwell = cluster.gpu.compute_capability.value in ("10.0", "10.3")
    f["cuda_graph_max_bs"] = min(f["max_num_seqs"] * 2, 1024 if datacenter_blackwell else 512)
    own = table.support(model.architecture, model.wrapper_architecture)
    capped = min(own.cuda_graph_max_bs or 0, f["max_num_batched_tokens"])  # capture sizes stay within the budget
    if own.cuda_graph_max_bs is not None and f["cuda_graph_max_bs"] != capped:
        f["cuda_graph_max_bs"] = capped
        notes.append(
            Note(
                kind="rewrite",
                message=f"{model.architecture} captures CUDA graphs up to batch {capped}",
                source=f"vllm {version} {own.source}",
            )
        )
    if f["pipeline_parallel_size"] > 1 and f["data_parallel_size"] > 1:
        notes.append(Note(kind="warning", message="DP ranks sit outside PP stages: each DP rank is a full pipeline"))
    return notes


def _sparse_attention(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> list[Note]:
    """DeepSeek Sparse Attention: 64-token blocks, the KV dtype an unset --kv-cache-dtype resolves to, and the scaled
    FP8 latent layout (fp8_ds_mla) where the backend takes it (data: sparse_attention)."""
    capability = cluster.gpu.compute_capability.value
    if model.attention.sparse is None or capability.startswith("gfx"):
        return []
    rule, dtype = flag_table("vllm").sparse_attention, f["kv_cache_dtype"]
    f.setdefault("block_size", rule["block_size"])
    glm = (model.wrapper_architecture or model.architecture) in rule["fp8_architectures"]
    if dtype == "auto" and ((glm and capability in rule["fp8_capabilities"]) or model.kv_dtype.startswith("fp8")):
        dtype = "fp8"  # an FP8 checkpoint's cache is FP8 unset, as everywhere here
    scaled = dtype.startswith("fp8") and capability in rule["scaled_fp8_capabilities"]
    if scaled or (dtype == "auto" and capability in rule["scaled_auto_capabilities"]):
        dtype = "fp8_ds_mla"
    if dtype == f["kv_cache_dtype"]:
        return []
    f["kv_cache_dtype"] = dtype
    return [
        Note(
            kind="rewrite",
            message=f"sparse attention caches its latents as {dtype} here",
            source=f"vllm {version} platforms/cuda.py _get_backend_priorities, model_executor/models/config.py",
        )
    ]


def _kv_sizing(f: dict[str, Any], sizing: dict[str, Any], *, cluster: ClusterSpec, version: Version) -> list[Note]:
    """The release's KV sizing: utilization, block size, the null block, and 0.34's extensible cache (its margin
    and granules), which is off where the command fixes the cache's size itself (config/vllm.py
    _resolve_extensible_kv_cache) or turns it off."""
    fixed = f.get("kv_cache_memory_bytes") is not None or f.get("num_gpu_blocks_override") is not None
    extensible = "margin_fraction" in sizing and f.get("enable_extensible_kv_cache") is not False and not fixed
    if f.get("gpu_memory_utilization") is None:
        f["gpu_memory_utilization"] = sizing["default_utilization"] if extensible else 0.92
    f.setdefault("block_size", sizing["default_block_size"])
    f["kv_null_blocks"] = sizing.get("null_blocks", 0)
    if not extensible:
        return []
    rocm = cluster.gpu.vendor == "amd"
    f["kv_margin"] = (
        sizing["margin_floor_gib_rocm" if rocm else "margin_floor_gib"] * 2**30,
        sizing["margin_fraction"],
    )
    f["kv_granule_bytes"] = sizing["granule_mib"] * 2**20
    return [
        Note(
            kind="rewrite",
            message=f"the extensible KV cache is sized after CUDA-graph capture from the memory then free, within "
            f"gpu_memory_utilization {f['gpu_memory_utilization']:g} of the GPU",
            source=f"vllm {version} v1/worker/extensible_kv_cache.py measure_kv_cache_bytes",
        )
    ]


def _allreduce_fusion_tokens(f: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, version: Version) -> int:
    """The most tokens a step may hold for its all-reduces to run fused with the RMSNorm after them (vllm.yaml's
    `allreduce_fusion`); 0: never."""
    rule = flag_table("vllm").allreduce_fusion
    tp = f["tensor_parallel_size"]
    sizes = rule["max_mib"].get(cluster.gpu.compute_capability.value, {})
    if version < Version(rule["since"]) or f.get("enforce_eager") or tp == 1 or tp not in sizes:
        return 0
    row_bytes = model.hidden_size * 2  # one token's bf16 activations (the pass divides by the model dtype's size)
    return min(int(sizes[tp] * 2**20) // row_bytes, f["max_num_batched_tokens"])


def layout_of(f: dict[str, Any], model: ModelSpec, version: Version) -> Layout:
    tp, dp, pcp = f["tensor_parallel_size"], f["data_parallel_size"], f["prefill_context_parallel_size"]
    ep = bool(f.get("enable_expert_parallel")) and model.moe is not None
    lockstep = model.moe is not None  # MoE DP ranks run their expert layers together
    backend = f["all2all_backend"]
    if ep and backend.startswith(A2A_DISPATCH):
        comm = "all2all"
    elif lockstep and dp * pcp > 1:
        comm = "allgather_reducescatter"
    else:
        comm = "allreduce"
    spec = None
    if f.get("speculative_config"):
        cfg = f["speculative_config"]
        method = str(cfg.get("method", "draft_model"))
        drafted, draft_model = cfg.get("num_speculative_tokens"), cfg.get("model")
        if method == "mtp":  # the MTP layers of the checkpoint `model` names (the target's own where unset), not a
            draft_model = None  # second model: config/speculative.py SpeculativeConfig.__post_init__
        kind = DRAFT_KINDS.get(method)
        chain = kind in ("eagle", "draft_model") and drafted  # a drafter forward per drafted token, all verified
        spec = SpecDecode(
            algorithm=method,
            kind=kind,
            num_steps=drafted if chain else None,
            topk=1 if chain else None,
            num_draft_tokens=drafted + 1 if chain else drafted,
            draft_model=draft_model,
        )
    options = EngineOptions(
        cuda_graph=f["cuda_graph"],
        cuda_graph_max_bs=f["cuda_graph_max_bs"] if f["cuda_graph"] else None,
        two_batch_overlap=bool(f.get("enable_dbo")),
        overlap_from_tokens=(f["dbo_decode_token_threshold"], f["dbo_prefill_token_threshold"]),
        eplb=bool(f.get("enable_eplb")),
        allreduce_norm_fusion_tokens=f["allreduce_norm_fusion_tokens"],
        kv_cache_dtype=None if f["kv_cache_dtype"] == "auto" else f["kv_cache_dtype"],
        chunked_prefill_tokens=f["max_num_batched_tokens"],
        max_running_requests=f["max_num_seqs"],
        memory_fraction=f["gpu_memory_utilization"],
        kv_margin=f.get("kv_margin"),
        kv_granule_bytes=f.get("kv_granule_bytes"),
        kv_pool_per_stage=True,  # v1/core/kv_cache_planning.py get_kv_cache_configs: the fewest of any worker
        kv_null_blocks=f.get("kv_null_blocks", 0),
        kv_cache_bytes=f.get("kv_cache_memory_bytes"),
        memory_fraction_of="total",
        activations_in_budget=True,
        max_model_len=None if f.get("max_model_len") == -1 else f.get("max_model_len") or model.max_position_embeddings,
        page_size=f.get("block_size"),
        window_kv=not f.get("disable_hybrid_kv_cache_manager"),
        # the indexer's cache is an MLAAttentionSpec, DCP-sharded like every attention spec (v1/kv_cache_interface.py
        # AttentionSpec.dcp_sharded; model_executor/models/deepseek_v2.py DeepseekV32IndexerCache.get_kv_cache_spec)
        index_keys_sharded=True,
        overlap_schedule=f["async_scheduling"] if f.get("async_scheduling") is not None else version >= V014,
        spec=spec,
        scheduler=_scheduler(),
    )
    world = tp * dp * pcp if lockstep else tp * pcp
    vision_tp = _vision_ways(f, model, tp)
    return Layout(
        engine="vllm",
        version=str(version),
        replicas=1 if lockstep else dp,
        pp=f["pipeline_parallel_size"],
        stage_gpus=world,
        attn_dp=dp if lockstep else 1,
        attn_cp=pcp,
        dcp=f["decode_context_parallel_size"],
        dcp_comm=f.get("dcp_comm_backend") or "ag_rs",  # unset: all-gather + reduce-scatter (config/parallel.py)
        dcp_q_replicate=bool(f.get("dcp_q_replicate")),
        moe_ep=world if ep else 1,
        dense_tp=tp,
        shared_tp=tp,
        lm_head_tp=tp,
        redundant_experts=(f.get("eplb_config") or {}).get("num_redundant_experts", 0),
        vision_tp=vision_tp,
        moe_comm=comm,
        a2a_backend=backend,
        dp_outside_pp=True,
        pp_extra_layers="before_last",
        options=options,
    )


def _vision_ways(f: dict[str, Any], model: ModelSpec, tp: int) -> int:
    """How vLLM places the vision tower: not at all (0) when the language model runs alone or every modality the
    tower serves is limited to 0, split over tp in "weights" mode when its heads divide, else a copy per GPU."""
    if model.vision is None:
        return 1
    modalities = flag_table("vllm").support(model.architecture, model.wrapper_architecture).vision_modalities or ()
    limits = f.get("limit_mm_per_prompt") or {}
    if f.get("language_model_only") or (modalities and all(limits.get(m) == 0 for m in modalities)):
        return 0
    heads = model.vision.num_heads
    if f["mm_encoder_tp_mode"] == "weights" and heads and heads % tp == 0:
        return tp
    return 1


@register_engine("vllm")
class VLLM(FlagEngine):
    display: ClassVar[str] = "vLLM"
    prog: ClassVar[str] = "vllm serve"
    parser_source: ClassVar[str] = "engine/arg_utils.py (argparse)"
    rules: ClassVar[list[Rule]] = RULES
    kv_budget: ClassVar[str] = "of_total"  # gpu_memory_utilization × total memory
    option_variants: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = (
        ("CUDA graphs off", {"enforce_eager": True}),
        ("FP8 KV cache", {"kv_cache_dtype": "fp8"}),
    )
    context_option: ClassVar[str | None] = "max_model_len"  # vLLM refuses a pool shorter than it (kv_cache_utils)
    what_if_options: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = (
        ("DeepEP all-to-all", {"enable_expert_parallel": True, "all2all_backend": "deepep_high_throughput"}),
        (
            "DeepEP all-to-all, dual-batch overlap",
            {"enable_expert_parallel": True, "all2all_backend": "deepep_high_throughput", "enable_dbo": True},
        ),
    )

    effective = staticmethod(effective_flags)
    layout = staticmethod(layout_of)

    def gpus_used(self, flags: dict[str, Any]) -> int:
        return gpus_used(flags)

    def nodes(self, flags: dict[str, Any], cluster: ClusterSpec) -> int:
        """Nodes one launch reaches: --nnodes, or the whole Ray cluster with the Ray executor."""
        return cluster.nodes if flags.get("distributed_executor_backend") == "ray" else flags["nnodes"]

    def node_options(self, given: dict[str, Any], rank: int) -> dict[str, Any]:
        """Node 0 serves the API; the others run the same command --headless (entrypoints/cli/serve.py)."""
        return {**given, "node_rank": rank, **({"headless": True} if rank else {})}

    def read(self, given: dict[str, Any]) -> dict[str, Any]:
        for name in ("speculative_config", "eplb_config", "limit_mm_per_prompt"):
            if name in given:
                given[name] = _json_option(name, given[name])
        given.pop("model_tag", None)
        given.pop("model", None)
        return given

    def parser_name(self, version: Version, message: str) -> str:
        """`vllm serve` is a subcommand: its own options' errors name it, but arguments it does not know are left
        over for the top-level `vllm` parser, which refuses them (argparse parse_args after parse_known_args)."""
        return "vllm" if message.startswith("unrecognized arguments") else self.prog

    def hint(self, message: str, argv: list[str]) -> str:
        if any(a in ("-ep", "--enable-expert-parallel") for a in argv) and "unrecognized arguments" in message:
            return " (--enable-expert-parallel / -ep is a switch, not a size: EP is tp × dp)"
        return ""

    def idle_note(self, flags: dict[str, Any], used: int, available: int) -> str:
        return f"uses {used} of {available} GPUs (dp × pp × tp)"

    def render_values(self, given: dict[str, Any], version: Version) -> dict[str, Any]:
        return {k: (json.dumps(val) if isinstance(val, dict) else val) for k, val in given.items()}

    def candidates(self, model: ModelSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
        """Stage widths tp × dp, widest TP first; EP on and off for MoE models; DCP for MLA models."""
        n, out = cluster.num_gpus, []
        for pp in (p for p in divisors(n) if p <= model.num_layers):
            for tp in sorted(divisors(n // pp), reverse=True):
                dp = n // (pp * tp)
                eps = [False, True] if model.moe else [False]
                dcps = divisors(tp) if model.attention.kind == "mla" else [1]
                for ep, dcp in product(eps, dcps):
                    sizes = {
                        "tensor_parallel_size": tp,
                        "pipeline_parallel_size": pp,
                        "data_parallel_size": dp,
                        "decode_context_parallel_size": dcp,
                    }
                    given: dict[str, Any] = {k: val for k, val in sizes.items() if val > 1}
                    if ep:
                        given["enable_expert_parallel"] = True
                    if cluster.nodes > 1:
                        given.update(nnodes=cluster.nodes, master_addr=HEAD_IP)
                    out.append(given)
        return out

    def hand_tried(self, model: ModelSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
        return _hand_tried(model, cluster)

    def benchmark_command(self, load: BenchLoad, *, model_ref: str) -> list[str]:
        """vllm bench serve: ShareGPT (it needs the file's path), or random lengths (its default range ratio 0 is
        fixed); its default rate is inf and it has no cap unless given."""
        cmd = ["vllm", "bench", "serve", "--model", model_ref, "--dataset-name"]
        if load.sharegpt:
            return [*cmd, "sharegpt", "--dataset-path", "ShareGPT_V3_unfiltered_cleaned_split.json", *load.sending()]
        lengths = ["--random-input-len", str(load.isl), "--random-output-len", str(load.osl)]
        ratio = ["--random-range-ratio", f"{load.range_ratio:g}"] if load.range_ratio else []
        return [*cmd, "random", *lengths, *ratio, *load.sending()]

    def speculative_options(self, algorithm: str, *, draft_model: str | None = None) -> dict[str, Any]:
        """Options that turn on MTP drafting (3 tokens); {} for drafting the rules here do not cover (DFlash)."""
        if algorithm == "dflash":
            return {}
        return {"speculative_config": {"method": "mtp", "num_speculative_tokens": 3}}


def _hand_tried(model: ModelSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
    """-tp up to the GPUs, with and without --enable-expert-parallel (MoE models), and one stage per GPU."""
    n = cluster.num_gpus
    out: list[dict[str, Any]] = []
    for tp, ep in product(divisors(n), [False, True] if model.moe else [False]):
        out.append({"tensor_parallel_size": tp, **({"enable_expert_parallel": True} if ep else {})})
    if 1 < n <= model.num_layers:
        out.append({"pipeline_parallel_size": n})
    return out


def _json_option(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineArgError(f"argument --{name.replace('_', '-')}: invalid JSON: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise EngineArgError(f"argument --{name.replace('_', '-')}: expected a JSON object")
    return value


@cache
def _scheduler() -> SchedulerPolicy:
    """vLLM's scheduler policy (one object for every layout: a search holds thousands)."""
    return SchedulerPolicy(**flag_table("vllm").scheduler)
