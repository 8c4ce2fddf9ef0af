"""Layout: how one deployment places a model on GPUs, in words no engine owns.

A deployment is `replicas` independent copies; each copy is `pp` pipeline stages; each stage is
`stage_gpus` GPUs. Inside a stage, attention is split into `attn_dp` data-parallel groups of
`attn_tp` GPUs (× `attn_cp` context-parallel ranks), and the MoE into `moe_dp` × `moe_ep` × `moe_tp`.
Engines differ in how their flags map onto these numbers (SGLang carves everything out of `--tp-size`;
vLLM multiplies `-tp` by `-dp`), not in what the numbers mean. From a Layout follow, engine-free: which
GPUs form each group and how each component is split (which collective runs where: ops/collectives.py).
"""

from __future__ import annotations

import math
from functools import cache
from operator import attrgetter
from typing import Literal, NamedTuple

from pydantic import Field, computed_field

from shardwise.frozen import Frozen
from shardwise.memo import Memo
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import Weight

MoeComm = Literal["allreduce", "all2all", "allgather_reducescatter"]
DraftKind = Literal["eagle", "draft_model", "block", "lookup"]


class SpecDecode(Frozen):
    """Speculative decoding as configured (acceptance is a workload matter, not a layout one)."""

    algorithm: str = Field(description="as the engine names it: EAGLE, EAGLE3, NEXTN, mtp, NGRAM, DFLASH, ...")
    kind: DraftKind | None = Field(
        default=None,
        description="how it drafts, whatever the engine calls it: eagle (a chain from EAGLE heads or the model's own "
        "MTP layers), draft_model (a chain from a separate small model), block (one drafter forward over a block: "
        "DFlash), lookup (n-grams found on the host); None for an algorithm shardwise does not model",
    )
    num_steps: int | None = None
    num_draft_tokens: int | None = None
    topk: int | None = None
    draft_model: str | None = None


class SchedulerPolicy(Frozen):
    """How the engine's scheduler batches, admits and evicts requests (read from its scheduler source; the
    values live in data/engines/<engine>.yaml under `scheduler`)."""

    mixed_batches: bool = Field(
        description="decode tokens and prefill chunks share one step under the token budget (vLLM); "
        "otherwise a prefill batch runs first, alone, whenever one can be formed (SGLang)"
    )
    reserve_ratio_start: float = Field(
        0.0, ge=0, le=1, description="share of each running request's remaining output held back when admitting"
    )
    reserve_ratio_min: float = Field(0.0, ge=0, le=1, description="the share it decays to while nothing is evicted")
    reserve_decay_steps: int = Field(1, ge=1, description="decode steps over which the share decays to its minimum")
    reserve_clip_tokens: int = Field(4096, ge=1, description="remaining output counted at most, per request")
    reserve_retract_steps: int = Field(
        0,
        ge=0,
        description="after an eviction the share restarts at (output so far + this many steps per request) "
        "÷ the requests' output lengths",
    )
    evict: Literal["fewest_output", "newest"] = Field(
        description="which running request goes back to the queue when the KV pool is full: the one with the "
        "fewest output tokens (SGLang retract_decode) or the last admitted (vLLM preemption); both recompute it"
    )
    poll_decode_steps: int = Field(
        1,
        ge=1,
        description="the scheduler reads newly sent requests only every this many decode steps (at once after a "
        "prefill step or while idle): SGLang --scheduler-recv-interval",
    )
    max_prefill_tokens: int | None = Field(
        None,
        description="a prefill batch takes no further request once this many prompt tokens are in it (SGLang "
        "--max-prefill-tokens: managers/schedule_policy.py PrefillAdder.budget_state); None: its chunk alone bounds it",
    )
    whole_prompts: bool = Field(
        False,
        description="a request after the prefill batch's first joins only if its whole prompt fits under what is left "
        "of max_prefill_tokens, and otherwise waits for the next prefill (SGLang PrefillAdder.add_one_req: before "
        "0.5.13 always, from 0.5.13 only where prefills are not chunked; never with the prefix cache off, where "
        "add_one_req_ignore_eos admits the requests that run to their length)",
    )
    budget_first: bool = Field(
        False,
        description="the scheduler asks whether the prefill budget is spent before each waiting request, the first "
        "included (SGLang 0.5.23 scheduler.py: a resumed chunk or the mixed decode rows can spend it); before, only "
        "after each request it adds (add_one_req returns budget_state)",
    )
    runs_finished_step: bool = Field(
        False,
        description="overlapping the GPU, the scheduler runs the step it formed before it learned that a request "
        "had its last token (SGLang: scheduler.py event_loop_overlap processes a batch's results after it forms the "
        "next); vLLM does not schedule a request whose step in flight reaches its max_tokens "
        "(v1/core/sched/scheduler.py, 0.33 and 0.34)",
    )
    holds_whole_output: bool = Field(
        False,
        description="a running request that ignores EOS (each simulated request ends at its output length, as the "
        "benchmarks' requests do) is held back at its whole remaining output, up to reserve_clip_tokens, not at the "
        "decaying share (SGLang from 0.5.22: PrefillAdder._get_running_request_total_token_offset)",
    )
    admits_to_length: bool = Field(
        False,
        description="with the prefix cache off, a request that ignores EOS is admitted when its prompt fits beside "
        "the running requests' reserve and the pool then holds it and every running request to their full lengths "
        "as they end, the fewest tokens left first, one token each to spare (SGLang PrefillAdder."
        "add_one_req_ignore_eos under tree_cache.disable, 0.5.2 to 0.5.23; not with a sliding-window pool)",
    )
    admission_page_tokens: int = Field(
        0,
        ge=0,
        description="tokens a request admitted to its length is charged beyond its prompt: one KV page from SGLang "
        "0.5.21 (PrefillAdder.per_req_token_overhead)",
    )


