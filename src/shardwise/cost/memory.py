"""Per-GPU memory of a layout, the KV-cache pool the engine will size from it, and whether it starts.

Weights are the exact checkpoint bytes of each tensor, divided the way the layout splits it, on the
pipeline stage that holds its layer. The KV pool follows the engine's rule, read from the layout:
- SGLang: pool = mem_fraction_static × (memory free before weights load) − weights (kv_cache_configurator:
  rest_memory = available_after_load − pre_load × (1 − mem_fraction_static)); activations and CUDA graphs
  live in the remaining share. For a hybrid sliding-window model the pool holds two: the full layers' tokens and
  swa_full_tokens_ratio × as many for the sliding-window layers (pool_configurator.py HybridSWAPoolConfigurator).
- vLLM: pool = gpu_memory_utilization × total − weights − non-torch memory − activation peak − CUDA-graph
  estimate (v1/worker/gpu_worker.py determine_available_memory), on each pipeline stage from its own memory, in whole
  blocks (cost/kv_blocks.py: its KV groups, 0.34's granules); every stage keeps the fewest blocks any holds, one of
  them the null block, and the rest must hold one max_model_len request.
The pool is the same on every rank of an attention-DP group, so the fullest GPU decides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal, NamedTuple

import numpy as np
from pydantic import Field

from shardwise.cost.book import PriceBook
from shardwise.cost.kv_blocks import request_groups, stage_blocks, stage_tensors
from shardwise.engines.layout import (
    EngineOptions,
    Layout,
    StatePool,
    WindowPool,
    groups,
    stage_layers,
    weight_split,
    weight_ways,
    with_kv_dtype,
)
from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.load import runtime
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.drafter import load_drafter
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import Weight, model_weights

GiB = 2**30


class GpuMemory(Frozen):
    gpu: int
    stage: int
    capacity_bytes: float
    weights_bytes: float
    kv_bytes: float
    runtime_bytes: float = Field(description="CUDA stack, communication buffers, engine caches")
    activation_bytes: float = Field(description="activation peak at the prefill chunk")
    cuda_graph_bytes: float
    state_bytes: float = Field(0, description="the linear-attention state pool, where it is its own")

    @property
    def other_bytes(self) -> float:
        return self.runtime_bytes + self.activation_bytes + self.cuda_graph_bytes + self.state_bytes

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
    kv_pool_bytes: float = Field(description="the KV cache budget on each GPU (the least of any stage)")
    runtime_bytes: float = Field(description="CUDA stack, communication buffers, engine caches, on each GPU")
    activation_bytes: float = Field(description="activation peak at the prefill chunk, on each GPU")
    cuda_graph_bytes: float = Field(description="captured CUDA graphs, on each GPU")
    gpu_stages: tuple[int, ...] = Field(description="the stage of each GPU the layout uses, in GPU order")
    weights_by_component_bytes: dict[str, float] = Field(description="on the fullest GPU")
    kv_bytes_per_token: float = Field(
        description="cache bytes per token of kv_tokens_per_rank, per GPU, on the stage with the most (with a window "
        "pool: the full layers' bytes plus the window pool's share of the sliding-window layers'; with vLLM's KV "
        "groups: a token of one group, the largest group's layers)"
    )
    kv_tokens_per_rank: int = Field(
        description="tokens one attention-DP rank's pool holds (with a window pool: the full layers' pool, SGLang's "
        "max_total_num_tokens; vLLM: num_blocks × block size, its null block included, a token of one KV group)"
    )
    kv_held_back_tokens_per_rank: int = Field(
        0, description="tokens of kv_tokens_per_rank the engine never hands to a request (vLLM's null block)"
    )
    kv_tokens_total: int = Field(description="unique tokens over every attention-DP rank and copy")
    state_bytes_per_request: float = Field(0, description="fixed per-request state (linear attention), per GPU")
    state_slots_per_rank: int | None = Field(
        None,
        description="where the states have a pool of their own (SGLang's mamba pool): its slots per rank "
        "(max_mamba_cache_size); None: states, if any, come out of the KV pool",
    )
    state_pool_bytes: float = Field(0, description="that pool's bytes on one GPU, padding slots included")
    state_requests_per_rank: int | None = Field(
        None, description="the requests that pool holds at once: its slots over the slots one request holds"
    )
    kv_window_tokens: int | None = Field(
        None,
        description="tokens a request keeps in its sliding-window layers at most, where the engine frees what "
        "leaves the window (vLLM's hybrid KV manager, SGLang's window pool); None: every cached layer keeps every "
        "token",
    )
    kv_full_groups: int = Field(
        1,
        description="where sliding-window layers share the pool in KV groups of their own (vLLM): the groups of "
        "layers that keep every token, each taking a request's tokens from the pool",
    )
    kv_window_groups: int = Field(
        0, description="the groups of sliding-window layers, each taking the tokens a request keeps in its window"
    )
    kv_window_pool_tokens_per_rank: int | None = Field(
        None,
        description="where sliding-window layers keep their tokens in a pool of their own (SGLang's hybrid SWA "
        "memory): its tokens per attention-DP rank (swa_max_total_num_tokens); None: one pool",
    )
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
        return tuple(
            GpuMemory(
                gpu=self.gpu_stages.index(stage),
                stage=stage,
                capacity_bytes=self.capacity_bytes,
                weights_bytes=weights,
                kv_bytes=self.kv_pool_bytes,
                runtime_bytes=self.runtime_bytes,
                activation_bytes=self.activation_bytes,
                cuda_graph_bytes=self.cuda_graph_bytes,
                state_bytes=self.state_pool_bytes,
            )
            for stage, weights in enumerate(self.stage_weights_bytes)
        )

    @property
    def per_gpu(self) -> tuple[GpuMemory, ...]:
        """Every GPU's row (built when asked for: a search keeps thousands of ledgers of up to 64 GPUs each)."""
        return tuple(self.stages[stage].model_copy(update={"gpu": gpu}) for gpu, stage in enumerate(self.gpu_stages))

    @property
    def kv_usable_tokens_per_rank(self) -> int:
        """Tokens of one rank's pool that requests can take."""
        return self.kv_tokens_per_rank - self.kv_held_back_tokens_per_rank

    def request_tokens(self, context_tokens: float | np.ndarray) -> float | np.ndarray:
        """Tokens of kv_tokens_per_rank one request of `context_tokens` L takes, element-wise for an array of
        requests: L where every layer keeps every token; where sliding-window layers keep only W of them (W =
        kv_window_tokens), either f · L + w · min(L, W) of one shared pool (f and w: the groups of full and of
        sliding-window layers), or, with a window pool of its own, what the pool it fills first asks, in full-pool
        tokens: max(L, min(L, W) × full pool / window pool). With SGLang's default ratio 0.8 the window pool
        binds requests shorter than W / 0.8; for requests of mixed lengths, taking the larger of the two for each
        asks a little more than the pools would."""
        if self.kv_window_tokens is None:
            return context_tokens
        window = np.minimum(context_tokens, self.kv_window_tokens)
        pool = self.kv_window_pool_tokens_per_rank
        if pool is not None:
            full_per_window = self.kv_tokens_per_rank / pool if pool else math.inf  # full-pool tokens per window token
            return np.maximum(context_tokens, window * full_per_window)
        return self.kv_full_groups * context_tokens + self.kv_window_groups * window

    def holder(self, *, isl: int, osl: int) -> str:
        """What sets `max_concurrency`: the KV pool, the linear-attention state pool, or the engine's limit on
        running requests."""
        cap = self.max_concurrency(isl=isl, osl=osl) // max(1, self.ranks)
        if self.state_requests_per_rank is not None and cap == self.state_requests_per_rank:
            return "its linear-attention state pool"
        if self.max_running_requests_per_rank is not None and cap == self.max_running_requests_per_rank:
            return "its running-request limit"
        return "its KV pool"

    def max_concurrency(self, *, isl: int, osl: int) -> int:
        """Requests of isl + osl tokens the pools hold at once (the KV bound, capped by running slots)."""
        if self.verdict != "ok":
            return 0
        state = self.state_bytes_per_request if self.state_slots_per_rank is None else 0.0  # its own pool caps slots
        per_request = self.kv_bytes_per_token * self.request_tokens(isl + osl) + state
        pool = self.kv_usable_tokens_per_rank * self.kv_bytes_per_token
        per_rank = int(pool // per_request) if per_request else 0
        if self.max_running_requests_per_rank is not None:
            per_rank = min(per_rank, self.max_running_requests_per_rank)
        return per_rank * self.ranks


Profile = dict[tuple[str, str], tuple[Weight, list[float]]]


def _weight_profile(model: ModelSpec, *, mtp: bool) -> Profile:
    """Bytes of each (component, role) by position: one slot per decoder layer, then one for what the first
    stage holds (embeddings, vision tower) and one for what the last holds (lm_head, final norm, MTP layers)."""
    weights = model_weights(model) + (model_weights(model, mtp=True) if mtp else [])
    n = model.num_layers
    profile: Profile = {}
    for w in weights:
        if w.layer is None or w.layer >= n:
            slot = n if w.role in ("embedding", "vision") else n + 1
        else:
            slot = w.layer
        entry = profile.setdefault((w.component, w.role), (w, [0.0] * (n + 2)))
        entry[1][slot] += w.bytes
    return profile


def _stage_weights(
    book: PriceBook, model: ModelSpec, layout: Layout, drafter: ModelSpec | None = None
) -> tuple[dict[str, float], ...]:
    """Bytes per component on one GPU of each stage (read them, do not change them), kept in the book by all they
    read: the pipeline, how each tensor is split (`weight_split`) and whether the MTP layers draft (every layout
    splits the same tensors; a search sizes each structure with several option sets, and many split alike)."""
    spec = layout.options.spec
    mtp = bool(spec and spec.kind == "eagle" and model.num_mtp_layers)
    key = (mtp, layout.pp, layout.pp_extra_layers, weight_split(layout))

    def split() -> tuple[dict[str, float], ...]:
        profile = book.weight_profiles.get((model,), mtp, lambda: _weight_profile(model, mtp=mtp))
        return tuple(_weights_per_stage(model, layout, drafter, profile))

    return book.stage_weights.get((model, drafter), key, split)


def _weights_per_stage(
    model: ModelSpec, layout: Layout, drafter: ModelSpec | None, profile: Profile
) -> list[dict[str, float]]:
    ranges = stage_layers(model.num_layers, layout.pp, layout.pp_extra_layers)
    stages: list[dict[str, float]] = [{} for _ in ranges]
    n = model.num_layers
    for (component, _), (rep, slots) in profile.items():
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
    """Cache bytes one pool token takes on one GPU of the stage holding `layers` (MLA latent on every
    attention-TP rank; GQA heads split, at least one per GPU; the draft's layers added for EAGLE/MTP): one per
    KV tensor of the stage (`stage_tensors`: its caching layers, or with vLLM's KV groups the largest group's). With
    a window pool, a token of the full layers' pool comes with full_tokens_ratio tokens of the window pool: full +
    ratio × sliding layers, or the sliding layers alone on a stage without full ones (pool_configurator.py
    HybridSWAPoolConfigurator._recompute_cell_size; its MTP layers are full layers). Sparse attention adds its
    indexer's key per token in each layer that runs one."""
    kinds = model.layer_attention[layers.start : layers.stop : layers.step]
    per_layer = model.kv_bytes_per_token_per_layer()
    if model.attention.kind == "gqa":
        kv_heads = model.attention.num_kv_heads
        per_gpu_heads = max(1, kv_heads // max(1, layout.attn_tp // layout.dcp))
        per_layer = per_layer * per_gpu_heads / kv_heads
    spec = layout.options.spec
    mtp = bool(spec and spec.kind == "eagle" and not spec.draft_model)
    pool = layout.options.window_pool
    if pool is not None and "sliding" in kinds:
        full, sliding = kinds.count("full"), kinds.count("sliding")
        cell = (full + (pool.full_tokens_ratio if full else 1.0) * sliding) * per_layer
        return cell + (per_layer * max(1, model.num_mtp_layers) if mtp else 0.0)
    cell = stage_tensors(model, layout, layers) * per_layer
    # sparse attention's indexer keys: whole on every DCP rank, where the latent is interleaved (SGLang
    # model_executor/pool_configurator.py _compute_cell_size), or like it a rank's own tokens' alone (vLLM)
    index = model.index_bytes_per_token(layers)
    if layout.options.index_keys_every_layer and model.attention.sparse is not None:
        index = len(layers) * model.attention.sparse.key_bytes
    cell += index * (1 if layout.options.index_keys_sharded else layout.dcp)
    return cell + (cell * max(1, model.num_mtp_layers) / model.num_layers if mtp else 0.0)


def _stage_cells(
    book: PriceBook, model: ModelSpec, layout: Layout
) -> tuple[list[float], list[int], list[tuple[int, float]]]:
    """`kv_bytes_per_token` and `stage_tensors` of each stage's layers, and the indexer caches among them (tensors,
    bytes a token each) where the engine maps each in granules of its own (vLLM 0.34: the indexer's cache is a
    layer of its own), kept in the book by what they read of the layout (a search sizes each structure's KV cache
    with several option sets)."""
    opts = layout.options
    key = (
        layout.pp,
        layout.pp_extra_layers,
        layout.attn_tp,
        layout.dcp,
        opts.spec,
        opts.window_pool,
        opts.window_kv,
        opts.index_keys_every_layer,
        opts.index_keys_sharded,
        opts.kv_granule_bytes,
    )
    ranges = stage_layers(model.num_layers, layout.pp, layout.pp_extra_layers)
    sparse = model.attention.sparse

    def index(r: range) -> tuple[int, float]:
        if sparse is None or opts.kv_granule_bytes is None:
            return 0, 0.0
        return round(model.index_bytes_per_token(r) / sparse.key_bytes), float(sparse.key_bytes)

    def sized() -> tuple[tuple[float, ...], tuple[int, ...], tuple[tuple[int, float], ...]]:
        cells = tuple(kv_bytes_per_token(model, layout, r) for r in ranges)
        return cells, tuple(stage_tensors(model, layout, r) for r in ranges), tuple(index(r) for r in ranges)

    cells, tensors, keys = book.cells.get((model,), key, sized)
    return list(cells), list(tensors), list(keys)


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


def runtime_bytes(layout: Layout, cluster: ClusterSpec) -> float:
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


def memory_ledger(
    model: ModelSpec, layout: Layout, cluster: ClusterSpec, *, book: PriceBook | None = None
) -> MemoryLedger:
    """The memory of every GPU of `layout` on `cluster`, the KV pool the engine sizes, and the verdict. `book`: the
    price book of the search or check (default one of its own)."""
    book = book or PriceBook()
    opts = layout.options
    weights_of, model = model, with_kv_dtype(model, layout)  # the weights are the same whatever the KV cache stores
    capacity = cluster.gpu.memory_bytes
    drafter, draft_warning = _drafter(model, layout)
    stage_components = _stage_weights(book, weights_of, layout, drafter)
    stage_weights = [sum(c.values()) for c in stage_components]
    rt = runtime_bytes(layout, cluster)
    vlm_cache = runtime().vlm_cache.si("bytes") if model.vision and not opts.activations_in_budget else 0.0
    chunk = opts.prefill_plan_tokens
    if chunk is None or opts.memory_fraction is None:
        raise ValueError("layout lacks its engine's prefill budget or memory fraction; build it with an engine")
    sampled = min(chunk, opts.max_running_requests or chunk)
    act = activation_bytes(model, layout, chunk, sampled=sampled)
    graph_batch = opts.cuda_graph_max_bs or 0
    graphs = activation_bytes(model, layout, graph_batch, sampled=graph_batch) if opts.cuda_graph else 0.0
    kv_per_stage = _stage_budgets(layout, capacity, stage_weights, rt=rt, act=act, graphs=graphs, vlm_cache=vlm_cache)
    state_slots, state_pool = _state_pool(opts.state_pool, min(kv_per_stage))
    kv_per_stage = [budget - state_pool for budget in kv_per_stage]
    kv = max(0.0, min(kv_per_stage))
    cells, tensors, keys = _stage_cells(book, model, layout)
    if drafter is not None:  # the draft keeps a KV cache of the same tokens in its own layers
        cells = [c + kv_bytes_per_token(drafter, layout, range(drafter.num_layers)) for c in cells]
    pools = [max(0.0, p) for p in kv_per_stage] if opts.kv_pool_per_stage else [kv] * layout.pp
    rows, tokens, window_pool_tokens = _pool_tokens(layout, pools, cells, tensors, keys)
    held_back = opts.kv_null_blocks * (opts.page_size or 1) * layout.dcp if tokens else 0
    worst = max(range(layout.pp), key=lambda s: stage_weights[s])
    gpu_stages, firsts = _gpu_stages(book, layout)
    window_tokens, groups = _window_kept(model, layout)
    verdict, reason, error = _verdict(
        layout,
        capacity=capacity,
        weights=stage_weights[worst],
        rt=rt,
        act=act,
        kv=kv,
        tokens=tokens,
        usable=tokens - held_back,
        cell=max(cells),
        longest=_longest_request(model, layout, groups, window_tokens),
        window_pool_tokens=window_pool_tokens,
        checked=partial(_checked_per_stage, layout, capacity, stage_weights, cells, rt=rt, act=act, graphs=graphs),
    )
    if (
        verdict == "ok"
        and opts.state_pool
        and state_slots is not None
        and state_slots < opts.state_pool.slots_per_request
    ):
        verdict, reason = (
            "no_kv_room",
            (
                f"the linear-attention state pool holds {state_slots} slots, fewer than the "
                f"{opts.state_pool.slots_per_request} one running request holds"
            ),
        )
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
        kv_held_back_tokens_per_rank=held_back,
        kv_tokens_total=tokens * layout.attn_dp * layout.replicas,
        state_bytes_per_request=opts.state_pool.state_bytes if opts.state_pool else state,
        state_slots_per_rank=state_slots,
        state_requests_per_rank=state_slots // opts.state_pool.slots_per_request if opts.state_pool else None,
        state_pool_bytes=state_pool,
        kv_window_tokens=window_tokens,
        kv_full_groups=groups[0],
        kv_window_groups=groups[1],
        kv_window_pool_tokens_per_rank=window_pool_tokens,
        max_running_requests_per_rank=_running_slots(model, layout, rows, state_slots),
        ranks=layout.attn_dp * layout.replicas,
        largest_fraction=None
        if opts.activations_in_budget
        else _largest_fraction(capacity, rt, act + graphs + opts.fraction_reserve_bytes),
        warnings=tuple(
            _headroom_warnings(firsts, capacity, stage_weights, kv + state_pool, rt + vlm_cache, act, graphs)
            if verdict == "ok"
            else ()
        )
        + _margin_warning(min(kv_per_stage), layout, verdict)
        + draft_warning,
    )


def _stage_budgets(
    layout: Layout,
    capacity: float,
    stage_weights: list[float],
    *,
    rt: float,
    act: float,
    graphs: float,
    vlm_cache: float,
) -> list[float]:
    """The KV budget of each stage's GPUs by the engine's rule, each with its own weights."""
    opts = layout.options
    assert opts.memory_fraction is not None
    if opts.memory_fraction_of == "total":
        return [_total_share_pool(opts, capacity, weights=w, rt=rt, act=act, graphs=graphs) for w in stage_weights]
    world = layout.stage_gpus * layout.pp  # the ranks whose least free memory SGLang reads
    return [
        _free_share_pool(opts.memory_fraction, free_before=capacity - rt, weights=w, world=world) - vlm_cache
        for w in stage_weights
    ]


def _pool_tokens(
    layout: Layout, pools: list[float], cells: list[float], tensors: list[int], keys: list[tuple[int, float]]
) -> tuple[int, int, int | None]:
    """What pools of `pools` bytes per GPU hold, with `cells` bytes per token and `tensors` KV tensors on each stage:
    the rows of each rank's pool, whole pages that every stage's GPUs hold (SGLang's max_total_num_tokens: its PP
    ranks take the least; vLLM's num_blocks, the least over workers, kv_cache_planning.py get_kv_cache_configs);
    the tokens they serve (DCP interleaves each request's tokens over dcp ranks, where SGLang's window-pool
    allocators do not: kv_cache_configurator.py logical_token_capacity); and the window pool's tokens, ratio × the
    rows in whole pages (pool_configurator.py HybridSWAPoolConfigurator._solve_pool_sizes)."""
    opts = layout.options
    page = opts.page_size or 1
    # a stage of linear-attention layers only caches no tokens
    blocks = [
        stage_blocks(kv, cell_bytes=c, tensors=n, page=page, granule_bytes=opts.kv_granule_bytes, index=k)
        for kv, c, n, k in zip(pools, cells, tensors, keys, strict=True)
        if c > 0
    ]
    rows = min(blocks) * page if blocks else 0
    pool = opts.window_pool
    if pool is None:
        return rows, rows * layout.dcp, None
    return rows, rows, int(rows * pool.full_tokens_ratio) // page * page


def _window_kept(model: ModelSpec, layout: Layout) -> tuple[int | None, tuple[int, int]]:
    """Where the engine frees sliding-window tokens as the window passes them, the tokens a request keeps in those
    layers at most, and where both kinds of layer share one pool, the KV groups a request takes tokens in (those
    that keep every token, those of sliding-window layers: `request_groups`): SGLang's window pool says what it
    keeps (engines/sglang_swa.py); vLLM's hybrid KV manager (SlidingWindowManager.remove_skipped_blocks) keeps whole
    blocks covering window − 1 tokens plus the one being written."""
    if layout.options.window_pool is not None:
        return layout.options.window_pool.kept_tokens, (1, 0)
    groups = request_groups(model, layout)
    if not groups[1] or not model.sliding_window:
        return None, (1, 0)
    page = layout.options.page_size or 16
    kept = (-(-(model.sliding_window - 1) // page) + 1) * page
    return kept, groups


class _Longest(NamedTuple):
    """One request of max_model_len as vLLM's start-up check counts it: its length, the pool tokens it takes (page ×
    (full groups × its blocks + window groups × theirs)), the groups, the page and a window group's blocks."""

    length: int
    need: float
    full_groups: int
    window_groups: int
    page: int
    window_blocks: int


def _longest_fitting(longest: _Longest, usable: int) -> int:
    """The longest max_model_len whose one request fits `usable` pool tokens (the whole pool under DCP, whose
    ranks each hold a 1 / dcp share of every request)."""
    if not longest.window_groups:
        return usable
    fixed = longest.page * longest.window_groups * longest.window_blocks
    return max(0, (usable - fixed) // longest.full_groups // longest.page * longest.page)


def _longest_request(
    model: ModelSpec, layout: Layout, groups: tuple[int, int], window_tokens: int | None
) -> _Longest | None:
    """vLLM's start-up check that one request of max_model_len fits the pool (kv_cache_planning.py
    _max_memory_usage_bytes_from_groups: the blocks each KV group needs, summed). With the hybrid manager a
    sliding-window group needs only the window plus the tokens in flight (SlidingWindowSpec
    .max_admission_blocks_per_request: min(window − 1 + in-flight, max_model_len) tokens, in whole blocks, plus
    one); in flight is one chunk per step the scheduler keeps going at once (config/vllm.py max_concurrent_batches:
    one per pipeline stage, and one more when it overlaps, as the default V2 model runner does)."""
    opts = layout.options
    longest = opts.max_model_len
    if not longest:
        return None
    page = opts.page_size or 16
    if window_tokens is None or not model.sliding_window:
        return _Longest(longest, float(longest), 1, 0, page, 0)
    in_flight = (layout.pp + opts.overlap_schedule) * (opts.chunked_prefill_tokens or 0)
    held = min(model.sliding_window - 1 + in_flight, longest)
    blocks_full, blocks_window = -(-longest // page), -(-held // page) + 1
    full, window = groups
    return _Longest(longest, page * (full * blocks_full + window * blocks_window), full, window, page, blocks_window)


def _free_share_pool(fraction: float, *, free_before: float, weights: float, world: int) -> float:
    """SGLang's pool, in whole bytes: what is free after the weights load less (1 − mem_fraction_static) × what was
    free before (kv_cache_configurator.py _profile_available_bytes). With more than one GPU in its world (tp × pp)
    SGLang reads both as the least over the ranks, sent as a float32 tensor (utils/common.py
    get_available_gpu_memory(distributed=True)): 24 significant bits, so steps of 8 KiB between 64 and 128 GiB."""

    def read(free_bytes: float) -> float:
        return float(np.float32(free_bytes)) if world > 1 else free_bytes

    return math.floor(read(free_before - weights) - (1 - fraction) * read(free_before))


def _total_share_pool(
    opts: EngineOptions, capacity: float, *, weights: float, rt: float, act: float, graphs: float
) -> float:
    """vLLM's pool: the share of the whole GPU less everything else. Sized after CUDA-graph capture (0.34's
    extensible KV cache), it is also capped by what is then free less a margin, max(floor, share × peak)."""
    if opts.kv_cache_bytes is not None:
        return opts.kv_cache_bytes
    pool = opts.memory_fraction * capacity - weights - rt - graphs
    if opts.kv_margin is not None:
        floor, share = opts.kv_margin
        pool = min(pool, capacity - weights - rt - graphs - max(floor, share * act))
    return pool - act


def _gpu_stages(book: PriceBook, layout: Layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The stage of every GPU in GPU order, and each stage's first GPU: kept in the book beside the layout's stage
    groups (which follow from the degrees, the pipeline's included)."""
    stages = groups(layout)["stage"]

    def placed() -> tuple[tuple[int, ...], tuple[int, ...]]:
        stage_of = {g: i % layout.pp for i, gpus in enumerate(stages) for g in gpus}
        gpu_stages = tuple(stage_of[g] for g in sorted(stage_of))
        return gpu_stages, tuple(gpu_stages.index(s) for s in range(layout.pp))

    return book.gpu_stages.get((stages,), None, placed)


class Verdict(NamedTuple):
    """Whether a layout starts, why not, and the engine's own error where it raises one."""

    verdict: Literal["ok", "oom", "no_kv_room"]
    reason: str | None
    engine_error: str | None


def _verdict(
    layout: Layout,
    *,
    capacity: float,
    weights: float,
    rt: float,
    act: float,
    kv: float,
    tokens: int,
    usable: int,
    cell: float,
    longest: _Longest | None = None,
    window_pool_tokens: int | None = None,
    checked: Callable[[], list[_Checked] | None] | None = None,
) -> Verdict:
    """Whether the layout starts, in the order the engine finds out: the GPU runs out of memory, the pool has no
    room, one longest request does not fit (vLLM), the window pool is too small (SGLang). Where vLLM refuses the
    pool, its message is the first worker's that fails its check (`checked`: its figures stage by stage, made only
    then)."""
    opts = layout.options
    page, pool = opts.page_size or 1, opts.window_pool
    out = _out_of_memory(opts, capacity=capacity, weights=weights, rt=rt, act=act, kv=kv) or _no_kv_room(
        opts, capacity=capacity, weights=weights, rt=rt, kv=kv, usable=usable
    )
    if out is None and longest and opts.activations_in_budget and usable < longest.need:
        out = _too_short(longest, usable=usable, rank_bytes_per_token=cell / layout.dcp)
    stages = checked() if out is not None and out.verdict == "no_kv_room" and checked and longest else None
    if stages and longest:
        error = _first_refusing_worker(stages, longest, dcp=layout.dcp)
        out = out._replace(engine_error=error or out.engine_error)
    if out is None and pool is not None and window_pool_tokens is not None:
        if pool.window_tokens + page >= window_pool_tokens:
            out = _window_pool_too_small(pool, page, window_pool_tokens, full_tokens=tokens)
    if out is None and tokens < 1:
        out = Verdict("no_kv_room", f"{kv / GiB:.2f} GiB of KV cache is less than one page", None)
    return out or Verdict("ok", None, None)


def _out_of_memory(
    opts: EngineOptions, *, capacity: float, weights: float, rt: float, act: float, kv: float
) -> Verdict | None:
    """The GPU itself runs out: loading the weights; in vLLM's profile run, at the activation peak, before any KV
    sizing (v1/worker/gpu_worker.py determine_available_memory → profile_run: the torch allocator fails); or
    allocating a KV pool the fraction asks for beyond what is free."""
    needs = f"each GPU of the fullest stage needs {weights / GiB:,.1f} GiB of weights + {rt / GiB:.1f} GiB"
    if weights + rt > capacity:
        return Verdict(
            "oom",
            f"{needs} for the CUDA stack, more than its {capacity / GiB:,.1f} GiB",
            "torch.OutOfMemoryError: CUDA out of memory (while loading weights)",
        )
    if opts.activations_in_budget and weights + rt + act > capacity:
        return Verdict(
            "oom",
            f"{needs} for the CUDA stack + {act / GiB:.1f} GiB at the activation peak of the profile run (a "
            f"prefill chunk of {opts.chunked_prefill_tokens:,} tokens), more than its {capacity / GiB:,.1f} GiB",
            "torch.OutOfMemoryError: CUDA out of memory (while profiling the activation peak)",
        )
    if kv > capacity - weights - rt:
        return Verdict(
            "oom",
            f"the memory fraction {opts.memory_fraction:g} asks for a KV pool of {kv / GiB:,.1f} GiB, more than the "
            f"{(capacity - weights - rt) / GiB:,.1f} GiB free after weights and the CUDA stack; the fraction is a "
            "share of the GPU, at most 1 and in practice below what leaves activations room",
            "torch.OutOfMemoryError: CUDA out of memory (while allocating the KV cache)",
        )
    return None


def _no_kv_room(
    opts: EngineOptions, *, capacity: float, weights: float, rt: float, kv: float, usable: int
) -> Verdict | None:
    """Nothing is left for the KV cache. SGLang: the weights take the fraction. vLLM: everything else takes the
    utilization, or the pool holds no block beside its null block (kv_cache_planning.py
    _check_enough_kv_cache_memory: available memory ≤ 0 once the null block is held back)."""
    if kv <= 0 and opts.memory_fraction_of == "free_at_start":
        minimum = weights / (capacity - rt)  # 1 - available / pre-load
        return Verdict(
            "no_kv_room",
            f"weights ({weights / GiB:,.1f} GiB) take all of mem_fraction_static "
            f"{opts.memory_fraction:.3f} × {(capacity - rt) / GiB:,.1f} GiB free at start, leaving no KV cache",
            f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
            f"{opts.memory_fraction}. Raise --mem-fraction-static above {math.ceil(minimum * 1000) / 1000:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative decoding, draft weights "
            "are now counted.",
        )
    if kv <= 0 or (opts.kv_null_blocks and usable <= 0):
        left = "take all of" if kv <= 0 else "leave no block beside the null block within"
        return Verdict(
            "no_kv_room",
            f"weights, activations and runtime {left} gpu_memory_utilization "
            f"{opts.memory_fraction} × {capacity / GiB:,.1f} GiB",
            "ValueError: No available memory for the cache blocks.",
        )
    return None


class _Checked(NamedTuple):
    """What vLLM's KV check reads of one pipeline stage's workers: the memory it found for the KV cache less the null
    block, and the cache bytes of a token of the stage's layers."""

    available_bytes: float
    cell_bytes: float


def _checked_per_stage(
    layout: Layout,
    capacity: float,
    stage_weights: list[float],
    cells: list[float],
    *,
    rt: float,
    act: float,
    graphs: float,
) -> list[_Checked] | None:
    """Per stage, in worker order, the figures vLLM checks the pool against (kv_cache_planning.py get_kv_cache_configs
    → _check_enough_kv_cache_memory): the memory the worker's profile left for the KV cache, before the extensible
    cache's margin and CUDA graphs where it sizes the pool after capture (0.34: the check reads the memory found
    before it), less one block held back for the null block. None for an engine that checks otherwise."""
    opts = layout.options
    if opts.memory_fraction_of != "total" or opts.memory_fraction is None or opts.kv_cache_bytes is not None:
        return None
    page = opts.page_size or 1
    after_capture = opts.kv_margin is not None  # the pool is sized after the graphs, the check before them
    budget = opts.memory_fraction * capacity - rt - act - (0.0 if after_capture else graphs)
    return [
        _Checked(budget - weights - opts.kv_null_blocks * page * cell, cell)
        for weights, cell in zip(stage_weights, cells, strict=True)
    ]


def _gib(size_bytes: float) -> str:
    """Bytes in GiB as vLLM prints them (utils/mem_utils.py format_gib: rounded to two places, as Python writes it)."""
    return f"{round(size_bytes / GiB, 2)}"


def _first_refusing_worker(checked: list[_Checked], longest: _Longest, *, dcp: int) -> str | None:
    """vLLM's refusal as the first worker that fails its check raises it: no memory at all, or less than one request
    of max_model_len needs on its layers."""
    for stage in checked:
        if stage.cell_bytes <= 0:  # a stage that caches no tokens is not checked
            continue
        if stage.available_bytes <= 0:
            return "ValueError: No available memory for the cache blocks."
        needed = longest.need * stage.cell_bytes / dcp
        if needed > stage.available_bytes:
            return (
                f"ValueError: To serve at least one request with the model's max seq len ({longest.length}), "
                f"({_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
                f"({_gib(stage.available_bytes)} GiB)."
            )
    return None


def _too_short(longest: _Longest, *, usable: int, rank_bytes_per_token: float) -> Verdict:
    """vLLM refuses a pool whose blocks, less the null block, cannot hold one request of max_model_len
    (kv_cache_planning.py _check_enough_kv_cache_memory); its message gives both in one GPU's bytes."""
    shorter = _longest_fitting(longest, usable)
    return Verdict(
        "no_kv_room",
        f"the KV pool hands out {usable:,} tokens, fewer than one request of max_model_len {longest.length:,} needs "
        f"({longest.need:,.0f}); lower --max-model-len to at most {shorter:,}",
        f"ValueError: To serve at least one request with the model's max seq len ({longest.length}), "
        f"({_gib(longest.need * rank_bytes_per_token)} GiB KV cache is needed, which is larger than the "
        f"available KV cache memory ({_gib(usable * rank_bytes_per_token)} GiB).",
    )


def _window_pool_too_small(pool: WindowPool, page: int, window_pool_tokens: int, *, full_tokens: int) -> Verdict:
    """SGLang refuses a window pool that cannot take one request's window and a page (pool_configurator.py
    MemoryPoolConfigurator.validate_swa_pool_size, run as the pools are sized)."""
    return Verdict(
        "no_kv_room",
        f"the sliding-window layers' pool holds {window_pool_tokens:,} tokens ({pool.full_tokens_ratio:g} × the full "
        f"layers' {full_tokens:,}), not more than one request's window of {pool.window_tokens:,} and a page",
        f"ValueError: SWA pool ({window_pool_tokens} tokens) cannot hold even one request: the prefill admission "
        f"floor is sliding_window_size ({pool.window_tokens}) + page_size ({page}). Increase "
        "--swa-full-tokens-ratio or the total KV budget.",
    )


def _largest_fraction(capacity: float, rt: float, outside: float) -> float:
    """The largest SGLang-style fraction (of the memory free before weights load) that leaves `outside` bytes
    (activation peak, CUDA graphs, and what the engine reserves for needs the ledger does not size) and the
    uncertainty of the CUDA-stack estimate (the measured single- to multi-GPU spread) free on the GPU. The engine's
    own multiplier for multimodal models is not applied: SGLang applies it to its default only (arg_groups/
    memory_hook.py adjust_mem_fraction_for_vlm), to keep room for the image encoder, which text requests do not run."""
    rt_model = runtime()
    band = rt_model.non_torch_multi_gpu.si("bytes") - rt_model.non_torch_single_gpu.si("bytes")
    return 1 - (outside + band) / (capacity - rt)


def _running_slots(model: ModelSpec, layout: Layout, rows: int, state_slots: int | None = None) -> int:
    """Request slots per attention-DP rank from the `rows` of one rank's pool (max_total_num_tokens: under DCP each
    rank's share of the interleaved tokens; with a window pool the full layers' pool): the engine's limit, or, where
    the engine leaves it to the pool (SGLang without --max-running-requests), kv_cache_configurator.py
    resolve_max_num_reqs: rows / context × 512 kept within 2048..4096; never more than rows // 2, as SGLang caps
    both; with a state pool, never more than its slots over the slots one request holds (resolve_max_num_reqs's
    max_mamba_cache_size // mamba ratio)."""
    limit = layout.options.max_running_requests
    if limit is None:
        context = model.max_position_embeddings or rows
        limit = max(min(int(rows / context * 512), 4096), 2048)
    limit = min(limit, rows // 2)
    pool = layout.options.state_pool
    if pool is not None and state_slots is not None:
        limit = min(limit, state_slots // pool.slots_per_request)
    return limit


def _state_pool(pool: StatePool | None, budget: float) -> tuple[int | None, float]:
    """The slots of a state pool (SGLang's max_mamba_cache_size, K) and the bytes it takes off the KV budget, out of
    `budget` bytes left for the KV and state pools on one GPU (kv_cache_configurator.py _handle_max_mamba_cache): K
    as given, or the most states that fit in ratio / (1 + ratio) of the budget beside the pool's padding slots; the
    pool holds K + padding. With speculative decoding every slot the running requests hold keeps D draft tokens'
    scratch states too: from 0.5.14 K is solved with them, K = (share − S(1 + D)) / (S(1 + D / slots per request)),
    and (min(reserved requests, K / slots per request) + 1) · D · S are taken off the KV budget; before, the
    scratch of the reserved requests is taken first and K is as given."""
    if pool is None:
        return None, 0.0
    state, draft, per_request = pool.state_bytes, pool.draft_tokens, pool.slots_per_request
    share = budget * pool.memory_ratio / (1 + pool.memory_ratio)
    slots = pool.fixed_slots
    if slots is None and draft and pool.spec_joint:
        slots = max(0, math.floor((share - state * (1 + draft)) / (state * (1 + draft / per_request))))
    elif slots is None:
        slots = max(0, math.floor((share - pool.padding_slots * state) / state))
    scratch = 0.0
    if draft:
        reserved = min(pool.reserve_requests, slots // per_request) if pool.spec_joint else pool.reserve_requests
        scratch = state * draft * (reserved + (1 if pool.spec_joint else 0))
    return slots, (slots + pool.padding_slots) * state + scratch


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


def _headroom_warnings(
    firsts: tuple[int, ...],
    capacity: float,
    stage_weights: list[float],
    kv: float,
    rt: float,
    act: float,
    graphs: float,
) -> list[str]:
    """Where the GPU with the least left (the first such, by stage) has less than nothing after everything else."""
    free = [_free_bytes(capacity, weights, kv, rt + act + graphs) for weights in stage_weights]
    tight = min(range(len(free)), key=free.__getitem__)
    if free[tight] >= 0:
        return []
    need = act + graphs
    return [
        f"GPU {firsts[tight]}: activations at the prefill chunk (unchunked, the prefill budget) and CUDA graphs "
        f"need about {need / GiB:.1f} GiB but {(need + free[tight]) / GiB:.1f} GiB remain after weights, KV cache "
        "and runtime: expect out-of-memory under load; lower the chunked-prefill size (unchunked, the prefill "
        "budget) or the memory fraction"
    ]
