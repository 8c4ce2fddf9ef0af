"""The ops of one forward step of a layout: per pipeline stage, on its busiest GPU.

`StepModel(model, layout, cluster)` reads the weights once (exact checkpoint bytes, split as the layout
splits them); `.ops(phase=…, requests=…, new_tokens=…, context_tokens=…)` then lists the ops of one step
for a batch. Layers of the same kind (attention type × MLP type) are listed once with a count. Engine-free:
kernel counts follow the structure of a standard forward (one launch per projection, norm, rotary,
activation; attention as split-KV plus merge; a fused MoE as align, two grouped GEMMs, activation, sum).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from shardwise.engines.layout import Layout, groups, stage_layers, weight_split, weight_ways, with_kv_dtype
from shardwise.hardware.collectives import Collective
from shardwise.hardware.kernel_tables import GemmShape, GQADecodeShape, MLADecodeShape, MLAPrefillShape, MoEShape
from shardwise.memo import Memo
from shardwise.ops.collectives import ACT_BYTES, comm_steps
from shardwise.ops.routing import busiest_rank
from shardwise.ops.types import Comm, Compute, Op, OpClass, Phase
from shardwise.spec.cluster import ClusterSpec, Span
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import Weight, model_weights

GEMM_ROLES = ("attention", "linear_attention", "dense_mlp", "shared_experts", "router")
# matrices the engines run as one GEMM (their QKVParallelLinear, MergedColumnParallelLinear and, for MLA, the
# fused q_a / kv_a down-projection), by the checkpoint module's last name
FUSED = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "gate_up",
    "up_proj": "gate_up",
    "q_a_proj": "qkv_a",
    "kv_a_proj_with_mqa": "qkv_a",
}
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj")  # split along their input under tensor parallelism
_PHASES = {p.value: p for p in Phase}
SIZED_BY = (
    "rank",
    "stage",
    "cached",
    "sampled",
)  # the tokens a collective is sized by, as `CommsPiece.tokens` lists them


@dataclass(frozen=True)
class _Matrix:
    """One weight component of one layer, as held by one GPU."""

    name: str
    params: float  # elements on this GPU
    bytes: float  # on this GPU
    dtype: str  # tensor-core dtype of its GEMM
    fmt: str = "bf16"  # storage format name
    gemms: tuple[GemmShape, ...] = ()  # the GEMMs it runs, as measured tables key them


def _gemm_kernels(component: str, model: ModelSpec, phase: Phase) -> int:
    """Launches of one projection: gate-up, activation and down for an MLP; for MLA decode the kv_b
    weights run as two batched GEMMs (absorbed into q and out of the latent) plus a copy."""
    if component in ("dense_mlp", "shared_experts"):
        return 3
    if _absorbed(component, model, phase):
        return 3
    return 1


def _absorbed(component: str, model: ModelSpec, phase: Phase) -> bool:
    """MLA decode runs kv_b as batched GEMMs absorbed into the query and the output, not as one GEMM."""
    return component == "attn.kv_b" and phase is Phase.DECODE and model.attention.kind == "mla"


def _dtype(w: Weight) -> str:
    bits = w.format.activation_bits if w.format else 16
    return {4: "fp4", 8: "fp8"}.get(bits, "bf16")


def _local(w: Weight, ways: float) -> tuple[int, int]:
    """(n, k) of one GPU's slice of a matrix: output rows split, or input columns for a row-parallel one."""
    out, inp = w.shape
    if w.module.rsplit(".", 1)[-1] in ROW_PARALLEL:
        return out, max(1, round(inp / ways))
    return max(1, round(out / ways)), inp


def _fusion_key(w: Weight, ways: float) -> tuple | None:
    group = FUSED.get(w.module.rsplit(".", 1)[-1])
    if group is None or w.layer is None:
        return None
    return w.layer, w.module.rsplit(".", 1)[0], group, w.format.name if w.format else "bf16", _local(w, ways)[1]


def _fused_widths(weights: tuple[Weight, ...], layout: Layout, model: ModelSpec) -> dict[tuple, int]:
    """Local output width of each GEMM the engines fuse from several matrices of one module, same format and
    input width (the fusion key)."""
    widths: dict[tuple, int] = {}
    for w in weights:
        if len(w.shape) == 2 and w.role in GEMM_ROLES and w.count == 1:
            ways = weight_ways(w, layout, model)
            key = _fusion_key(w, ways)
            if key is not None:
                widths[key] = widths.get(key, 0) + _local(w, ways)[0]
    return widths


def _gemms(w: Weight, ways: float, fused: dict[tuple, int]) -> tuple[GemmShape, ...]:
    """The GEMM one matrix runs as: its own, or its share of the fused one."""
    if w.count != 1:
        return ()
    n, k = _local(w, ways)
    fmt = w.format.name if w.format else "bf16"
    key = _fusion_key(w, ways)
    width = fused.get(key, n) if key else n
    return (GemmShape(weight_format=fmt, n=width, k=k, share=n / width),)


def _first_layers(model: ModelSpec) -> dict[tuple[str, str], int]:
    """The first layer of each layer kind."""
    first: dict[tuple[str, str], int] = {}
    for layer in range(model.num_layers):
        first.setdefault(_kind(model, layer), layer)
    return first


def _representative_weights(model: ModelSpec) -> tuple[Weight, ...]:
    """The tensors a step model reads: those of the first layer of each kind, and lm_head / embeddings."""
    layers = set(_first_layers(model).values())
    return tuple(w for w in model_weights(model) if w.layer in layers or w.role in ("lm_head", "embedding"))


def _kind(model: ModelSpec, layer: int) -> tuple[str, str]:
    """(attention, MLP) of a layer; "indexed" for a sparse-attention layer that runs its own indexer."""
    sparse = model.attention.sparse
    attention = "indexed" if sparse is not None and layer in sparse.layers else model.layer_attention[layer]
    return attention, model.layer_mlp[layer]


