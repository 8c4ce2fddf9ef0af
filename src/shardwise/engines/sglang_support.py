"""SGLang's checks that turn on what a model's own implementation and the platform support: attention DP, MLA
decode context parallelism (its attention backend), --language-model-only, DeepEP's links. Facts per architecture
and backend live in data/engines/sglang.yaml (`models`, `mla_dcp_backends`, …) with their source lines; the checks
read them. Paths are under sglang/srt/ in the 0.5.23 release wheel.
"""

from __future__ import annotations

from shardwise.engines.base import Context, Rejection
from shardwise.engines.flags import flag_table
from shardwise.spec.model import ModelSpec


def _src(ctx: Context, where: str) -> str:
    return f"sglang {ctx.version} {where}"


def deepep_link(ctx: Context) -> Rejection | None:
    """DeepEP's normal (high-throughput) kernels move tokens between the GPUs of a node over NVLink only; its
    low-latency kernels do not need it. SGLang's deepep_mode auto runs normal kernels for prefill."""
    f = ctx.flags
    if not f["moe_a2a_backend"].startswith("deepep") or ctx.cluster.intra.link.kind == "nvlink":
        return None
    if f["deepep_mode"] == "low_latency":
        return None  # works, slower than NCCL on PCIe: a warning (see notes)
    return Rejection(
        rule="deepep_needs_nvlink",
        stage="run",
        reason=f"DeepEP's normal-mode kernels (deepep_mode {f['deepep_mode']}: used for prefill) need NVLink "
        f"between the GPUs of a node; this box links them by {ctx.cluster.intra.link.display_name}. Use the "
        "default all-reduce MoE path, or --deepep-mode low_latency (it runs without NVLink, and measured no faster "
        "than NCCL on PCIe)",
        engine_error=None,
        source="deepseek-ai/DeepEP issues #216 and #162 (maintainers: normal mode needs NVLink), #462 (low-latency "
        "mode on 8 PCIe H800: no faster than NCCL)",
    )


def mla_decode_backend(flags: dict, model: ModelSpec, capability: str, tp_size: int) -> str:
    """The MLA decode attention backend SGLang runs: the one given, else the model's or the platform's default."""
    given = flags.get("decode_attention_backend") or flags.get("attention_backend")
    if given:
        return given
    table = flag_table("sglang")
    own = table.support(model.architecture, model.wrapper_architecture).mla_default_backend or {}
    defaults = {**table.mla_default_backend, **own}
    if capability.startswith("gfx"):
        heads = max(1, model.attention.num_kv_heads // tp_size)
        return defaults["rocm"] if heads in table.rocm_aiter_kv_heads else defaults["rocm_other"]
    return defaults.get(capability, defaults["other"])


def dcp_backend(ctx: Context) -> Rejection | None:
    """MLA decode CP needs a decode backend that returns the LSE of its partial attention (data:
    mla_dcp_backends); with speculative decoding the target-verify step needs it too."""
    f, model = ctx.flags, ctx.model
    if f["dcp_size"] == 1 or model.attention.kind != "mla":
        return None
    table = flag_table("sglang")
    capability = ctx.cluster.gpu.compute_capability.value
    backend = mla_decode_backend(f, model, capability, f["tp_size"])
    spec = f.get("speculative_algorithm")
    if spec and backend == "trtllm_mla":
        return Rejection(
            rule="dcp_spec_backend",
            stage="load",
            reason="decode CP with speculative decoding cannot run on trtllm_mla (no DCP metadata to its decode "
            "kernel, no rank-local LSE); only cutedsl_mla (SM100) serves it",
            engine_error="ValueError: trtllm_mla cannot serve decode context parallelism with speculative decoding: "
            "it does not forward the cyclic DCP metadata to its decode kernel and returns no rank-local LSE for "
            "the cross-rank merge. Select cutedsl_mla.",
            source=_src(ctx, "layers/attention/attention_registry.py create_trtllm_mla_backend"),
        )
    allowed = table.mla_dcp_spec_backends if spec else table.mla_dcp_backends
    if backend in allowed:
        return None
    if spec:
        reason = (
            f"decode CP with speculative decoding needs the LSE in target-verify steps too; the {backend} "
            "backend does not return it there; cutedsl_mla (SM100) and aiter (ROCm) do"
        )
    else:
        default = "" if f.get("attention_backend") or f.get("decode_attention_backend") else " (the default here)"
        fix = (
            "aiter, the ROCm backend with the DCP path, takes 16 or 128 KV heads per rank"
            if capability.startswith("gfx")
            else "add --attention-backend flashinfer"
        )
        reason = (
            f"decode CP merges each rank's partial MLA attention by its LSE, which the {backend} decode "
            f"backend{default} does not return: the first decode step (CUDA-graph capture) fails; "
            f"{fix}"
        )
    return Rejection(
        rule="dcp_attention_backend",
        stage="run",
        reason=reason,
        engine_error=None,
        source=_src(ctx, "models/deepseek_common/attention_forward_methods/forward_mla.py forward_absorb_core"),
    )


def attention_dp_support(ctx: Context) -> Rejection | None:
    """Attention DP needs a model whose attention splits heads over the attention-TP group (data: `models`)."""
    if ctx.flags["attn_dp_size"] == 1:
        return None
    model = ctx.model
    support = flag_table("sglang").support(model.architecture, model.wrapper_architecture)
    if support.attention_dp is not False:
        return None
    return Rejection(
        rule="attention_dp_unsupported",
        stage="run",
        reason=f"SGLang's {model.architecture} has no attention-DP path: its attention splits heads over the "
        "whole TP group, so attention-DP ranks would all-reduce different batches; SGLang does not refuse it at "
        "start-up, but it cannot serve correctly. Use --tp-size alone, or --dp-size for replicas",
        engine_error=None,
        source=_src(ctx, support.source or "models/"),
    )


def language_model_only(ctx: Context) -> Rejection | None:
    if not ctx.flags.get("language_model_only"):
        return None
    model = ctx.model
    allowed = flag_table("sglang").language_model_only_architectures
    architectures = [model.wrapper_architecture or model.architecture]
    if architectures[0] in allowed:
        return None
    return Rejection(
        rule="language_model_only",
        reason=f"--language-model-only is accepted only for {', '.join(allowed)}",
        engine_error=f"ValueError: --language-model-only does not support {architectures}. Supported: {list(allowed)}.",
        source=_src(ctx, "arg_groups/model_hook.py handle_language_model_only"),
    )
