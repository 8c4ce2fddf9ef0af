"""SGLang's start-up checks, one small function each, with the error SGLang raises and where.

Sources are the sglang 0.5.23 and 0.5.9 release wheels (paths under python/sglang/srt/), as collected in
shared/reference/frameworks.md §1.5–1.6. `tp_size` is the GPU count of one pipeline stage; attention
splits it TP → DP → ATTN_CP → ATTN_TP and the MoE TP → MOE_DP → EP → MOE_TP.
"""

from __future__ import annotations

from packaging.version import Version

from shardwise.engines.base import Context, Rejection, Rule
from shardwise.engines.flags import flag_table
from shardwise.engines.sglang_support import attention_dp_support, dcp_backend, deepep_link, language_model_only

V0523, V0521, V0520 = Version("0.5.23"), Version("0.5.21"), Version("0.5.20")
A2A_EP_SPANNING = frozenset(
    {
        "megamoe",
        "deepep",
        "deepep_v2",
        "mooncake",
        "nixl",
        "ascend_fuseep",
        "flashinfer",
        "flashinfer_megamoe",
        "mori",
        "pplx",
    }
)
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"})
# the algorithms SGLang's EAGLE worker runs, overlapped or not, after NEXTN has become EAGLE (_handle_eagle_family)
EAGLE_WORKER = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


def _src(ctx: Context, where: str) -> str:
    return f"sglang {ctx.version} {where}"


def _attn_tp(f: dict) -> int:
    return f["tp_size"] // f["attn_dp_size"] // f["attn_cp_size"]


def attn_dp_divides_tp(ctx: Context) -> Rejection | None:
    f = ctx.flags
    if f["tp_size"] % f["attn_dp_size"] == 0:
        return None
    return Rejection(
        rule="attn_dp_divides_tp",
        reason=f"attention DP {f['attn_dp_size']} does not divide tp {f['tp_size']}",
        engine_error="AssertionError: assert cfg.tp_size % cfg.attn_dp_size == 0",
        source=_src(ctx, "arg_groups/parallel_hook.py handle_data_parallelism"),
    )


def attn_cp_divides_tp(ctx: Context) -> Rejection | None:
    f = ctx.flags
    cp, dp, tp = f["attn_cp_size"], f["attn_dp_size"], f["tp_size"]
    if cp == 1 or (tp % cp == 0 and tp % (dp * cp) == 0):
        return None
    return Rejection(
        rule="attn_cp_divides_tp",
        reason=f"attention CP {cp} × attention DP {dp} does not divide tp {tp}",
        engine_error="AssertionError",
        source=_src(ctx, "arg_groups/parallel_hook.py"),
    )


def _inconsistent_moe(ctx: Context, rule: str, reason: str) -> Rejection:
    """From 0.5.21 the launcher publishes the parallel topology before it spawns anything and refuses one whose MoE
    split does not multiply back to tp (runtime_context.py _validate_parallel, run by the first
    override_permanently of _configure_context as entrypoints/engine.py _launch_subprocesses publishes it): EP wider
    than tp, or not dividing it, fails there, before any weight loads."""
    f = ctx.flags
    tp, ep, mdp = f["tp_size"], f["ep_size"], f["moe_dp_size"]
    moe_tp = tp // ep // mdp
    return Rejection(
        rule=rule,
        stage="arguments",
        reason=reason,
        engine_error=(
            "ValueError: parallel topology is inconsistent (set by override_permanently):\ntp_size == moe_ep_size * "
            f"moe_dp_size * moe_tp_size\n  {tp} != {ep} * {mdp} * {moe_tp} (= {ep * mdp * moe_tp})"
        ),
        source=_src(
            ctx,
            "runtime_context.py _validate_parallel, from ParallelContext.override_permanently as "
            "_configure_context publishes the topology (entrypoints/engine.py _launch_subprocesses)",
        ),
    )