class Placed(NamedTuple):
    """Where one piece of a step runs: its stage, how often, and the slot whose key names it (`piece_keys`)."""

    stage: int
    count: int
    slot: int


Shape = tuple[Placed, ...]  # a step's pieces in order


class Piece(NamedTuple):
    """Ops that run `count` times on one stage of a step. Its `key` names them: in one step model, pieces with the
    same key hold the same ops (`StepModel.piece_ops`), so a cost model prices each once and multiplies. A layer's key
    holds the layer's interned inputs (`LayerInputs`); its ops' own keys (`layer_op_keys`) name each op on any
    layout, so an op's cost is found without building the op."""

    stage: int
    count: int
    key: PieceKey


@dataclass(frozen=True, eq=False)
class GemmInputs:
    """One matrix's GEMM as a layer runs it."""

    model: ModelSpec
    matrix: _Matrix


@dataclass(frozen=True, eq=False)
class AttentionInputs:
    """One layer's attention kernel: the model (as its KV cache stores it), the layer's attention type, its split."""

    model: ModelSpec
    attention: str
    attn_tp: int
    dcp: int


@dataclass(frozen=True, eq=False)
class ExpertInputs:
    """One layer's routed experts: the busiest rank's slice of one expert, and how they are spread."""

    model: ModelSpec
    experts: _Matrix
    moe_ep: int
    moe_tp: int
    eplb: bool


@dataclass(frozen=True, eq=False)
class HeadInputs:
    """The lm_head as one GPU holds it, and how its logits are split."""

    model: ModelSpec
    head: _Matrix
    lm_head_tp: int


@dataclass(frozen=True, eq=False)
class LayerInputs:
    """Everything a layer kind's ops are built from besides the batch."""

    model: ModelSpec
    kind: tuple[str, str]
    gemms: tuple[GemmInputs, ...]
    attention: AttentionInputs
    experts: ExpertInputs | None
    gathered: bool  # the shared experts and router see every attention-DP rank's tokens
    dense_gathered: bool  # so does the dense MLP (its own TP over the DP ranks)
    # steps of up to this many tokens per rank fold the two residual-add norms into the all-reduces before them
    norm_fusion_tokens: int
    # its elementwise kernels: two residual-add norms, rotary, cache write (+ the q_a and kv_a norms of MLA), the MoE
    # output add; and whether it runs routed experts
    elementwise: int = field(init=False)
    moe: bool = field(init=False)

    def __post_init__(self) -> None:
        moe = self.kind[1] == "moe"
        object.__setattr__(self, "moe", moe)
        object.__setattr__(self, "elementwise", (6 if self.model.attention.kind == "mla" else 4) + moe)


StageKinds = tuple[tuple[Counter[tuple[str, str]], ...], tuple[bool, ...]]


def _stage_kinds(model: ModelSpec, pp: int, extra: str) -> StageKinds:
    """Each stage's layer kinds, counted, and whether it runs MoE layers."""
    kinds = tuple(Counter(_kind(model, i) for i in r) for r in stage_layers(model.num_layers, pp, extra))
    return kinds, tuple(any(mlp == "moe" for _, mlp in k) for k in kinds)


class OpBook:
    """What the step models of one search (or one check) build once and share: the weights as each split holds them,
    each stage's layer kinds, the interned inputs of ops, collective templates and where their groups sit. Made by the
    caller that prices (`cost.book.PriceBook`) and let go with it. The tables are bounded (least recently used first
    out) so that a search over 64 GPUs holds a few thousand entries of each."""

    def __init__(self) -> None:
        self._weights = Memo(16)  # per model: the tensors a step model reads
        self._splits = Memo(256)  # per model and weight split: the weights as one GPU holds them
        self._kinds = Memo(256)  # per model, pipeline and where its extra layers go: each stage's layer kinds
        self.plans = Memo(64)  # per model, cluster, groups: `_CommPlan`s
        self.placed = Memo(4096)  # per groups and cluster: each collective's GPUs and span
        self._interned = Memo(16_384)  # op inputs, templates and spans, under their model or cluster

    def split_weights(self, model: ModelSpec, layout: Layout) -> _Split:
        """`_read_weights` for the layouts that split the weights alike (`weight_split` reads no other degree)."""
        read = self._weights.get((model,), None, lambda: _representative_weights(model))
        return self._splits.get((model,), weight_split(layout), lambda: _read_weights(model, layout, read))

    def stage_kinds(self, model: ModelSpec, pp: int, extra: str) -> StageKinds:
        """`_stage_kinds` (read them, do not change them)."""
        return self._kinds.get((model,), (pp, extra), lambda: _stage_kinds(model, pp, extra))

    def interned(self, cls: type, model: ModelSpec, *fields: object) -> Any:
        """The one object of `cls` with these fields: op inputs are interned, so an op key that holds them hashes and
        compares by identity, and layouts that run the same op share its key (and so its cost)."""
        return self._interned.get((model,), (cls, *fields), lambda: cls(model, *fields))

    def gemm_inputs(self, model: ModelSpec, matrices: list[_Matrix]) -> tuple[GemmInputs, ...]:
        """The interned GEMM inputs of one weight split's list of matrices."""
        return self._interned.get(
            (model, matrices), "gemms", lambda: tuple(self.interned(GemmInputs, model, m) for m in matrices)
        )

    def span(self, cluster: ClusterSpec, group: tuple[int, ...]) -> Span:
        """`cluster.span(group)`: the layouts of a search ask for the same groups."""
        return self._interned.get((cluster,), ("span", group), lambda: cluster.span(group))

    def comm_template(self, cluster: ClusterSpec, entries: list[CommEntry]) -> CommTemplate:
        """The one template of these collectives, interned by all but their groups' GPU ids."""
        key = ("template", *(e.unplaced() for e in entries))
        return self._interned.get((cluster,), key, lambda: CommTemplate(cluster, tuple(entries)))


