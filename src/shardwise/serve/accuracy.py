"""The accuracy validate states (data/measurements/accuracy.yaml): which releases the model stands for, the
group each measurement is summarised in, and when an error is beyond the stated figure."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version

from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate

GROUPS = ("plain", "speculative", "older release")


class Modelled(Frozen):
    release: str
    why: str


class Stated(Frozen):
    group: str
    metric: str
    median: float


class AccuracyFile(Frozen):
    modelled_from: dict[str, Modelled]
    stated: tuple[Stated, ...]


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


def group_of(engine: str, release: str | None, *, speculative: bool) -> str:
    """plain or speculative; a release older than the modelled range is its own group."""
    if older_than_modelled(engine, release) is not None:
        return "older release"
    return "speculative" if speculative else "plain"


def stated_median(group: str, metric: str) -> float | None:
    """The stated median error of a group and metric, or None where none is stated."""
    return {(s.group, s.metric): s.median for s in accuracy().stated}.get((group, metric))


def beyond_stated(error: float | None, metric: str, *, speculative: bool) -> bool:
    """Whether an error exceeds the accuracy the model states for this kind of decoding (plain or speculative):
    a row from an older release is held to the same figure as the rest."""
    figure = stated_median("speculative" if speculative else "plain", metric)
    return error is not None and figure is not None and abs(error) > figure
