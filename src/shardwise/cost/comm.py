"""Collective communication time on a cluster: measured tables where the box was measured, α–β elsewhere.

A group of GPUs inside one measured box uses that box's nccl-tests or custom all-reduce curve for its size.
Any other group uses the ring α–β model,

    time = steps × α + size × bus_factor / β

with α the per-step latency and β the per-GPU collective bandwidth of the slowest link the ring crosses:
the intra-node link (P2P off: the P2P-off latency; across CPU sockets: the cross-NUMA bandwidth) or, for a
group spanning nodes, the network share of each GPU. Engines decide which implementation they use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shardwise.hardware.collectives import Collective, bus_factor, ring_steps
from shardwise.spec.cluster import ClusterSpec, Span

# The largest input the engines' custom all-reduce takes; a larger one goes to NCCL (SGLang
# distributed/device_communicators/custom_all_reduce.py _MAX_CAR_SIZE = 8192 * 1024 on CUDA, twice that on ROCm;
# vLLM's CustomAllreduce max_size=8192 * 1024).
CUSTOM_ALLREDUCE_MAX_BYTES = 8192 * 1024


@dataclass(frozen=True, kw_only=True)
class CollectiveCost:
    op: Collective
    impl: str  # "nccl" or "custom" (custom all-reduce kernels); the α–β model stands for an NCCL ring
    n_gpus: int
    size_bytes: float
    time_s: float
    method: Literal["measured", "alpha-beta", "none"]
    source: str  # which table or which links
    latency_s: float  # α part (alpha-beta) or the measured time at the smallest size
    bandwidth_bytes_per_s: float  # effective per-GPU bus bandwidth at this size


def _group(cluster: ClusterSpec, gpus: Sequence[int] | int) -> list[int]:
    group = list(range(gpus)) if isinstance(gpus, int) else list(gpus)
    if not group or len(set(group)) != len(group) or min(group) < 0 or max(group) >= cluster.num_gpus:
        raise ValueError(f"group {gpus!r} is not a set of GPU ids of a {cluster.num_gpus}-GPU cluster")
    return group


def collective_cost(
    cluster: ClusterSpec, op: Collective, *, size_bytes: float, gpus: Sequence[int] | int, impl: str = "nccl"
) -> CollectiveCost:
    """Time of one collective of `size_bytes` (nccl-tests convention) over the GPU group `gpus`
    (ids, or a count meaning GPUs 0..n−1)."""
    group = _group(cluster, gpus)
    n = len(group)
    if n == 1:
        return CollectiveCost(
            op=op,
            impl=impl,
            n_gpus=1,
            size_bytes=size_bytes,
            time_s=0.0,
            method="none",
            source="single GPU",
            latency_s=0.0,
            bandwidth_bytes_per_s=float("inf"),
        )
    span = cluster.span(group)  # all the rest reads of the group
    measured = _measured(cluster, op, size_bytes, span, impl)
    return measured or _alpha_beta(cluster, op, size_bytes, span)


def _measured(cluster: ClusterSpec, op: Collective, size_bytes: float, span: Span, impl: str) -> CollectiveCost | None:
    tables = cluster.collectives
    if tables is None or span.across_nodes:
        return None
    n = span.gpus
    # reduce-scatter moves the same bytes in the same steps as all-gather, mirrored
    looked_up = Collective.ALL_GATHER if op is Collective.REDUCE_SCATTER else op
    custom = impl != "custom" or size_bytes <= CUSTOM_ALLREDUCE_MAX_BYTES
    curve = (tables.curve(looked_up, n, impl) if custom else None) or tables.curve(looked_up, n, "nccl")
    if curve is None:
        return None
    alpha = ring_steps(op, n) * _step_latency_s(cluster, span)
    time_s = curve.time_s(size_bytes, latency_floor_s=alpha)
    factor = bus_factor(op, n)
    source = f"{tables.name}: {curve.op.value} {curve.impl} x{n} ({curve.source or tables.source})"
    return CollectiveCost(
        op=op,
        impl=curve.impl,
        n_gpus=n,
        size_bytes=size_bytes,
        time_s=time_s,
        method="measured",
        source=source,
        latency_s=curve.time_s(0, latency_floor_s=alpha),
        bandwidth_bytes_per_s=size_bytes * factor / time_s if time_s else float("inf"),
    )


def _box_latency_s(cluster: ClusterSpec, span: Span) -> float | None:
    """Smallest-message time measured for any collective on this many GPUs of this box, if any."""
    tables = cluster.collectives
    if tables is None or span.across_nodes:
        return None
    floors = [c.measured()[0][1] for c in tables.tables if c.gpus == span.gpus and c.points and c.impl == "nccl"]
    return min(floors) if floors else None


def _step_latency_s(cluster: ClusterSpec, span: Span) -> float:
    if span.across_nodes and cluster.inter is not None:
        return cluster.inter.network.step_latency_s
    link = cluster.intra.link
    if not cluster.intra.p2p and link.p2p_off_latency is not None:
        return link.p2p_off_latency.si("s")
    return link.step_latency_s


def _bandwidth(cluster: ClusterSpec, op: Collective, span: Span) -> tuple[float, str]:
    link = cluster.intra.link
    # a ring collective runs at the measured bus bandwidth; a single transfer at point-to-point bandwidth
    p2p = op is Collective.SEND_RECV
    beta = link.bandwidth_bytes_per_s if p2p else link.collective_bandwidth_bytes_per_s
    names = [link.name]
    if span.across_sockets and link.cross_numa_bandwidth is not None:
        beta = min(beta, link.cross_numa_bandwidth.si("bytes_per_s"))
        names.append("cross-NUMA")
    network = cluster.network_bytes_per_s_per_gpu
    if span.across_nodes and network is not None and cluster.inter is not None:
        beta = min(beta, network)
        names.append(cluster.inter.network.name)
    return beta, " + ".join(names)


def _alpha_beta(cluster: ClusterSpec, op: Collective, size_bytes: float, span: Span) -> CollectiveCost:
    n = span.gpus
    measured_latency = _box_latency_s(cluster, span)
    alpha = measured_latency or ring_steps(op, n) * _step_latency_s(cluster, span)
    beta, links = _bandwidth(cluster, op, span)
    if measured_latency:
        links += f", latency measured on {n} GPUs of {cluster.collectives.name}"  # type: ignore[union-attr]
    time_s = alpha + size_bytes * bus_factor(op, n) / beta
    effective = size_bytes * bus_factor(op, n) / time_s if time_s else float("inf")
    return CollectiveCost(
        op=op,
        impl="nccl",
        n_gpus=n,
        size_bytes=size_bytes,
        time_s=time_s,
        method="alpha-beta",
        source=f"ring α–β over {links}",
        latency_s=alpha,
        bandwidth_bytes_per_s=effective,
    )