def moe_tp_zero(ctx: Context) -> Rejection | None:
    f = ctx.flags
    tp, ep, mdp = f["tp_size"], f["ep_size"], f["moe_dp_size"]
    if ep * mdp <= tp:
        return None
    fitting = [t for t in range(ep * mdp, ctx.gpus_available + 1, ep * mdp)]
    advice = f"; for EP {ep} use --tp-size {fitting[-1]} --ep-size {ep}" if fitting else ""
    checked = ctx.version >= V0521
    reason = (
        f"EP is carved out of tp: moe_tp_size = tp {tp} // ep {ep} // moe_dp {mdp} = {tp // ep // mdp}, which SGLang "
        + (
            "refuses before it starts (releases before 0.5.21 divide by it at start-up: ZeroDivisionError)"
            if checked
            else "divides by at start-up"
        )
        + f"; this command would also use only {f['dp_size'] * tp * f['pp_size']} GPUs (dp × tp × pp){advice}"
    )
    if checked:
        return _inconsistent_moe(ctx, "moe_tp_zero", reason)
    where = (
        "runtime_context.py derive_spawn_ranks (line 129)"
        if ctx.version >= V0520
        else "entrypoints/engine.py launcher (moe_ep_rank)"
    )
    return Rejection(
        rule="moe_tp_zero",
        stage="load",
        reason=reason,
        engine_error="ZeroDivisionError: integer division or modulo by zero",
        source=_src(ctx, where),
    )


def ep_divides_tp(ctx: Context) -> Rejection | None:
    f = ctx.flags
    tp, ep, mdp = f["tp_size"], f["ep_size"], f["moe_dp_size"]
    if ep * mdp > tp or tp % (ep * mdp) == 0:
        return None
    moe_tp = tp // ep // mdp
    if ctx.version >= V0521:
        return _inconsistent_moe(ctx, "ep_divides_tp", f"ep {ep} × moe_dp {mdp} does not divide tp {tp}")
    if "routed_experts" in ctx.blocks:
        return Rejection(
            rule="ep_divides_tp",
            stage="load",
            reason=f"ep {ep} does not divide tp {tp}",
            engine_error=f"ValueError: tp_size {tp} must be divisible by ep_size {ep}",
            source=_src(ctx, "model_runner_components/moe_ep_setup.py check_quantized_moe_compatibility"),
        )
    return Rejection(  # releases before the topology check: no error of theirs is on record for this split
        rule="ep_divides_tp",
        stage="load",
        reason=f"ep {ep} × moe_dp {mdp} does not divide tp {tp}: moe_tp_size = tp // ep // moe_dp = {moe_tp} leaves "
        f"{tp - ep * mdp * moe_tp} of the {tp} ranks outside the expert split",
        source=_src(ctx, "model_runner_components/moe_ep_setup.py (moe_tp_size = tp_size // ep_size // dp_size)"),
    )


def replicas_with_attn_dp(ctx: Context) -> Rejection | None:
    f = ctx.flags
    if f["dp_size"] == 1 or f["attn_dp_size"] == 1:
        return None
    return Rejection(
        rule="replicas_with_attn_dp",
        reason="data-parallel replicas (--dp-size) cannot be combined with attention data parallelism",
        engine_error=(
            "ValueError: --dp-size … with --attn-dp-size …: data-parallel replicas combined with attention "
            "data parallelism are not supported."
        ),
        source=_src(ctx, "arg_groups/parallel_hook.py"),
    )


def moe_dp_rules(ctx: Context) -> Rejection | None:
    """The MoE-DP asserts of handle_context_parallelism, in their order (0.5.23 arg_groups/parallel_hook.py)."""
    f = ctx.flags
    tp, mdp, ep, cp = f["tp_size"], f["moe_dp_size"], f["ep_size"], f["attn_cp_size"]
    if mdp == 1:
        return None
    checks = [
        (tp % mdp, f"moe_dp {mdp} does not divide tp {tp}", "tp_size must be divisible by moe_dp_size"),
        (
            f["pp_size"] > 1,
            "MoE DP does not work with pipeline parallelism",
            "PP is not supported with context parallelism",
        ),
        (
            ep > 1 and ep * mdp != tp,
            f"with EP, ep × moe_dp must equal tp ({ep} × {mdp} ≠ {tp})",
            "ep_size * moe_dp_size must be equal to tp_size",
        ),
        (
            cp != mdp,
            f"attention CP {cp} must equal moe_dp {mdp} (add --attn-cp-size {mdp})",
            "attn_cp_size != moe_dp_size is only supported when moe_dp_size == 1",
        ),
    ]
    for failed, reason, message in checks:
        if failed:
            return Rejection(
                rule="moe_dp",
                reason=reason,
                engine_error=f"AssertionError: {message}",
                source=_src(ctx, "arg_groups/parallel_hook.py handle_context_parallelism"),
            )
    return None