def layer_inputs(
    book: OpBook,
    model: ModelSpec,
    kind: tuple[str, str],
    matrices: list[_Matrix],
    experts: _Matrix | None,
    layout: Layout,
    *,
    weights: ModelSpec | None = None,
) -> LayerInputs:
    """The interned inputs of one layer kind's ops under `layout` (`model` as its KV cache stores it; `weights` the
    model its GEMMs and experts are interned under, default `model`: what the KV cache stores changes neither)."""
    weights = weights or model
    gemms = book.gemm_inputs(weights, matrices)
    attention = book.interned(AttentionInputs, model, kind[0], layout.attn_tp, layout.dcp)
    routed = (
        None
        if experts is None
        else book.interned(ExpertInputs, weights, experts, layout.moe_ep, layout.moe_tp, layout.options.eplb)
    )
    gathered = layout.attn_dp > 1 and layout.moe_comm != "all2all"
    dense_gathered = layout.attn_dp > 1 and layout.dense_tp > 1
    fusion = layout.options.allreduce_norm_fusion_tokens
    return book.interned(LayerInputs, model, kind, gemms, attention, routed, gathered, dense_gathered, fusion)


class CommEntry(NamedTuple):
    """One collective of a stage's template: where it runs, what it moves per token of `sized_by` (the tokens it is
    sized by, their place in `SIZED_BY`), one group that runs it and how that group spans the cluster."""

    where: str
    collective: Collective
    bytes_per_token: float
    sized_by: int
    group: tuple[int, ...]
    span: Span
    impl: str
    overlapped: bool  # hidden by two-batch overlap
    count: int  # times run

    def unplaced(self) -> tuple:
        """All but the group's GPU ids: what the link model reads of the collective."""
        return (*self[:4], *self[5:])


@dataclass(frozen=True, eq=False)
class CommTemplate:
    """A stage's collectives in one phase. Interned by everything but the groups' GPU ids (`CommEntry.unplaced`): the
    link model reads a group only through its span, so stages and layouts whose collectives differ only in which GPUs
    run them share one template (and so the time of its collectives)."""

    cluster: ClusterSpec
    entries: tuple[CommEntry, ...]


class _Split(NamedTuple):
    """The weights a step model reads, as one GPU holds them under one weight split."""

    matrices: dict[tuple[str, str], list[_Matrix]]  # per layer kind its GEMM matrices
    experts: dict[tuple[str, str], _Matrix]  # per layer kind one routed expert (one GPU's slice)
    head: _Matrix  # lm_head


def _read_weights(model: ModelSpec, layout: Layout, weights: tuple[Weight, ...]) -> _Split:
    """Per layer kind: its GEMM matrices on one GPU; its routed experts (bytes of ONE expert, one GPU's
    slice); and the lm_head bytes on one GPU. `weights`: the tensors a step model reads (`_representative_weights`)."""
    first = _first_layers(model)
    by_layer: dict[int, dict[str, _Matrix]] = {layer: {} for layer in first.values()}
    experts: dict[tuple[str, str], _Matrix] = {}
    head = _Matrix("lm_head", 0.0, 0.0, "bf16")
    fused = _fused_widths(weights, layout, model)
    for w in weights:
        ways = weight_ways(w, layout, model)
        if w.role == "lm_head" or (w.role == "embedding" and model.tie_word_embeddings):
            head = _Matrix("lm_head", w.params / ways, w.bytes / ways, _dtype(w), gemms=_gemms(w, ways, {}))
        if w.layer not in by_layer or len(w.shape) != 2:
            continue
        kind = _kind(model, w.layer)
        if w.role == "routed_experts":
            share = w.count * layout.moe_tp
            old = experts.get(kind)
            experts[kind] = _Matrix(
                "experts",
                w.params / share + (old.params if old else 0.0),
                w.bytes / share + (old.bytes if old else 0.0),
                _dtype(w),
                w.format.name if w.format else "bf16",
            )
        elif w.role in GEMM_ROLES:
            mats = by_layer[w.layer]
            old = mats.get(w.component)
            mats[w.component] = _Matrix(
                w.component,
                w.params / ways + (old.params if old else 0.0),
                w.bytes / ways + (old.bytes if old else 0.0),
                _dtype(w),
                gemms=(old.gemms if old else ()) + _gemms(w, ways, fused),
            )
    matrices = {kind: list(by_layer[layer].values()) for kind, layer in first.items()}
    return _Split(matrices, experts, head)


class LayerPiece(NamedTuple):
    """A layer's ops for a batch: `rank_requests` requests of the busiest attention-DP rank adding `new_tokens` each
    (`rank_tokens` in all; `stage_tokens` over the stage's DP ranks) to `context` cached tokens each."""

    inputs: LayerInputs
    phase: str
    rank_requests: int
    rank_tokens: int
    stage_tokens: int
    new_tokens: int
    context: int


class CommsPiece(NamedTuple):
    """A stage's collectives in one part of a step (`StepModel.comm_template`), sized by the tokens `SIZED_BY`
    names."""

    template: CommTemplate
    phase: str
    part: str  # all | halved | whole (two-batch overlap)
    rank_tokens: int
    stage_tokens: int
    cached_tokens: int
    sampled: int

    @property
    def tokens(self) -> tuple[int, int, int, int]:
        """The tokens a template entry's `source` indexes, in `SIZED_BY` order."""
        return self.rank_tokens, self.stage_tokens, self.cached_tokens, self.sampled


class EmbeddingPiece(NamedTuple):
    """The embedding lookup of the rank's new tokens, on the first stage."""

    hidden: int
    tokens: int


class HeadPiece(NamedTuple):
    """lm_head on the sampled tokens, and sampling, on the last stage."""

    head: HeadInputs
    vocab: int
    sampled: int


# A piece's key holds all its ops follow from: equal keys list equal ops on any layout. (In a table shared by several
# kinds, the first field's type tells them apart: a layer's inputs, a template, a size, the head's inputs.)
PieceKey = LayerPiece | CommsPiece | EmbeddingPiece | HeadPiece


