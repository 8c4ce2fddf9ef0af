"""Calibrated constants: physical quantities fitted to measurements of one machine, applied on top of the
data files' defaults. A profile says which constants it sets, on what GPU, from which measurements, and how
much it changed the error on measurements it was not fitted to.

The constants a profile may set, each a quantity the cost model already uses:
- mem_bandwidth_bytes_per_s: memory bandwidth a GPU achieves (default: the measured streaming figure);
- eager_kernel_cpu_s: host time to launch one kernel without CUDA graphs (overheads.yaml): every eager step's, but
  the eager prefills of an engine and model family whose prefill was measured whole (eager_prefill_kernel_cpu);
- kernel_gpu_s: the least GPU time of one kernel (overheads.yaml);
- scheduler_step_cpu_s: scheduler host time per step when it does not overlap the GPU (overheads.yaml);
- request_cpu_s: host time per running request per step (scheduling, sampling, output processing, streaming
  each token); no measured default (0): beside the kernel launches when the scheduler overlaps the GPU, after
  them when it does not;
- collective_call_s: time one collective call costs beyond its measured nccl-tests time (default 0 s: the
  tables already hold what nccl-tests sees; engines call collectives from Python, eagerly, each step);
- first_token_host_s: host time a request spends outside the engine's steps before its first token reaches the
  client besides the front end's tokenising, which overheads.yaml prices (HTTP, the hops between the server's
  processes); no measured default (0): it delays the
  request's arrival at the scheduler, so where nothing queues it adds to TTFT and to each client's time per
  request, never to TPOT;
- non_torch_bytes: GPU memory a server holds besides weights, KV cache, activations and CUDA graphs (the CUDA
  context, library workspaces, communication buffers; runtime.yaml), fitted to a start-up log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import Field

from shardwise.errors import SpecError
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate


@dataclass(frozen=True)
class Constant:
    name: str
    meaning: str
    determined_by: str  # the kind of measurement that moves it
    low: float  # plausible range, SI
    high: float


CONSTANTS = {
    c.name: c
    for c in (
        Constant(
            "mem_bandwidth_bytes_per_s",
            "memory bandwidth a GPU achieves",
            "a memory-bound decode: one request or a small batch",
            1e11,
            1e13,
        ),
        Constant(
            "eager_kernel_cpu_s",
            "host time per kernel launch without CUDA graphs",
            "a run with CUDA graphs off at one request",
            1e-6,
            1e-4,
        ),
        Constant(
            "kernel_gpu_s", "least GPU time of one kernel", "a run with CUDA graphs on at one request", 5e-7, 3e-5
        ),
        Constant(
            "scheduler_step_cpu_s",
            "scheduler host time per step when it does not overlap",
            "a pipeline-parallel run or one with --disable-overlap-schedule",
            1e-5,
            1e-2,
        ),
        Constant(
            "request_cpu_s",
            "host time per running request per step (scheduling, sampling, output processing, streaming)",
            "a served run at hundreds of requests",
            0.0,
            1e-3,
        ),
        Constant(
            "non_torch_bytes",
            "GPU memory besides weights, KV cache, activations and graphs (CUDA context, buffers)",
            "a start-up log: shardwise calibrate --log FILE",
            2**28,
            2**34,
        ),
        Constant(
            "first_token_host_s",
            "host time a request spends outside the engine's steps before its first token reaches the client",
            "time to first token at one client over a few prompt lengths",
            0.0,
            0.5,
        ),
        Constant(
            "collective_call_s",
            "time per collective call beyond its nccl-tests time",
            "a tensor-parallel run at one request",
            0.0,
            2e-3,
        ),
    )
}


class Calibration(Frozen):
    """Fitted constants for one GPU model (and the engine measured on it)."""

    gpu: str = Field(description="GPU profile name the measurements were taken on")
    constants: dict[str, float] = Field(description="constant name → value in SI units")
    fitted_on: tuple[str, ...] = Field(description="the measurements it was fitted to")
    held_out: tuple[str, ...] = ()
    held_out_error_before: float | None = Field(
        None, description="root-mean-square log(predicted / measured) on the held-out measurements, defaults"
    )
    held_out_error_after: float | None = None
    at_bounds: tuple[str, ...] = Field((), description="constants the data pushed to the edge of their plausible range")

    def value(self, name: str, default: float) -> float:
        return self.constants.get(name, default)


def load_calibration(path: Path) -> Calibration:
    cal = validate(Calibration, read_yaml(path), origin=str(path))
    unknown = set(cal.constants) - set(CONSTANTS)
    if unknown:
        raise SpecError(f"{path}: unknown constants {sorted(unknown)}; known: {', '.join(CONSTANTS)}")
    return cal


def calibration_yaml(cal: Calibration) -> str:
    return yaml.safe_dump(cal.model_dump(mode="json"), sort_keys=False)
