"""The accuracy validate states: which releases the model stands for (data/measurements/accuracy.yaml), its median
error per metric over every validated row (data/measurements/validated.csv, `validate --set all --record`), and
when a row's error is beyond it; and the confidence each prediction carries: the errors validate measured on the
rows of its family.

A prediction's family is its engine and the parallelism mechanisms its layout uses (`Layout.family`), at a load
regime. Its confidence comes from the validated rows of that family, looked for in this order: this GPU at this
regime, this GPU at any load, other GPUs at this regime, other GPUs at any load. The uncertainty a ranking allows
it is the median tok/s error of those rows, at least the median over every row where they were measured on this
GPU, and at least the 90th percentile over every row (the error nine in ten predictions stay within) where no row
of the family was measured on this GPU: a mechanism validated elsewhere, or nowhere, is an extrapolation here.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version

from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate

KINDS = ("plain", "speculative")  # the headline's two figures per metric: speculative rows also rest on an acceptance


class Modelled(Frozen):
    release: str
    why: str


class AccuracyFile(Frozen):
    modelled_from: dict[str, Modelled]


@cache
def accuracy() -> AccuracyFile:
    path = Path(str(resources.files("shardwise") / "data" / "measurements" / "accuracy.yaml"))
    return validate(AccuracyFile, read_yaml(path), origin=str(path))


def older_than_modelled(engine: str, release: str | None) -> Modelled | None:
    """The modelled range a release falls before, or None (in range, unknown release or engine)."""
    modelled = accuracy().modelled_from.get(engine)
    if modelled is None or release is None:
        return None
    try:
        return modelled if Version(release) < Version(modelled.release) else None
    except InvalidVersion:
        return None


def kind_of(*, speculative: bool) -> str:
    return "speculative" if speculative else "plain"


@lru_cache(maxsize=16)
def stated_median(kind: str, metric: str) -> float | None:
    """The median absolute error of `metric` over every validated row of `kind` (plain or speculative decoding),
    whatever its release, GPU or load: the headline `validate --set all` prints and the README quotes. None where no
    row has it."""
    return _median_abs([r for r in validated_rows() if r.kind == kind], metric)


def beyond_stated(error: float | None, metric: str, *, speculative: bool) -> bool:
    """Whether an error exceeds the accuracy the model states for this kind of decoding (plain or speculative)."""
    figure = stated_median(kind_of(speculative=speculative), metric)
    # at the precision validated.csv keeps: a row at the median is not beyond it by a rounding
    return error is not None and figure is not None and round(abs(error), ERROR_DIGITS) > figure


METRICS = ("output_tok_s", "tpot_ms", "ttft_ms")
VALIDATED_COLUMNS = ("id", "engine", "family", "regime", "gpu", *METRICS)
ERROR_DIGITS = 4  # decimals validated.csv keeps of each signed relative error


def regime_of(concurrency: int | None, *, static_batch: bool = False) -> str:
    """The load regime: a static batch, clients in a closed loop (1-8, 9-64, more), or an open-loop burst."""
    if static_batch:
        return "static batch"
    if concurrency is None:
        return "open loop"
    return "C 1-8" if concurrency <= 8 else "C 9-64" if concurrency <= 64 else "C > 64"


@dataclass(frozen=True, slots=True)
class ValidatedRow:
    id: str
    engine: str
    family: str  # the layout's mechanisms, Layout.family()
    regime: str
    gpu: str
    errors: dict[str, float | None]  # signed (predicted − measured) / measured, by metric

    @property
    def kind(self) -> str:
        return kind_of(speculative="speculative" in self.family.split())


def validated_path() -> Path:
    return Path(str(resources.files("shardwise") / "data" / "measurements" / "validated.csv"))


@cache
def validated_rows() -> tuple[ValidatedRow, ...]:
    """Every predicted row of the bundled measurements with its errors, as `validate --set all --record` wrote them."""
    with validated_path().open(newline="") as f:
        return tuple(
            ValidatedRow(
                id=r["id"],
                engine=r["engine"],
                family=r["family"],
                regime=r["regime"],
                gpu=r["gpu"],
                errors={m: float(r[m]) if r[m] else None for m in METRICS},
            )
            for r in csv.DictReader(f)
        )


@dataclass(frozen=True, slots=True)
class Confidence:
    """What the validated rows of a prediction's family say about it."""

    family: str  # "sglang TP EP"
    regime: str
    basis: str  # "this GPU", "other GPUs" or "none" (no validated row of the family)
    rows: int  # the rows behind the figures
    scope: str  # which rows, in words
    median_error: dict[str, float | None]  # median absolute error of those rows, by metric
    uncertainty: float  # the relative tok/s error a ranking allows the prediction

    def to_json(self) -> dict:
        return {
            "family": self.family,
            "regime": self.regime,
            "validated_on": self.basis,
            "rows": self.rows,
            "scope": self.scope,
            "median_error": {m: None if e is None else round(e, 3) for m, e in self.median_error.items()},
            "uncertainty": round(self.uncertainty, 3),
        }

    def describe(self) -> str:
        tok = self.median_error["output_tok_s"]
        if self.basis == "none":
            return f"{self.family}: no validated row; uncertainty ±{self.uncertainty:.0%} (every row's 90th percentile)"
        return (
            f"{self.family}: {self.scope}, median error {tok:.0%} in tok/s; uncertainty ±{self.uncertainty:.0%}"
            if tok is not None
            else f"{self.family}: {self.scope}; uncertainty ±{self.uncertainty:.0%}"
        )


