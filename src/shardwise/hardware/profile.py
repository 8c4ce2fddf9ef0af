"""Hardware profiles: what a GPU and a link physically are, each number with its unit and its source.

Owns the schemas of `data/hardware/gpus/*.yaml` and `data/hardware/links/*.yaml` and their SI views
(`memory_bytes`, `mem_bandwidth_bytes_per_s`, ...). Holds datasheet and measured physics only: any
correction fitted to a user's machine belongs to a calibration profile, never here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from shardwise.frozen import Frozen
from shardwise.units import Dimension, to_si


class Quantity(Frozen):
    """A number as published: value, unit, where it comes from, and whether it is in doubt."""

    value: float
    unit: str
    source: str = Field(min_length=2, description="a key of data/hardware/sources.yaml, then any detail")
    uncertain: bool = Field(False, description="sources disagree or only a secondary source exists")
    note: str | None = None

    def si(self, dimension: Dimension) -> float:
        return to_si(self.value, self.unit, dimension=dimension)


class Fact(Frozen):
    """A non-numeric fact (a name, a flag) with its source."""

    value: str | bool
    source: str = Field(min_length=2)
    uncertain: bool = False
    note: str | None = None


TENSOR_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")


class HourlyPrice(Frozen):
    """What one GPU-hour costs: the rate shardwise prices at, and the range published beside it, with its date."""

    usd: float = Field(gt=0, allow_inf_nan=False, description="USD per GPU-hour that costs are priced at")
    low_usd: float = Field(gt=0, allow_inf_nan=False)
    high_usd: float = Field(gt=0, allow_inf_nan=False)
    source: str = Field(min_length=2, description="a key of data/hardware/sources.yaml, then any detail")
    date: str = Field(description="when the prices were published (YYYY-MM-DD)")
    note: str | None = None


class GpuProfile(Frozen):
    """One GPU model: memory, bandwidth, dense tensor throughput, links."""

    name: str = Field(description="catalog key, e.g. 'rtx-pro-6000-server'")
    display_name: str
    aliases: tuple[str, ...] = ()
    family: str = Field(description="GPUs of one family share a die and a link: 'rtx-pro-6000', 'h100', ...")
    vendor: Literal["nvidia", "amd"]
    architecture: str
    compute_capability: Fact
    memory: Quantity = Field(
        description="capacity as sold; datasheets write 'GB' for binary gigabytes (an '80 GB' H100 reports 81,559 "
        "MiB), so the data files record it in GiB"
    )
    memory_visible: Quantity | None = Field(None, description="capacity the driver reports (nvidia-smi)")
    memory_type: Fact
    mem_bandwidth: Quantity = Field(description="datasheet memory bandwidth")
    mem_bandwidth_measured: Quantity | None = Field(None, description="bandwidth achieved streaming weights")
    tensor_dense: dict[str, Quantity] = Field(description="dense (no sparsity) tensor peak per dtype")
    gemm_measured: dict[str, Quantity] = Field(default_factory=dict, description="best measured GEMM per dtype")
    sm_count: Quantity | None = None
    l2_cache: Quantity | None = None
    tdp: Quantity
    price_per_hour: HourlyPrice | None = Field(None, description="published rental or TCO price, where one is")
    host_link: Fact = Field(description="link profile name of the host interface, e.g. 'pcie5-x16'")
    gpu_link: Fact = Field(description="link profile name of the GPU-to-GPU fabric, or 'none'")
    p2p: Fact = Field(description="whether GPUs can reach each other's memory directly over PCIe")

    @field_validator("tensor_dense", "gemm_measured")
    @classmethod
    def _known_dtypes(cls, value: dict[str, Quantity]) -> dict[str, Quantity]:
        unknown = set(value) - set(TENSOR_DTYPES)
        if unknown:
            raise ValueError(f"unknown tensor dtypes {sorted(unknown)}; known: {', '.join(TENSOR_DTYPES)}")
        return value

    @property
    def memory_bytes(self) -> float:
        """Usable capacity: what the driver reports where known, else the datasheet figure."""
        return (self.memory_visible or self.memory).si("bytes")

    @property
    def mem_bandwidth_bytes_per_s(self) -> float:
        return self.mem_bandwidth.si("bytes_per_s")

    @property
    def mem_bandwidth_measured_bytes_per_s(self) -> float | None:
        return self.mem_bandwidth_measured.si("bytes_per_s") if self.mem_bandwidth_measured else None

    def dense_flops_per_s(self, dtype: str) -> float | None:
        """Dense tensor peak for `dtype`, or None where the GPU has no such tensor path."""
        quantity = self.tensor_dense.get(dtype)
        return quantity.si("flop_per_s") if quantity else None

    @property
    def has_gpu_link(self) -> bool:
        return self.gpu_link.value != "none"


class LinkProfile(Frozen):
    """A link between GPUs or between nodes: bandwidth per direction per GPU, and latency."""

    name: str
    display_name: str
    kind: Literal["pcie", "nvlink", "xgmi", "infiniband", "roce", "ethernet"]
    bandwidth: Quantity = Field(description="theoretical bandwidth per GPU, one direction")
    bandwidth_measured: Quantity | None = Field(None, description="measured point-to-point, one direction")
    cross_numa_bandwidth: Quantity | None = Field(
        None, description="PCIe only: measured point-to-point bandwidth between GPUs on different CPU sockets"
    )
    latency: Quantity | None = Field(None, description="measured point-to-point latency")
    collective_busbw: Quantity | None = Field(
        None, description="best measured all-reduce bus bandwidth per GPU over this link (the α–β model's β)"
    )
    collective_step_latency: Quantity | None = Field(
        None, description="latency of one step of a ring collective over this link (the α–β model's α)"
    )
    p2p_off_latency: Quantity | None = Field(None, description="PCIe only: latency when P2P is off")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Point-to-point bandwidth: measured where there is a measurement, else theoretical."""
        return (self.bandwidth_measured or self.bandwidth).si("bytes_per_s")

    @property
    def collective_bandwidth_bytes_per_s(self) -> float:
        """Per-GPU bandwidth a ring collective achieves: measured bus bandwidth, else point-to-point."""
        return self.collective_busbw.si("bytes_per_s") if self.collective_busbw else self.bandwidth_bytes_per_s

    @property
    def step_latency_s(self) -> float:
        """Per-step latency for the α–β model; the point-to-point latency where no collective figure exists."""
        chosen = self.collective_step_latency or self.latency
        return chosen.si("s") if chosen else 0.0


