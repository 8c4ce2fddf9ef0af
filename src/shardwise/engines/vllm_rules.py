"""vLLM's start-up checks, one small function each, with the error vLLM raises and where.

Sources: the vllm 0.33.0 release wheel (config/model.py, config/parallel.py, config/cache.py,
model_executor/layers/quantization/utils/fp8_utils.py), as collected in shared/reference/frameworks.md §2.
"""

from __future__ import annotations

import math
from typing import Any

from packaging.version import Version

from shardwise.engines.base import Context, Rejection, Rule

V034 = Version("0.34.0")  # the model runner's DBO exclusions
V0110 = Version("0.11.0")  # async scheduling's refusals below, read from the 0.10.2 and 0.11.0 wheels


def moe_world(f: dict[str, Any]) -> int:
    """GPUs the MoE layers of one pipeline stage span: tp × dp × pcp."""
    return f["tensor_parallel_size"] * f["data_parallel_size"] * f["prefill_context_parallel_size"]


def gpus_used(f: dict[str, Any]) -> int:
    return moe_world(f) * f["pipeline_parallel_size"]


def _src(ctx: Context, where: str) -> str:
    return f"vllm {ctx.version} {where}"


def heads_divisible(ctx: Context) -> Rejection | None:
    heads, tp = ctx.model.attention.num_heads, ctx.flags["tensor_parallel_size"]
    if heads % tp == 0:
        return None
    return Rejection(
        rule="heads_divisible",
        reason=f"{heads} attention heads do not split over tp {tp}",
        engine_error=f"ValueError: Total number of attention heads ({heads}) must be divisible by "
        f"tensor parallel size ({tp}).",
        source=_src(ctx, "config/model.py verify_with_parallel_config"),
    )


def kv_heads_split(ctx: Context) -> Rejection | None:
    att, tp = ctx.model.attention, ctx.flags["tensor_parallel_size"]
    kv = att.num_kv_heads
    if att.kind == "mla" or (kv % tp == 0 if kv >= tp else tp % kv == 0):
        return None
    return Rejection(
        rule="kv_heads_split",
        stage="load",
        reason=f"{kv} KV heads neither split over nor replicate onto tp {tp}",
        engine_error="AssertionError: not divisible",
        source=_src(ctx, "model_executor/layers/linear.py QKVParallelLinear"),
    )


def kv_heads_per_rank(ctx: Context) -> Rejection | None:
    """gpt-oss's attention gives each rank num_key_value_heads // tp KV heads, with no replication past one per rank
    as QKVParallelLinear has (models/gpt_oss.py OAIAttention.__init__): past tp = KV heads that is 0, and the
    Attention layer divides its heads by it while the model is built (attention.py: num_heads % num_kv_heads)."""
    att, tp = ctx.model.attention, ctx.flags["tensor_parallel_size"]
    if ctx.model.architecture != "GptOssForCausalLM" or tp <= att.num_kv_heads:
        return None
    return Rejection(
        rule="kv_heads_per_rank",
        stage="load",
        reason=f"gpt-oss gives each rank {att.num_kv_heads} // tp {tp} = 0 KV heads (its attention does not replicate "
        f"them); use tp ≤ {att.num_kv_heads} and data parallelism beyond",
        engine_error="ZeroDivisionError: integer modulo by zero",  # num_heads % 0
        source=_src(ctx, "model_executor/models/gpt_oss.py OAIAttention.__init__ (num_local_key_value_heads)"),
    )


def ep_needs_moe(ctx: Context) -> Rejection | None:
    if not ctx.flags.get("enable_expert_parallel") or ctx.model.moe is not None:
        return None
    return Rejection(
        rule="ep_needs_moe",
        reason=f"--enable-expert-parallel on {ctx.model.name}, which has no experts",
        engine_error="ValueError: Number of experts in the model must be greater than 0 when expert "
        "parallelism is enabled.",
        source=_src(ctx, "config/model.py _verify_with_expert_parallelism"),
    )


