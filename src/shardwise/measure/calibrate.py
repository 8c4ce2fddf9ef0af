"""Fit named physical constants of the cost model to one machine's measurements.

The fit minimises the squared log error of predicted against measured output tok/s (and TPOT where
measured, and TTFT at one client, where the closed form prices a first token exactly) over the measurements it
may use, within each constant's plausible range (scipy's bounded least squares). It refuses a fit the data
cannot determine: fewer measurements than constants, or a constant that moves no prediction (its column of the
Jacobian is zero), and says what measurement would determine it. Measurements held out are predicted before
and after, so the profile reports what calibration bought.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from shardwise.cost.memory import MemoryLedger, memory_ledger
from shardwise.engines.check import check_command
from shardwise.engines.layout import Layout
from shardwise.errors import SpecError
from shardwise.hardware.calibration import CONSTANTS, Calibration
from shardwise.hardware.load import overheads, runtime
from shardwise.measure.reference import ReferenceRow
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import ClusterSpec, load_cluster
from shardwise.spec.model import ModelSpec

MOVES = 1e-3  # a constant whose largest effect on any log prediction over its range is below this moves nothing
STARTS = (0.1, 0.5, 0.9)  # extra starting points, as fractions of each constant's range


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    row: ReferenceRow
    model: ModelSpec
    layout: Layout
    cluster: ClusterSpec
    memory: MemoryLedger


@dataclass(frozen=True, kw_only=True)
class CalibrationReport:
    calibration: Calibration
    fitted_error_before: float  # root-mean-square log(predicted / measured) on the fitted measurements
    fitted_error_after: float


def defaults(cluster: ClusterSpec) -> dict[str, float]:
    """Each constant's value before calibration, from the data files."""
    oh, gpu = overheads(), cluster.gpu
    return {
        "mem_bandwidth_bytes_per_s": gpu.mem_bandwidth_measured_bytes_per_s or gpu.mem_bandwidth_bytes_per_s,
        "eager_kernel_cpu_s": oh.eager_kernel_cpu.si("s"),
        "kernel_gpu_s": oh.kernel_gpu.si("s"),
        "scheduler_step_cpu_s": oh.scheduler_step_cpu.si("s"),
        "request_cpu_s": 0.0,
        "first_token_host_s": 0.0,
        "collective_call_s": 0.0,
        "non_torch_bytes": runtime().non_torch_multi_gpu.si("bytes"),
    }


def _prepare(rows: Sequence[ReferenceRow]) -> list[_Prepared]:
    out = []
    for row in rows:
        cluster = load_cluster(row.gpus)
        checked = check_command(row.command, cluster=cluster, model=row.model or None)
        layout = checked.setup.layout
        if layout is None or not checked.setup.valid or row.concurrency is None:
            raise SpecError(f"{row.id}: only closed-loop runs of setups that start can calibrate")
        memory = memory_ledger(checked.model, layout, cluster)
        if memory.verdict != "ok":
            raise SpecError(f"{row.id}: the setup does not fit in memory as the model sees it ({memory.verdict})")
        out.append(_Prepared(row=row, model=checked.model, layout=layout, cluster=cluster, memory=memory))
    return out


def _log_errors(prepared: list[_Prepared], constants: dict[str, float], gpu: str) -> np.ndarray:
    cal = Calibration(gpu=gpu, constants=constants, fitted_on=())
    errors = []
    for p in prepared:
        cluster = p.cluster.calibrated(cal)
        accept = p.row.accept_length
        (pred,) = Predictor(StepTimes(p.model, p.layout, cluster, accept_length=accept), p.memory).sweep(
            [p.row.concurrency or 1], isl=p.row.isl, osl=p.row.osl
        )
        if p.row.output_tok_s:
            errors.append(math.log(pred.output_tok_s / p.row.output_tok_s))
        if p.row.tpot_ms:
            errors.append(math.log(pred.tpot_s * 1e3 / p.row.tpot_ms))
        if p.row.ttft_ms and p.row.concurrency == 1:
            errors.append(math.log(pred.ttft_s * 1e3 / p.row.ttft_ms))
    return np.asarray(errors)