def heads_split(ctx: Context) -> Rejection | None:
    att, a_tp = ctx.model.attention, _attn_tp(ctx.flags)
    if a_tp == 0:
        return None
    if att.num_heads % a_tp:
        return Rejection(
            rule="heads_split",
            stage="load",
            reason=f"{att.num_heads} attention heads do not split over attention TP {a_tp}",
            engine_error="AssertionError: assert num_heads % attn_tp_size == 0",
            source=_src(
                ctx,
                "models/deepseek_v2.py DeepseekV2AttentionMLA.__init__"
                if att.kind == "mla"
                else "models/llama.py LlamaAttention.__init__",
            ),
        )
    kv = att.num_kv_heads
    if att.kind == "gqa" and (kv % a_tp if kv >= a_tp else a_tp % kv):
        return Rejection(
            rule="kv_heads_split",
            stage="load",
            reason=f"{kv} KV heads neither split over nor replicate onto attention TP {a_tp}",
            engine_error="AssertionError",
            source=_src(ctx, "models/llama.py LlamaAttention.__init__"),
        )
    return None


def tp_exceeds_experts(ctx: Context) -> Rejection | None:
    moe, tp = ctx.model.moe, ctx.flags["tp_size"]
    if moe is None or ctx.model.family not in ("deepseek", "glm4_moe") or tp <= moe.num_experts:
        return None
    return Rejection(
        rule="tp_exceeds_experts",
        stage="load",
        reason=f"tp {tp} is larger than the {moe.num_experts} routed experts",
        engine_error=f"ValueError: Tensor parallel size {tp} is greater than the number of experts {moe.num_experts}.",
        source=_src(ctx, "models/deepseek_v2.py DeepseekV2MoE.__init__"),
    )


def experts_split_evenly(ctx: Context) -> Rejection | None:
    moe, ep = ctx.model.moe, ctx.flags["ep_size"]
    if moe is None:
        return None
    slots = moe.num_experts + ctx.flags["ep_num_redundant_experts"]
    if slots % ep == 0:
        return None
    return Rejection(
        rule="experts_split_evenly",
        stage="load",
        reason=f"{slots} expert slots do not split evenly over EP {ep}",
        engine_error="AssertionError: assert self._num_global_routed % storage_ep_size == 0",
        source=_src(ctx, "layers/moe/fused_moe_triton/layer.py"),
    )


