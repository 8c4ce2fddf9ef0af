"""What a prediction costs in dollars and draws in watts: dollars per million output tokens at a GPU-hour rate, and
output tokens per second per kilowatt.

Cost: the GPUs a setup holds, at the GPU's published hourly price (`price_per_hour` in its data file: InferenceX's
neocloud TCO where it publishes one, else a rental list price; the source and date are in the file) or the user's
own rate, plus, where the user gives an electricity price with that rate, the energy the estimate below draws (a
published price includes power; an owned box's amortised rate does not).

Power, an estimate: each GPU draws its TDP for the share of a decode step it runs kernels (compute, memory traffic,
collectives, launches, drafting and the prefills mixed in) and nothing while it waits on the host or on another
pipeline stage (a token's parts add one trip through every stage: with fewer micro-batches in flight than stages,
each stage works on its own only that share of the trip); idle draw is not counted and memory-bound kernels draw
less than TDP, so the GPU figure leans high while busy and low while waiting. Each GPU adds its share of its host's
draw (`data/hardware/power.yaml`, an upper bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardwise.engines.layout import Layout
from shardwise.errors import SpecError
from shardwise.hardware.load import power_facts
from shardwise.serve.steady import Prediction
from shardwise.spec.cluster import ClusterSpec

# the parts of a token's time in which the GPUs run kernels (the rest: they wait on the host or another stage)
BUSY_PARTS = ("compute", "memory", "comm", "launch", "prefill", "draft")


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """The rates a search prices at: USD per GPU-hour (None: the GPU's published price) and USD per kWh (None: the
    hourly rate includes power)."""

    gpu_hour_usd: float | None = None
    kwh_usd: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("--gpu-hour-usd", self.gpu_hour_usd), ("--kwh-usd", self.kwh_usd)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise SpecError(f"{name} takes a price of zero or more in USD; got {value}")
        if self.kwh_usd is not None and self.gpu_hour_usd is None:
            raise SpecError(
                "--kwh-usd adds energy to your own hourly rate: give --gpu-hour-usd too (a published GPU-hour price "
                "already includes power)"
            )

    def hourly_usd(self, cluster: ClusterSpec) -> float | None:
        """The rate of one GPU-hour: the user's, else the GPU's published one, else None (no price known)."""
        if self.gpu_hour_usd is not None:
            return self.gpu_hour_usd
        price = cluster.gpu.price_per_hour
        return price.usd if price is not None else None

    def basis(self, cluster: ClusterSpec) -> str:
        """Where the rate comes from, for a report."""
        if self.gpu_hour_usd is not None:
            return f"${self.gpu_hour_usd:,.2f} per GPU-hour (given)"
        price = cluster.gpu.price_per_hour
        if price is None:
            return f"no published price for {cluster.gpu.name}: give --gpu-hour-usd"
        how = (price.note or "").split(";")[0].removeprefix("priced at ") or price.source
        if price.low_usd == price.high_usd == price.usd:
            return f"${price.usd:,.2f} per GPU-hour ({how})"
        return (
            f"${price.usd:,.2f} per GPU-hour ({how}, {price.date}; published ${price.low_usd:,.2f}-"
            f"{price.high_usd:,.2f})"
        )


@dataclass(frozen=True, kw_only=True)
class Economics:
    gpu_utilisation: float  # share of a token's time the GPUs run kernels
    gpu_power_w: float  # all the setup's GPUs
    host_power_w: float  # the hosts' share of its GPUs
    cost_per_hour_usd: float | None  # GPUs at the rate, plus energy where priced; None: no rate known
    usd_per_million_output_tokens: float | None
    output_tok_s_per_kw: float

    @property
    def power_w(self) -> float:
        return self.gpu_power_w + self.host_power_w


def economics(p: Prediction, cluster: ClusterSpec, layout: Layout, pricing: Pricing = Pricing()) -> Economics:
    """Cost and power of `p`, a prediction of `layout` on `cluster`'s GPUs."""
    gpus = layout.gpus_used
    total = sum(p.breakdown_s.values())
    busy = sum(p.breakdown_s.get(part, 0.0) for part in BUSY_PARTS)
    # each stage runs one of the trip's pp legs per micro-batch: busy for its own share of it, times the micro-batches
    # in flight (one per running request of a copy, at most one per stage)
    in_flight = min(layout.pp, max(1, p.running // layout.replicas))
    utilisation = min(1.0, busy / total * in_flight / layout.pp) if total > 0 else 1.0
    gpu_w = gpus * utilisation * cluster.gpu.tdp.si("W")
    host_w = gpus * power_facts().host_per_gpu.si("W")
    power_kw = (gpu_w + host_w) / 1e3
    rate = pricing.hourly_usd(cluster)
    cost = None if rate is None else gpus * rate + power_kw * (pricing.kwh_usd or 0.0)
    tokens_per_hour = p.output_tok_s * 3600
    return Economics(
        gpu_utilisation=utilisation,
        gpu_power_w=gpu_w,
        host_power_w=host_w,
        cost_per_hour_usd=cost,
        usd_per_million_output_tokens=cost / tokens_per_hour * 1e6
        if cost is not None and tokens_per_hour > 0
        else None,
        output_tok_s_per_kw=p.output_tok_s / power_kw,
    )
