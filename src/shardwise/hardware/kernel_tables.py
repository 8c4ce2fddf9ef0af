"""Measured kernel times from the silicon tables of aiconfigurator-core (data/hardware/kernel_tables.yaml says
which package version, which system each GPU is, and how our weight formats name theirs).

This module owns the mapping from a shardwise op to a table row set: `moe_curve(gpu, engine, release, shape)`
returns the measured latency of the routed-expert kernels of one shape against the tokens entering them, from
the newest table release at or below the engine release modelled (or the oldest there is, flagged), or None
when no table holds that shape; `mla_decode_grid`, `gqa_decode_grid`, `mla_prefill_grid` and `gemm_grid` do the
same for decode attention over (batch, KV length), MLA prefill attention over (prompts, prompt length) and dense
GEMMs over (tokens, n, k). Lookups interpolate log-log between measured points; beyond the last one they scale
linearly from it (flagged as extrapolated), except a windowed attention's length, which a window caps, and a
prompt's length, whose attention grows as its square. Only the row set a run asks for is read, once per
process; the package's are kept under the user's cache (`cache_dir()`), so later runs read neither the table nor
pyarrow.
A folder of the user's own measurements in the same layout ($SHARDWISE_KERNEL_TABLES) is looked up first; tables
shipped with shardwise in that layout (data/hardware/kernel-tables/: AMD's block-FP8 GEMMs, from aiter's tuner) last,
for the engine releases that run the kernels they time.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from shardwise.errors import DataError
from shardwise.hardware.load import data_dir, read_yaml, validate


class MoETables(BaseModel):
    table: str
    distribution: str
    dtypes: dict[str, str]


class DecodeTables(BaseModel):
    """An attention table (MLA or GQA) and its KV cache dtypes."""

    table: str
    kv_dtypes: dict[str, str]  # KV bytes per element → the table's kv_cache_dtype
    kernel_sources: list[str] | None = None  # the rows of these kernels only (None: every kernel's)


class GemmTables(BaseModel):
    table: str
    dtypes: dict[str, str]  # shardwise weight format → the table's gemm_dtype
    not_kernel_times: dict[str, list[str]] = {}  # framework → gemm_dtypes whose rows time more than the kernel


class ShippedTables(BaseModel):
    """Tables shipped with shardwise (under data/hardware/), for the engine releases that run the kernels they time."""

    folder: str
    label: str
    systems: dict[str, str] = {}  # system → the system whose shipped tables it reads (the same kernels run there)
    releases: dict[str, tuple[str, str]]  # engine → (first, last) release these kernels run in


class KernelTablesSpec(BaseModel):
    package: str
    version: str
    priced: list[str]  # op families priced from tables (the rest: the roofline)
    systems: dict[str, str]
    shipped: ShippedTables
    moe: MoETables
    mla_decode: DecodeTables
    mla_prefill: DecodeTables
    gemm: GemmTables
    gqa_decode: DecodeTables


@cache
def spec() -> KernelTablesSpec:
    path = data_dir() / "kernel_tables.yaml"
    return validate(KernelTablesSpec, read_yaml(path), origin=str(path))


USER_TABLES = "SHARDWISE_KERNEL_TABLES"  # a folder of the user's own tables, read before the package's


class _Root(NamedTuple):
    """A folder of tables in the package's layout, <system>/<family>/<framework>/<release>/<table>.parquet."""

    label: str
    folder: Path
    kept: bool  # whether its row sets are kept in the cache
    releases: dict[str, tuple[str, str]] | None = None  # engine → the releases its tables serve (None: any)
    systems: dict[str, str] | None = None  # system → the one whose folder it reads here (None: its own)

    def serves(self, engine: str, release: str) -> bool:
        """Whether this folder's tables time the kernels `release` of `engine` runs."""
        if self.releases is None:
            return True
        span = self.releases.get(engine)
        return span is not None and Version(span[0]) <= Version(release) <= Version(span[1])

    def system(self, system: str) -> str:
        return (self.systems or {}).get(system, system)