class RuntimeProfile(Frozen):
    """Memory the CUDA stack and the engines' communication take on each GPU (data/hardware/runtime.yaml)."""

    name: str
    non_torch_single_gpu: Quantity
    non_torch_multi_gpu: Quantity
    deepep_buffers: Quantity
    vlm_cache: Quantity


class PowerFacts(Frozen):
    """What a machine draws besides its GPUs (data/hardware/power.yaml)."""

    name: str
    host_per_gpu: Quantity = Field(description="a node's CPUs, memory, switches, NICs and fans, per GPU it holds")


class Overheads(Frozen):
    """Host and launch time of an engine step (data/hardware/overheads.yaml)."""

    name: str
    eager_kernel_cpu: Quantity = Field(description="host time to issue one kernel from eager PyTorch")
    eager_prefill_kernel_cpu: dict[str, dict[str, Quantity]] = Field(
        default_factory=dict,
        description="by engine and model family, where an eager prefill was measured whole: its host time per kernel",
    )
    kernel_gpu: Quantity = Field(description="least GPU time of one separately launched kernel")
    graph_launch_cpu: Quantity = Field(description="host time to replay one CUDA graph")
    scheduler_step_cpu: Quantity = Field(description="host time per step for batching, sampling and output")
    speculative_step_cpu: Quantity = Field(
        description="host time per SGLang speculative decode step without the overlap scheduler"
    )
    tokenize_cpu_per_prose_token: Quantity = Field(description="front-end host time per prompt token of prose")
    tokenize_cpu_per_random_token: Quantity = Field(
        description="front-end host time per prompt token of a prompt decoded from random token ids"
    )

    def eager_prefill_kernel_s(self, engine: str, family: str) -> float | None:
        """Host time per kernel of this engine's eager prefill of this model family, where one was measured whole."""
        measured = self.eager_prefill_kernel_cpu.get(engine, {}).get(family)
        return measured.si("s") if measured else None