class _LayerSlot(NamedTuple):
    kind: tuple[str, str]  # (attention, mlp)
    halved: bool  # run once per half of a two-batch-overlap split


class _CommsSlot(NamedTuple):
    template: CommTemplate
    part: str


_EMBEDDING, _HEAD = "embedding", "head"  # the slots of the once-a-step pieces
Slot = _LayerSlot | _CommsSlot | str


class _CommPlan:
    """What follows from a step model's collectives, its stages' layers and its groups alone, shared by the step models
    that have them all alike (a structure's with another KV cache dtype): per (stage, phase, part) the interned
    template and the stage's own collectives (its own groups); per phase the stage classes; the pieces' shapes."""

    __slots__ = ("classes", "shapes", "templates")

    def __init__(self) -> None:
        self.templates: dict[tuple[int, str, str], tuple[CommTemplate | None, tuple[CommEntry, ...]]] = {}
        self.classes: dict[Phase, tuple[int, ...]] = {}
        self.shapes: dict[tuple[str, bool, tuple[int, ...] | None], tuple[Shape, tuple[Slot, ...]]] = {}


class StepModel:
    """A layout's step, ready to be listed for any batch. `book`: what the step models of one search share (default
    a book of its own)."""

    def __init__(self, model: ModelSpec, layout: Layout, cluster: ClusterSpec, book: OpBook | None = None) -> None:
        book = self._book = book or OpBook()
        self.model, self.layout, self.cluster = with_kv_dtype(model, layout), layout, cluster
        self._groups = groups(layout)
        # per (group, its size, stage): the GPUs that run a collective there and how they span the cluster, shared by
        # the layouts with these groups (their GPU ids follow from the degrees that name them)
        self._placed: dict[tuple[str, int, int], tuple[tuple[int, ...], Span]] = book.placed.get(
            (self._groups, cluster), None, dict
        )
        self._stage_kinds, self._moe_kinds = book.stage_kinds(self.model, layout.pp, layout.pp_extra_layers)
        split = book.split_weights(model, layout)
        # the weights' ops are the same whatever the KV cache stores: interned under the model as given, so the setups
        # of a structure with another KV cache dtype share their GEMMs', experts' and head's costs
        self._head = book.interned(HeadInputs, model, split.head, layout.lm_head_tp)
        self._layers = {
            kind: layer_inputs(book, self.model, kind, mats, split.experts.get(kind), layout, weights=model)
            for kind, mats in split.matrices.items()
        }
        self._comm = comm_steps(layout, self.model)
        self._ar_impl = self._allreduce_impl()
        plan = (tuple(self._comm), layout.pp, layout.pp_extra_layers, self._ar_impl, layout.options.two_batch_overlap)
        self._plan: _CommPlan = book.plans.get((model, cluster, self._groups), plan, _CommPlan)
        self._firsts: dict[Phase, tuple[int, ...]] = {}

    # --- set-up --------------------------------------------------------------------------------------

    def _allreduce_impl(self) -> str:
        """Custom all-reduce runs over NVLink and over PCIe only for two GPUs; beyond that the engines fall back
        to NCCL (vLLM and SGLang custom_all_reduce.py: 'not supported on more than two PCIe-only GPUs')."""
        if self.cluster.intra.link.kind in ("nvlink", "xgmi") and self.cluster.intra.p2p:
            return "custom"
        return "custom" if self.layout.attn_tp <= 2 and self.cluster.intra.p2p else "nccl"

    # --- one step ------------------------------------------------------------------------------------

    def pieces(
        self, *, phase: Phase, requests: int, new_tokens: int, context_tokens: int, stages: Sequence[int] | None = None
    ) -> list[Piece]:
        """The ops of one step where `requests` requests each add `new_tokens` tokens (1 in decode, a chunk in
        prefill) to a context of `context_tokens` already cached, as pieces: `ops` lists them whole. `stages`: those
        stages' pieces only (default every stage's)."""
        shape, keys = self.piece_keys(
            phase=phase, requests=requests, new_tokens=new_tokens, context_tokens=context_tokens, stages=stages
        )
        return [Piece(stage, count, keys[slot]) for stage, count, slot in shape]

    def piece_keys(
        self, *, phase: Phase, requests: int, new_tokens: int, context_tokens: int, stages: Sequence[int] | None = None
    ) -> tuple[Shape, list[PieceKey]]:
        """`pieces` as (its shape: the stage, times run and slot of every piece in order; the key of each slot). A slot
        is one piece whatever the stage (a layer kind's, for instance, on every stage that runs it): priced once. The
        shape follows from the phase, whether two-batch overlap splits the step and the stages asked (remembered)."""
        lay = self.layout
        rank_requests = math.ceil(requests / (lay.attn_dp * lay.replicas))  # busiest attention-DP rank
        rank_tokens = rank_requests * new_tokens
        stage_tokens = rank_tokens * lay.attn_dp  # what an MLP split over the stage sees
        # a decode step samples every new token (several per request when it verifies drafts); prefill the last
        sampled = rank_tokens if phase is Phase.DECODE else rank_requests
        # two-batch overlap halves the requests and runs each MoE layer once per half (SGLang
        # two_batch_overlap.py compute_split_seq_index: requests // 2, so one request does not split; dense layers
        # run whole, deepseek_v2.py forward; vLLM only from its token thresholds, ubatch_utils.py): the weights
        # are read once per half, and an all-to-all's dispatch and combine run beside the other half's compute
        least = lay.options.overlap_from_tokens[0 if phase is Phase.DECODE else 1]
        split = lay.options.two_batch_overlap and rank_requests >= 2 and rank_tokens >= least
        part = math.ceil(rank_requests / 2)  # the larger half
        named = phase.value
        shape, slots = self._shape(named, split, None if stages is None else tuple(stages))
        keys: list[PieceKey] = []
        for slot in slots:
            if type(slot) is _LayerSlot:
                here = part if slot.halved else rank_requests
                tokens = here * new_tokens
                inputs = self._layers[slot.kind]
                keys.append(LayerPiece(inputs, named, here, tokens, tokens * lay.attn_dp, new_tokens, context_tokens))
            elif type(slot) is _CommsSlot:
                if slot.part == "halved":
                    sized = (part * new_tokens, part * new_tokens * lay.attn_dp, part * context_tokens, sampled)
                else:
                    sized = (rank_tokens, stage_tokens, rank_requests * context_tokens, sampled)
                keys.append(CommsPiece(slot.template, named, slot.part, *sized))
            elif slot == _EMBEDDING:
                keys.append(EmbeddingPiece(self.model.hidden_size, rank_tokens))
            else:
                keys.append(HeadPiece(self._head, self.model.vocab_size, sampled))
        return shape, keys

    def _shape(self, phase: str, split: bool, stages: tuple[int, ...] | None) -> tuple[Shape, tuple[Slot, ...]]:
        """The pieces of a step of `phase` on `stages` (None: all) as (stage, times run, slot), and the slots: a layer
        kind, a stage's collectives in one part, the embedding, the head."""
        made = self._plan.shapes.get((phase, split, stages))
        if made is not None:
            return made
        shape: list[Placed] = []
        slots: list[Slot] = []
        index: dict[Slot, int] = {}

        def add(stage: int, count: int, slot: Slot) -> None:
            at = index.get(slot)
            if at is None:
                at = index[slot] = len(slots)
                slots.append(slot)
            shape.append(Placed(stage, count, at))

        for stage in range(self.layout.pp) if stages is None else stages:
            halved = split and self._moe_kinds[stage]
            for kind, count in self._stage_kinds[stage].items():
                half = halved and kind[1] == "moe"
                add(stage, 2 * count if half else count, _LayerSlot(kind, half))
            for which in ("halved", "whole") if halved else ("all",):
                template = self.comm_template(stage, phase, which)
                if template is not None:  # the stage's collectives, one piece (none where it runs none)
                    add(stage, 1, _CommsSlot(template, which))
        if stages is None or 0 in stages:
            add(0, 1, _EMBEDDING)
        if stages is None or self.layout.pp - 1 in stages:
            add(self.layout.pp - 1, 1, _HEAD)
        made = self._plan.shapes[(phase, split, stages)] = (tuple(shape), tuple(slots))
        return made

    def stage_classes(self, phase: Phase) -> tuple[int, ...]:
        """Per stage, the first stage whose pieces are the same in every step of `phase` (the same layers in the same
        order, the same collectives' template in each part, and neither first nor last): its sums are that stage's."""
        made = self._plan.classes.get(phase)
        if made is None:
            parts = ("all", "halved", "whole") if self.layout.options.two_batch_overlap else ("all",)
            last, first = self.layout.pp - 1, {}
            classes = []
            for stage, kinds in enumerate(self._stage_kinds):
                alike = (
                    tuple(kinds.items()),
                    stage == 0,
                    stage == last,
                    *(self._stage_comms(stage, phase.value, part)[0] for part in parts),
                )
                classes.append(first.setdefault(alike, stage))
            made = self._plan.classes[phase] = tuple(classes)
        return made

    def class_firsts(self, phase: Phase) -> tuple[int, ...]:
        """The first stage of each class of `stage_classes`, in order."""
        made = self._firsts.get(phase)
        if made is None:
            made = self._firsts[phase] = tuple(s for s, c in enumerate(self.stage_classes(phase)) if s == c)
        return made

    def piece_ops(self, key: PieceKey) -> tuple[Op, ...]:
        """The ops a piece names, each run once (their stage 0: a piece's place is its own). A stage's collectives are
        listed on the groups of one stage that runs them alike (their time is the same); `ops` lists each stage's
        own groups."""
        if type(key) is CommsPiece:
            return comm_ops(key)
        return tuple(k.op() for k in piece_op_keys(key))

    def ops(self, *, phase: Phase, requests: int, new_tokens: int, context_tokens: int) -> list[Op]:
        """Ops of one step where `requests` requests each add `new_tokens` tokens (1 in decode, a chunk in
        prefill) to a context of `context_tokens` already cached."""
        out: list[Op] = []
        for p in self.pieces(phase=phase, requests=requests, new_tokens=new_tokens, context_tokens=context_tokens):
            if type(p.key) is CommsPiece:  # the stage's own groups
                key = p.key
                ops = _comm_ops(self._stage_comms(p.stage, key.phase, key.part)[1], key.tokens)
            else:
                ops = self.piece_ops(p.key)
            out += [replace(op, stage=p.stage, count=op.count * p.count) for op in ops]
        return out

    def comm_template(self, stage: int, phase: str, part: str) -> CommTemplate | None:
        """The collectives of `comm_steps` that run on this stage in this phase (None: none run): per layer kind, once
        per step (embedding all-reduce on the first stage, logits all-gather of the sampled tokens on the last), and the
        hand-offs between stages (counted on the first). `part`: "all" the stage's layers; with two-batch overlap,
        "halved" its MoE layers, whose collectives run once per half and whose all-to-all's dispatch and combine hide
        behind the other half's compute (SGLang overlaps only those in DeepSeek-V2/V3 layers: operations_strategy.py;
        with no all-to-all backend, validation_hook.py check_two_batch_overlap: only DeepSeek-V4's), and "whole" the
        others, with the once-a-step collectives and the hand-offs."""
        return self._stage_comms(stage, phase, part)[0]

    def _stage_comms(self, stage: int, phase: str, part: str) -> tuple[CommTemplate | None, tuple[CommEntry, ...]]:
        """`comm_template`'s template, and the stage's own collectives (its own groups), made once."""
        made = self._plan.templates.get((stage, phase, part))
        if made is not None:
            return made
        last = self.layout.pp - 1
        kinds = self._stage_kinds[stage]
        if part != "all":
            kinds = Counter({k: n for k, n in kinds.items() if (k[1] == "moe") == (part == "halved")})
        per_step, halves = part != "halved", 2 if part == "halved" else 1
        per_count = {
            "layer": sum(kinds.values()),
            "attention_layer": sum(n for (attention, _), n in kinds.items() if attention != "linear"),
            "moe_layer": sum(n for (_, mlp), n in kinds.items() if mlp == "moe"),
            "dense_layer": sum(n for (_, mlp), n in kinds.items() if mlp == "dense"),
            "stage_boundary": self.layout.pp - 1 if stage == 0 and per_step else 0,
        }
        out = []
        for c in self._comm:
            if (c.phase is not None and c.phase != phase) or (c.per == "step" and not per_step):
                continue
            source = "stage" if c.group == "stage" and c.op is not Collective.ALL_TO_ALL else "rank"
            if c.sized_by == "cached":
                source = "cached"
            if c.per == "step":  # the logits gather runs where lm_head is, on the sampled tokens only
                gather = c.op is Collective.ALL_GATHER
                count, source = int(stage == (last if gather else 0)), "sampled" if gather else "rank"
            else:
                count = per_count[c.per] * halves
            if not count:
                continue
            where = (c.group, c.group_size, stage)
            placed = self._placed.get(where)
            if placed is None:
                group = self._group(*where)
                placed = self._placed[where] = (group, self._book.span(self.cluster, group))
            overlapped = halves > 1 and c.per == "moe_layer" and c.op is Collective.ALL_TO_ALL
            impl = self._ar_impl if c.op is Collective.ALL_REDUCE else "nccl"
            sized_by = SIZED_BY.index(source)
            out.append(CommEntry(c.where, c.op, c.bytes_per_token, sized_by, *placed, impl, overlapped, count))
        template = self._book.comm_template(self.cluster, out) if out else None
        made = self._plan.templates[(stage, phase, part)] = (template, tuple(out))
        return made

    def _group(self, name: str, size: int, stage: int) -> tuple[int, ...]:
        """The GPUs of one group of `name` that runs a collective of `size` GPUs on `stage` (the first such group; "pp":
        the first GPUs of the first two stages, a hand-off's pair)."""
        if name == "pp":
            return tuple(g[0] for g in self._groups["stage"][:2])
        key = name if name in ("attn_tp", "moe_ep") else "stage"
        per_stage = len(self._groups[key]) // (self.layout.pp * self.layout.replicas)
        candidates = self._groups[key][stage * per_stage : (stage + 1) * per_stage] or self._groups[key]
        return tuple(candidates[0][:size])