def partitions_fit_blocks(ctx: Context) -> Rejection | None:
    """Every tensor-parallel slice must be a whole number of rows, and of 128-wide FP8 blocks where the
    checkpoint is block-quantized (validate_fp8_block_shape; check_quantized_moe_compatibility)."""
    f = ctx.flags
    if f["ep_size"] * f["moe_dp_size"] > f["tp_size"]:
        return None  # reported by moe_tp_zero
    for role, width, ways, label in _partitions(ctx):
        block = ctx.blocks.get(role, (1, 1))[0]
        if ways <= 1 or (width % ways == 0 and (width // ways) % block == 0):
            continue
        if role == "routed_experts" and block > 1:
            return Rejection(
                rule="moe_tp_width",
                stage="load",
                reason=f"moe_intermediate_size {width} / moe_tp {ways} is not a "
                f"multiple of the {block}-wide quantization block",
                engine_error=(
                    "ValueError: For quantized MoE models, please make sure "
                    "(moe_intermediate_size / moe_tp_size) % weight_block_size_n == 0"
                ),
                source=_src(ctx, "model_runner_components/moe_ep_setup.py"),
            )
        if role == "routed_experts":
            return Rejection(
                rule="moe_tp_width",
                stage="load",
                reason=f"moe_intermediate_size {width} does not split over moe_tp {ways}",
                engine_error="AssertionError: assert intermediate_size % self.moe_tp_size == 0",
                source=_src(ctx, "layers/moe/fused_moe_triton/layer.py"),
            )
        return Rejection(
            rule="partition_block",
            stage="load",
            reason=f"{label}: {width} / {ways} is not a multiple of the {block}-wide FP8 block",
            engine_error=(
                f"ValueError: Weight output_partition_size = {width / ways:g} is not divisible by "
                f"weight quantization block_n = {block}."
            ),
            source=_src(ctx, "layers/quantization/fp8_utils.py validate_fp8_block_shape"),
        )
    return None


def _partitions(ctx: Context) -> list[tuple[str, int, int, str]]:
    f, model = ctx.flags, ctx.model
    tp, a_tp = f["tp_size"], _attn_tp(f)
    moe_tp = tp // f["ep_size"] // f["moe_dp_size"]
    att = model.attention
    out = []
    if model.moe:
        out.append(("routed_experts", model.moe.expert_intermediate_size, moe_tp, "routed experts"))
        if model.moe.num_shared_experts and f["moe_a2a_backend"] not in A2A_EP_SPANNING:
            out.append(
                (
                    "shared_experts",
                    model.moe.shared_intermediate_size * model.moe.num_shared_experts,
                    tp,
                    "shared experts",
                )
            )
    if model.layer_mlp.count("dense"):
        dense_tp = 1 if f.get("moe_dense_tp_size") == 1 else tp
        out.append(("dense_mlp", model.intermediate_size, dense_tp, "dense MLP (--moe-dense-tp-size 1 replicates it)"))
    if att.kind == "mla" and att.mla:
        out.append(("attention", att.num_heads * (att.mla.qk_nope_head_dim + att.mla.v_head_dim), a_tp, "kv_b_proj"))
        out.append(("attention", att.num_heads * att.mla.v_head_dim, a_tp, "o_proj input"))
    else:
        out.append(("attention", att.num_heads * att.head_dim, a_tp, "q_proj"))
    return out


def multi_node(ctx: Context) -> Rejection | None:
    """check_server_args' node asserts, then what makes the nodes find each other (the engine does not check it:
    without it they wait)."""
    f = ctx.flags
    nnodes = f["nnodes"]
    if nnodes == 1:
        return None
    src = _src(ctx, "arg_groups/validation_hook.py check_server_args")
    if (f["tp_size"] * f["pp_size"]) % nnodes:
        return Rejection(
            rule="multi_node_split",
            reason=f"tp × pp = {f['tp_size'] * f['pp_size']} GPUs do not split over {nnodes} nodes",
            engine_error="AssertionError: tp_size must be divisible by number of nodes",
            source=src,
        )
    if f["dp_size"] > 1:
        return Rejection(
            rule="multi_node_replicas",
            reason="data-parallel replicas are single-node only",
            engine_error="AssertionError: multi-node data-parallel replicas are not supported; use attention DP "
            "(--attn-dp-size) across nodes",
            source=src,
        )
    if not f.get("dist_init_addr"):
        return Rejection(
            rule="multi_node_address",
            stage="run",
            reason=f"--nnodes {nnodes} without --dist-init-addr: each node would set up its own group on "
            "127.0.0.1 and wait for the others (with attention DP the launch fails on the empty address); give "
            "every node --dist-init-addr <node 0's address>:<port> and "
            "its own --node-rank",
            engine_error=None,
            source=_src(ctx, "server_args.py PortArgs.init_new (dist_init_addr)"),
        )
    if not 0 <= f["node_rank"] < nnodes:
        return Rejection(
            rule="multi_node_rank",
            stage="run",
            reason=f"--node-rank {f['node_rank']} is not one of 0…{nnodes - 1}",
            engine_error=None,
            source=_src(ctx, "entrypoints/engine.py (GPU ranks from node_rank)"),
        )
    return None


def moe_dense_tp(ctx: Context) -> Rejection | None:
    value, tp = ctx.flags.get("moe_dense_tp_size"), ctx.flags["tp_size"]
    allowed = {None, 1, tp} if ctx.version >= V0523 else {None, 1}
    if value in allowed:
        return None
    return Rejection(
        rule="moe_dense_tp",
        reason=f"--moe-dense-tp-size {value} must be one of "
        f"{', '.join(str(a) for a in sorted(x for x in allowed if x))} (or unset)",
        engine_error="AssertionError",
        source=_src(ctx, "arg_groups/parallel_hook.py"),
    )


def dcp_rules(ctx: Context) -> Rejection | None:
    f = ctx.flags
    dcp, backend = f["dcp_size"], f.get("dcp_comm_backend")
    hook = _src(ctx, "arg_groups/parallel_hook.py")
    if dcp == 1:
        if backend in ("a2a", "fi_a2a") or f.get("dcp_replicate_q_proj"):
            flag = f"--dcp-comm-backend {backend}" if backend in ("a2a", "fi_a2a") else "--dcp-replicate-q-proj"
            return Rejection(
                rule="dcp_options_without_dcp",
                engine_error="ValueError",
                source=hook,
                reason=f"{flag} needs --dcp-size > 1 (it only changes decode CP)",
            )
        return None
    if f.get("dcp_replicate_q_proj") and backend == "ag_rs":
        return Rejection(
            rule="dcp_replicate_q_needs_a2a",
            engine_error="ValueError",
            source=hook,
            reason="--dcp-replicate-q-proj only works with the a2a DCP backend, not --dcp-comm-backend ag_rs",
        )
    if f["tp_size"] % dcp:
        return Rejection(
            rule="dcp_divides_tp",
            stage="load",
            reason=f"decode CP {dcp} does not divide tp {f['tp_size']}",
            engine_error="AssertionError",
            source=_src(ctx, "distributed/parallel_state.py initialize_model_parallel"),
        )
    if f.get("enable_prefill_cp"):
        return Rejection(
            rule="dcp_with_prefill_cp",
            reason="decode CP cannot be combined with --enable-prefill-cp",
            engine_error="ValueError",
            source=hook,
        )
    return None


def chunk_fits_pages(ctx: Context) -> Rejection | None:
    f = ctx.flags
    chunk, page = f.get("chunked_prefill_size"), f["page_size"]
    if chunk is None or chunk <= 0 or chunk % page == 0:
        return None
    return Rejection(
        rule="chunk_page",
        reason=f"chunked prefill size {chunk} is not a multiple of page size {page}",
        engine_error=None,
        source=_src(ctx, "arg_groups/validation_hook.py"),
    )


def prefill_budget_admits(ctx: Context) -> Rejection | None:
    """0.5.23 asks the prefill budget before it admits the first waiting request (schedule_policy.py PrefillAdder
    budget_state, asked in scheduler.py get_new_batch_prefill before the loop over the waiting queue): with no
    budget it starts and then never admits one. Earlier releases admit the first request before they ask."""
    budget = ctx.flags["max_prefill_tokens"]
    if ctx.version < V0523 or budget > 0:
        return None
    return Rejection(
        rule="prefill_budget",
        stage="run",
        reason=f"--max-prefill-tokens {budget}: sglang {ctx.version} asks this budget before it admits a request "
        "to a prefill, so it starts and admits none: give a positive number of tokens",
        source=_src(ctx, "managers/schedule_policy.py PrefillAdder.budget_state"),
    )


def pipeline_exclusions(ctx: Context) -> Rejection | None:
    f = ctx.flags
    if f["pp_size"] == 1:
        return None
    if f.get("speculative_algorithm"):
        return Rejection(
            rule="pp_with_spec",
            reason="pipeline parallelism with speculative decoding runs only on "
            "PD prefill nodes (or with SGLANG_ENABLE_PP_SPEC)",
            engine_error="ValueError",
            source=_src(ctx, "check_pipeline_parallel_compat"),
        )
    return None


def feature_combinations(ctx: Context) -> Rejection | None:
    f = ctx.flags
    src = _src(ctx, "arg_groups/validation_hook.py")
    checks = [
        (
            f.get("enable_eplb") and f["ep_size"] == 1,
            "eplb_needs_ep",
            "--enable-eplb needs ep > 1",
            "AssertionError: assert resolved_view(server_args).ep_size > 1",
        ),
        (
            f.get("enable_two_batch_overlap")
            and f["moe_a2a_backend"] == "none"
            and (ctx.version < V0523 or f["attn_dp_size"] == 1),
            "tbo_needs_a2a",
            "two-batch overlap without an all-to-all backend needs attention DP"
            if ctx.version >= V0523
            else "two-batch overlap needs an all-to-all backend",
            "ValueError (check_two_batch_overlap)",
        ),
        (
            f.get("enable_dp_lm_head") and f["attn_dp_size"] == 1,
            "dp_lm_head_needs_attn_dp",
            "--enable-dp-lm-head needs attention DP (with replicas alone SGLang keeps it on and refuses it)",
            "AssertionError: --enable-dp-lm-head requires attention DP (--attn-dp-size).",
        ),
        (
            f.get("enable_two_batch_overlap") and f["moe_a2a_backend"] == "deepep_v2",
            "tbo_deepep_v2",
            "DeepEP v2 does not support two-batch overlap",
            "ValueError",
        ),
        (
            f["moe_a2a_backend"] == "flashinfer_megamoe" and f["attn_dp_size"] != f["tp_size"],
            "megamoe_needs_full_dp",
            "flashinfer_megamoe needs attention DP equal to tp",
            "ValueError",
        ),
        (
            f.get("speculative_algorithm") == "STANDALONE" and f["attn_dp_size"] > 1,
            "standalone_with_attn_dp",
            "STANDALONE speculative decoding does not support attention DP",
            "ValueError",
        ),
        (
            f.get("speculative_algorithm") in ("DFLASH", "DSPARK")
            and f["attn_dp_size"] > 1
            and not f.get("enable_dp_lm_head"),
            "dflash_needs_dp_lm_head",
            "DFLASH/DSPARK with attention DP needs --enable-dp-lm-head",
            "ValueError",
        ),
    ]
    for failed, rule, reason, error in checks:
        if failed:
            return Rejection(rule=rule, reason=reason, engine_error=error, source=src)
    return None


def mtp_needs_draft(ctx: Context) -> Rejection | None:
    f = ctx.flags
    if f.get("speculative_algorithm") not in EAGLE_FAMILY or f.get("speculative_draft_model_path"):
        return None
    if ctx.model.num_mtp_layers > 0 and f.get("speculative_algorithm") != "EAGLE3":
        return None  # the checkpoint's own MTP layers are the draft
    return Rejection(
        rule="mtp_needs_draft",
        stage="load",
        reason=f"{ctx.model.name} has no MTP layers "
        "(num_nextn_predict_layers = 0); give --speculative-draft-model-path (an EAGLE/EAGLE3 draft)",
        engine_error=None,
        source=_src(ctx, "speculative/spec_info.py"),
    )


def spec_v2_topk(ctx: Context) -> Rejection | None:
    """0.5.7-0.5.10 with SGLANG_ENABLE_SPEC_V2 set: spec v2 refuses an EAGLE tree (EAGLE and EAGLE3; STANDALONE too
    from 0.5.8) while resolving the arguments."""
    f, v = ctx.flags, ctx.version
    algorithms = {"EAGLE", "EAGLE3"} | ({"STANDALONE"} if v >= Version("0.5.8") else set())
    if not (Version("0.5.7") <= v < Version("0.5.11") and f.get("spec_v2_env")):
        return None
    if f.get("speculative_algorithm") not in algorithms or (f.get("speculative_eagle_topk") or 1) <= 1:
        return None
    return Rejection(
        rule="spec_v2_topk",
        reason="spec v2 (SGLANG_ENABLE_SPEC_V2) drafts a chain only: give --speculative-eagle-topk 1 or unset it",
        engine_error="ValueError: Spec v2 currently only supports topk = 1 for speculative decoding.",
        source=_src(ctx, spec_handler(f["speculative_algorithm"], v)),
    )


def eagle_steps_without_topk(ctx: Context) -> Rejection | None:
    """An EAGLE-family command that gives --speculative-num-steps leaves the other two to the user (the engine
    chooses all three only when none is given): a missing top-k reaches the paged-tree check as None, in every
    release from 0.5.2 (server_args.py; arg_groups/speculative_hook.py _handle_eagle_family from 0.5.13)."""
    f = ctx.flags
    if f.get("speculative_algorithm") not in EAGLE_WORKER:
        return None
    if f.get("speculative_num_steps") is None or f.get("speculative_eagle_topk") is not None:
        return None
    return Rejection(
        rule="eagle_steps_without_topk",
        reason="--speculative-num-steps without --speculative-eagle-topk: give both (and --speculative-num-draft-tokens"
        " for a tree), or none of the three for the engine's choice",
        engine_error="TypeError: '>' not supported between instances of 'NoneType' and 'int'",
        source=_src(ctx, spec_handler(f["speculative_algorithm"], ctx.version)),
    )


def spec_handler(algorithm: str, version: Version) -> str:
    """Where SGLang resolves the options of a speculative algorithm: one function in server_args.py, one handler
    per algorithm in arg_groups/speculative_hook.py from 0.5.13."""
    if version < Version("0.5.13"):
        return "server_args.py _handle_speculative_decoding"
    handler = {"DFLASH": "_handle_dflash", "NGRAM": "_handle_ngram", "FROZEN_KV_MTP": "_handle_frozen_kv_mtp"}
    return f"arg_groups/speculative_hook.py {handler.get(algorithm, '_handle_eagle_family')}"


def enough_gpus(ctx: Context) -> Rejection | None:
    f = ctx.flags
    needed = f["dp_size"] * f["tp_size"] * f["pp_size"]
    if needed <= ctx.gpus_available:
        return None
    return Rejection(
        rule="not_enough_gpus",
        stage="load",
        reason=f"needs dp × tp × pp = {needed} GPUs; {ctx.gpus_available} are available",
        engine_error="RuntimeError: CUDA error: invalid device ordinal",
        source=_src(ctx, "entrypoints/engine.py (scheduler processes on base_gpu_id + tp_rank)"),
    )


def allreduce_fusion_platform(ctx: Context) -> Rejection | None:
    """0.5.23 resolves the FlashInfer all-reduce fusion backend when it sets up the fusion workspaces, before CUDA
    graph capture, wherever the fusion group has more than one GPU; off SM90 / SM100 that raises."""
    f = ctx.flags
    asked = f.get("enable_flashinfer_allreduce_fusion") or f.get("flashinfer_allreduce_fusion_backend")
    capability = ctx.cluster.gpu.compute_capability.value
    runs_on = flag_table("sglang").allreduce_fusion["capabilities"]  # is_sm90 / is_sm100
    if ctx.version < V0523 or not asked or f["tp_size"] == 1 or capability in runs_on:
        return None
    return Rejection(
        rule="allreduce_fusion_platform",
        stage="load",
        reason=f"FlashInfer's all-reduce fusion runs on SM90 and SM100 GPUs only; {ctx.cluster.gpu.name} is "
        f"{capability}: drop --enable-flashinfer-allreduce-fusion / --flashinfer-allreduce-fusion-backend",
        engine_error="ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
        source=_src(
            ctx,
            "layers/flashinfer_comm_fusion.py _resolve_backend (ensure_workspace_initialized, from "
            "model_executor/runner/base_runner.py _pre_initialize_flashinfer_allreduce_workspace)",
        ),
    )


def prefill_graph_backend(ctx: Context) -> Rejection | None:
    """0.5.14's parser offers every capture backend for either phase, and its checks then refuse a full graph for
    prefill, whose shapes vary (from 0.5.15 prefill may take it)."""
    backend = ctx.flags.get("cuda_graph_backend_prefill")
    if backend != "full" or ctx.version >= Version(flag_table("sglang").prefill_graph["breakable_default_since"]):
        return None
    return Rejection(
        rule="prefill_graph_backend",
        reason="SGLang 0.5.14 captures no full CUDA graph for prefill: --cuda-graph-backend-prefill takes "
        "breakable, tc_piecewise or disabled there",
        engine_error="ValueError: --cuda-graph-config[prefill].backend='full' not allowed; allowed: "
        "('breakable', 'tc_piecewise', 'disabled')",
        source=_src(
            ctx, "server_args.py _validate_cuda_graph_config (cuda_graph_config.py ALLOWED_BACKENDS_PER_PHASE)"
        ),
    )


RULES: list[Rule] = [
    attn_dp_divides_tp,
    attn_cp_divides_tp,
    moe_tp_zero,
    ep_divides_tp,
    replicas_with_attn_dp,
    moe_dp_rules,
    heads_split,
    tp_exceeds_experts,
    experts_split_evenly,
    partitions_fit_blocks,
    multi_node,
    moe_dense_tp,
    dcp_rules,
    dcp_backend,
    deepep_link,
    chunk_fits_pages,
    prefill_budget_admits,
    pipeline_exclusions,
    feature_combinations,
    mtp_needs_draft,
    spec_v2_topk,
    eagle_steps_without_topk,
    attention_dp_support,
    language_model_only,
    allreduce_fusion_platform,
    prefill_graph_backend,
    enough_gpus,
]
