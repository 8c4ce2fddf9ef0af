"""Fit the machine's non-weight memory (non_torch_bytes) to what a server printed while it started.

SGLang prints the memory free before any weight loads, so the CUDA context and communicators are measured
directly: non_torch = capacity − free before weights. vLLM prints the weights it loaded and the KV memory it
found; its pool is utilization × capacity less weights, non-torch memory, activation peak and CUDA graphs, so
non_torch = utilization × capacity − weights − KV − activations − graphs (the last two as shardwise estimates
them; the line it prints is its estimate before graph capture, in 0.34 too). Where the
log gives only the KV tokens, the same rule is solved for them. The fitted profile is then checked on the log's
own KV-token count.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.cost.memory import MemoryLedger, memory_ledger
from shardwise.engines.base import Setup
from shardwise.errors import SpecError
from shardwise.hardware.calibration import CONSTANTS, Calibration
from shardwise.hardware.load import runtime
from shardwise.measure.startup_log import StartupMemory
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec


def _runtime_default(model: ModelSpec, setup: Setup, ledger: MemoryLedger) -> float:
    """The non-torch memory the model assumed: the ledger's runtime less the multimodal cache SGLang reserves."""
    assert setup.layout is not None
    sglang_vlm = model.vision is not None and not setup.layout.options.activations_in_budget
    return ledger.per_gpu[0].runtime_bytes - (runtime().vlm_cache.si("bytes") if sglang_vlm else 0.0)


@dataclass(frozen=True, kw_only=True)
class MemoryFit:
    calibration: Calibration
    default_non_torch_bytes: float
    logged_kv_tokens: int | None
    default_kv_tokens: int
    fitted_kv_tokens: int


def _non_torch(
    log: StartupMemory, ledger: MemoryLedger, *, model: ModelSpec, setup: Setup, cluster: ClusterSpec
) -> float:
    capacity = cluster.gpu.memory_bytes
    row = max(ledger.per_gpu, key=lambda r: r.weights_bytes)
    if log.free_before_weights_bytes is not None:
        return capacity - log.free_before_weights_bytes
    assert setup.layout is not None
    opts = setup.layout.options
    weights = log.weights_bytes if log.weights_bytes is not None else row.weights_bytes
    if log.kv_bytes is not None:
        kv = log.kv_bytes
    elif log.kv_tokens is not None:
        kv = log.kv_tokens / setup.layout.dcp * ledger.kv_bytes_per_token
    else:
        raise SpecError(f"{log.source}: no free memory before the weights and no KV cache size to solve from")
    if opts.memory_fraction_of == "free_at_start":  # SGLang: kv = f × (capacity − non_torch) − weights − vlm cache
        vlm = runtime().vlm_cache.si("bytes") if model.vision else 0.0
        return capacity - (kv + weights + vlm) / opts.memory_fraction
    # "Available KV cache memory" is the profiling estimate before graph capture in 0.33 and 0.34 alike
    # (gpu_worker.py: requested − consumed − peak − the CUDA-graph estimate)
    return opts.memory_fraction * capacity - weights - kv - row.activation_bytes - row.cuda_graph_bytes


def fit_memory(log: StartupMemory, *, model: ModelSpec, setup: Setup, cluster: ClusterSpec) -> MemoryFit:
    """The non_torch_bytes that makes shardwise's memory model match this start-up log."""
    if setup.layout is None:
        raise SpecError(f"the launch command does not start: {setup.rejections[0].reason}")
    if log.engine != setup.engine:
        raise SpecError(f"the log is {log.engine}'s and the command {setup.engine}'s; give the command it ran")
    before = memory_ledger(model, setup.layout, cluster)
    value = _non_torch(log, before, model=model, setup=setup, cluster=cluster)
    low, high = CONSTANTS["non_torch_bytes"].low, CONSTANTS["non_torch_bytes"].high
    if not low <= value <= high:
        raise SpecError(
            f"the log implies {value / 2**30:.2f} GiB per GPU outside weights, KV cache, activations and graphs, "
            f"outside {low / 2**30:.2f}…{high / 2**30:.0f} GiB: is it the log of this command on {cluster.gpu.name}?"
        )
    cal = Calibration(gpu=cluster.gpu.name, constants={"non_torch_bytes": value}, fitted_on=(log.source,))
    after = memory_ledger(model, setup.layout, cluster.calibrated(cal))
    return MemoryFit(
        calibration=cal,
        default_non_torch_bytes=_runtime_default(model, setup, before),
        logged_kv_tokens=log.kv_tokens,
        default_kv_tokens=before.kv_tokens_per_rank,
        fitted_kv_tokens=after.kv_tokens_per_rank,
    )