class WindowPool(Frozen):
    """Sliding-window layers that keep their tokens in a pool of their own, sized as a share of the full-attention
    layers' pool (SGLang's hybrid SWA memory: model_executor/pool_configurator.py HybridSWAPoolConfigurator)."""

    full_tokens_ratio: float = Field(
        description="tokens of the sliding-window pool per token of the full layers' pool (--swa-full-tokens-ratio)"
    )
    window_tokens: int = Field(ge=1, description="the window the engine's attention reads (its sliding_window_size)")
    kept_tokens: int = Field(
        ge=1,
        description="tokens one request keeps in the sliding-window pool at most: its window, the tokens that pass "
        "out of it before the engine frees them, and the pages being written",
    )


class StatePool(Frozen):
    """Per-request recurrent states of linear-attention layers in a pool of their own beside the KV pool, sized as a
    share of the memory left for both (SGLang's mamba pool: mem_cache/kv_cache_configurator.py
    _handle_max_mamba_cache)."""

    state_bytes: float = Field(gt=0, description="one request's state on one GPU of the fullest stage")
    memory_ratio: float = Field(ge=0, description="state pool : KV pool bytes (--mamba-full-memory-ratio)")
    slots_per_request: int = Field(ge=1, description="state slots the pool keeps per running request")
    padding_slots: int = Field(0, ge=0, description="slots the pool holds besides its K")
    fixed_slots: int | None = Field(
        None,
        ge=0,
        description="K as given (--max-mamba-cache-size, or --max-running-requests without the radix "
        "cache, per DP rank)",
    )
    ssm_dtype: str = Field("fp32", description="the recurrent state's dtype the engine keeps (flag, config, default)")
    draft_tokens: int = Field(0, ge=0, description="speculative decoding's draft tokens: each slot's scratch states")
    reserve_requests: int = Field(0, ge=0, description="the running requests whose scratch states are reserved")
    spec_joint: bool = Field(
        True, description="K solved with the scratch states (from 0.5.14), else they are reserved first"
    )


