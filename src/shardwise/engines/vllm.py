"""vLLM (V1): flags → effective configuration → checks → Layout, and back.

In vLLM, GPUs = dp × pp × tp (× pcp): `-tp` is the attention and dense-layer TP inside one DP rank and
DP ranks add GPUs. MoE layers are sharded over tp × dp (× pcp): by expert with `--enable-expert-parallel`
(EP = tp × dp, no partial EP), else by tensor slices. Each DP rank has its own scheduler and KV cache.
"""

from __future__ import annotations

import json
from itertools import product
from typing import Any, ClassVar

from packaging.version import Version

from shardwise.engines.base import Context, Note, Rejection, Rule, Setup, divisors, register_engine, run_rules
from shardwise.engines.flags import EngineArgError, flag_table, parse_flags, parse_version, render_command
from shardwise.engines.layout import EngineOptions, Layout, SpecDecode
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import block_shapes

A2A_DISPATCH = ("deepep", "mori", "moonep", "nixl", "flashinfer")  # backends that send tokens to their experts
REMOVED_A2A = {"pplx", "naive"}


def _src(ctx: Context, where: str) -> str:
    return f"vllm {ctx.version} {where}"


def _moe_world(f: dict[str, Any]) -> int:
    return f["tensor_parallel_size"] * f["data_parallel_size"] * f["prefill_context_parallel_size"]


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
        reason=f"{kv} KV heads neither split over nor replicate onto tp {tp}",
        engine_error="AssertionError: not divisible",
        source=_src(ctx, "model_executor/layers/linear.py QKVParallelLinear"),
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
    f, att = ctx.flags, ctx.model.attention
    dcp, tp, pcp = f["decode_context_parallel_size"], f["tensor_parallel_size"], f["prefill_context_parallel_size"]
    if dcp == 1:
        return None
    problem = None
    if pcp == 1 and tp % dcp:
        problem = f"decode CP {dcp} does not divide tp {tp}"
    elif pcp > 1 and dcp not in (pcp, tp * pcp):
        problem = f"with prefill CP {pcp}, decode CP must be 1, {pcp} or {tp * pcp}"
    elif att.kind == "gqa" and (tp <= att.num_kv_heads or dcp > tp // att.num_kv_heads):
        problem = f"for GQA, decode CP needs tp > KV heads ({tp} vs {att.num_kv_heads}) and dcp ≤ tp // KV heads"
    if problem is None:
        return None
    return Rejection(rule="dcp", reason=problem, engine_error="ValueError", source=_src(ctx, "config/parallel.py"))


def eplb_rules(ctx: Context) -> Rejection | None:
    f, moe = ctx.flags, ctx.model.moe
    redundant = (f.get("eplb_config") or {}).get("num_redundant_experts", 0)
    problem = None
    if f.get("enable_eplb") and not f.get("enable_expert_parallel"):
        problem = "--enable-eplb needs --enable-expert-parallel"
    elif f.get("enable_eplb") and _moe_world(f) == 1:
        problem = "--enable-eplb needs tp × dp × pcp > 1"
    elif redundant and not f.get("enable_eplb"):
        problem = "redundant experts need --enable-eplb"
    elif f.get("enable_eplb") and moe and (moe.num_experts + redundant) % _moe_world(f):
        return Rejection(
            rule="eplb_even",
            reason=f"{moe.num_experts + redundant} experts do not split evenly over EP {_moe_world(f)}",
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
        checks.append(("routed_experts", model.moe.expert_intermediate_size, _moe_world(f)))
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
            return Rejection(
                rule="partition",
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


def enough_gpus(ctx: Context) -> Rejection | None:
    needed = _gpus_used(ctx.flags)
    if needed <= ctx.gpus_available:
        return None
    return Rejection(
        rule="not_enough_gpus",
        reason=f"needs dp × pp × tp = {needed} GPUs; {ctx.gpus_available} are available",
        engine_error="RuntimeError (not enough GPUs for the workers)",
        source=_src(ctx, "v1/executor"),
    )


RULES: list[Rule] = [
    heads_divisible,
    kv_heads_split,
    ep_needs_moe,
    dcp_rules,
    eplb_rules,
    partitions,
    memory_utilization,
    enough_gpus,
]


def _gpus_used(f: dict[str, Any]) -> int:
    return _moe_world(f) * f["pipeline_parallel_size"]


def effective_flags(
    given: dict[str, Any], *, version: Version, cluster: ClusterSpec
) -> tuple[dict[str, Any], list[Note]]:
    table = flag_table("vllm")
    f = {name: option.default for name, option in table.options.items() if option.default is not None}
    f.update(given)
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
    f["cuda_graph"] = not f.get("enforce_eager")
    datacenter_blackwell = cluster.gpu.compute_capability.value in ("10.0", "10.3")
    f["cuda_graph_max_bs"] = min(f["max_num_seqs"] * 2, 1024 if datacenter_blackwell else 512)
    if f["pipeline_parallel_size"] > 1 and f["data_parallel_size"] > 1:
        notes.append(Note(kind="warning", message="DP ranks sit outside PP stages: each DP rank is a full pipeline"))
    return f, notes


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
        spec = SpecDecode(
            algorithm=str(cfg.get("method", "draft_model")),
            num_draft_tokens=cfg.get("num_speculative_tokens"),
            draft_model=cfg.get("model"),
        )
    options = EngineOptions(
        cuda_graph=f["cuda_graph"],
        cuda_graph_max_bs=f["cuda_graph_max_bs"] if f["cuda_graph"] else None,
        two_batch_overlap=bool(f.get("enable_dbo")),
        eplb=bool(f.get("enable_eplb")),
        kv_cache_dtype=None if f["kv_cache_dtype"] == "auto" else f["kv_cache_dtype"],
        chunked_prefill_tokens=f["max_num_batched_tokens"],
        max_running_requests=f["max_num_seqs"],
        memory_fraction=f["gpu_memory_utilization"],
        memory_fraction_of="total",
        activations_in_budget=True,
        max_model_len=f.get("max_model_len") or model.max_position_embeddings,
        page_size=f.get("block_size"),
        spec=spec,
    )
    world = tp * dp * pcp if lockstep else tp * pcp
    return Layout(
        engine="vllm",
        version=str(version),
        replicas=1 if lockstep else dp,
        pp=f["pipeline_parallel_size"],
        stage_gpus=world,
        attn_dp=dp if lockstep else 1,
        attn_cp=pcp,
        dcp=f["decode_context_parallel_size"],
        moe_ep=world if ep else 1,
        dense_tp=tp,
        shared_tp=tp,
        lm_head_tp=tp,
        redundant_experts=(f.get("eplb_config") or {}).get("num_redundant_experts", 0),
        moe_comm=comm,
        a2a_backend=backend,
        dp_outside_pp=True,
        pp_extra_layers="before_last",
        options=options,
    )


@register_engine("vllm")
class VLLM:
    name: ClassVar[str] = "vllm"
    supports_expert_parallel: ClassVar[bool] = True
    supports_attention_dp: ClassVar[bool] = True
    kv_budget: ClassVar[str] = "of_total"  # gpu_memory_utilization × total memory

    def resolve(
        self,
        argv: list[str],
        *,
        model: ModelSpec,
        cluster: ClusterSpec,
        version: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Setup:
        table = flag_table("vllm")
        v = parse_version(version or table.default_version, "vllm")
        try:
            given = parse_flags(table, argv, v)
            for name in ("speculative_config", "eplb_config"):
                if name in given:
                    given[name] = _json_option(name, given[name])
        except EngineArgError as exc:
            return _argument_error(str(exc), argv, v, cluster)
        given.pop("model_tag", None)
        given.pop("model", None)
        return self.setup(given, model=model, cluster=cluster, version=v, env=env or {})

    def setup(
        self,
        given: dict[str, Any],
        *,
        model: ModelSpec,
        cluster: ClusterSpec,
        version: Version,
        env: dict[str, str] | None = None,
    ) -> Setup:
        flags, notes = effective_flags(given, version=version, cluster=cluster)
        available = cluster.num_gpus
        visible = (env or {}).get("CUDA_VISIBLE_DEVICES")
        if visible is not None and cluster.nodes == 1:
            available = min(available, len([d for d in visible.split(",") if d.strip()]))
        ctx = Context(
            flags=flags,
            model=model,
            cluster=cluster,
            version=version,
            gpus_available=available,
            blocks=block_shapes(model),
        )
        rejections = tuple(run_rules(RULES, ctx))
        used = _gpus_used(flags)
        if not rejections and used < available:
            notes.append(Note(kind="warning", message=f"uses {used} of {available} GPUs (dp × pp × tp)"))
        return Setup(
            engine="vllm",
            version=str(version),
            given=given,
            flags=flags,
            notes=tuple(notes),
            rejections=rejections,
            layout=None if rejections else layout_of(flags, model, version),
            gpus_used=used,
            gpus_available=available,
        )

    def enumerate(self, model: ModelSpec, cluster: ClusterSpec, *, version: str | None = None) -> list[Setup]:
        v = parse_version(version or flag_table("vllm").default_version, "vllm")
        n, seen, found = cluster.num_gpus, set(), []
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
                    setup = self.setup(given, model=model, cluster=cluster, version=v)
                    if setup.layout and setup.layout.structure() not in seen:
                        seen.add(setup.layout.structure())
                        found.append(setup)
        return found

    def launch_command(self, setup: Setup, *, model_ref: str, remote_code: bool = False) -> list[str]:
        values = {k: (json.dumps(val) if isinstance(val, dict) else val) for k, val in setup.given.items()}
        if remote_code:
            values["trust_remote_code"] = True
        return render_command(flag_table("vllm"), Version(setup.version), model_ref=model_ref, values=values)


def _json_option(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineArgError(f"argument --{name.replace('_', '-')}: invalid JSON: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise EngineArgError(f"argument --{name.replace('_', '-')}: expected a JSON object")
    return value


def _argument_error(message: str, argv: list[str], version: Version, cluster: ClusterSpec) -> Setup:
    reason = f"vLLM's argument parser refuses the command: {message}"
    if any(a in ("-ep", "--enable-expert-parallel") for a in argv) and "unrecognized arguments" in message:
        reason += " (--enable-expert-parallel / -ep is a switch, not a size: EP is tp × dp)"
    rejection = Rejection(
        rule="arguments",
        reason=reason,
        engine_error=f"vllm serve: error: {message}",
        source=f"vllm {version} engine/arg_utils.py (argparse)",
    )
    return Setup(
        engine="vllm",
        version=str(version),
        given={},
        flags={},
        rejections=(rejection,),
        gpus_used=0,
        gpus_available=cluster.num_gpus,
    )