class GemmKey(NamedTuple):
    """One matrix's GEMM over `tokens` tokens."""

    inputs: GemmInputs
    phase: str
    tokens: int

    def op(self) -> Compute:
        return _gemm(self.inputs, _PHASES[self.phase], self.tokens)


class AttentionKey(NamedTuple):
    """One layer's attention for `requests` requests adding `new_tokens` each to `context` cached tokens."""

    inputs: AttentionInputs
    phase: str
    requests: int
    new_tokens: int
    context: int

    def op(self) -> Compute:
        return _attention(self.inputs, _PHASES[self.phase], self.requests, self.new_tokens, self.context)


class IndexerKey(NamedTuple):
    """The indexer of the sparse attention `attention` names: its fields in a tuple of their own, so that the key is
    never equal to the attention's (tuples compare by their items, whatever their class)."""

    attention: AttentionKey

    def op(self) -> Compute:
        a = self.attention
        return _indexer(a.inputs, _PHASES[a.phase], a.requests, a.new_tokens, a.context)


class ElementwiseKey(NamedTuple):
    """A layer's norms, rotary and residual adds: `kernels` passes over `tokens` tokens of `hidden` values."""

    kernels: int
    hidden: int
    tokens: int

    def op(self) -> Compute:
        moved = self.kernels * 2 * self.tokens * self.hidden * ACT_BYTES  # each kernel reads and writes the tokens
        return _moving("norms, rotary, residual", OpClass.ELEMENTWISE, moved, self.kernels)