class EngineOptions(Frozen):
    """Engine settings that change cost or memory, as they take effect (after the engine's rewrites)."""

    cuda_graph: bool = True
    cuda_graph_max_bs: int | None = Field(None, description="largest decode batch captured; None = engine default")
    two_batch_overlap: bool = False
    overlap_from_tokens: tuple[int, int] = Field(
        (0, 0),
        description="(decode, prefill): two-batch overlap splits a step only where a rank's tokens reach "
        "these (vLLM --dbo-decode-token-threshold / --dbo-prefill-token-threshold); it needs two requests to split",
    )
    overlap_schedule: bool = Field(
        True, description="the scheduler prepares the next batch while the GPU runs this one (hides its host time)"
    )
    eplb: bool = False
    allreduce_norm_fusion_tokens: int = Field(
        0,
        description="steps of up to this many tokens per rank run each all-reduce fused with the residual add and "
        "RMSNorm after it (SGLang's FlashInfer fusion, vLLM's fusion pass); 0 = never",
    )
    kv_cache_dtype: str | None = Field(None, description="None = the model's dtype")
    chunked_prefill_tokens: int | None = Field(
        None,
        description="the most prompt tokens one prefill step takes, the last request cut to fit (SGLang "
        "--chunked-prefill-size, vLLM --max-num-batched-tokens); None: prompts are never cut (SGLang's chunked "
        "prefill off, --chunked-prefill-size -1), and a step holds what the scheduler's max_prefill_tokens lets in",
    )
    max_running_requests: int | None = Field(None, description="request slots per attention-DP rank")
    memory_fraction: float | None = Field(None, description="SGLang mem_fraction_static / vLLM gpu_memory_utilization")
    memory_fraction_of: Literal["free_at_start", "total"] = Field(
        "free_at_start",
        description="what the fraction multiplies: memory free before weights load (SGLang) or "
        "the GPU's total memory (vLLM)",
    )
    activations_in_budget: bool = Field(
        False,
        description="activation peak and CUDA-graph memory come out of the fraction (vLLM), not out of the "
        "rest (SGLang)",
    )
    kv_margin: tuple[float, float] | None = Field(
        None,
        description="(floor bytes, share of the activation peak) kept free when the engine sizes the KV cache from "
        "the memory measured after CUDA-graph capture (vLLM's extensible KV cache); None where it does not",
    )
    kv_granule_bytes: int | None = Field(
        None,
        description="each KV-cache tensor is mapped in whole granules of this many bytes, so a stage's pool holds "
        "the blocks that fit each tensor's whole granules (vLLM's extensible KV cache); None: the pool's bytes are "
        "used whole",
    )
    kv_pool_per_stage: bool = Field(
        False,
        description="each pipeline stage sizes its pool from its own free memory and its own bytes per block, and "
        "every stage keeps the fewest blocks any holds (vLLM); otherwise every rank sizes from the least memory "
        "any rank has free (SGLang)",
    )
    kv_null_blocks: int = Field(
        0, ge=0, description="blocks of the pool the engine never hands to a request (vLLM's null block)"
    )
    kv_cache_bytes: float | None = Field(None, description="a KV cache size the command fixes (per GPU)")
    fraction_reserve_bytes: float = Field(
        0.0, description="memory the engine keeps outside its fraction for needs the ledger does not size (bytes)"
    )
    fraction_scale: float = Field(1.0, description="the engine's own multiplier on its fraction (multimodal models)")
    prefill_cuda_graph: bool = False
    prefill_graph_tokens: int = Field(0, description="most prompt tokens of a prefill step run under a CUDA graph")
    max_model_len: int | None = Field(None, description="longest request the engine must be able to hold (vLLM)")
    page_size: int | None = None
    window_kv: bool = Field(
        False, description="sliding-window layers keep only the blocks their window reaches (vLLM's hybrid KV manager)"
    )
    window_pool: WindowPool | None = Field(
        None, description="sliding-window layers keep their tokens in a pool of their own (SGLang's hybrid SWA memory)"
    )
    index_keys_every_layer: bool = Field(
        False, description="sparse attention's indexer keys cached in every layer, not only those that run one"
    )
    index_keys_sharded: bool = Field(
        False,
        description="DCP ranks cache the indexer keys of their own tokens alone (vLLM), not every token's (SGLang)",
    )
    state_pool: StatePool | None = Field(
        None, description="linear-attention states in a pool of their own beside the KV pool (SGLang's mamba pool)"
    )
    spec: SpecDecode | None = None
    scheduler: SchedulerPolicy = SchedulerPolicy(mixed_batches=False, evict="newest")

    @property
    def prefill_plan_tokens(self) -> int | None:
        """The prompt tokens the engine plans one prefill step for (its activations, its reserve): its chunk, or
        unchunked, its prefill budget (SGLang sizes both so: server_args.py, mem_fraction_static unset)."""
        return self.chunked_prefill_tokens or self.scheduler.max_prefill_tokens