def calibrate(rows: Sequence[ReferenceRow], *, names: Sequence[str], held_out: Sequence[str] = ()) -> CalibrationReport:
    """Fit `names` to `rows` not in `held_out`; report the error on both parts before and after."""
    unknown = [n for n in names if n not in CONSTANTS]
    if unknown:
        raise SpecError(f"unknown constants {unknown}; calibratable: {', '.join(CONSTANTS)}")
    if not names:
        raise SpecError(f"name the constants to fit, from: {', '.join(CONSTANTS)}")
    prepared = _prepare(rows)
    gpus = {p.cluster.gpu.name for p in prepared}
    if len(gpus) != 1:
        raise SpecError(f"a calibration is for one GPU model; these measurements span {sorted(gpus)}")
    gpu = gpus.pop()
    fit = [p for p in prepared if p.row.id not in held_out]
    test = [p for p in prepared if p.row.id in held_out]
    base = defaults(prepared[0].cluster)
    start = {n: base[n] for n in names}
    residual_count = len(_log_errors(fit, {}, gpu))
    if residual_count < len(names):
        raise SpecError(
            f"{residual_count} measured values cannot determine {len(names)} constants; add measurements: "
            + "; ".join(f"{n}: {CONSTANTS[n].determined_by}" for n in names)
        )
    _check_moves(fit, names, start, gpu)
    fitted = _fit(fit, names, start, gpu)
    before, after = _rms(_log_errors(fit, {}, gpu)), _rms(_log_errors(fit, fitted, gpu))
    held_before = _rms(_log_errors(test, {}, gpu)) if test else None
    held_after = _rms(_log_errors(test, fitted, gpu)) if test else None
    edges = tuple(
        n
        for n, v in fitted.items()
        if min(v - CONSTANTS[n].low, CONSTANTS[n].high - v) <= 1e-6 * (CONSTANTS[n].high - CONSTANTS[n].low)
    )
    cal = Calibration(
        gpu=gpu,
        constants=fitted,
        fitted_on=tuple(p.row.id for p in fit),
        held_out=tuple(p.row.id for p in test),
        held_out_error_before=held_before,
        held_out_error_after=held_after,
        at_bounds=edges,
    )
    return CalibrationReport(calibration=cal, fitted_error_before=before, fitted_error_after=after)


def _rms(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(errors**2)))


def _fit(fit: list[_Prepared], names: Sequence[str], start: dict[str, float], gpu: str) -> dict[str, float]:
    """Bounded least squares from the defaults and from a few points across each range: a step that is
    host-bound does not move with GPU time until the GPU side catches up, so the error can be flat where
    a single start begins."""
    lo = np.array([CONSTANTS[n].low for n in names])
    hi = np.array([CONSTANTS[n].high for n in names])
    scale = np.maximum(hi - lo, 1e-30)
    first = np.clip((np.array([start[n] for n in names]) - lo) / scale, 0.0, 1.0)
    starts = [first, *(np.array(p) for p in product(STARTS, repeat=len(names)))]
    from scipy.optimize import least_squares  # imported here: half a second the other commands need not pay

    best = None
    for u0 in starts:
        result = least_squares(
            lambda u: _log_errors(fit, dict(zip(names, lo + u * scale, strict=True)), gpu), u0, bounds=(0.0, 1.0)
        )
        if best is None or result.cost < best.cost - 1e-12:
            best = result
    assert best is not None
    return dict(zip(names, (lo + best.x * scale).tolist(), strict=True))


def _check_moves(fit: list[_Prepared], names: Sequence[str], start: dict[str, float], gpu: str) -> None:
    """Refuse constants that move no prediction of the fitted measurements over their plausible range, and the host
    time before a first token without a first token measured at one client (throughput alone moves with it too,
    but cannot tell it from the engine's own time)."""
    if "first_token_host_s" in names and not any(p.row.ttft_ms and p.row.concurrency == 1 for p in fit):
        c = CONSTANTS["first_token_host_s"]
        raise SpecError(f"the measurements cannot determine first_token_host_s ({c.meaning}); add {c.determined_by}")
    base = _log_errors(fit, start, gpu)
    for name in names:
        c = CONSTANTS[name]
        spread = max(
            float(np.max(np.abs(_log_errors(fit, {**start, name: value}, gpu) - base))) for value in (c.low, c.high)
        )
        if spread < MOVES:
            raise SpecError(
                f"the measurements cannot determine {name} ({c.meaning}): no prediction moves with it; "
                f"add {c.determined_by}"
            )