def dcp_rules(ctx: Context) -> Rejection | None:
    """ParallelConfig's DCP sizes (config/parallel.py), then ModelConfig's GQA limits (config/model.py
    verify_with_parallel_config): each DCP rank must hold whole KV heads and split each head's queries evenly."""
    f, att = ctx.flags, ctx.model.attention
    dcp, tp, pcp = f["decode_context_parallel_size"], f["tensor_parallel_size"], f["prefill_context_parallel_size"]
    if dcp == 1:
        return None
    checks = [
        (pcp == 1 and tp % dcp != 0, f"tp_size={tp} must be divisible by dcp_size={dcp}.", "config/parallel.py"),
        (
            pcp > 1 and dcp not in (1, pcp, tp * pcp),
            "When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis. "
            f"Got TP={tp}, PCP={pcp}, DCP={dcp}; valid DCP sizes are {sorted({1, pcp, tp * pcp})}.",
            "config/parallel.py",
        ),
    ]
    if att.kind == "gqa":
        kv, q_per_kv = att.num_kv_heads, att.num_heads // att.num_kv_heads
        checks += [
            (
                tp <= kv,
                f"Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` ({tp}) to be "
                f"greater than the model's total number of KV heads ({kv}). Increase `--tensor-parallel-size` or set "
                "`--decode-context-parallel-size 1`.",
                "config/model.py verify_with_parallel_config",
            ),
            (
                tp > kv and dcp > tp // kv,
                f"`--decode-context-parallel-size` ({dcp}) exceeds the maximum supported "
                f"value ({tp // kv}) for `--tensor-parallel-size` ({tp}) and {kv} model KV heads.",
                "config/model.py verify_with_parallel_config",
            ),
            (
                q_per_kv % dcp != 0,
                f"The model's number of query heads per KV head ({q_per_kv}) must be divisible "
                f"by `--decode-context-parallel-size` ({dcp}) for GQA/MQA.",
                "config/model.py verify_with_parallel_config",
            ),
        ]
    for failed, message, where in checks:
        if failed:  # raised inside pydantic validators: the engine prints a ValidationError of the config
            config = "ParallelConfig" if where.startswith("config/parallel") else "VllmConfig"
            error = f"ValidationError: 1 validation error for {config}: Value error, {message}"
            return Rejection(rule="dcp", reason=message, engine_error=error, source=_src(ctx, where))
    return None


def sparse_mla_dcp(ctx: Context) -> Rejection | None:
    """DCP on FlashMLA's sparse backend with an FP8 cache (fp8_ds_mla on SM 9.0): the backend serves it only on its
    mixed-batch FP8 path, taken under 32 local heads, and only where the local and the DCP-gathered heads pad to
    the same FP8 decode kernel (64 heads up to 64, else 128): v1/attention/backends/mla/flashmla_sparse.py
    FlashMLASparseMetadataBuilder.__init__ (0.33 and 0.34, without prefill CP)."""
    f, att = ctx.flags, ctx.model.attention
    dcp = f["decode_context_parallel_size"]
    on_backend = ctx.cluster.gpu.compute_capability.value == "9.0" and f.get("kv_cache_dtype") == "fp8_ds_mla"
    if att.sparse is None or dcp == 1 or not on_backend or f["prefill_context_parallel_size"] > 1:
        return None
    local = att.num_heads // f["tensor_parallel_size"]

    def padded(heads: int) -> int:
        return 64 if heads <= 64 else 128

    if local >= 32:
        message = (
            "DCP for FlashMLA sparse is only supported on the mixed-batch fp8 path (num_heads < 32); the separate "
            "prefill/decode path returns the LSE for decode tokens only, while the DCP merge needs it for every token"
        )
    elif padded(local) != padded(local * dcp):
        message = (
            "DCP for FlashMLA sparse requires the local and DCP-gathered head counts to pad to the same fp8 decode "
            f"kernel envelope; got {local} local heads (pad to {padded(local)}) vs {local * dcp} gathered heads (pad "
            f"to {padded(local * dcp)})"
        )
    else:
        return None
    return Rejection(
        rule="sparse_mla_dcp",
        stage="load",
        reason=f"{local} attention heads per GPU under DCP {dcp} on FlashMLA's sparse FP8 backend: {message}",
        engine_error=f"NotImplementedError: {message}",
        source=_src(ctx, "v1/attention/backends/mla/flashmla_sparse.py FlashMLASparseMetadataBuilder.__init__"),
    )


# the cache dtypes vLLM's one sparse-attention backend on SM 12.x takes (FlashInferMLASparseSM120Backend)
SM120_SPARSE_KV = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")


