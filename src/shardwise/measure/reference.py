"""Predictions for published measurements, and how far off they are.

The bundled rows (data/measurements/reference.yaml) are measurements the model covers: SGLang or vLLM,
a bundled model, one instance, CUDA graphs on. Each row is checked as its launch command says, predicted
at its workload, and compared metric by metric; the summary is the mean and median absolute percentage
error per metric.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import Field

from shardwise.cost.memory import memory_ledger
from shardwise.engines.check import check_command
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate
from shardwise.serve.steady import Prediction, predict
from shardwise.spec.cluster import load_cluster

METRICS = ("output_tok_s", "tpot_ms")


class ReferenceRow(Frozen):
    id: str
    source: str
    model: str
    gpus: str
    command: str
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    output_tok_s: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    accept_length: float | None = Field(None, ge=1, description="speculative decoding: mean tokens kept per step")
    assumed: str | None = None

    @property
    def group(self) -> str:
        return "speculative" if self.accept_length else "plain"


class ReferenceFile(Frozen):
    name: str
    rows: tuple[ReferenceRow, ...]


@dataclass(frozen=True, kw_only=True)
class Checked:
    row: ReferenceRow
    layout: str | None
    predicted: Prediction | None
    problem: str | None  # why there is no prediction (the setup would not start, as the model sees it)

    def value(self, metric: str) -> float | None:
        if self.predicted is None:
            return None
        return {"output_tok_s": self.predicted.output_tok_s, "tpot_ms": self.predicted.tpot_s * 1e3}[metric]

    def error(self, metric: str) -> float | None:
        """Signed relative error (predicted − measured) / measured."""
        measured, predicted = getattr(self.row, metric), self.value(metric)
        if measured is None or predicted is None:
            return None
        return (predicted - measured) / measured


def bundled_path() -> Path:
    return Path(str(resources.files("shardwise") / "data" / "measurements" / "reference.yaml"))


def load_rows(path: Path | None = None) -> tuple[ReferenceRow, ...]:
    path = path or bundled_path()
    return validate(ReferenceFile, read_yaml(path), origin=str(path)).rows


def check_row(row: ReferenceRow) -> Checked:
    cluster = load_cluster(row.gpus)
    checked = check_command(row.command, cluster=cluster, model=row.model)
    layout = checked.setup.layout
    if layout is None or not checked.setup.valid:
        reason = checked.setup.rejections[0].reason if checked.setup.rejections else "no layout"
        return Checked(row=row, layout=None, predicted=None, problem=reason)
    memory = memory_ledger(checked.model, layout, cluster)
    if memory.verdict != "ok":
        return Checked(row=row, layout=layout.describe(), predicted=None, problem=memory.reason)
    (predicted,) = predict(
        checked.model, layout, cluster, memory, concurrency=[row.concurrency], isl=row.isl, osl=row.osl,
        accept_length=row.accept_length,
    )  # fmt: skip
    return Checked(row=row, layout=layout.describe(), predicted=predicted, problem=None)


@dataclass(frozen=True, kw_only=True)
class ErrorSummary:
    group: str  # plain | speculative
    metric: str
    rows: int
    mape: float  # mean absolute percentage error, as a fraction
    median_ape: float
    worst: str  # row id


def summarise(checked: list[Checked]) -> list[ErrorSummary]:
    """Mean and median absolute percentage error per metric, for plain and for speculative decoding apart."""
    out = []
    for group in ("plain", "speculative"):
        out += _summarise_group(group, [c for c in checked if c.row.group == group])
    return out


def _summarise_group(group: str, checked: list[Checked]) -> list[ErrorSummary]:
    out = []
    for metric in METRICS:
        errors = {c.row.id: abs(e) for c in checked if (e := c.error(metric)) is not None}
        if errors:
            out.append(
                ErrorSummary(
                    group=group,
                    metric=metric,
                    rows=len(errors),
                    mape=statistics.fmean(errors.values()),
                    median_ape=statistics.median(errors.values()),
                    worst=max(errors, key=errors.__getitem__),
                )
            )
    return out