class ExpertsKey(NamedTuple):
    """One layer's routed experts over the stage's `tokens` tokens."""

    inputs: ExpertInputs
    tokens: int

    def op(self) -> Compute:
        return _routed_experts(self.inputs, self.tokens)


class LookupKey(NamedTuple):
    """The embedding lookup of `tokens` tokens."""

    hidden: int
    tokens: int

    def op(self) -> Compute:
        return _moving("embedding lookup", OpClass.ELEMENTWISE, 2 * self.tokens * self.hidden * ACT_BYTES, 1)


class LmHeadKey(NamedTuple):
    """lm_head over the `sampled` tokens."""

    inputs: HeadInputs
    sampled: int

    def op(self) -> Compute:
        head, sampled = self.inputs.head, self.sampled
        return Compute(
            name="lm_head",
            op_class=OpClass.GEMM,
            stage=0,
            count=1,
            flops=2 * sampled * head.params,
            bytes=head.bytes + sampled * self.inputs.model.vocab_size / self.inputs.lm_head_tp * 4,
            weight_bytes=head.bytes,
            dtype=head.dtype,
            gemms=head.gemms,
            tokens=sampled,
        )


class SamplingKey(NamedTuple):
    """Sampling `sampled` tokens from a vocabulary of `vocab`."""

    vocab: int
    sampled: int

    def op(self) -> Compute:
        return _moving("sampling", OpClass.SAMPLING, self.sampled * self.vocab * 4 * 2, 4)  # FP32 logits, read twice


# The key of one compute op: it holds all the op is built from (`.op()` builds it, run once on stage 0), so equal keys
# name equal ops on any layout. A layer's keys hold interned inputs of distinct types, so keys of different kinds never
# compare equal; the embedding's and the head's are priced within their pieces.
OpKey = GemmKey | AttentionKey | IndexerKey | ElementwiseKey | ExpertsKey | LookupKey | LmHeadKey | SamplingKey
LayerOpKey = GemmKey | AttentionKey | IndexerKey | ElementwiseKey | ExpertsKey