def sparse_mla_sm120(ctx: Context) -> Rejection | None:
    """On SM 12.x the only backend vLLM has for sparse attention is FlashInfer's SM120 one (platforms/cuda.py
    _get_backend_priorities: TRITON_MLA, then FLASHINFER_MLA_SPARSE_SM120; Triton serves no sparse model): it serves
    no DCP (supports_dcp unset) and caches FP8 alone (v1/attention/backends/mla/flashinfer_mla_sparse.py
    FlashInferMLASparseSM120Backend), so either finds no backend as the model is built (0.33 and 0.34)."""
    f, att = ctx.flags, ctx.model.attention
    if att.sparse is None or att.mla is None or not ctx.cluster.gpu.compute_capability.value.startswith("12."):
        return None
    dcp, dtype = f["decode_context_parallel_size"], f.get("kv_cache_dtype") or "auto"
    if dcp > 1:
        why = f"DCP {dcp}: FLASHINFER_MLA_SPARSE_SM120 serves no DCP"
    elif dtype not in SM120_SPARSE_KV:
        why = f"a {dtype} KV cache: FLASHINFER_MLA_SPARSE_SM120 caches FP8 only"
    else:
        return None
    head = att.mla.kv_lora_rank + att.mla.qk_rope_head_dim
    return Rejection(
        rule="sparse_mla_sm120",
        stage="load",
        reason=f"no sparse-attention backend on SM {ctx.cluster.gpu.compute_capability.value} for {why}",
        engine_error="ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
        f"head_size={head}",
        source=_src(ctx, "platforms/cuda.py, v1/attention/backends/mla/flashinfer_mla_sparse.py"),
    )


def eplb_rules(ctx: Context) -> Rejection | None:
    f, moe = ctx.flags, ctx.model.moe
    redundant = (f.get("eplb_config") or {}).get("num_redundant_experts", 0)
    problem = None
    if f.get("enable_eplb") and not f.get("enable_expert_parallel"):
        problem = "--enable-eplb needs --enable-expert-parallel"
    elif f.get("enable_eplb") and moe_world(f) == 1:
        problem = "--enable-eplb needs tp × dp × pcp > 1"
    elif redundant and not f.get("enable_eplb"):
        problem = "redundant experts need --enable-eplb"
    elif f.get("enable_eplb") and moe and (moe.num_experts + redundant) % moe_world(f):
        return Rejection(
            rule="eplb_even",
            stage="load",
            reason=f"{moe.num_experts + redundant} experts do not split evenly over EP {moe_world(f)}",
            engine_error="ValueError: EPLB currently only supports even distribution of experts across ranks.",
            source=_src(ctx, "model_executor/layers/fused_moe/layer.py"),
        )
    if problem is None:
        return None
    return Rejection(rule="eplb", reason=problem, engine_error="ValueError", source=_src(ctx, "config/parallel.py"))


