"""The speed of light of decoding a model on a cluster: no engine, no communication, no overheads.

Think of the GPUs as one device with their summed memory bandwidth and FLOP rate, holding the weights once
and every remaining byte as KV cache (no copy of the latent per TP rank, nothing for the CUDA stack beyond
its measured minimum), stored in FP8 (the narrowest KV dtype the search tries) and only as much as each layer
keeps (a sliding-window layer its window, a linear-attention layer its state). One decode step of B requests
must read the weights those B tokens touch (every dense matrix; the distinct routed experts they activate)
and their KV cache, and must do 2 × active parameters FLOPs per token. Its time is the larger of bytes ÷
bandwidth and FLOPs ÷ FLOP rate; the ceiling is the best B / time over the batches the memory can hold. A real
setup reaches a fraction of it; the fraction says how much the engine, the links and the layout cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.cost.roofline import rates
from shardwise.hardware.load import runtime
from shardwise.ops.routing import busiest_rank
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec
from shardwise.spec.quant import kv_dtype_bytes
from shardwise.spec.weights import weight_ledger

KV_DTYPE = "fp8_e4m3"  # the narrowest KV-cache dtype the search tries (its FP8 KV variant)


@dataclass(frozen=True, kw_only=True)
class Ceiling:
    output_tok_s: float
    batch: int  # the batch that reaches it
    max_batch: int  # requests of the workload the memory holds at once
    step_s: float
    bound: str  # memory | compute
    weights_read_bytes: float  # per step, at that batch
    kv_read_bytes: float


def ceiling(model: ModelSpec, cluster: ClusterSpec, *, isl: int, osl: int) -> Ceiling | None:
    """The decode ceiling for requests of isl in / osl out; None when the weights alone do not fit."""
    r = rates(cluster)
    n = cluster.num_gpus
    bandwidth = n * r.bandwidth_bytes_per_s
    ledger = weight_ledger(model)
    experts = next((c for c in ledger.components if c.name == "routed_experts"), None)
    dense_bytes = ledger.total_bytes - (experts.bytes if experts else 0.0)
    flop_rate = n * max(r.flops_per_s.values())
    room = n * (cluster.gpu.memory_bytes - runtime().non_torch_multi_gpu.si("bytes")) - ledger.total_bytes
    kv = model.with_overrides(kv_dtype=KV_DTYPE) if model.kv_bytes_per_element > kv_dtype_bytes(KV_DTYPE) else model
    held = kv.kv_bytes_per_sequence(isl + osl)
    max_batch = int(room // held) if held else 1 << 16
    if room <= 0 or max_batch < 1:
        return None
    best: Ceiling | None = None
    batch = 1
    while True:
        step = _step(
            model,
            batch,
            dense_bytes=dense_bytes,
            experts=experts,
            kv_read=kv.kv_bytes_per_sequence(isl + osl // 2),
            bandwidth=bandwidth,
            flop_rate=flop_rate,
            active=ledger.active_params,
        )
        tok_s = batch / step[0]
        if best is None or tok_s > best.output_tok_s:
            best = Ceiling(
                output_tok_s=tok_s,
                batch=batch,
                max_batch=max_batch,
                step_s=step[0],
                bound=step[1],
                weights_read_bytes=step[2],
                kv_read_bytes=step[3],
            )
        if batch >= max_batch:
            return best
        batch = min(max_batch, batch * 2)


def _step(
    model: ModelSpec,
    batch: int,
    *,
    dense_bytes: float,
    experts,
    kv_read: float,
    bandwidth: float,
    flop_rate: float,
    active: float,
) -> tuple[float, str, float, float]:
    weights = dense_bytes
    if experts is not None and model.moe is not None:
        touched = busiest_rank(
            tokens=batch, num_experts=model.moe.num_experts, top_k=model.moe.top_k, ranks=1, balanced=False
        ).distinct_experts
        weights += experts.bytes * touched / model.moe.num_experts
    kv = batch * kv_read
    memory_s = (weights + kv) / bandwidth
    compute_s = 2 * active * batch / flop_rate
    return max(memory_s, compute_s), ("memory" if memory_s >= compute_s else "compute"), weights, kv