def piece_op_keys(key: LayerPiece | EmbeddingPiece | HeadPiece) -> list[OpKey]:
    """The keys of the ops of a layer, embedding or head piece (`StepModel.pieces`): a piece's key holds all its ops
    follow from, so equal keys list equal ops on any layout."""
    if type(key) is LayerPiece:
        return layer_op_keys(key)
    if type(key) is EmbeddingPiece:
        return [LookupKey(key.hidden, key.tokens)]
    assert type(key) is HeadPiece
    return [LmHeadKey(key.head, key.sampled), SamplingKey(key.vocab, key.sampled)]


def layer_op_keys(piece: LayerPiece) -> list[LayerOpKey]:
    """The keys of one layer's ops (run once) for the batch its piece names: its GEMMs first (`layer_gemm_keys`), then
    the rest (`layer_other_keys`)."""
    return layer_gemm_keys(piece.inputs, piece.phase, piece.rank_tokens, piece.stage_tokens) + layer_other_keys(piece)


def layer_gemm_keys(inputs: LayerInputs, phase: str, rank_tokens: int, stage_tokens: int) -> list[LayerOpKey]:
    """The keys of a layer's GEMMs: they follow from its matrices, which of them see every attention-DP rank's tokens,
    the phase and the tokens alone."""
    keys: list[LayerOpKey] = []
    for g in inputs.gemms:
        name = g.matrix.name
        if name.startswith(("shared_experts", "router")):
            tokens = stage_tokens if inputs.gathered else rank_tokens
        elif name.startswith("dense_mlp"):
            tokens = stage_tokens if inputs.dense_gathered else rank_tokens
        else:
            tokens = rank_tokens
        keys.append(GemmKey(g, phase, tokens))
    return keys


def _fused_norms(inputs: LayerInputs, rank_tokens: int) -> int:
    """The layer's residual-add norms that run inside the all-reduce before them (its attention output's and its
    MLP's; the kernel does the reduction and the norm in one pass, so the all-reduce is priced as before and the two
    norm kernels are gone). Counted as two in every layer: the first layer's input norm has no all-reduce before it
    and the last layer's MLP all-reduce no norm after it, which leaves one more norm kernel per stage in the engine
    than here."""
    return 2 if 0 < rank_tokens <= inputs.norm_fusion_tokens else 0


def layer_other_keys(piece: LayerPiece) -> list[LayerOpKey]:
    """The keys of a layer's attention, elementwise kernels and routed experts."""
    inputs = piece.inputs
    attention = AttentionKey(inputs.attention, piece.phase, piece.rank_requests, piece.new_tokens, piece.context)
    keys: list[LayerOpKey] = [
        attention,
        ElementwiseKey(
            inputs.elementwise - _fused_norms(inputs, piece.rank_tokens), inputs.model.hidden_size, piece.rank_tokens
        ),
    ]
    if inputs.attention.attention == "indexed":
        keys.append(IndexerKey(attention))
    if inputs.moe:
        keys.append(ExpertsKey(inputs.experts, piece.stage_tokens))
    return keys


def _moving(name: str, op_class: OpClass, moved_bytes: float, kernels: int) -> Compute:
    """An op that only moves activations (no weights, no FLOPs counted), run once on stage 0."""
    return Compute(
        name=name,
        op_class=op_class,
        stage=0,
        count=1,
        flops=0.0,
        bytes=moved_bytes,
        weight_bytes=0.0,
        dtype="bf16",
        kernels=kernels,
    )


def _gemm(inputs: GemmInputs, phase: Phase, tokens: int) -> Compute:
    """One matrix's GEMM over `tokens` tokens."""
    m, model = inputs.matrix, inputs.model
    h = model.hidden_size
    return Compute(
        name=m.name,
        op_class=OpClass.GEMM,
        stage=0,
        count=1,
        flops=2 * tokens * m.params,
        bytes=m.bytes + tokens * ACT_BYTES * (h + m.params / h),
        weight_bytes=m.bytes,
        dtype=m.dtype,
        kernels=_gemm_kernels(m.name, model, phase),
        gemms=() if _absorbed(m.name, model, phase) else m.gemms,
        untimed_kernels=int(m.name in ("dense_mlp", "shared_experts")),  # the activation
        tokens=tokens,
    )