def _roots() -> list[_Root]:
    """Where tables are looked up, in order: the user's own measurements first ($SHARDWISE_KERNEL_TABLES, with the
    package's columns), then the pinned package's, then those shipped with shardwise for the engine releases that
    run the kernels they time (a few hundred rows: read afresh, pyarrow with them)."""
    roots = []
    user = os.environ.get(USER_TABLES)
    if user:
        roots.append(_Root(f"user tables {user}", Path(user), kept=False))
    package = _package_root()
    if package is not None:
        roots.append(_Root(f"{spec().package} {spec().version}", package, kept=True))
    shipped = spec().shipped
    roots.append(
        _Root(
            shipped.label, data_dir() / shipped.folder, kept=False, releases=shipped.releases, systems=shipped.systems
        )
    )
    return roots


@cache
def _package_root() -> Path | None:
    """The installed package's system data, when it is installed at the pinned version."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        if version(spec().package) != spec().version:
            return None
        return Path(str(resources.files("aiconfigurator_core") / "systems" / "data"))
    except (ModuleNotFoundError, PackageNotFoundError):
        return None


@dataclass(frozen=True, slots=True)
class MoEShape:
    """The routed-expert block of one layer as the tables key it: the whole model's expert shape and how one
    GPU's share is cut (expert parallel over moe_ep ranks, each expert's width over moe_tp)."""

    weight_format: str  # shardwise format name of the expert weights
    hidden: int
    inter: int
    topk: int
    experts: int
    moe_tp: int
    moe_ep: int


@dataclass(frozen=True, slots=True)
class MLADecodeShape:
    """Absorbed MLA decode attention on one GPU as the tables key it: its local query heads and the bytes of
    each cached latent element."""

    heads: int
    kv_bytes: int


@dataclass(frozen=True, slots=True)
class MLAPrefillShape:
    """MLA prefill attention on one GPU as the tables key it (they timed whole prompts, nothing cached before
    them): its local query heads and the bytes of each cached latent element."""

    heads: int
    kv_bytes: int


@dataclass(frozen=True, slots=True)
class GemmShape:
    """One GEMM an op runs on one GPU, as the tables key it (the token count is the op's): its weight format and
    its local output and input widths. Where the engines fuse several matrices into one GEMM (q, k and v; gate and
    up), each is keyed by the fused shape and takes `share` of its time: its part of the fused output."""

    weight_format: str
    n: int
    k: int
    share: float = 1.0


@dataclass(frozen=True, slots=True)
class GQADecodeShape:
    """Decode attention of multi-head / grouped-query attention on one GPU as the tables key it."""

    heads: int  # local query heads
    kv_heads: int  # local KV heads
    head_dim: int
    kv_bytes: int  # bytes per cached element
    window: int = 0  # sliding window in tokens; 0: full attention


@dataclass(frozen=True)
class Grid:
    """Measured seconds over a grid of shape coordinates, for one shape, from one table: (batch, KV length) for
    decode attention, (tokens, n, k) for a GEMM. NaN where a cell was not measured."""

    axes: tuple[np.ndarray, ...]  # each ascending; the first is the batch (tokens)
    seconds: np.ndarray  # one dimension per axis
    source: str
    release: str
    grows: tuple[float, ...] = ()  # per axis: beyond its last value the time grows as its power (0: flat; default 1)
    scale_batch: bool = True  # a cell not measured: linear in batch from a smaller one (attention, not GEMMs)

    def time_s(self, *point: float) -> tuple[float, bool] | None:
        """(seconds, whether outside the measured range): log-linear in every axis between the measured cells
        around the point; below an axis's first value, that value's time; beyond its last, in proportion to it
        (or flat, as a window caps the length read). Where a cell it needs was not measured (the collectors
        measured large batches at short lengths only), linear in batch from the largest batch measured there,
        for attention; a GEMM is left to the roofline. None where nothing is."""
        if any(math.isnan(v) for v in point):
            return None
        found = self._between(point)
        if found is not None or not self.scale_batch:
            return found
        for batch in self.axes[0][::-1]:
            if batch < point[0]:
                below = self._between((float(batch), *point[1:]))
                if below is not None:
                    return below[0] * point[0] / float(batch), True
        return None

    @cached_property
    def _log_axes(self) -> tuple[list[float], ...]:
        return tuple([math.log(float(v)) for v in axis] for axis in self.axes)

    def _between(self, point: tuple[float, ...]) -> tuple[float, bool] | None:
        scale, beyond, lows, fractions = 1.0, False, [], []
        grows = self.grows or (1.0,) * len(self.axes)
        for value, logs, grow in zip(point, self._log_axes, grows, strict=True):
            log_v = math.log(max(float(value), 1.0))
            if log_v < logs[0]:
                beyond, log_v = True, logs[0]
            if log_v > logs[-1]:
                beyond = True
                scale *= math.exp(grow * (log_v - logs[-1]))
                log_v = logs[-1]
            i = min(max(bisect.bisect_left(logs, log_v) - 1, 0), max(len(logs) - 2, 0))
            j = min(i + 1, len(logs) - 1)
            lows.append(i)
            fractions.append(min(max((log_v - logs[i]) / (logs[j] - logs[i]), 0.0), 1.0) if j > i else 0.0)
        total = 0.0  # the log-linear blend of the cells around the point
        cells, strides, corners = self._cells
        base = sum(i * stride for i, stride in zip(lows, strides, strict=True))
        blends = [(1.0 - f, f) for f in fractions]
        for corner, offset in corners:
            weight = 1.0
            for up, blend in zip(corner, blends, strict=True):
                weight *= blend[up]
            if weight == 0.0:
                continue
            cell = cells[base + offset]
            if math.isnan(cell):
                return None
            total += weight * math.log(cell)
        return math.exp(total) * scale, beyond

    @cached_property
    def _cells(self) -> tuple[list[float], tuple[int, ...], tuple[tuple[tuple[int, ...], int], ...]]:
        """The seconds as one flat list of floats (read cell by cell faster than the array), each axis's stride in
        it, and each corner around a point with its place from the point's lower cell (an axis of one value has no
        upper neighbour: the corner stays on it)."""
        shape = self.seconds.shape
        strides = tuple(math.prod(shape[a + 1 :]) for a in range(len(shape)))
        steps = [stride if n > 1 else 0 for stride, n in zip(strides, shape, strict=True)]
        corners = tuple(
            (corner, sum(up * step for up, step in zip(corner, steps, strict=True)))
            for corner in itertools.product((0, 1), repeat=len(shape))
        )
        return self.seconds.ravel().tolist(), strides, corners


@dataclass(frozen=True)
class Curve:
    """Measured seconds against tokens, for one shape, from one table."""

    tokens: np.ndarray  # ascending
    seconds: np.ndarray
    source: str  # e.g. "aiconfigurator-core 0.12.0 rtx_pro_6000_server sglang 0.5.14 moe_perf (sglang_marlin_moe)"
    release: str  # the engine release that measured it

    def time_s(self, tokens: float) -> tuple[float, bool]:
        """(seconds at `tokens`, whether that is beyond the measured range)."""
        t = max(float(tokens), 1.0)
        lo, hi = self.tokens[0], self.tokens[-1]
        if t <= lo:
            return float(self.seconds[0]), bool(t < lo)
        if t >= hi:
            return float(self.seconds[-1]) * t / hi, bool(t > hi)
        log_tokens, log_seconds = self._logs
        log_s = np.interp(math.log(t), log_tokens, log_seconds)
        return float(math.exp(log_s)), False

    @cached_property
    def _logs(self) -> tuple[np.ndarray, np.ndarray]:
        return np.log(self.tokens), np.log(self.seconds)


def _releases(root: Path, system: str, family: str, engine: str) -> list[str]:
    folder = root / system / family / engine
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        try:
            Version(child.name)
        except InvalidVersion:
            continue
        found.append(child.name)
    return found


def _ordered(releases: list[str], modelled: str) -> list[str]:
    """Releases to try: at or below the modelled one, newest first; then the newer ones, oldest first."""
    target = Version(modelled)
    below = sorted((r for r in releases if Version(r) <= target), key=Version, reverse=True)
    above = sorted((r for r in releases if Version(r) > target), key=Version)
    return below + above


def _row_sets(
    system: str,
    engine: str,
    release: str,
    table: str,
    key: str,
    columns: tuple[str, ...],
    filters: tuple[tuple[str, str, object], ...],
) -> Iterator[tuple[str, str, dict[str, np.ndarray]]]:
    """(label, table release, rows) of every table that could hold a shape, in the order they are tried: the
    user's folder first, then the package's, then the shipped ones where they serve the release; in each, the
    releases `_ordered` names. `table` is the file's path under the system, <family>/{framework}/{release}/<file>;
    `key` names the row set in the cache (the package's tables only)."""
    family = table.split("/", 1)[0]
    for root in _roots():
        if not root.serves(engine, release):
            continue
        read = root.system(system)
        label = root.label if read == system else f"{root.label} ({read}'s, the same kernels)"
        for table_release in _ordered(_releases(root.folder, read, family, engine), release):
            path = root.folder / read / table.format(framework=engine, release=table_release)
            rows = _rows(path, f"{key}-{system}-{engine}-{table_release}" if root.kept else None, columns, filters)
            if rows is not None:
                yield label, table_release, rows


@cache
def moe_curve(gpu: str, engine: str, release: str, shape: MoEShape) -> Curve | None:
    """The measured routed-expert latency curve of `shape` on `gpu`, or None where no table holds it."""
    cfg = spec()
    system = cfg.systems.get(gpu)
    dtype = cfg.moe.dtypes.get(shape.weight_format)
    if system is None or dtype is None:
        return None
    filters = (("moe_dtype", "=", dtype), ("hidden_size", "=", shape.hidden), ("num_experts", "=", shape.experts))
    key = f"moe-{dtype}-{shape.hidden}-{shape.experts}"
    for label, table_release, rows in _row_sets(system, engine, release, cfg.moe.table, key, MOE_COLUMNS, filters):
        keep = (
            (rows["inter_size"] == shape.inter)
            & (rows["topk"] == shape.topk)
            & (rows["moe_tp_size"] == shape.moe_tp)
            & (rows["moe_ep_size"] == shape.moe_ep)
            & (rows["distribution"] == cfg.moe.distribution)
        )
        if keep.sum() < 2:
            continue
        tokens, seconds = rows["num_tokens"][keep], rows["latency"][keep] / 1e3
        tokens, first = np.unique(tokens, return_index=True)  # a repeated key: the first row, as the package does
        kernel = str(rows["kernel_source"][keep][0])
        source = f"{label} {system} {engine} {table_release} moe_perf ({kernel})"
        return Curve(tokens=tokens.astype(float), seconds=seconds[first], source=source, release=table_release)
    return None


MOE_COLUMNS = (
    "kernel_source",
    "num_tokens",
    "inter_size",
    "topk",
    "moe_tp_size",
    "moe_ep_size",
    "distribution",
    "latency",
)


def cache_dir() -> Path:
    """Where row sets read from the tables are kept between runs ($SHARDWISE_CACHE, else the user's cache)."""
    base = os.environ.get("SHARDWISE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shardwise"
    )
    return Path(base) / "kernel-tables" / spec().version


def _keep(path: Path, rows: dict[str, np.ndarray]) -> None:
    """Save a row set for the next run; a cache that cannot be written is only slower, never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as handle:
            np.savez(handle, **rows)
        os.replace(handle.name, path)
    except OSError:
        return


def _decode_row_sets(
    gpu: str, engine: str, release: str, tables: DecodeTables, kind: str, columns: tuple[str, ...], kv_bytes: int
) -> Iterator[tuple[str, str, dict[str, np.ndarray]]]:
    """The row sets of an attention table (`kind` "mla", "mla-prefill" or "gqa") for a KV cache of `kv_bytes` per
    element, BF16 attention, as `_row_sets` finds them: each with its label (source, GPU, engine, release) and its
    release."""
    system = spec().systems.get(gpu)
    kv_dtype = tables.kv_dtypes.get(str(kv_bytes))
    if system is None or kv_dtype is None:
        return
    dtype_column = "attn_dtype" if kind == "gqa" else "mla_dtype"
    filters = (("kv_cache_dtype", "=", kv_dtype), (dtype_column, "=", "bfloat16"))
    name = f"{kind}-{kv_dtype}" if kind == "mla-prefill" else f"{kind}-decode-{kv_dtype}"
    for label, table_release, rows in _row_sets(system, engine, release, tables.table, name, columns, filters):
        yield f"{label} {system} {engine} {table_release}", table_release, rows


def _mla_rows(found, heads: int, kernel_sources: list[str] | None = None):
    """The first MLA row set holding `heads` local heads (of `kernel_sources`, where given) at four points or more:
    (its label, its release, its rows, which rows, their kernel), or None."""
    for label, table_release, rows in found:
        keep = rows["num_heads"] == heads
        if kernel_sources is not None:
            keep &= np.isin(rows["kernel_source"], kernel_sources)
        if keep.sum() >= 4:
            return label, table_release, rows, keep, str(rows["kernel_source"][keep][0])
    return None


@cache
def mla_decode_grid(gpu: str, engine: str, release: str, shape: MLADecodeShape) -> Grid | None:
    """The measured MLA decode attention of `shape` on `gpu` over (batch, KV length), or None."""
    found = _decode_row_sets(gpu, engine, release, spec().mla_decode, "mla", MLA_COLUMNS, shape.kv_bytes)
    chosen = _mla_rows(found, shape.heads)
    if chosen is None:
        return None
    label, table_release, rows, keep, kernel = chosen
    # `step` tokens were cached before this one
    coordinates = (rows["batch_size"][keep], rows["step"][keep] + 1)
    return _grid(coordinates, rows["latency"][keep], f"{label} generation_mla_perf ({kernel})", table_release)


@cache
def mla_prefill_grid(gpu: str, engine: str, release: str, shape: MLAPrefillShape) -> Grid | None:
    """The measured MLA prefill attention of `shape` on `gpu` over (prompts, prompt length), or None."""
    tables = spec().mla_prefill
    found = _decode_row_sets(gpu, engine, release, tables, "mla-prefill", MLA_PREFILL_COLUMNS, shape.kv_bytes)
    chosen = _mla_rows(found, shape.heads, tables.kernel_sources)
    if chosen is None:
        return None
    label, table_release, rows, keep, kernel = chosen
    # a whole prompt's query-key pairs grow as its length squared: past the longest measured, so does its time
    coordinates = (rows["batch_size"][keep], rows["isl"][keep])
    source = f"{label} context_mla_perf ({kernel})"
    return _grid(coordinates, rows["latency"][keep], source, table_release, length_power=2.0)


def _grid(
    coordinates: tuple[np.ndarray, ...],
    latency_ms: np.ndarray,
    source: str,
    release: str,
    *,
    flat_from: float | None = None,
    scale_batch: bool = True,
    length_power: float = 1.0,
) -> Grid:
    """A grid of the measured cells (a key measured twice: its first row, as the package reads it). Beyond the last
    value of the last axis, the time grows as its `length_power`. With `flat_from` (a window's length), the last
    axis is a length the window caps: a batch measured at or past it keeps that time at longer lengths; one
    measured only short of it is left to the batch scaling."""
    axes = tuple(np.unique(c) for c in coordinates)
    seconds = np.full(tuple(len(a) for a in axes), np.nan)
    index = np.stack([np.searchsorted(a, c) for a, c in zip(axes, coordinates, strict=True)], axis=1)
    _, first = np.unique(np.ravel_multi_index(tuple(index.T), seconds.shape), return_index=True)  # each cell's first
    seconds[tuple(index[first].T)] = latency_ms[first] / 1e3
    grows = (*(1.0,) * (len(axes) - 1), length_power)
    if flat_from is not None:
        grows = (*grows[:-1], 0.0)
        rows = seconds.reshape(-1, len(axes[-1]))  # a view: the array is new and contiguous
        for row in rows:
            measured = np.flatnonzero(~np.isnan(row))
            if len(measured) and axes[-1][measured[-1]] >= flat_from:
                row[measured[-1] + 1 :] = row[measured[-1]]
    return Grid(
        axes=tuple(a.astype(float) for a in axes),
        seconds=seconds,
        source=source,
        release=release,
        grows=grows,
        scale_batch=scale_batch,
    )


@cache
def gemm_grid(gpu: str, engine: str, release: str, weight_format: str) -> Grid | None:
    """The measured GEMMs of one weight format on `gpu` over (tokens, n, k), or None. The collectors ran the
    kernel the engine dispatches for each shape, so one grid can hold several kernels."""
    cfg = spec()
    system = cfg.systems.get(gpu)
    dtype = cfg.gemm.dtypes.get(weight_format)
    if system is None or dtype is None or dtype in cfg.gemm.not_kernel_times.get(engine, ()):
        return None
    for label, table_release, rows in _row_sets(
        system, engine, release, cfg.gemm.table, f"gemm-{dtype}", GEMM_COLUMNS, (("gemm_dtype", "=", dtype),)
    ):
        if len(rows["m"]) < 8:
            continue
        kernels = ", ".join(sorted({str(k) for k in rows["kernel_source"]}))
        source = f"{label} {system} {engine} {table_release} gemm_perf ({kernels})"
        return _grid((rows["m"], rows["n"], rows["k"]), rows["latency"], source, table_release, scale_batch=False)
    return None


GEMM_COLUMNS = ("kernel_source", "m", "n", "k", "latency")


@cache
def gqa_decode_grid(gpu: str, engine: str, release: str, shape: GQADecodeShape) -> Grid | None:
    """The measured decode attention of `shape` on `gpu` over (batch, KV length), or None."""
    tables = spec().gqa_decode
    found = _decode_row_sets(gpu, engine, release, tables, "gqa", GQA_COLUMNS, shape.kv_bytes)
    for label, table_release, rows in found:
        keep = (
            (rows["num_heads"] == shape.heads)
            & (rows["num_key_value_heads"] == shape.kv_heads)
            & (rows["head_dim"] == shape.head_dim)
            & (rows["window_size"] == shape.window)
        )
        if keep.sum() < 4:
            continue
        kernel = str(rows["kernel_source"][keep][0])
        source = f"{label} generation_attention_perf ({kernel})"
        # `step` tokens were cached before this one; a window caps what is read, so its time stays flat
        return _grid(
            (rows["batch_size"][keep], rows["step"][keep] + 1),
            rows["latency"][keep],
            source,
            table_release,
            flat_from=shape.window + 1 if shape.window else None,
        )
    return None


GQA_COLUMNS = (
    "kernel_source",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "window_size",
    "batch_size",
    "step",
    "latency",
)


MLA_COLUMNS = ("kernel_source", "num_heads", "batch_size", "step", "latency")
MLA_PREFILL_COLUMNS = ("kernel_source", "num_heads", "batch_size", "isl", "latency")


@cache
def _rows(
    path: Path, key: str | None, columns: tuple[str, ...], filters: tuple[tuple[str, str, object], ...]
) -> dict[str, np.ndarray] | None:
    """The rows of one table that pass `filters`: from the cache when an earlier run read them (`key` names them
    there; None: a user's table, read afresh each run, as it may change)."""
    kept = cache_dir() / f"{key}.npz" if key else None
    if kept is not None and kept.is_file():
        with np.load(kept, allow_pickle=False) as saved:
            rows = {name: saved[name] for name in saved.files}
        return rows or None
    if not path.is_file():
        return None
    import pyarrow.parquet as pq  # imported here: only a run that reads a table afresh pays for it

    try:
        table = pq.read_table(path, columns=list(columns), filters=list(filters))
    except Exception as exc:  # pyarrow's errors for a file that is not such a table: one line, with the fix
        raise DataError(
            f"{path}: not a kernel table shardwise can read ({str(exc).splitlines()[0]}); it needs the columns "
            f"{', '.join(columns)} and {', '.join(name for name, _, _ in filters)}, as the package's tables have"
        ) from None
    rows = {name: np.asarray(table.column(name).to_pylist()) for name in columns} if table.num_rows else {}
    if kept is not None:
        _keep(kept, rows)
    return rows or None