class Layout(Frozen):
    """Where every part of the model lives and which GPUs talk to which."""

    engine: str
    version: str
    replicas: int = Field(1, ge=1, description="independent copies behind a router")
    pp: int = Field(1, ge=1, description="pipeline stages per copy")
    stage_gpus: int = Field(ge=1, description="GPUs per pipeline stage of one copy")
    attn_dp: int = Field(1, ge=1, description="attention data-parallel groups per stage (own batch and KV each)")
    attn_cp: int = Field(1, ge=1, description="attention context-parallel ranks (prefill)")
    dcp: int = Field(1, ge=1, description="decode context parallel: each request's KV interleaved over dcp ranks")
    dcp_comm: Literal["a2a", "ag_rs"] = Field(
        "ag_rs",
        description="how DCP ranks combine partial attention outputs: one all-to-all with the LSE packed in, or "
        "an all-gather of the LSE and a reduce-scatter of the outputs",
    )
    dcp_partial_bytes: int = Field(2, ge=1, description="bytes per element of the partial outputs reduce-scattered")
    dcp_q_replicate: bool = Field(False, description="every DCP rank projects all query heads (no query gather)")
    moe_dp: int = Field(1, ge=1)
    moe_ep: int = Field(1, ge=1, description="expert-parallel width: experts divided over this many GPUs")
    dense_tp: int = Field(ge=1, description="TP width of dense MLP layers (1 = replicated on every GPU)")
    shared_tp: int = Field(ge=1, description="TP width of shared experts (1 = replicated)")
    lm_head_tp: int = Field(ge=1, description="vocab-parallel width of embeddings and lm_head")
    redundant_experts: int = Field(0, ge=0, description="extra physical expert slots (EPLB)")
    vision_tp: int = Field(
        1, ge=0, description="ways the vision tower is split on the first stage (1: a copy on each GPU; 0: not loaded)"
    )
    moe_comm: MoeComm = Field(
        "allreduce",
        description="how MoE tokens and outputs move: all-reduce of partial "
        "sums, all-to-all dispatch/combine, or all-gather + reduce-scatter",
    )
    a2a_backend: str = "none"
    dp_outside_pp: bool = Field(False, description="rank order: vLLM puts DP outside PP, SGLang PP outside TP")
    pp_extra_layers: Literal["last", "before_last"] = Field(
        "last",
        description="which stages take the remainder layers: the last ones (SGLang) or those before the "
        "last stage (vLLM, which keeps lm_head alone on the last)",
    )
    options: EngineOptions = EngineOptions()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def attn_tp(self) -> int:
        return self.stage_gpus // (self.attn_dp * self.attn_cp)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def moe_tp(self) -> int:
        return self.stage_gpus // (self.moe_dp * self.moe_ep)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpus_used(self) -> int:
        return self.replicas * self.pp * self.stage_gpus

    def structure(self) -> tuple[int, ...]:
        """The numbers that decide placement and traffic, for telling layouts apart."""
        return (
            self.replicas,
            self.pp,
            self.stage_gpus,
            self.attn_dp,
            self.attn_cp,
            self.dcp,
            self.moe_dp,
            self.moe_ep,
            self.dense_tp,
            self.shared_tp,
            self.lm_head_tp,
            self.redundant_experts,
        )

    def describe(self) -> str:
        """Short engine-neutral name: 'TP8', 'TP8 EP8', 'DP8 EP8' (attention DP), 'TP8 EP4×TP2', 'PP8', '2× TP4'."""
        a_tp, m_tp = self.attn_tp, self.moe_tp
        attention = f"DP{self.attn_dp}" + (f"×TP{a_tp}" if a_tp > 1 else "") if self.attn_dp > 1 else f"TP{a_tp}"
        parts = [] if attention == "TP1" and self.pp > 1 else [attention]
        if self.moe_ep > 1:
            parts.append(f"EP{self.moe_ep}" + (f"×TP{m_tp}" if m_tp > 1 else ""))
        elif m_tp != a_tp:
            parts.append(f"MoE-TP{m_tp}")
        if self.dense_tp != a_tp:
            parts.append(f"dense-TP{self.dense_tp}")  # dense MLP split unlike attention (--moe-dense-tp-size)
        parts += [f"{name}{n}" for name, n in (("PP", self.pp), ("CP", self.attn_cp), ("DCP", self.dcp)) if n > 1]
        name = " ".join(parts)
        return f"{self.replicas}× {name}" if self.replicas > 1 else name

    def family(self) -> str:
        """The parallelism mechanisms the layout uses, without their degrees (what a measured error carries over
        between): 'TP', 'TP EP', 'attention-DP TP EP', 'PP', 'replicas TP', 'TP speculative', 'one GPU'."""
        uses = {
            "replicas": self.replicas > 1,
            "attention-DP": self.attn_dp > 1,
            "TP": max(self.attn_tp, self.moe_tp, self.dense_tp) > 1,
            "EP": self.moe_ep > 1,
            "PP": self.pp > 1,
            "CP": self.attn_cp > 1,
            "DCP": self.dcp > 1,
            "speculative": self.options.spec is not None,
        }
        named = [name for name, used in uses.items() if used]
        return " ".join(named) if set(named) - {"replicas", "speculative"} else " ".join(["one GPU", *named])


