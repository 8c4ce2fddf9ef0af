"""Predictions for published measurements, and how far off they are.

The bundled rows (data/measurements/reference.yaml) are measurements the model covers: SGLang or vLLM,
a bundled model, one instance, CUDA graphs on. Each row is checked as its launch command says, simulated as
its benchmark ran (the dataset's lengths, the prompts, the rate and the cap, or a static batch), and compared
metric by metric; the summary is the mean and median absolute percentage error per metric.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
import statistics
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import combinations
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from shardwise.cost.memory import MemoryLedger, memory_ledger
from shardwise.cost.step import StepCost
from shardwise.engines.check import check_command
from shardwise.engines.flags import flag_table, parse_version, split_command, unmodelled_flags
from shardwise.engines.layout import Layout
from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate
from shardwise.measure.importers import MeasuredLevel
from shardwise.serve.accuracy import ERROR_DIGITS, KINDS, METRICS, VALIDATED_COLUMNS, kind_of, regime_of
from shardwise.serve.simulate import ServeResult, simulate
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import ClusterSpec, load_cluster
from shardwise.spec.workload import Lengths, WorkloadSpec, dataset

INFERENCEX = "InferenceX"  # the source of every row replayed from an InferenceX points file
PCIE = "PCIe RTX PRO 6000 set"  # the source of every row replayed from the PCIe set (measure/pcie.py)


def from_inferencex(row: ReferenceRow) -> bool:
    return row.source.startswith(INFERENCEX)


class ReferenceRow(Frozen):
    id: str
    source: str
    model: str
    gpus: str
    command: str
    engine_version: str | None = Field(None, description="the engine release the row was measured on")
    benchmark: Literal["serving", "one_batch", "decode_only"] = Field(
        "serving",
        description="a served load (bench_serving, vllm bench serve), a static batch (bench_one_batch), or C streams "
        "decoding from a prompt already cached (decode benchmarks: no prefill timed)",
    )
    isl: int = Field(ge=1, description="mean prompt tokens per request (the dataset's, when it names one)")
    osl: int = Field(ge=1, description="mean output tokens per request")
    dataset: str | None = Field(None, description="bundled length set the requests were drawn from; none: fixed")
    concurrency: int | None = Field(None, ge=1, description="--max-concurrency; a static batch: its size")
    request_rate: float | None = Field(None, gt=0, description="requests per second sent; .inf: all at once")
    num_prompts: int | None = Field(None, ge=1, description="requests of the run; none: the tools' default, 1000")
    range_ratio: float | None = Field(
        None, ge=0, le=1, description="random lengths: each request's drawn uniformly in [int(L × ratio), L]"
    )
    output_tok_s: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0, description="time per output token after the first (see latency)")
    ttft_ms: float | None = Field(None, gt=0, description="time to first token (see latency)")
    latency: Literal["mean", "median"] = Field("mean", description="the statistic tpot_ms and ttft_ms report")
    split_key: str | None = Field(None, description="what the training / held-out split is fixed by; default: source")
    not_modelled: tuple[str, ...] = Field((), description="what the run set that the prediction does not model")
    waived: tuple[str, ...] = Field(
        (),
        description="engine rules the run's own build lifts (a custom image's kernels serve what the release refuses)",
    )
    accept_length: float | None = Field(None, ge=1, description="speculative decoding: mean tokens kept per step")
    cold: bool = Field(
        False, description="the client sent no warm-up requests: its first met an engine that had served nothing yet"
    )
    p99_ttft_ms: float | None = Field(
        None, gt=0, description="99th-percentile time to first token (a cold run's first requests' wait shows in it)"
    )
    cold_start_s: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="what a cold run's first requests waited for the engine (none: the replay finds it, cold_wait)",
    )
    peak: bool = Field(
        False,
        description="output_tok_s is the most the run reached over loads it does not record: predicted at the "
        "closed loop's load where the prediction peaks (PEAK_CLIENTS)",
    )
    assumed: str | None = None

    @model_validator(mode="after")
    def _load_given(self) -> ReferenceRow:
        if self.peak and (
            self.concurrency or self.request_rate or self.tpot_ms or self.ttft_ms or not self.output_tok_s
        ):
            raise ValueError("a peak gives output_tok_s alone: its load is what it does not record")
        if self.concurrency is None and self.request_rate is None and not self.peak:
            raise ValueError("a measurement needs its load: concurrency (closed loop) or request_rate (open loop)")
        if self.benchmark in ("one_batch", "decode_only") and self.concurrency is None:
            raise ValueError(f"a {self.benchmark} benchmark needs its streams or batch size as concurrency")
        if self.dataset is not None:
            dataset(self.dataset)  # an unknown name is one clear error
        return self

    @property
    def workload(self) -> tuple:
        """What two measurements must share to be compared with each other."""
        return (
            self.model,
            self.gpus,
            self.benchmark,
            self.dataset,
            self.isl,
            self.osl,
            self.concurrency,
            self.request_rate,
            self.num_prompts,
        )

    def workload_spec(self) -> WorkloadSpec:
        """The requests as the benchmark sent them: a static batch all at once; decode-only streams, one request
        each from a cached prompt (its steady rate is the streams' as they restart); a served load with its prompts,
        rate and cap, lengths drawn from its dataset (seed 0, the tools' default) or fixed at isl / osl."""
        if self.benchmark == "one_batch":
            n, clients, rate = self.concurrency or 1, None, math.inf
        elif self.benchmark == "decode_only":
            n, clients, rate = self.concurrency or 1, self.concurrency, math.inf
        else:
            n, clients, rate = self.num_prompts or 1000, self.concurrency, self.request_rate or math.inf
        pairs = dataset(self.dataset).sample(n, seed=0) if self.dataset else ()
        if self.range_ratio is not None:
            lengths = (
                Lengths.sglang_random(self.isl, self.range_ratio),
                Lengths.sglang_random(self.osl, self.range_ratio),
            )
        else:
            lengths = Lengths.fixed(self.isl), Lengths.fixed(self.osl)
        return WorkloadSpec(
            input=lengths[0],
            output=lengths[1],
            pairs=pairs,
            num_requests=n,
            concurrency=clients,
            request_rate=rate,
            offline=self.benchmark == "one_batch",
            decode_only=self.benchmark == "decode_only",
            cold_start_s=self.cold_start_s or 0.0,
        )

    def load_text(self) -> str:
        """The load as the benchmark ran it, in a few words."""
        if self.benchmark == "one_batch":
            return f"batch {self.concurrency}"
        if self.benchmark == "decode_only":
            return f"{self.concurrency} decoding at {self.isl:,}"
        n = self.num_prompts or 1000
        if self.peak:
            return f"peak (predicted at C={self.concurrency})" if self.concurrency else "peak"
        if self.request_rate is None or math.isinf(self.request_rate):
            return f"C={self.concurrency}" if self.concurrency else f"{n:,} at once"
        return f"{self.request_rate:g}/s" + (f" C={self.concurrency}" if self.concurrency else "")


class ReferenceFile(Frozen):
    name: str
    rows: tuple[ReferenceRow, ...]


@dataclass(frozen=True, kw_only=True)
class Checked:
    row: ReferenceRow
    engine: str
    problem: str | None  # why there is no prediction (the setup would not start, as the model sees it)
    layout_spec: Layout | None = None  # the layout as the engine runs it
    simulated: ServeResult | None = None  # the run as the benchmark sent it
    workload: WorkloadSpec | None = None  # what was simulated
    cluster: ClusterSpec | None = None  # the GPUs as predicted
    step: StepCost | None = None  # the decode step at the run's mean batch
    kv_tokens: int | None = None  # KV pool per rank, in tokens
    not_modelled: tuple[str, ...] = ()  # options and environment the run set that the prediction does not model

    @property
    def cold_start_s(self) -> float:
        """What the run's first requests waited for an engine that had served nothing yet."""
        return self.row.cold_start_s or 0.0

    @property
    def layout(self) -> str | None:
        return self.layout_spec.describe() if self.layout_spec else None

    @property
    def coverage(self) -> dict | None:
        """The decode step at the run's mean batch: the share priced from measured kernel tables."""
        return self.step.coverage if self.step else None

    def value(self, metric: str) -> float | None:
        if self.simulated is None:
            return None
        median = self.row.latency == "median"
        tpot, ttft = self.simulated.tpot_s, self.simulated.ttft_s
        return {
            "output_tok_s": self.simulated.output_tok_s,
            "tpot_ms": (tpot.p50 if median else tpot.mean) * 1e3,
            "ttft_ms": (ttft.p50 if median else ttft.mean) * 1e3,
        }[metric]

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


def check_row(
    row: ReferenceRow, *, cluster: ClusterSpec | None = None, tables: bool = True, prefill_scale: float = 1.0
) -> Checked:
    """Predict one row as its benchmark ran it. `cluster`, `tables` and `prefill_scale` change one input (another
    description of the row's GPUs; the roofline instead of the kernel tables; prefill steps that many times their
    priced time) to price what that input does to the prediction."""
    cluster = cluster or load_cluster(row.gpus)
    checked = check_command(
        row.command, cluster=cluster, model=row.model, version=row.engine_version, waive=frozenset(row.waived)
    )
    launch = split_command(row.command)
    version = parse_version(checked.setup.version, launch.engine)
    unread = row.not_modelled + unmodelled_flags(flag_table(launch.engine), launch.argv, version)
    unread += tuple(n.message for n in checked.setup.notes if n.message.startswith("lifted for this build"))
    layout = checked.setup.layout
    if layout is None or not checked.setup.valid:
        reason = checked.setup.rejections[0].reason if checked.setup.rejections else "no layout"
        return Checked(row=row, engine=checked.setup.engine, problem=reason, not_modelled=unread)
    memory = memory_ledger(checked.model, layout, cluster)
    if memory.verdict != "ok":
        return Checked(row=row, engine=layout.engine, problem=memory.reason, layout_spec=layout, not_modelled=unread)
    try:
        steps = StepTimes(
            checked.model, layout, cluster, accept_length=row.accept_length, tables=tables, prefill_scale=prefill_scale
        )
    except SpecError as exc:  # a speculative row that states no acceptance, a drafter shardwise does not model
        return Checked(row=row, engine=layout.engine, problem=str(exc), layout_spec=layout, not_modelled=unread)
    if row.peak:
        row = _at_peak(row, steps, memory)
    workload = row.workload_spec()
    try:
        result = simulate(steps, memory, workload)
        if row.cold_start_s is None:  # found once, then kept: a what-if on the row replays the same wait
            row = row.model_copy(update={"cold_start_s": cold_wait(row, workload, result)})
            if row.cold_start_s:
                workload = row.workload_spec()
                result = simulate(steps, memory, workload)
    except SpecError as exc:  # a request the pool cannot hold
        return Checked(row=row, engine=layout.engine, problem=str(exc), layout_spec=layout, not_modelled=unread)
    ranks = max(1, memory.ranks)
    running = max(1, round(result.mean_running * ranks))  # the whole layout's batch at the run's mean
    mean_in, mean_out = workload.mean_lengths
    context = mean_in + mean_out / 2
    decode = steps.decode(running, int(context))
    return Checked(
        row=row,
        engine=layout.engine,
        problem=None,
        layout_spec=layout,
        simulated=result,
        workload=workload,
        cluster=cluster,
        step=decode.step,
        kv_tokens=memory.kv_tokens_per_rank,
        not_modelled=unread,
    )


def cold_wait(row: ReferenceRow, workload: WorkloadSpec, warm: ServeResult) -> float:
    """What a run without warm-up requests spent before it served: an engine meets each kernel shape for the first
    time on its first requests and compiles or tunes it then (JIT kernels, autotuners), a wait that depends on the
    image, the kernels and the machine's caches, which no model of serving prices. The run measured it: all of its
    first wave of clients wait, and the client's 99th-percentile TTFT (interpolated between two requests' TTFTs)
    is one of theirs when both of those are. It is taken as the time that TTFT exceeds the one simulated on a warm
    engine (`warm`), where it is unambiguous: longer than a request of the run took from send to last token (its
    median TTFT and osl − 1 median TPOTs), which no warm run's first token waits. Elsewhere the percentile is the
    run's ordinary tail (and the model's error on it), and the wait zero; so for a warmed run and one that does not
    say."""
    c, n = workload.concurrency, workload.num_requests
    if not row.cold or None in (row.p99_ttft_ms, row.ttft_ms, row.tpot_ms) or c is None:
        return 0.0
    if math.floor(0.99 * (n - 1)) < n - min(c, n):  # numpy's p99 reaches below the first wave
        return 0.0
    request_ms = row.ttft_ms + (row.osl - 1) * row.tpot_ms
    if row.p99_ttft_ms <= request_ms:
        return 0.0
    return max(0.0, row.p99_ttft_ms / 1e3 - warm.ttft_s.p99)


PEAK_CLIENTS = tuple(2**i for i in range(13))  # 1 … 4096 clients, doubling: past its KV pool no setup predicts more


def _at_peak(row: ReferenceRow, steps: StepTimes, memory: MemoryLedger) -> ReferenceRow:
    """A peak, whose load the run does not record, as predicted: the closed loop at the fewest clients where the
    steady-state prediction is highest, run for four rounds of them."""
    figures = Predictor(steps, memory).figures(PEAK_CLIENTS, isl=row.isl, osl=row.osl)
    best = max(figures, key=lambda p: p.output_tok_s)  # the first of equals: the fewest clients
    return row.model_copy(update={"concurrency": best.concurrency, "num_prompts": 4 * best.concurrency})


@dataclass(frozen=True, kw_only=True)
class RankAgreement:
    groups: int  # workloads measured with two or more setups
    pairs: int
    concordant: int  # pairs the prediction orders as the measurement does

    @property
    def fraction(self) -> float:
        return self.concordant / self.pairs if self.pairs else float("nan")


def rank_agreement(checked: list[Checked]) -> RankAgreement:
    """Within each workload measured on several setups: how many pairs of setups the predictions rank in the
    measured order of output tok/s."""
    groups: dict[tuple, list[Checked]] = {}
    for c in checked:
        if c.value("output_tok_s") is not None and c.row.output_tok_s is not None:
            groups.setdefault(c.row.workload, []).append(c)
    pairs = concordant = 0
    used = 0
    for rows in groups.values():
        if len({r.row.command for r in rows}) < 2:
            continue
        used += 1
        for a, b in combinations(rows, 2):
            pairs += 1
            measured = (a.row.output_tok_s or 0) - (b.row.output_tok_s or 0)
            predicted = (a.value("output_tok_s") or 0) - (b.value("output_tok_s") or 0)
            concordant += measured * predicted > 0
    return RankAgreement(groups=used, pairs=pairs, concordant=concordant)


@dataclass(frozen=True, kw_only=True)
class ErrorSummary:
    group: str  # plain | speculative
    metric: str
    rows: int
    mape: float  # mean absolute percentage error, as a fraction
    median_ape: float
    worst: str  # row id


def group_of_row(c: Checked) -> str:
    """plain or speculative decoding: the headline's two figures."""
    return kind_of(speculative=c.row.accept_length is not None)


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


def headline(checked: list[Checked]) -> list[ErrorSummary]:
    """The error of each metric over every row that has it: plain decoding, and speculative decoding apart (its
    figure also rests on the acceptance each row states)."""
    out = []
    for kind in KINDS:
        out += _summarise_group(kind, [c for c in checked if group_of_row(c) == kind])
    return out


def split_of(row: ReferenceRow) -> str:
    """training or held-out, by the row's source as data/measurements/splits.yaml fixes it."""
    return "held-out" if _source_key(row) in held_out_sources() else "training"


def _source_key(row: ReferenceRow) -> str:
    return Path(row.split_key).name if row.split_key else re.split(r"[,(]", row.source)[0].strip()


class Splits(Frozen):
    rule: str
    held_out: tuple[str, ...]


@cache
def held_out_sources() -> frozenset[str]:
    path = Path(str(resources.files("shardwise") / "data" / "measurements" / "splits.yaml"))
    return frozenset(validate(Splits, read_yaml(path), origin=str(path)).held_out)


def family_of(c: Checked) -> str:
    """The engine and the parallelism mechanisms of the layout, without their degrees: 'sglang TP EP',
    'vllm attention-DP TP EP' (Layout.family)."""
    return f"{c.engine} {c.layout_spec.family() if c.layout_spec else 'not started'}"


def load_of(row: ReferenceRow) -> str:
    """The load regime: a static batch, clients in a closed loop (1-8, 9-64, more), or an open-loop burst."""
    return regime_of(row.concurrency, static_batch=row.benchmark == "one_batch")


def validated_csv(checked: list[Checked]) -> str:
    """Each predicted row with its family, regime, GPU and signed errors: data/measurements/validated.csv, which
    the confidence of every prediction reads (serve/accuracy.py)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(VALIDATED_COLUMNS)
    for c in sorted(checked, key=lambda c: c.row.id):
        errors = [c.error(m) for m in METRICS]
        if c.layout_spec is None or c.cluster is None or all(e is None for e in errors):
            continue
        cells = ["" if e is None else f"{e:.{ERROR_DIGITS}f}" for e in errors]
        writer.writerow([c.row.id, c.engine, c.layout_spec.family(), load_of(c.row), c.cluster.gpu.name, *cells])
    return out.getvalue()


def tables_of(c: Checked) -> str:
    """How much of the row's decode step measured kernel tables price: 'most' (half its time or more, as where the
    MoE, attention and GEMMs are timed), 'part' (less, as where only the GEMMs are) or 'none' (every op at its
    roofline bound)."""
    share = (c.coverage or {}).get("measured_share", 0.0)
    return "most" if share >= 0.5 else "part" if share > 0 else "none"


def source_of(row: ReferenceRow) -> str:
    """The bundled set a row comes from (its source up to the first bracket), or the publications and files."""
    for bulk in (INFERENCEX, PCIE):
        if row.source.startswith(bulk):
            return bulk
    return "publications and measured files"


BREAKDOWNS = {
    "release": lambda c: f"{c.engine} {c.row.engine_version or 'unknown'}",
    "GPU": lambda c: c.row.gpus.split("x", 1)[-1],
    "kernel tables": tables_of,
    "family": family_of,
    "load": lambda c: load_of(c.row),
    "source": lambda c: source_of(c.row),
    "split": lambda c: split_of(c.row),
    "model": lambda c: c.row.model,
    # a PCIe row's build (its custom image): one build's quirks are not to hide in the median
    "build": lambda c: (
        f"{c.row.gpus.split('x', 1)[0]} GPUs, {c.row.split_key}" if c.row.source.startswith(PCIE) else None
    ),
}


def breakdown(checked: list[Checked]) -> list[ErrorSummary]:
    """The headline's rows grouped by release, GPU, kernel tables, family, load, source and split: beside the
    headline, never instead of it. A group is named 'dimension: value'."""
    out = []
    for dimension, key in BREAKDOWNS.items():
        groups: dict[str, list[Checked]] = {}
        for c in checked:
            value = key(c)
            if value is not None:
                groups.setdefault(value, []).append(c)
        for value in sorted(groups):
            for s in headline(groups[value]):
                kind = "" if s.group == "plain" else f" ({s.group})"
                out.append(dataclasses.replace(s, group=f"{dimension}: {value}{kind}"))
    return out


def rows_from_results(
    levels: list[MeasuredLevel], *, command: str | None, gpus: str | None, model: str | None
) -> list[ReferenceRow]:
    """Measured levels as rows to predict; the launch command and GPUs come from the record or the caller."""
    rows = []
    for level in levels:
        cmd, cluster = level.command or command, level.gpus or gpus
        if not cmd or not cluster:
            raise SpecError(
                f"{level.source} does not record its launch command and GPUs: give them, e.g. shardwise validate "
                "FILE --gpus 8xrtx-pro-6000 --command 'python -m sglang.launch_server --model-path … --tp 8'"
            )
        rows.append(
            ReferenceRow(
                id=level.source,
                source=level.tool,
                model=model or level.model or "",
                gpus=cluster,
                command=cmd,
                isl=level.isl,
                osl=level.osl,
                concurrency=level.concurrency,
                request_rate=level.request_rate if level.concurrency is None else None,
                num_prompts=level.num_prompts,
                output_tok_s=level.output_tok_s,
                tpot_ms=level.tpot_ms,
                ttft_ms=level.ttft_ms,
            )
        )
    return rows
