"""Time of one op on one GPU: the slower of its FLOPs and its bytes, plus the fixed time of its kernels.

    compute_s = flops / achievable FLOP/s of its dtype    (best measured GEMM, else the dense peak)
    memory_s  = bytes / achievable bandwidth               (measured weight streaming, else the datasheet)
    time_s    = max(compute_s, memory_s) + kernels × per-kernel GPU time

The per-kernel term is why small kernels fall short of the roofline: a kernel that moves a few KB still
occupies the GPU for its launch, block scheduling and drain (≈3 µs, the null-kernel latency).
A collective costs what the cluster's link model says (measured tables, else ring α–β).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardwise.cost.comm import collective_cost
from shardwise.hardware.collectives import Collective
from shardwise.hardware.load import overheads
from shardwise.ops.types import Comm, Compute, OpClass
from shardwise.spec.cluster import ClusterSpec, Span

Bound = str  # "compute" | "memory" | "comm" | "launch"


@dataclass(frozen=True, kw_only=True)
class Rates:
    """What one GPU can achieve, and where each figure comes from."""

    bandwidth_bytes_per_s: float
    flops_per_s: dict[str, float]
    kernel_gpu_s: float


def rates(cluster: ClusterSpec) -> Rates:
    gpu, oh, cal = cluster.gpu, overheads(), cluster.calibration
    measured = gpu.mem_bandwidth_measured_bytes_per_s
    flops = {}
    for dtype in ("bf16", "fp8", "fp4"):
        best = gpu.gemm_measured.get(dtype)
        rate = best.si("flop_per_s") if best else gpu.dense_flops_per_s(dtype)
        if rate:
            flops[dtype] = rate
    for dtype in ("fp8", "fp4"):  # no tensor path for the dtype: the kernels upcast to BF16
        flops.setdefault(dtype, flops["bf16"])
    bandwidth = measured or gpu.mem_bandwidth_bytes_per_s
    kernel = oh.kernel_gpu.si("s")
    return Rates(
        bandwidth_bytes_per_s=cal.value("mem_bandwidth_bytes_per_s", bandwidth) if cal else bandwidth,
        flops_per_s=flops,
        kernel_gpu_s=cal.value("kernel_gpu_s", kernel) if cal else kernel,
    )


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """One op's share of a step, over all its executions (`count` of them)."""

    name: str
    op_class: OpClass
    stage: int
    count: int
    kernels: int  # launches per step
    flops: float
    bytes: float
    time_s: float  # GPU time on the critical path
    # its parts (an op priced on the roofline is the longer of compute and memory, plus its launches)
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    launch_s: float = 0.0  # per-kernel GPU time
    bound: Bound
    hidden: bool = False  # overlapped with other work (two-batch overlap): not on the critical path
    measured: str | None = None  # the kernel table its time comes from; None: priced by the roofline
    extrapolated: bool = False  # looked up beyond the table's measured range
    measured_release: str | None = None  # the engine release that measured the table

    def run(self, times: int, stage: int) -> OpCost:
        """The cost of running this op `times` times as often, on `stage`."""
        return replace(
            self,
            stage=stage,
            count=self.count * times,
            kernels=self.kernels * times,
            flops=self.flops * times,
            bytes=self.bytes * times,
            compute_s=self.compute_s * times,
            memory_s=self.memory_s * times,
            comm_s=self.comm_s * times,
            launch_s=self.launch_s * times,
            time_s=self.time_s * times,
        )


def compute_cost(op: Compute, r: Rates, measured: Measured | None = None) -> OpCost:
    """The roofline time of one op; with a measurement of its kernels, the measured time instead (the roofline
    terms stay, to say what bounds it)."""
    compute = op.flops / r.flops_per_s[op.dtype]
    memory = op.bytes / r.bandwidth_bytes_per_s
    launch = op.kernels * r.kernel_gpu_s
    one = max(compute, memory) + launch
    bound = "launch" if launch > max(compute, memory) else ("compute" if compute > memory else "memory")
    if measured is not None:  # the table's time, and the least GPU time of any kernel of the op it does not time
        one = measured.seconds + measured.untimed_kernels * r.kernel_gpu_s
        launch = min(launch, one)
    return OpCost(
        name=op.name,
        op_class=op.op_class,
        stage=op.stage,
        count=op.count,
        kernels=op.kernels * op.count,
        flops=op.flops * op.count,
        bytes=op.bytes * op.count,
        compute_s=compute * op.count,
        memory_s=memory * op.count,
        launch_s=launch * op.count,
        time_s=one * op.count,
        bound=bound,
        measured=measured.source if measured else None,
        extrapolated=measured.extrapolated if measured else False,
        measured_release=measured.release if measured else None,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """One execution's time from a kernel table."""

    seconds: float
    source: str
    extrapolated: bool
    release: str  # the engine release that measured it
    untimed_kernels: int = 0  # kernels of the op the table does not time (an MLP's activation between its GEMMs)


def collective_s(
    cluster: ClusterSpec,
    collective: Collective,
    size_bytes: float,
    group: tuple[int, ...],
    impl: str,
    cache: dict[tuple, float] | None = None,
    span: Span | None = None,
) -> float:
    """One run of a collective from the link model, with any calibrated fixed time per call; `cache` remembers the
    link model's times by (collective, size, how the group spans the cluster, implementation): groups of one span
    cost the same (`span`: the group's, where known)."""
    key = (collective, size_bytes, span or cluster.span(group), impl)
    one = cache.get(key) if cache is not None else None
    if one is None:
        one = collective_cost(cluster, collective, size_bytes=size_bytes, gpus=group, impl=impl).time_s
        if cache is not None:
            cache[key] = one
    return one + (cluster.calibration.value("collective_call_s", 0.0) if cluster.calibration else 0.0)


def comm_cost(op: Comm, cluster: ClusterSpec, cache: dict[tuple, float] | None = None) -> OpCost:
    """A collective's time from the link model; `cache` remembers times by (op, size, group, impl)."""
    total = collective_s(cluster, op.collective, op.size_bytes, op.group, op.impl, cache) * op.count
    return OpCost(
        name=op.name,
        op_class=OpClass.COMM,
        stage=op.stage,
        count=op.count,
        kernels=op.kernels * op.count,
        flops=0.0,
        bytes=op.size_bytes * op.count,
        comm_s=total,
        time_s=total,
        bound="comm",
        hidden=op.overlapped,
    )
