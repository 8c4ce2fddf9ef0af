"""Measured kernel times from the silicon tables of aiconfigurator-core (data/hardware/kernel_tables.yaml says
which package version, which system each GPU is, and how our weight formats name theirs).

This module owns the mapping from a shardwise op to a table row set: `moe_curve(gpu, engine, release, shape)`
returns the measured latency of the routed-expert kernels of one shape against the tokens entering them, from
the newest table release at or below the engine release modelled (or the oldest there is, flagged), or None
when no table holds that shape. Lookups interpolate log-log between measured token counts; beyond the last
one they scale linearly from it (flagged as extrapolated). Only the row set a run asks for is read, once per
process; it is kept under the user's cache (`cache_dir()`), so later runs read neither the table nor pyarrow.
A folder of the user's own measurements in the same layout ($SHARDWISE_KERNEL_TABLES) is looked up first.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from shardwise.errors import DataError
from shardwise.hardware.load import data_dir, read_yaml, validate


class MoETables(BaseModel):
    table: str
    distribution: str
    dtypes: dict[str, str]


class MLADecodeTables(BaseModel):
    table: str
    kv_dtypes: dict[str, str]  # KV bytes per element → the table's kv_cache_dtype


class KernelTablesSpec(BaseModel):
    package: str
    version: str
    priced: list[str]  # op families priced from tables (the rest: the roofline)
    systems: dict[str, str]
    moe: MoETables
    mla_decode: MLADecodeTables


@cache
def spec() -> KernelTablesSpec:
    path = data_dir() / "kernel_tables.yaml"
    return validate(KernelTablesSpec, read_yaml(path), origin=str(path))


USER_TABLES = "SHARDWISE_KERNEL_TABLES"  # a folder of the user's own tables, read before the package's


def _roots() -> list[tuple[str, Path, bool]]:
    """Where tables are looked up, in order: (label, folder, whether its row sets are kept in the cache). The
    user's own measurements first ($SHARDWISE_KERNEL_TABLES: a folder laid out as the package's data,
    <system>/<family>/<framework>/<release>/<table>.parquet, with the same columns), then the pinned package's."""
    roots = []
    user = os.environ.get(USER_TABLES)
    if user:
        roots.append((f"user tables {user}", Path(user), False))
    package = _package_root()
    if package is not None:
        roots.append((f"{spec().package} {spec().version}", package, True))
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


@dataclass(frozen=True)
class Grid:
    """Measured seconds over (batch, KV length), for one shape, from one table; NaN where a cell was not
    measured."""

    batch: np.ndarray  # ascending
    kv_len: np.ndarray  # ascending
    seconds: np.ndarray  # [batch, kv_len]
    source: str
    release: str

    def time_s(self, batch: float, kv_len: float) -> tuple[float, bool] | None:
        """(seconds, whether beyond the measured range): log-bilinear between the four measured cells around the
        point; beyond the largest batch, linear in batch from it. None where a cell it needs was not measured."""
        b, k = max(float(batch), 1.0), min(max(float(kv_len), float(self.kv_len[0])), float(self.kv_len[-1]))
        beyond = b > self.batch[-1] or kv_len > self.kv_len[-1]
        scale = 1.0
        if b > self.batch[-1]:
            scale, b = b / self.batch[-1], float(self.batch[-1])
        i = int(np.clip(np.searchsorted(self.batch, b) - 1, 0, len(self.batch) - 2))
        j = int(np.clip(np.searchsorted(self.kv_len, k) - 1, 0, len(self.kv_len) - 2))
        cells = self.seconds[i : i + 2, j : j + 2]
        if np.isnan(cells).any():
            return None
        fb = (math.log(b) - math.log(self.batch[i])) / (math.log(self.batch[i + 1]) - math.log(self.batch[i]))
        fk = (math.log(k) - math.log(self.kv_len[j])) / (math.log(self.kv_len[j + 1]) - math.log(self.kv_len[j]))
        logs = np.log(cells)
        row = logs[:, 0] + (logs[:, 1] - logs[:, 0]) * min(max(fk, 0.0), 1.0)
        value = row[0] + (row[1] - row[0]) * min(max(fb, 0.0), 1.0)
        return float(math.exp(value)) * scale, bool(beyond)


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
        log_s = np.interp(math.log(t), np.log(self.tokens), np.log(self.seconds))
        return float(math.exp(log_s)), False


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


@cache
def moe_curve(gpu: str, engine: str, release: str, shape: MoEShape) -> Curve | None:
    """The measured routed-expert latency curve of `shape` on `gpu`, or None where no table holds it."""
    cfg = spec()
    system = cfg.systems.get(gpu)
    dtype = cfg.moe.dtypes.get(shape.weight_format)
    if system is None or dtype is None:
        return None
    for label, root, kept in _roots():
        for table_release in _ordered(_releases(root, system, "moe", engine), release):
            rows = _rows(root / system / cfg.moe.table.format(framework=engine, release=table_release),
                         f"moe-{system}-{engine}-{table_release}-{dtype}-{shape.hidden}-{shape.experts}" if kept
                         else None, MOE_COLUMNS, (("moe_dtype", "=", dtype), ("hidden_size", "=", shape.hidden),
                                                  ("num_experts", "=", shape.experts)))  # fmt: skip
            if rows is None:
                continue
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


MOE_COLUMNS = ("kernel_source", "num_tokens", "inter_size", "topk", "moe_tp_size", "moe_ep_size", "distribution",
               "latency")  # fmt: skip


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


@cache
def mla_decode_grid(gpu: str, engine: str, release: str, shape: MLADecodeShape) -> Grid | None:
    """The measured MLA decode attention of `shape` on `gpu` over (batch, KV length), or None."""
    cfg = spec()
    system = cfg.systems.get(gpu)
    kv_dtype = cfg.mla_decode.kv_dtypes.get(str(shape.kv_bytes))
    if system is None or kv_dtype is None:
        return None
    for label, root, kept in _roots():
        for table_release in _ordered(_releases(root, system, "mla", engine), release):
            rows = _rows(root / system / cfg.mla_decode.table.format(framework=engine, release=table_release),
                         f"mla-decode-{system}-{engine}-{table_release}-{kv_dtype}" if kept else None,
                         MLA_COLUMNS, (("kv_cache_dtype", "=", kv_dtype), ("mla_dtype", "=", "bfloat16")))  # fmt: skip
            if rows is None:
                continue
            keep = rows["num_heads"] == shape.heads
            if keep.sum() < 4:
                continue
            batch, kv_len = rows["batch_size"][keep], rows["step"][keep] + 1  # `step` tokens cached before this one
            seconds = rows["latency"][keep] / 1e3
            batches, lens = np.unique(batch), np.unique(kv_len)
            grid = np.full((len(batches), len(lens)), np.nan)
            for b, k, t in zip(batch[::-1], kv_len[::-1], seconds[::-1], strict=True):  # repeated key: the first row
                grid[np.searchsorted(batches, b), np.searchsorted(lens, k)] = t
            kernel = str(rows["kernel_source"][keep][0])
            source = f"{label} {system} {engine} {table_release} generation_mla_perf ({kernel})"
            return Grid(batch=batches.astype(float), kv_len=lens.astype(float), seconds=grid, source=source,
                        release=table_release)  # fmt: skip
    return None


MLA_COLUMNS = ("kernel_source", "num_heads", "batch_size", "step", "latency")


@cache
def _rows(path: Path, key: str | None, columns: tuple[str, ...],
          filters: tuple[tuple[str, str, object], ...]) -> dict[str, np.ndarray] | None:  # fmt: skip
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