_SHAPE = attrgetter(*(name for name in Layout.model_fields if name != "options"))
_OPTIONS_BUT_FRACTION = attrgetter(*(name for name in EngineOptions.model_fields if name != "memory_fraction"))


class Reads(NamedTuple):
    """How a busy scheduler's reads of newly sent requests lag its steps (serve/simulate says why)."""

    lagged: bool  # a request sent on a step's tokens misses the read after that step (a pipeline: it does not)
    overlap: bool  # and joins the step after the one in flight, formed while the GPU runs it
    runs_finished_step: bool  # the step formed with requests that had their last token still runs


def reads(layout: Layout) -> Reads:
    lagged = layout.pp == 1  # a pipeline reads once per micro-batch, far more often than once per cycle
    overlap = lagged and layout.options.overlap_schedule
    return Reads(lagged, overlap, overlap and layout.options.scheduler.runs_finished_step)


def shape_key(layout: Layout) -> tuple:
    """Every field of `layout` but its options, as a key: layouts with equal keys place and split the model alike."""
    return _SHAPE(layout)


def sized_alike_key(layout: Layout) -> tuple:
    """Every field of `layout` but its memory fraction, as a key: layouts with equal keys differ at most in how much
    memory their engine gives the KV cache."""
    return _SHAPE(layout), _OPTIONS_BUT_FRACTION(layout.options)


# --- which GPUs form each group ---------------------------------------------------------------------