def partitions(ctx: Context) -> Rejection | None:
    """Tensor-parallel slices must be whole, and whole 128-wide blocks for FP8 block checkpoints."""
    f, model = ctx.flags, ctx.model
    tp, att = f["tensor_parallel_size"], model.attention
    checks = []
    if model.moe and not f.get("enable_expert_parallel"):
        checks.append(("routed_experts", model.moe.expert_intermediate_size, moe_world(f)))
    if model.layer_mlp.count("dense"):
        checks.append(("dense_mlp", model.intermediate_size, tp))
    if model.moe and model.moe.num_shared_experts:
        checks.append(("shared_experts", model.moe.shared_intermediate_size * model.moe.num_shared_experts, tp))
    if att.kind == "mla" and att.mla:
        checks.append(("attention", att.num_heads * (att.mla.qk_nope_head_dim + att.mla.v_head_dim), tp))
    for role, width, ways in checks:
        block = ctx.blocks.get(role, (1, 1))[0]
        if ways > 1 and (width % ways or (width // ways) % block):
            error = (
                f"ValueError: Weight output_partition_size = {width / ways:g} is not divisible by weight "
                f"quantization block_n = {block}."
                if block > 1
                else f"AssertionError: {width} is not divisible by {ways}"
            )
            if role == "routed_experts" and block > 1 and not width % ways:
                # FP8 MoE scales are refined at load to the largest block (32 or more) dividing the checkpoint's
                # block, the shard and the hidden size (fused_moe/oracle/fp8.py refine_fp8_moe_block_shape)
                if math.gcd(block, width // ways, model.hidden_size) >= 32:
                    continue
                error = (
                    f"ValueError: The output_size of gate's and up's weight = {width // ways} is not divisible by "
                    f"weight quantization block_n = {block}."
                )
            return Rejection(
                rule="partition",
                stage="load",
                reason=f"{role.replace('_', ' ')}: width {width} over {ways} GPUs"
                + (f" is not a whole number of {block}-wide FP8 blocks" if block > 1 else " is not whole"),
                engine_error=error,
                source=_src(ctx, "model_executor/layers/quantization/utils/fp8_utils.py"),
            )
    return None


def memory_utilization(ctx: Context) -> Rejection | None:
    util = ctx.flags["gpu_memory_utilization"]
    if 0 < util <= 1:
        return None
    return Rejection(
        rule="gpu_memory_utilization",
        reason=f"--gpu-memory-utilization {util} must be in (0, 1]",
        engine_error="pydantic ValidationError: gpu_memory_utilization",
        source=_src(ctx, "config/cache.py"),
    )


def deepep_link(ctx: Context) -> Rejection | None:
    """DeepEP's high-throughput (normal) kernels need NVLink inside a node; low-latency ones do not."""
    backend = ctx.flags["all2all_backend"]
    if not ctx.flags.get("enable_expert_parallel") or backend != "deepep_high_throughput":
        return None
    if ctx.cluster.intra.link.kind == "nvlink":
        return None
    return Rejection(
        rule="deepep_needs_nvlink",
        stage="run",
        reason=f"DeepEP's high-throughput kernels need NVLink between the GPUs of a node; this box links them by "
        f"{ctx.cluster.intra.link.display_name}. Use allgather_reducescatter, or deepep_low_latency (it runs "
        "without NVLink, and measured no faster than NCCL on PCIe)",
        engine_error=None,
        source="deepseek-ai/DeepEP issues #216 and #162 (maintainers: normal mode needs NVLink), #462 (low-latency "
        "mode on 8 PCIe H800: no faster than NCCL)",
    )


def dbo_backend(ctx: Context) -> Rejection | None:
    """Dual-batch overlap splits the batch around a DeepEP / NIXL EP all-to-all (CUDA)."""
    f = ctx.flags
    supported: tuple[str, ...] = ("deepep_low_latency", "deepep_high_throughput", "nixl_ep")
    if ctx.cluster.gpu.vendor == "amd":  # the naive DP/EP path runs on the comm stream under DBO on ROCm
        supported = (*supported, "allgather_reducescatter")
    backend = f["all2all_backend"]
    if not f.get("enable_dbo") or backend in supported:
        return None
    return Rejection(
        rule="dbo_backend",
        reason=f"--enable-dbo splits the batch around a DeepEP or NIXL EP all-to-all; --all2all-backend is {backend}",
        engine_error="ValidationError: 1 validation error for VllmConfig\n  Assertion failed, Microbatching currently "
        "only supports the "
        f"{', '.join(supported)} all2all backends on this platform. {backend} is not supported. To fix use one of "
        f"{', '.join('--all2all-backend=' + b for b in supported)} and install the matching kernels.",
        source=_src(ctx, "config/vllm.py VllmConfig.__post_init__"),
    )


def dbo_runner(ctx: Context) -> Rejection | None:
    """From 0.34 the GPU model runner lists what it cannot microbatch (config/vllm.py
    _get_dbo_unsupported_features): pipeline stages, prefill CP, multimodal, hybrid (linear-attention) models."""
    f, model = ctx.flags, ctx.model
    if not f.get("enable_dbo") or ctx.version < V034:
        return None
    unsupported = [
        label
        for failed, label in (
            (f["pipeline_parallel_size"] > 1, "dual batch overlap with pipeline parallelism"),
            (f["prefill_context_parallel_size"] > 1, "dual batch overlap with prefill context parallelism"),
            (model.vision is not None, "dual batch overlap with multimodal models"),  # --language-model-only too
            (model.linear_attention is not None, "dual batch overlap with hybrid models"),
        )
        if failed
    ]
    if not unsupported:
        return None
    message = f"The GPU model runner does not support: {', '.join(unsupported)}"
    return Rejection(
        rule="dbo_runner",
        reason=message,
        engine_error=f"ValueError: {message}",
        source=_src(ctx, "config/vllm.py VllmConfig._validate_model_runner"),
    )


def async_scheduling_early(ctx: Context) -> Rejection | None:
    """Before async scheduling became vLLM's default it was experimental: --async-scheduling refused pipeline
    parallelism and speculative decoding (EngineArgs.create_engine_config in the 0.10.2 and 0.11.0 wheels; later
    releases up to 0.33 are not read, so the rule stops at 0.11.0)."""
    f = ctx.flags
    if not f.get("async_scheduling") or ctx.version > V0110:
        return None
    if f["pipeline_parallel_size"] > 1:
        reason, error = (
            f"--async-scheduling with pipeline parallelism (pp {f['pipeline_parallel_size']})",
            "Async scheduling is not supported with pipeline-parallel-size > 1.",
        )
    elif f.get("speculative_config"):
        reason, error = (
            "--async-scheduling with speculative decoding",
            "Currently, speculative decoding is not supported with async scheduling.",
        )
    else:
        return None
    return Rejection(
        rule="async_scheduling_early",
        reason=reason,
        engine_error=f"ValueError: {error}",
        source=_src(ctx, "engine/arg_utils.py EngineArgs.create_engine_config"),
    )


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def multi_node(ctx: Context) -> Rejection | None:
    """create_engine_config's checks of --nnodes / --node-rank (0.33 engine/arg_utils.py), then the address: with
    the default 127.0.0.1 the other nodes never reach node 0."""
    f = ctx.flags
    nodes, rank = f["nnodes"], f["node_rank"]
    if nodes == 1:
        return None
    world = gpus_used(f)
    executor = f.get("distributed_executor_backend")
    checks = [
        (
            executor not in (None, "mp", "uni", "external_launcher"),
            f"--nnodes {nodes} runs workers by multiprocessing",
            "nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher.",
        ),
        (
            f["data_parallel_backend"] != "mp",
            f"--nnodes {nodes} needs the mp data-parallel backend",
            f"`--nnodes {nodes}` requires `--data-parallel-backend mp`; got `--data-parallel-backend "
            f"{f['data_parallel_backend']}`. Use the MP backend or set `--nnodes 1`.",
        ),
        (
            world % nodes != 0,
            f"{nodes} nodes do not split the {world} GPUs evenly",
            f"`--nnodes {nodes}` must evenly divide the total world size ({world}). Adjust `--nnodes`, "
            "`--data-parallel-size`, `--pipeline-parallel-size`, `--tensor-parallel-size`, or "
            "`--prefill-context-parallel-size`.",
        ),
        (
            not 0 <= rank < nodes,
            f"--node-rank {rank} is not one of 0…{nodes - 1}",
            f"`--node-rank` must be between 0 and {nodes - 1}; got `--node-rank {rank}`. Set it to this node's "
            "zero-based index.",
        ),
    ]
    for failed, reason, message in checks:
        if failed:
            prefix = "" if message.startswith("nnodes") else "Invalid data-parallel launch options: "
            return Rejection(
                rule="multi_node",
                reason=reason,
                engine_error=f"ValueError: {prefix}{message}",
                source=_src(ctx, "engine/arg_utils.py, config/parallel.py"),
            )
    if f["master_addr"] in LOOPBACK:
        return Rejection(
            rule="multi_node_address",
            stage="run",
            reason=f"--nnodes {nodes} without --master-addr: every node would look for node 0 at "
            f"{f['master_addr']} and wait; give each node --master-addr <node 0's address> and its --node-rank, "
            "and --headless on the nodes after the first",
            engine_error=None,
            source=_src(ctx, "config/parallel.py ParallelConfig.master_addr"),
        )
    return None


def enough_gpus(ctx: Context) -> Rejection | None:
    """One DP rank's world (tp × pp × pcp) must fit the node unless --nnodes or Ray spreads it
    (ParallelConfig.__post_init__); all DP ranks together must fit the GPUs the launch reaches."""
    f = ctx.flags
    world = f["tensor_parallel_size"] * f["pipeline_parallel_size"] * f["prefill_context_parallel_size"]
    per_node = ctx.cluster.gpus_per_node
    cuda = ctx.cluster.gpu.vendor == "nvidia"  # ParallelConfig raises it on CUDA; elsewhere the start fails later
    if cuda and f["nnodes"] == 1 and not f.get("distributed_executor_backend") and world > per_node:
        return Rejection(
            rule="not_enough_gpus",
            reason=f"tp × pp = {world} GPUs in one DP rank, {per_node} on this node; spread it over nodes with "
            "--nnodes and --node-rank (or Ray)",
            engine_error="ValidationError: 1 validation error for ParallelConfig: Value error, "
            f"World size ({world}) is larger than the number of available GPUs ({per_node}) "
            "in this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend "
            "ray'.\n- multiprocessing, set '--nnodes' appropriately.",
            source=_src(ctx, "config/parallel.py ParallelConfig.__post_init__"),
        )
    needed = gpus_used(f)
    if needed <= ctx.gpus_available:
        return None
    return Rejection(
        rule="not_enough_gpus",
        reason=f"needs dp × pp × tp = {needed} GPUs; {ctx.gpus_available} are available",
        engine_error="RuntimeError (not enough GPUs for the workers)",
        source=_src(ctx, "v1/executor"),
        stage="load",
    )


RULES: list[Rule] = [
    heads_divisible,
    kv_heads_split,
    kv_heads_per_rank,
    ep_needs_moe,
    dcp_rules,
    sparse_mla_dcp,
    sparse_mla_sm120,
    eplb_rules,
    partitions,
    memory_utilization,
    deepep_link,
    dbo_backend,
    dbo_runner,
    async_scheduling_early,
    multi_node,
    enough_gpus,
]