def _attention(inputs: AttentionInputs, phase: Phase, requests: int, new_tokens: int, context: int) -> Compute:
    """The attention kernel of one layer: reads every cached token of every request once, and computes each new
    token against them (prefill: causal, so the chunk's own tokens count half)."""
    model, attention = inputs.model, inputs.attention
    att = model.attention
    heads = att.num_heads / inputs.attn_tp
    if attention == "linear" and model.linear_attention is not None:
        state = model.linear_state_bytes / max(1, sum(k == "linear" for k in model.layer_attention))
        lin = model.linear_attention
        flops = 4 * requests * new_tokens * lin.num_value_heads * lin.key_head_dim * lin.value_head_dim
        return Compute(
            name="linear attention",
            op_class=OpClass.ATTENTION,
            stage=0,
            count=1,
            flops=flops / inputs.attn_tp,
            bytes=2 * requests * state / inputs.attn_tp,
            weight_bytes=0.0,
            dtype="bf16",
            kernels=3,
        )
    seen = context + (new_tokens / 2 if phase is Phase.PREFILL else new_tokens)
    full_length = context + new_tokens  # what a decode table is looked up at (with its window, if any)
    window = model.sliding_window if attention == "sliding" and model.sliding_window else 0
    if window:
        seen = min(seen, window)
        context = min(context, window)
    cached = context + new_tokens
    read = cached
    # sparse attention: each query reads the top-k cached tokens its indexer chose; up to top-k tokens, all of them
    sparse = att.sparse is not None and full_length > att.sparse.top_k
    if att.sparse is not None:
        seen, read = min(seen, att.sparse.top_k), min(cached, att.sparse.top_k * max(1, new_tokens))
        full_length = min(full_length, att.sparse.top_k)
    per_token_cache = model.kv_bytes_per_token_per_layer()
    if att.kind == "mla" and att.mla is not None:
        latent = att.mla.kv_lora_rank + att.mla.qk_rope_head_dim
        if phase is Phase.DECODE or sparse:  # absorbed: scores over the latent + rope key, values from the latent
            per_pair = 2 * (latent + att.mla.kv_lora_rank)
        else:  # prefill expands the latent into per-head keys and values
            per_pair = 2 * (att.head_dim + att.mla.v_head_dim)
        cache_share = 1.0 / inputs.dcp  # the latent is replicated over attention TP; DCP interleaves it
    else:
        per_pair = 2 * 2 * att.head_dim
        kv_heads = att.num_kv_heads
        cache_share = max(1, kv_heads // max(1, inputs.attn_tp)) / kv_heads / inputs.dcp
    flops = requests * new_tokens * heads * seen * per_pair / inputs.dcp
    kv_bytes = requests * read * per_token_cache * cache_share
    measured_shape, gqa_shape, prefill_shape = None, None, None
    one_query = phase is Phase.DECODE and new_tokens == 1 and inputs.dcp == 1
    if att.kind == "mla" and one_query:
        measured_shape = MLADecodeShape(heads=int(heads), kv_bytes=int(model.kv_bytes_per_element))
    elif att.kind == "mla" and phase is Phase.PREFILL and inputs.dcp == 1 and heads == int(heads) and not sparse:
        prefill_shape = MLAPrefillShape(heads=int(heads), kv_bytes=int(model.kv_bytes_per_element))
    elif att.kind != "mla" and one_query and heads == int(heads):
        gqa_shape = GQADecodeShape(
            heads=int(heads),
            kv_heads=max(1, att.num_kv_heads // max(1, inputs.attn_tp)),
            head_dim=att.head_dim,
            kv_bytes=int(model.kv_bytes_per_element),
            window=window,
        )
    return Compute(
        name="attention",
        op_class=OpClass.ATTENTION,
        stage=0,
        count=1,
        flops=flops,
        bytes=kv_bytes,
        weight_bytes=0.0,
        dtype="bf16",
        kernels=2,  # split-KV partials + merge
        mla_decode=measured_shape,
        mla_prefill=prefill_shape,
        gqa_decode=gqa_shape,
        tokens=requests,
        context=int(full_length),
        new_tokens=new_tokens,
    )


def _indexer(inputs: AttentionInputs, phase: Phase, requests: int, new_tokens: int, context: int) -> Compute:
    """Sparse attention's lightning indexer in one layer: each new token's FP8 logits against every cached token's
    indexer key (SGLang layers/attention/dsa/dsa_indexer.py: deep_gemm fp8_paged_mqa_logits in decode,
    fp8_mqa_logits in prefill) and their top-k. Every attention-TP and DCP rank runs all of it (its weights and keys
    are whole on each). A prefill whose requests are no longer than top-k skips the logits
    (_should_skip_logits_computation): it attends to every token."""
    sparse = inputs.model.attention.sparse
    assert sparse is not None
    seen = context + (new_tokens / 2 if phase is Phase.PREFILL else new_tokens)
    if phase is Phase.PREFILL and context + new_tokens <= sparse.top_k:
        seen = 0.0
    return Compute(
        name="sparse-attention indexer",
        op_class=OpClass.ATTENTION,
        stage=0,
        count=1,
        flops=2 * requests * new_tokens * sparse.num_heads * sparse.head_dim * seen,
        bytes=requests * (context + new_tokens) * sparse.key_bytes if seen else 0.0,
        weight_bytes=0.0,
        dtype="fp8",
        kernels=2 if seen else 0,  # logits, top-k
        tokens=requests,
        context=context + new_tokens,
        new_tokens=new_tokens,
    )


def _routed_experts(inputs: ExpertInputs, tokens: int) -> Compute:
    """The grouped expert GEMMs of the busiest EP rank: the distinct experts it must read, the token-expert pairs it
    must compute."""
    model = inputs.model
    moe, one = model.moe, inputs.experts
    assert moe is not None and one is not None
    load = busiest_rank(
        tokens=tokens,  # every token of the stage is routed, whichever way it travels
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        ranks=inputs.moe_ep,
        balanced=inputs.eplb,
    )
    h = model.hidden_size
    return Compute(
        name="routed experts",
        op_class=OpClass.EXPERTS,
        stage=0,
        count=1,
        flops=2 * load.assignments * one.params,
        bytes=load.distinct_experts * one.bytes + load.assignments * ACT_BYTES * (2 * h + 3 * one.params / h),
        weight_bytes=load.distinct_experts * one.bytes,
        dtype=one.dtype,
        kernels=9,  # top-k, expert map, align/sort (2), workspace zeroing, gate-up GEMM, activation, down, sum
        moe=MoEShape(
            weight_format=one.fmt,
            hidden=h,
            inter=moe.expert_intermediate_size,
            topk=moe.top_k,
            experts=moe.num_experts,
            moe_tp=inputs.moe_tp,
            moe_ep=inputs.moe_ep,
        ),
        tokens=tokens,
    )


def comm_ops(key: CommsPiece) -> tuple[Comm, ...]:
    """The collectives a stage's piece names, each on one group that runs it (`StepModel.ops` lists each stage's own
    groups; the link model reads only their span)."""
    return _comm_ops(key.template.entries, key.tokens)


def _comm_ops(entries: Sequence[CommEntry], tokens: Sequence[int]) -> tuple[Comm, ...]:
    """Template entries' collectives for these tokens (the rank's new tokens, the stage's, those cached, those
    sampled, in `SIZED_BY` order)."""
    return tuple(
        Comm(
            name=e.where,
            stage=0,
            count=e.count,
            collective=e.collective,
            group=e.group,
            size_bytes=e.bytes_per_token * tokens[e.sized_by],
            impl=e.impl,
            overlapped=e.overlapped,
        )
        for e in entries
    )