def _gpu(layout: Layout, *, replica: int, stage: int, local: int) -> int:
    """Global GPU id of stage-local rank `local` of pipeline stage `stage` of copy `replica`."""
    base = replica * layout.pp * layout.stage_gpus
    if layout.dp_outside_pp and layout.attn_dp > 1:
        dp_rank, tp_rank = divmod(local, layout.attn_tp * layout.attn_cp)
        per_dp = layout.pp * layout.attn_tp * layout.attn_cp
        return base + dp_rank * per_dp + stage * layout.attn_tp * layout.attn_cp + tp_rank
    return base + stage * layout.stage_gpus + local


_GROUPS = Memo(4096)  # per the degrees they follow from, the GPU ids of every group


def groups(layout: Layout) -> dict[str, list[list[int]]]:
    """GPU ids of every communication group: stage (the engine's TP world), attn_tp, moe_ep, moe_tp, pp. Remembered
    by the degrees they follow from, and shared: read them, do not change them."""
    key = (
        layout.replicas,
        layout.pp,
        layout.stage_gpus,
        layout.attn_dp,
        layout.attn_tp,
        layout.attn_cp,
        layout.moe_dp,
        layout.moe_ep,
        layout.dp_outside_pp,
    )
    return _GROUPS.get((), key, lambda: _groups(layout))


def _groups(layout: Layout) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {name: [] for name in ("stage", "attn_tp", "moe_ep", "moe_tp", "pp")}
    n, a_tp, m_tp = layout.stage_gpus, layout.attn_tp, layout.moe_tp
    for r in range(layout.replicas):
        for s in range(layout.pp):
            gpu = [_gpu(layout, replica=r, stage=s, local=i) for i in range(n)]
            out["stage"].append(gpu)
            out["attn_tp"] += [gpu[i : i + a_tp] for i in range(0, n, a_tp)]
            out["moe_tp"] += [gpu[i : i + m_tp] for i in range(0, n, m_tp)]
            block = layout.moe_ep * m_tp  # one MoE-DP block; EP ranks stride by moe_tp inside it
            out["moe_ep"] += [gpu[b + t : b + block : m_tp] for b in range(0, n, block) for t in range(m_tp)]
        if layout.pp > 1:
            out["pp"] += [[_gpu(layout, replica=r, stage=s, local=i) for s in range(layout.pp)] for i in range(n)]
    return out


# --- which layers each stage holds, how each tensor is divided ----


def stage_layers(num_layers: int, pp: int, extra: str) -> list[range]:
    """Layer ranges of each pipeline stage: remainder layers on the last stages (SGLang get_pp_indices) or on
    the stages before the last (vLLM get_pp_indices, which keeps the last stage for lm_head)."""
    return list(_stage_ranges(num_layers, pp, extra))


@cache
def _stage_ranges(num_layers: int, pp: int, extra: str) -> tuple[range, ...]:
    base, rest = divmod(num_layers, pp)
    counts = [base] * pp
    extra_stages = range(pp - rest, pp) if extra == "last" else range(pp - 1 - rest, pp - 1)
    for i in extra_stages:
        counts[i] += 1
    starts = [sum(counts[:i]) for i in range(pp)]
    return tuple(range(s, s + c) for s, c in zip(starts, counts, strict=True))


def weight_split(layout: Layout) -> tuple[int, ...]:
    """The degrees `weight_ways` reads: layouts equal in them hold each tensor alike on a GPU."""
    return (
        layout.lm_head_tp,
        layout.moe_ep,
        layout.moe_tp,
        layout.redundant_experts,
        layout.shared_tp,
        layout.dense_tp,
        layout.attn_tp,
        layout.vision_tp,
    )