@lru_cache(maxsize=1024)
def measured_on(engine: str, family: str, gpu: str) -> bool:
    """Whether any validated row of this engine and family ran on this GPU."""
    return any((r.engine, r.family, r.gpu) == (engine, family, gpu) for r in validated_rows())


def _median_abs(rows: list[ValidatedRow], metric: str) -> float | None:
    values = [abs(e) for r in rows if (e := r.errors[metric]) is not None]
    return statistics.median(values) if values else None


@cache
def _population() -> tuple[float, float]:
    """The median and the 90th percentile of every validated row's absolute tok/s error."""
    values = sorted(abs(e) for r in validated_rows() if (e := r.errors["output_tok_s"]) is not None)
    return statistics.median(values), statistics.quantiles(values, n=10, method="inclusive")[-1]


@lru_cache(maxsize=4096)
def confidence(engine: str, family: str, regime: str, gpu: str) -> Confidence:
    """The confidence of a prediction of `engine` with a layout of `family` at `regime` on GPU `gpu`."""
    median_all, p90_all = _population()
    same = [r for r in validated_rows() if r.engine == engine and r.family == family]
    name = f"{engine} {family}"
    steps = (
        ("this GPU", f"{gpu} at {regime}", lambda r: r.gpu == gpu and r.regime == regime),
        ("this GPU", f"{gpu} at other loads", lambda r: r.gpu == gpu),
        ("other GPUs", f"other GPUs at {regime}", lambda r: r.regime == regime),
        ("other GPUs", "other GPUs at other loads", lambda r: True),
    )
    for basis, where, keep in steps:
        rows = [r for r in same if keep(r)]
        tok = _median_abs(rows, "output_tok_s")
        if tok is None:
            continue
        floor = median_all if basis == "this GPU" else p90_all
        return Confidence(
            family=name,
            regime=regime,
            basis=basis,
            rows=len(rows),
            scope=f"{len(rows)} row{'s' * (len(rows) != 1)} on {where}",
            median_error={m: _median_abs(rows, m) for m in METRICS},
            uncertainty=max(tok, floor),
        )
    return Confidence(
        family=name,
        regime=regime,
        basis="none",
        rows=0,
        scope="no validated row",
        median_error=dict.fromkeys(METRICS),
        uncertainty=p90_all,
    )
