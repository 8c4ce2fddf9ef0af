"""Per-GPU memory of a layout, the KV-cache pool the engine will size from it, and whether it starts.

Weights are the exact checkpoint bytes of each tensor, divided the way the layout splits it, on the
pipeline stage that holds its layer. The KV pool follows the engine's rule, read from the layout:
- SGLang: pool = mem_fraction_static × (memory free before weights load) − weights (kv_cache_configurator:
  rest_memory = available_after_load − pre_load × (1 − mem_fraction_static)); activations and CUDA graphs
  live in the remaining share.
- vLLM: pool = gpu_memory_utilization × total − weights − non-torch memory − activation peak − CUDA-graph
  estimate (v1/worker/gpu_worker.py determine_available_memory), and it must hold one max_model_len request.
The pool is the same on every rank of an attention-DP group, so the fullest GPU decides it.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field

from shardwise.engines.layout import (
    EngineOptions,
    Layout,
    groups,
    stage_layers,
    weight_split,
    weight_ways,
    with_kv_dtype,
)
from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.load import runtime
from shardwise.memo import Memo
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.drafter import load_drafter
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import Weight, model_weights

GiB = 2**30
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "MTP", "FROZEN_KV_MTP", "mtp", "eagle", "eagle3")


class GpuMemory(Frozen):
    gpu: int
    stage: int
    capacity_bytes: float
    weights_bytes: float
    kv_bytes: float
    runtime_bytes: float = Field(description="CUDA stack, communication buffers, engine caches")
    activation_bytes: float = Field(description="activation peak at the prefill chunk")
    cuda_graph_bytes: float

    @property
    def other_bytes(self) -> float:
        return self.runtime_bytes + self.activation_bytes + self.cuda_graph_bytes

    @property
    def free_bytes(self) -> float:
        return _free_bytes(self.capacity_bytes, self.weights_bytes, self.kv_bytes, self.other_bytes)


def _free_bytes(capacity: float, weights: float, kv: float, other: float) -> float:
    """What a GPU has left after its weights, KV cache and the rest (runtime, activations, graphs)."""
    return capacity - weights - kv - other


class MemoryLedger(Frozen):
    """Memory per GPU, KV capacity and the verdict, each with the numbers behind it."""

    verdict: Literal["ok", "oom", "no_kv_room"]
    reason: str | None = None
    engine_error: str | None = None
    capacity_bytes: float = Field(description="each GPU's memory")
    stage_weights_bytes: tuple[float, ...] = Field(description="weights on each GPU of each pipeline stage")
    kv_pool_bytes: float = Field(description="the KV cache on each GPU (every stage sizes the same pool)")
    runtime_bytes: float = Field(description="CUDA stack, communication buffers, engine caches, on each GPU")
    activation_bytes: float = Field(description="activation peak at the prefill chunk, on each GPU")
    cuda_graph_bytes: float = Field(description="captured CUDA graphs, on each GPU")
    gpu_stages: tuple[int, ...] = Field(description="the stage of each GPU the layout uses, in GPU order")
    weights_by_component_bytes: dict[str, float] = Field(description="on the fullest GPU")
    kv_bytes_per_token: float = Field(description="per GPU, for the stage with the most layers")
    kv_tokens_per_rank: int = Field(description="tokens one attention-DP rank's pool holds")
    kv_tokens_total: int = Field(description="unique tokens over every attention-DP rank and copy")
    state_bytes_per_request: float = Field(0, description="fixed per-request state (linear attention), per GPU")
    kv_window_tokens: int | None = Field(
        None,
        description="tokens a request keeps in its sliding-window layers at most, where the engine frees what "
        "leaves the window (vLLM's hybrid KV manager); None: every cached layer keeps every token",
    )
    kv_full_share: float = Field(1.0, description="share of a token's cache bytes in layers that keep every token")
    max_running_requests_per_rank: int | None = None
    ranks: int = Field(description="independent KV pools: attention-DP ranks × copies")
    largest_fraction: float | None = Field(
        None,
        description="the largest memory fraction that still leaves every GPU its activation peak and CUDA-graph "
        "memory (SGLang's mem_fraction_static, which they live outside of); None where the engine sizes them "
        "inside the fraction",
    )
    warnings: tuple[str, ...] = ()

    @property
    def stages(self) -> tuple[GpuMemory, ...]:
        """One row per pipeline stage (its first GPU): a stage's GPUs hold the same (made from the fields when asked: a
        search sizes thousands of layouts of up to 64 stages, and a copy with other figures shows its own)."""
        return tuple(GpuMemory(gpu=self.gpu_stages.index(stage), stage=stage, capacity_bytes=self.capacity_bytes,
                               weights_bytes=weights, kv_bytes=self.kv_pool_bytes, runtime_bytes=self.runtime_bytes,
                               activation_bytes=self.activation_bytes, cuda_graph_bytes=self.cuda_graph_bytes)
                     for stage, weights in enumerate(self.stage_weights_bytes))  # fmt: skip

    @property
    def per_gpu(self) -> tuple[GpuMemory, ...]:
        """Every GPU's row (built when asked for: a search keeps thousands of ledgers of up to 64 GPUs each)."""
        return tuple(self.stages[stage].model_copy(update={"gpu": gpu}) for gpu, stage in enumerate(self.gpu_stages))

    def request_tokens(self, context_tokens: float | np.ndarray) -> float | np.ndarray:
        """Pool tokens one request of `context_tokens` holds (fewer than its tokens where sliding-window layers
        keep only their window); element-wise for an array of requests."""
        if self.kv_window_tokens is None:
            return context_tokens
        a = self.kv_full_share
        return a * context_tokens + (1 - a) * np.minimum(context_tokens, self.kv_window_tokens)

    def max_concurrency(self, *, isl: int, osl: int) -> int:
        """Requests of isl + osl tokens the pools hold at once (the KV bound, capped by running slots)."""
        if self.verdict != "ok":
            return 0
        per_request = self.kv_bytes_per_token * self.request_tokens(isl + osl) + self.state_bytes_per_request
        pool = self.kv_tokens_per_rank * self.kv_bytes_per_token
        per_rank = int(pool // per_request) if per_request else 0
        if self.max_running_requests_per_rank is not None:
            per_rank = min(per_rank, self.max_running_requests_per_rank)
        return per_rank * self.ranks


_PROFILES = Memo(16)  # per model, whether MTP layers draft: its weight profile


def _weight_profile(model: ModelSpec, *, mtp: bool) -> dict[tuple[str, str], tuple[Weight, list[float]]]:
    """Bytes of each (component, role) by position: one slot per decoder layer, then one for what the first
    stage holds (embeddings, vision tower) and one for what the last holds (lm_head, final norm, MTP layers).
    Remembered per model: every layout splits the same tensors."""

    def profiled() -> dict[tuple[str, str], tuple[Weight, list[float]]]:
        weights = model_weights(model) + (model_weights(model, mtp=True) if mtp else [])
        n = model.num_layers
        profile: dict[tuple[str, str], tuple[Weight, list[float]]] = {}
        for w in weights:
            if w.layer is None or w.layer >= n:
                slot = n if w.role in ("embedding", "vision") else n + 1
            else:
                slot = w.layer
            entry = profile.setdefault((w.component, w.role), (w, [0.0] * (n + 2)))
            entry[1][slot] += w.bytes
        return profile

    return _PROFILES.get((model,), mtp, profiled)


_STAGE_WEIGHTS = Memo(256)  # per model, drafter and how a layout splits the weights: their bytes per stage


def _stage_weights(model: ModelSpec, layout: Layout, drafter: ModelSpec | None = None) -> tuple[dict[str, float], ...]:
    """Bytes per component on one GPU of each stage (shared: read them, do not change them). Remembered by all they
    read: the pipeline, how each tensor is split (`weight_split`) and whether the MTP layers draft; a search sizes
    each structure with CUDA graphs off, the memory fraction raised and so on, and many structures split alike."""
    spec = layout.options.spec
    mtp = bool(spec and spec.algorithm in EAGLE_FAMILY and model.num_mtp_layers)
    key = (mtp, layout.pp, layout.pp_extra_layers, weight_split(layout))
    return _STAGE_WEIGHTS.get((model, drafter), key, lambda: tuple(_weights_per_stage(model, layout, drafter, mtp)))


def _weights_per_stage(
    model: ModelSpec, layout: Layout, drafter: ModelSpec | None, mtp: bool
) -> list[dict[str, float]]:
    ranges = stage_layers(model.num_layers, layout.pp, layout.pp_extra_layers)
    stages: list[dict[str, float]] = [{} for _ in ranges]
    n = model.num_layers
    for (component, _), (rep, slots) in _weight_profile(model, mtp=mtp).items():
        ways = weight_ways(rep, layout, model)
        for stage, r in enumerate(ranges):
            share = sum(slots[r.start : r.stop]) + (slots[n] if stage == 0 else 0.0)
            share += slots[n + 1] if stage == layout.pp - 1 else 0.0
            if share:
                stages[stage][component] = stages[stage].get(component, 0.0) + share / ways
    if drafter is not None:  # a separate draft checkpoint: its layers on every GPU of the stage, split by TP
        layers = sum(w.bytes / weight_ways(w, layout, drafter) for w in model_weights(drafter) if w.layer is not None)
        stages[-1]["draft model"] = layers
    return stages


def _drafter(model: ModelSpec, layout: Layout) -> tuple[ModelSpec | None, tuple[str, ...]]:
    """The draft checkpoint a launch command names (not the target's own MTP layers), and a warning when its
    config cannot be read. Its embedding and lm_head are the target's (DFlash, MTP-style heads)."""
    spec = layout.options.spec
    if spec is None or not spec.draft_model:
        return None, ()
    try:
        return load_drafter(spec.draft_model).model, ()
    except SpecError as exc:
        return None, (f"the draft model's memory is not counted: {exc}",)


def kv_bytes_per_token(model: ModelSpec, layout: Layout, layers: range) -> float:
    """Cache bytes one token takes on one GPU of the stage holding `layers` (MLA latent on every
    attention-TP rank; GQA heads split, at least one per GPU; the draft's layers added for EAGLE/MTP)."""
    caching = len(layers) - model.layer_attention[layers.start : layers.stop : layers.step].count("linear")
    per_layer = model.kv_bytes_per_token_per_layer()
    if model.attention.kind == "gqa":
        kv_heads = model.attention.num_kv_heads
        per_gpu_heads = max(1, kv_heads // max(1, layout.attn_tp // layout.dcp))
        per_layer = per_layer * per_gpu_heads / kv_heads
    cell = caching * per_layer
    spec = layout.options.spec
    if spec and spec.algorithm in EAGLE_FAMILY and not spec.draft_model:
        cell += cell * max(1, model.num_mtp_layers) / model.num_layers
    return cell


_CELLS = Memo(256)  # per model (as its KV cache stores it), the cache bytes of a token on each stage


def _stage_cells(model: ModelSpec, layout: Layout) -> list[float]:
    """`kv_bytes_per_token` of each stage's layers, remembered by what it reads of the layout (a search sizes each
    structure's KV cache with several option sets)."""
    key = (layout.pp, layout.pp_extra_layers, layout.attn_tp, layout.dcp, layout.options.spec)
    ranges = stage_layers(model.num_layers, layout.pp, layout.pp_extra_layers)
    return list(_CELLS.get((model,), key, lambda: tuple(kv_bytes_per_token(model, layout, r) for r in ranges)))


def activation_bytes(model: ModelSpec, layout: Layout, tokens: int, *, sampled: int) -> float:
    """Live activations of a forward pass over `tokens` on one GPU: the residual stream and its neighbours
    (4 × hidden), plus the widest intermediate (attention q/k/v/out or the MLP's gate/up/act; for MoE the
    fused kernel's caches for every routed copy), plus fp32 logits of the sampled tokens."""
    h2 = model.hidden_size * 2
    att = model.attention
    if att.kind == "mla" and att.mla:
        attention = att.num_heads / layout.attn_tp * (2 * att.head_dim + att.mla.v_head_dim) * 2
    else:
        attention = (att.num_heads + 2 * att.num_kv_heads) / layout.attn_tp * att.head_dim * 2 * 2
    mlp = 3 * model.intermediate_size / layout.dense_tp * 2 if model.layer_mlp.count("dense") else 0.0
    if model.moe:
        routed = model.moe.top_k * (3 * model.moe.expert_intermediate_size / layout.moe_tp * 2 + h2)
        mlp = max(mlp, routed)
    gathered = layout.attn_dp if layout.attn_dp > 1 and layout.moe_comm != "all2all" else 1
    per_token = 4 * h2 + max(attention, mlp * gathered)
    logits = sampled * model.vocab_size / layout.lm_head_tp * 4
    return tokens * per_token + logits


def _runtime_bytes(layout: Layout, cluster: ClusterSpec) -> float:
    """Memory outside the weights, KV cache, activations and graphs: the measured default (one GPU, or several with
    their communicators), or what a start-up log of this machine showed (a calibrated non_torch_bytes)."""
    rt = runtime()
    alone = layout.stage_gpus == 1 and layout.pp == 1
    total = (rt.non_torch_single_gpu if alone else rt.non_torch_multi_gpu).si("bytes")
    if cluster.calibration is not None:
        total = cluster.calibration.value("non_torch_bytes", total)
    if layout.a2a_backend.startswith("deepep"):
        total += rt.deepep_buffers.si("bytes")
    return total


def memory_ledger(model: ModelSpec, layout: Layout, cluster: ClusterSpec) -> MemoryLedger:
    """The memory of every GPU of `layout` on `cluster`, the KV pool the engine sizes, and the verdict."""
    opts = layout.options
    weights_of, model = model, with_kv_dtype(model, layout)  # the weights are the same whatever the KV cache stores
    capacity = cluster.gpu.memory_bytes
    ranges = stage_layers(model.num_layers, layout.pp, layout.pp_extra_layers)
    drafter, draft_warning = _drafter(model, layout)
    stage_components = _stage_weights(weights_of, layout, drafter)
    stage_weights = [sum(c.values()) for c in stage_components]
    rt = _runtime_bytes(layout, cluster)
    vlm_cache = runtime().vlm_cache.si("bytes") if model.vision and not opts.activations_in_budget else 0.0
    if opts.chunked_prefill_tokens is None or opts.memory_fraction is None:
        raise ValueError("layout lacks its engine's chunked-prefill size or memory fraction; build it with an engine")
    chunk = opts.chunked_prefill_tokens
    sampled = min(chunk, opts.max_running_requests or chunk)
    act = activation_bytes(model, layout, chunk, sampled=sampled)
    graph_batch = opts.cuda_graph_max_bs or 0
    graphs = activation_bytes(model, layout, graph_batch, sampled=graph_batch) if opts.cuda_graph else 0.0
    fraction = opts.memory_fraction
    kv_per_stage = []
    for weights in stage_weights:
        if opts.memory_fraction_of == "free_at_start":
            kv_per_stage.append(fraction * (capacity - rt) - weights - vlm_cache)
        else:
            kv_per_stage.append(_total_share_pool(opts, capacity, weights=weights, rt=rt, act=act, graphs=graphs))
    kv = max(0.0, min(kv_per_stage))
    cells = _stage_cells(model, layout)
    if drafter is not None:  # the draft keeps a KV cache of the same tokens in its own layers
        cells = [c + kv_bytes_per_token(drafter, layout, range(drafter.num_layers)) for c in cells]
    page = opts.page_size or 1
    caching = [c for c in cells if c > 0]  # a stage of linear-attention layers only caches no tokens
    tokens = min(int(kv // c) // page * page for c in caching) * layout.dcp if kv > 0 and caching else 0
    worst = max(range(layout.pp), key=lambda s: stage_weights[s])
    gpu_stages, firsts = _gpu_stages(layout)
    window_tokens, full_share = _window_kept(model, layout, ranges[worst])
    verdict, reason, error = _verdict(
        layout, capacity=capacity, weights=stage_weights[worst], rt=rt, kv=kv, tokens=tokens, cell=max(cells),
        longest=_longest_request(model, layout, full_share if window_tokens else None),
    )  # fmt: skip
    state = model.linear_state_bytes / max(1, layout.attn_tp)
    return MemoryLedger(
        verdict=verdict,
        reason=reason,
        engine_error=error,
        capacity_bytes=capacity,
        stage_weights_bytes=tuple(stage_weights),
        kv_pool_bytes=kv,
        runtime_bytes=rt + vlm_cache,
        activation_bytes=act,
        cuda_graph_bytes=graphs,
        gpu_stages=gpu_stages,
        weights_by_component_bytes=stage_components[worst],
        kv_bytes_per_token=max(cells),
        kv_tokens_per_rank=tokens,
        kv_tokens_total=tokens * layout.attn_dp * layout.replicas,
        state_bytes_per_request=state,
        kv_window_tokens=window_tokens,
        kv_full_share=full_share,
        max_running_requests_per_rank=_running_slots(model, layout, tokens),
        ranks=layout.attn_dp * layout.replicas,
        largest_fraction=None
        if opts.activations_in_budget
        else _largest_fraction(capacity, rt, act + graphs + opts.fraction_reserve_bytes),
        warnings=tuple(
            _headroom_warnings(firsts, capacity, stage_weights, kv, rt + vlm_cache, act, graphs)
            if verdict == "ok"
            else ()
        )  # fmt: skip
        + _margin_warning(min(kv_per_stage), layout, verdict)
        + draft_warning,
    )


def _window_kept(model: ModelSpec, layout: Layout, layers: range) -> tuple[int | None, float]:
    """Where the engine frees sliding-window blocks as the window passes them (vLLM's hybrid KV manager,
    SlidingWindowManager.remove_skipped_blocks): the tokens a request keeps in those layers at most, whole
    blocks covering window − 1 tokens plus the one being written, and the share of a token's bytes in the layers
    that keep every token."""
    if not layout.options.window_kv or not model.sliding_window:
        return None, 1.0
    full = sum(model.layer_attention[i] == "full" for i in layers)
    sliding = sum(model.layer_attention[i] == "sliding" for i in layers)
    if not sliding:
        return None, 1.0
    page = layout.options.page_size or 16
    kept = (-(-(model.sliding_window - 1) // page) + 1) * page
    return kept, full / (full + sliding)


def _longest_fitting(longest: tuple[int, float, float, int, int], tokens: int) -> int:
    """The longest max_model_len whose one request fits a pool of `tokens`: its need is
    page × (share × ⌈L / page⌉ + (1 − share) × window blocks)."""
    _, _, share, page, window_blocks = longest
    if share >= 1.0:
        return tokens
    fixed = page * (1 - share) * window_blocks
    return max(0, int((tokens - fixed) / share) // page * page)


def _longest_request(
    model: ModelSpec, layout: Layout, full_share: float | None
) -> tuple[int, float, float, int, int] | None:
    """vLLM's start-up check that one request of max_model_len fits the pool (kv_cache_planning.py
    max_memory_usage_bytes): (the longest request, the pool tokens it needs, the share of a token's bytes in
    layers that keep every token, the page, the sliding layers' blocks). With the hybrid manager a
    sliding-window layer needs only the window plus the tokens in flight (SlidingWindowSpec
    .max_admission_blocks_per_request: min(window − 1 + in-flight, max_model_len) tokens, in whole blocks, plus
    one); in flight is one chunk per step the scheduler keeps going at once (two when it overlaps)."""
    opts = layout.options
    longest = opts.max_model_len
    if not longest:
        return None
    page = opts.page_size or 16
    if full_share is None or not model.sliding_window:
        return longest, float(longest), 1.0, page, 0
    in_flight = (2 if opts.overlap_schedule else 1) * (opts.chunked_prefill_tokens or 0)
    held = min(model.sliding_window - 1 + in_flight, longest)
    blocks_full, blocks_window = -(-longest // page), -(-held // page) + 1
    need = page * (full_share * blocks_full + (1 - full_share) * blocks_window)
    return longest, need, full_share, page, blocks_window


def _total_share_pool(opts: EngineOptions, capacity: float, *, weights: float, rt: float, act: float,
                      graphs: float) -> float:  # fmt: skip
    """vLLM's pool: the share of the whole GPU less everything else. Sized after CUDA-graph capture (0.34's
    extensible KV cache), it is also capped by what is then free less a margin, max(floor, share × peak)."""
    if opts.kv_cache_bytes is not None:
        return opts.kv_cache_bytes
    pool = opts.memory_fraction * capacity - weights - rt - graphs
    if opts.kv_margin is not None:
        floor, share = opts.kv_margin
        pool = min(pool, capacity - weights - rt - graphs - max(floor, share * act))
    return pool - act


_GPU_STAGES = Memo(4096)  # per stage groups, each GPU's stage and each stage's first GPU


def _gpu_stages(layout: Layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The stage of every GPU in GPU order, and each stage's first GPU: remembered beside the layout's stage groups
    (which are remembered by the degrees they follow from, the pipeline's included)."""
    stages = groups(layout)["stage"]

    def placed() -> tuple[tuple[int, ...], tuple[int, ...]]:
        stage_of = {g: i % layout.pp for i, gpus in enumerate(stages) for g in gpus}
        gpu_stages = tuple(stage_of[g] for g in sorted(stage_of))
        return gpu_stages, tuple(gpu_stages.index(s) for s in range(layout.pp))

    return _GPU_STAGES.get((stages,), None, placed)


def _verdict(
    layout: Layout, *, capacity: float, weights: float, rt: float, kv: float, tokens: int, cell: float,
    longest: tuple[int, float, float, int, int] | None = None,
) -> tuple[Literal["ok", "oom", "no_kv_room"], str | None, str | None]:  # fmt: skip
    opts = layout.options
    if weights + rt > capacity:
        return (
            "oom",
            f"each GPU of the fullest stage needs {weights / GiB:,.1f} GiB of weights + {rt / GiB:.1f} GiB "
            f"for the CUDA stack, more than its {capacity / GiB:,.1f} GiB",
            "torch.OutOfMemoryError: CUDA out of memory (while loading weights)",
        )
    if kv > capacity - weights - rt:
        return (
            "oom",
            f"the memory fraction {opts.memory_fraction:g} asks for a KV pool of {kv / GiB:,.1f} GiB, more than the "
            f"{(capacity - weights - rt) / GiB:,.1f} GiB free after weights and the CUDA stack; the fraction is a "
            "share of the GPU, at most 1 and in practice below what leaves activations room",
            "torch.OutOfMemoryError: CUDA out of memory (while allocating the KV cache)",
        )
    if kv <= 0 and opts.memory_fraction_of == "free_at_start":
        minimum = weights / (capacity - rt)  # 1 - available / pre-load
        return (
            "no_kv_room",
            f"weights ({weights / GiB:,.1f} GiB) take all of mem_fraction_static "
            f"{opts.memory_fraction:.3f} × {(capacity - rt) / GiB:,.1f} GiB free at start, leaving no KV cache",
            f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
            f"{opts.memory_fraction}. Raise --mem-fraction-static above {math.ceil(minimum * 1000) / 1000:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative decoding, draft weights "
            "are now counted.",
        )
    if kv <= 0:
        return (
            "no_kv_room",
            f"weights, activations and runtime take all of gpu_memory_utilization "
            f"{opts.memory_fraction} × {capacity / GiB:,.1f} GiB",
            "ValueError: No available memory for the cache blocks.",
        )
    if longest and opts.activations_in_budget and tokens < longest[1]:
        length, need, shorter = longest[0], longest[1], _longest_fitting(longest, tokens)
        return (
            "no_kv_room",
            f"the KV pool holds {tokens:,} tokens, fewer than one request of max_model_len {length:,} needs "
            f"({need:,.0f}); lower --max-model-len to at most {shorter:,}",
            f"ValueError: To serve at least one request with the model's max seq len ({length}), "
            f"({need * cell / GiB:.2f} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({kv / GiB:.2f} GiB).",
        )
    if tokens < 1:
        return ("no_kv_room", f"{kv / GiB:.2f} GiB of KV cache is less than one page", None)
    return "ok", None, None


def _largest_fraction(capacity: float, rt: float, outside: float) -> float:
    """The largest SGLang-style fraction (of the memory free before weights load) that leaves `outside` bytes
    (activation peak, CUDA graphs, and what the engine reserves for needs the ledger does not size) and the
    uncertainty of the CUDA-stack estimate (the measured single- to multi-GPU spread) free on the GPU. The engine's
    own multiplier for multimodal models is not applied: SGLang applies it to its default only (arg_groups/
    memory_hook.py adjust_mem_fraction_for_vlm), to keep room for the image encoder, which text requests do not run."""
    rt_model = runtime()
    band = rt_model.non_torch_multi_gpu.si("bytes") - rt_model.non_torch_single_gpu.si("bytes")
    return 1 - (outside + band) / (capacity - rt)


def _running_slots(model: ModelSpec, layout: Layout, tokens: int) -> int:
    """Request slots per attention-DP rank: the engine's limit, or, where the engine leaves it to the pool (SGLang
    without --max-running-requests), resolve_max_num_reqs: tokens / context × 512 kept within 2048..4096. A
    request needs at least two cache slots, so never more than tokens // 2."""
    limit = layout.options.max_running_requests
    if limit is None:
        context = model.max_position_embeddings or tokens
        limit = max(min(int(tokens / context * 512), 4096), 2048)
    return min(limit, tokens // 2)


def _margin_warning(margin: float, layout: Layout, verdict: str) -> tuple[str, ...]:
    """The CUDA-stack figure is a measurement of another machine; say so when the verdict hangs on it."""
    rt = runtime()
    band = rt.non_torch_multi_gpu.si("bytes") - rt.non_torch_single_gpu.si("bytes")
    if verdict == "oom" or abs(margin) > band:
        return ()
    side = "left for" if margin > 0 else "short of"
    return (
        f"borderline: {abs(margin) / GiB:.2f} GiB {side} the KV cache is within the ±{band / GiB:.1f} GiB "
        "uncertainty of the CUDA-stack and communication-buffer estimate; set the memory fraction explicitly "
        "and confirm with a real start",
    )


def _headroom_warnings(firsts: tuple[int, ...], capacity: float, stage_weights: list[float], kv: float, rt: float,
                       act: float, graphs: float) -> list[str]:  # fmt: skip
    """Where the GPU with the least left (the first such, by stage) has less than nothing after everything else."""
    free = [_free_bytes(capacity, weights, kv, rt + act + graphs) for weights in stage_weights]
    tight = min(range(len(free)), key=free.__getitem__)
    if free[tight] >= 0:
        return []
    need = act + graphs
    return [
        f"GPU {firsts[tight]}: activations at the prefill chunk and CUDA graphs need about {need / GiB:.1f} GiB "
        f"but {(need + free[tight]) / GiB:.1f} GiB remain after weights, KV cache and runtime: "
        "expect out-of-memory under load; lower the chunked-prefill size or the memory fraction"
    ]