def weight_ways(w: Weight, layout: Layout, model: ModelSpec) -> float:
    """Over how many GPUs of a stage one tensor is divided (1 = a full copy on each)."""
    if w.role in ("embedding", "lm_head"):
        return layout.lm_head_tp
    if w.role == "routed_experts" and model.moe:
        return layout.moe_ep * layout.moe_tp / (1 + layout.redundant_experts / model.moe.num_experts)
    if w.role == "shared_experts":
        return layout.shared_tp
    if w.role == "dense_mlp":
        return layout.dense_tp
    if w.role in ("attention", "linear_attention"):
        if w.component in ("attn.q_a", "attn.kv_a", "mtp", "attn.indexer"):
            return 1  # MLA down-projections and the sparse-attention indexer are replicated
        if w.component in ("attn.k", "attn.v"):
            return min(layout.attn_tp, model.attention.num_kv_heads)  # KV heads replicate past their count
        return layout.attn_tp
    if w.role == "vision":
        return layout.vision_tp or math.inf  # 0: the engine does not load it
    return 1  # router, norms


# --- how each component is split --------------------------------------------------------------------


class Split(Frozen):
    component: str
    ways: int = Field(description="1 = a full copy on every GPU that holds it")
    group: str
    how: str


def _mlp_split(component: str, ways: int) -> Split:
    """An MLP split over the stage's GPUs along its intermediate dimension, or replicated on each."""
    return Split(
        component=component, ways=ways, group="stage", how="intermediate dim split" if ways > 1 else "replicated"
    )


def splits(layout: Layout, model: ModelSpec) -> list[Split]:
    """How each component is divided across the GPUs of one pipeline stage."""
    mla = model.attention.kind == "mla"
    attn = [
        Split(
            component="attention heads (q, k/v up-projections, o)",
            ways=layout.attn_tp,
            group="attn_tp",
            how="heads split over attention TP; copied in each attention-DP group",
        )
    ]
    if mla:
        attn.append(
            Split(
                component="MLA down-projections (q_a, kv_a)",
                ways=1,
                group="stage",
                how="replicated: every GPU computes the shared latent",
            )
        )
        kv = Split(
            component="KV cache",
            ways=layout.dcp,
            group="attn_tp",
            how="MLA latent replicated on each attention-TP rank"
            + (f", interleaved over {layout.dcp} DCP ranks" if layout.dcp > 1 else ""),
        )
    else:
        kv_ways = min(layout.attn_tp, model.attention.num_kv_heads) * layout.dcp
        kv = Split(component="KV cache", ways=kv_ways, group="attn_tp", how="KV heads split over attention TP")
    parts = [
        *attn,
        kv,
        Split(component="embeddings and lm_head", ways=layout.lm_head_tp, group="stage", how="vocab-parallel"),
    ]
    if model.layer_mlp.count("dense"):
        parts.append(_mlp_split("dense MLP", layout.dense_tp))
    if model.moe:
        parts.append(
            Split(
                component="routed experts",
                ways=layout.moe_ep * layout.moe_tp,
                group="moe_ep × moe_tp",
                how=f"{model.moe.num_experts + layout.redundant_experts} expert slots over {layout.moe_ep} "
                f"EP ranks, each expert's width over {layout.moe_tp} MoE-TP ranks",
            )
        )
        if model.moe.num_shared_experts:
            parts.append(_mlp_split("shared experts", layout.shared_tp))
    if layout.pp > 1:
        parts.append(Split(component="decoder layers", ways=layout.pp, group="pp", how="contiguous layer ranges"))
    return parts


_KV_MODELS = Memo(16)  # per model and KV cache dtype, the model as that cache stores it


def with_kv_dtype(model: ModelSpec, layout: Layout) -> ModelSpec:
    """The model as the layout's caches store it: the KV cache in --kv-cache-dtype, and linear-attention states in
    the engine's dtype where the config names none (SGLang's state pool: FP32); the same object when unchanged."""
    dtype = layout.options.kv_cache_dtype
    pool = layout.options.state_pool
    lin = model.linear_attention
    ssm = pool.ssm_dtype if pool and lin and lin.ssm_dtype != pool.ssm_dtype else None
    if not dtype and not ssm:
        return model
    return _KV_MODELS.get((model,), (dtype, ssm), lambda: model.with_overrides(kv_dtype=dtype, ssm_dtype=ssm))
