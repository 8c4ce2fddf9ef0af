"""InferenceX points as rows to predict: each run replayed as its benchmark script launched it and its client sent it.

The file is the form of data/measurements/inferencex.csv (scripts/inferencex_launches.py writes it from the
InferenceX reference set): one measured point per line with its engine image, GPUs, client settings, the launch
command its script ran (environment and argv) and the medians the client reported. A user's file of the same form
is read the same way. Points shardwise cannot replay are kept with the reason: another engine, a model not in the
bundled catalog, no recovered launch command, speculative decoding without a published acceptance.

The client (InferenceX utils/bench_serving, closed loop): `--random-range-ratio r` draws each request's input and
output length uniformly in [int(r × L), L]; `--num-prompts` requests (10 per client) under `--max-concurrency`
clients, all sent at once; warm-up requests run before the timed ones on the same server, so the timed run starts
from an idle engine, as simulated. Runs before 2026-01-21 sent none (`num_warmups` "none"): their first requests
waited while the engine compiled and tuned its kernels on first use, which the run's 99th-percentile TTFT measured
and the replay takes as measured where it is unambiguous (reference.py cold_wait). TTFT and TPOT are the client's
medians.

Where the client's tokenizer disagreed with the engine's (data/measurements/inferencex_client.yaml: DeepSeek-R1
under transformers 5, before InferenceX fixed its client), the engine received about five tokens for each prompt
token the client counted; such a row is replayed with the prompt lengths the engine received (uniform, with their
measured mean and spread), and says so.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version
from pydantic import field_validator

from shardwise.engines.flags import split_command
from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate
from shardwise.measure.reference import INFERENCEX, ReferenceRow
from shardwise.spec.catalog import find_by_repo

ENGINES = ("sglang", "vllm")
COLUMNS = ("id", "model", "checkpoint", "gpu", "n_gpus", "framework", "framework_version", "spec_decoding")
COLUMNS += ("isl", "osl", "concurrency", "num_prompts", "output_tok_s", "median_tpot_ms", "median_ttft_ms")
COLUMNS += ("command", "launch_script", "provenance", "random_range_ratio")
# read where a file has them: `date`, `num_warmups`, `p99_ttft_ms`
# Environment variables a launch sets that the model reads (the rest are listed per row as not modelled).
MODELLED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "SGLANG_ENABLE_SPEC_V2"})
# Environment that says how Python finds packages, never how fast the engine runs.
INERT_ENV = frozenset({"PYTHONNOUSERSITE"})


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str


@dataclass(frozen=True)
class Points:
    rows: tuple[ReferenceRow, ...]
    skipped: tuple[Skipped, ...]


def _measurements(name: str) -> Path:
    return Path(str(resources.files("shardwise") / "data" / "measurements" / name))


def bundled_path() -> Path:
    return _measurements("inferencex.csv")


class Spread(Frozen):
    mean: float  # over the prompts, in units of the client's --random-input-len
    sd: float


class ClientMismatch(Frozen):
    """When the InferenceX client's prompts reached the engine longer than it counted them, and how long
    (data/measurements/inferencex_client.yaml, written by scripts/inferencex_client_tokens.py)."""

    name: str
    engine: str
    checkpoints: tuple[str, ...]
    transformers_5_since: str  # the first engine release whose image carries transformers 5
    fixed_from: str  # the first run date (ISO) with the fixed client
    how: str  # how the lengths were measured
    engine_tokens_per_l: dict[int, Spread]

    @field_validator("transformers_5_since")
    @classmethod
    def _a_release(cls, value: str) -> str:
        Version(value)  # a bad release is the data file's error, said at load
        return value

    def lengths(self, p: dict[str, str]) -> tuple[int, float] | None:
        """The prompt lengths the engine received for the point `p`, where its client broke, as the client's
        random lengths are given (the longest, and the shortest's share of it): uniform with the measured mean and
        spread. None where the client did not break (or the point does not say its release or date)."""
        if p["framework"] != self.engine or p["checkpoint"] not in self.checkpoints or not p.get("date"):
            return None
        release = release_of(p["framework_version"])
        try:
            broken = release is not None and Version(release) >= Version(self.transformers_5_since)
        except InvalidVersion:
            return None
        if not broken or p["date"] >= self.fixed_from:
            return None
        isl = int(p["isl"])
        measured = self.engine_tokens_per_l[min(self.engine_tokens_per_l, key=lambda n: abs(math.log(n / isl)))]
        half_width = math.sqrt(3) * measured.sd  # a uniform's half width from its standard deviation
        longest = (measured.mean + half_width) * isl
        return round(longest), (measured.mean - half_width) * isl / longest


@cache
def client_mismatch() -> ClientMismatch:
    path = _measurements("inferencex_client.yaml")
    return validate(ClientMismatch, read_yaml(path), origin=str(path))


def release_of(image: str) -> str | None:
    """The engine release an image tag names: 'lmsysorg/sglang:v0.5.12-cu130' → 0.5.12, a ROCm dev image
    '…sgl-dev-v0.5.2-rocm7.0-mi30x-20250915' → 0.5.2; None for nightly or dev tags without one."""
    found = re.search(r"v(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)", image)
    return found.group(1) if found else None


def read_table(path: Path, columns: tuple[str, ...], what: str) -> list[dict[str, str]]:
    """The lines of a CSV measurements file that has every one of `columns` (`what` names the form in the one-line
    error of a file without them, or one that cannot be read)."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise SpecError(f"{path}: not {what}: no column {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from exc


def read_points(path: Path | None = None) -> Points:
    """Every point of the file: the rows shardwise predicts and the points it cannot, with why."""
    path = path or bundled_path()
    points = read_table(path, COLUMNS, "an InferenceX points file")
    rows, skipped = [], []
    for point in points:
        try:
            row = _row(point)
        except ValueError as exc:  # a cell that is not a number where one is needed (pydantic's errors included)
            reason = str(exc).splitlines()[0]
            raise SpecError(
                f"{path}: point {point.get('id') or '?'}: {reason}; give numbers in its numeric columns"
            ) from None
        if isinstance(row, str):
            skipped.append(Skipped(id=point["id"], reason=row))
        else:
            rows.append(row)
    return Points(rows=tuple(rows), skipped=tuple(skipped))


def _row(p: dict[str, str]) -> ReferenceRow | str:
    """A point as a row to predict, or why it cannot be one."""
    if p["framework"] not in ENGINES:
        return f"{p['framework']} is not an engine shardwise models"
    if not p["command"]:
        return "no launch command: " + (p.get("launch_problem") or "the file gives none")
    entry = find_by_repo(p["checkpoint"])
    if entry is None:
        return f"{p['checkpoint']} is not in the bundled model catalog"
    if p["spec_decoding"] not in ("", "none"):
        return "speculative decoding, and the run's acceptance length is not published"
    if not p["output_tok_s"]:
        return "no output tok/s"
    launch = split_command(p["command"])
    env = [f"{k}={v}" for k, v in launch.env.items() if k not in MODELLED_ENV | INERT_ENV]
    ratio = p["random_range_ratio"]
    isl, range_ratio, assumed = int(p["isl"]), float(ratio) if ratio[:1].isdigit() else None, None
    received = client_mismatch().lengths(p)
    if received is not None:
        isl, range_ratio = received
        assumed = (
            f"the engine received prompts of {int(isl * range_ratio)}..{isl} tokens where the client counted "
            f"{p['isl']} at most: its tokenizer broke under transformers 5 (data/measurements/inferencex_client.yaml)"
        )
    return ReferenceRow(
        id=p["id"],
        source=f"{INFERENCEX} ({p['provenance']}), {p['launch_script']}",
        model=entry.alias,
        gpus=f"{p['n_gpus']}x{p['gpu']}",
        command=p["command"],
        engine_version=release_of(p["framework_version"]),
        isl=isl,
        osl=int(p["osl"]),
        range_ratio=range_ratio,
        concurrency=int(p["concurrency"]),
        num_prompts=int(p["num_prompts"]) if p["num_prompts"] else 10 * int(p["concurrency"]),
        request_rate=float("inf"),
        output_tok_s=float(p["output_tok_s"]),
        tpot_ms=float(p["median_tpot_ms"]) if p["median_tpot_ms"] else None,
        ttft_ms=float(p["median_ttft_ms"]) if p["median_ttft_ms"] else None,
        p99_ttft_ms=float(p["p99_ttft_ms"]) if p.get("p99_ttft_ms") else None,
        cold=p.get("num_warmups", "").startswith("none"),
        latency="median",
        split_key=p["launch_script"].split("@")[0],
        not_modelled=tuple(env),
        assumed=assumed,
    )
