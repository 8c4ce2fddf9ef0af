"""The price book of one search (or one check): every table of figures its pricing makes once and reads again.

A search prices thousands of setups that share most of their work: the same model's weights split alike, the same
GEMMs on different layouts, the same collectives on groups that span the cluster alike, a structure sized with CUDA
graphs off or the memory fraction raised. The caller that prices makes one `PriceBook` and hands it down to the step
models, cost models, step times and memory ledgers it builds; what they make once is kept here, and nothing outlives
the book. Each table is bounded, least recently used first out (`Memo`), or cleared when full.

The tables, in the order a step is priced (docs/how-a-step-is-priced.md):
- `ops` (`OpBook`): the weights as each split holds them, each stage's layer kinds, interned op inputs, collective
  templates and where their groups sit;
- `op_prices(cluster, engine, version, tables)`: each op's cost by its key, each piece's costs and sums, a layer's
  GEMMs by what they follow from;
- `comm_prices(cluster)`: collective times;
- `layout_prices(...)`: per set of layouts whose ops cost the same, the step model, its step figures and stage sums,
  and what the serving models built on it remember (decode cycles, prefill times);
- the memory ledger's weight profiles, per-stage weights, KV cells and GPU stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardwise.memo import Memo
from shardwise.ops.build import OpBook

if TYPE_CHECKING:
    from shardwise.cost.roofline import OpCost
    from shardwise.cost.step import Figures, PieceSums, PricedPiece, StepCost
    from shardwise.ops.build import GemmInputs, OpKey, PieceKey, StepModel
    from shardwise.spec.cluster import ClusterSpec

ENTRIES = 200_000  # op costs (or pieces) one table holds before it is cleared (8x8 H100: under 40,000 pieces a release)


class OpPrices:
    """The priced ops of one cluster and one engine release's kernel tables (or the roofline alone)."""

    __slots__ = ("gemm_sums", "ops", "pieces")

    def __init__(self) -> None:
        self.ops: dict[OpKey, OpCost] = {}
        self.pieces: dict[PieceKey, PricedPiece] = {}  # keys of different kinds never compare equal
        # a layer's GEMMs' costs and sums by its matrices, which of them see every attention-DP rank's tokens, the phase
        # and the tokens
        self.gemm_sums: dict[
            tuple[tuple[GemmInputs, ...], bool, bool, str, int, int], tuple[tuple[OpCost, ...], PieceSums]
        ] = {}


class CommPrices:
    """The collective times of one cluster."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: dict[tuple, float] = {}  # one run's time by (collective, size, span, implementation)


class PrefillPrices:
    """What the serving models of layouts with the same ops and scheduler remember of their prefills."""

    __slots__ = ("chunks", "steps", "sums")

    def __init__(self) -> None:
        self.steps: dict[tuple[int, int, int], float] = {}  # one prefill step's time by (requests, tokens, context)
        self.sums: dict[tuple, tuple[float, float, float]] = {}  # a request's prefill by what it follows from
        self.chunks: dict[tuple, float] = {}  # a chunked prefill's time by what it follows from


class LayoutPrices:
    """The tables of the layouts whose ops cost the same (a structure with CUDA graphs off, the memory fraction raised,
    other slot counts): their step model and pricer (set by the cost model that makes them), the stage sums of each
    step by its ops' key, its figures by that key and how the host issues it, its steps, and what serving models
    remember of its decode cycles and prefills."""

    __slots__ = ("cycles", "figures", "prefills", "pricer", "step_model", "steps", "sums")

    def __init__(self) -> None:
        self.step_model: StepModel | None = None
        self.pricer: Any = None  # its pricer, once made
        self.sums: dict[tuple, dict[int, PieceSums]] = {}  # each class of stages' sums, by the step's ops' key
        self.figures: dict[tuple, Figures] = {}  # by the ops' key and how the host issues the step
        self.steps: dict[tuple, StepCost] = {}
        self.cycles: dict[tuple, tuple[float, dict[str, float]]] = {}
        self.prefills: dict[tuple[bool, float], PrefillPrices] = {}

    def prefill(self, overlap: bool, scale: float) -> PrefillPrices:
        """The prefill tables of serving models with this scheduler overlap and prefill scale."""
        made = self.prefills.get((overlap, scale))
        if made is None:
            made = self.prefills[(overlap, scale)] = PrefillPrices()
        return made


class PriceBook:
    """Every table one search (or one check) prices from; made by the caller, handed down, let go with it."""

    def __init__(self) -> None:
        self.ops = OpBook()
        self._op_prices = Memo(16)  # per cluster, engine release and whether kernel tables are read
        self._comm_prices = Memo(16)  # per cluster
        self._layouts = Memo(32)  # per model, cluster and what a layout's op costs follow from (`StepCostModel.of`)
        # the memory ledger's (cost/memory.py): per model its weight profile; per model and drafter the weights per
        # stage; per model its KV cells per stage; per stage groups each GPU's stage
        self.weight_profiles = Memo(16)
        self.stage_weights = Memo(256)
        self.cells = Memo(256)
        self.gpu_stages = Memo(4096)

    def op_prices(self, cluster: ClusterSpec, engine: str, version: str, tables: bool) -> OpPrices:
        return self._op_prices.get((cluster,), (engine, version, tables), OpPrices)

    def comm_prices(self, cluster: ClusterSpec) -> CommPrices:
        return self._comm_prices.get((cluster,), None, CommPrices)

    def layout_prices(self, owners: tuple[object, ...], key: tuple) -> LayoutPrices:
        return self._layouts.get(owners, key, LayoutPrices)
