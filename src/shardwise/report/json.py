"""JSON views of shardwise's values: plain dicts in SI units (bytes, seconds, bytes/s), keys named with units."""

from __future__ import annotations

from typing import Any

from shardwise.cost.comm import CollectiveCost
from shardwise.hardware.profile import GpuProfile, LinkProfile
from shardwise.jsontext import dumps as dumps  # the one serializer, for the commands that print these
from shardwise.spec.catalog import CatalogEntry
from shardwise.spec.cluster import ClusterSpec
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import WeightLedger


def model_payload(model: ModelSpec, ledger: WeightLedger, entry: CatalogEntry | None) -> dict[str, Any]:
    att, moe = model.attention, model.moe
    return {
        "model": model.name,
        "repo": entry.repo if entry else None,
        "config_provenance": entry.provenance if entry else "user file",
        "architecture": model.architecture,
        "family": model.family,
        "generic": model.generic,
        "total_params": ledger.total_params,
        "active_params": round(ledger.active_params),
        "weight_bytes": ledger.total_bytes,
        "kv_bytes_per_token": model.kv_bytes_per_token,
        "kv_bytes_per_token_beyond_window": model.kv_bytes_per_token_beyond_window,
        "kv_dtype": model.kv_dtype,
        "index_bytes_per_token": model.index_bytes_per_token(),
        "linear_state_bytes_per_sequence": model.linear_state_bytes,
        "sliding_window": model.sliding_window,
        "quantization": model.quant.method,
        "components": [
            {
                "name": c.name,
                "params": c.params,
                "bytes": c.bytes,
                "active_params": round(c.active_params),
                "formats": list(c.formats),
            }
            for c in ledger.components
        ],
        "mtp_params": ledger.mtp_params,
        "mtp_bytes": ledger.mtp_bytes,
        "layers": {
            "total": model.num_layers,
            "moe": model.num_moe_layers,
            "dense": model.num_layers - model.num_moe_layers,
            "full_attention": model.layer_attention.count("full"),
            "sliding_attention": model.layer_attention.count("sliding"),
            "linear_attention": model.layer_attention.count("linear"),
            "mtp": model.num_mtp_layers,
        },
        "hidden_size": model.hidden_size,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_position_embeddings,
        "attention": att.model_dump(),
        "moe": moe.model_dump() if moe else None,
    }


def gpu_payload(gpu: GpuProfile) -> dict[str, Any]:
    return {
        "name": gpu.name,
        "display_name": gpu.display_name,
        "aliases": list(gpu.aliases),
        "family": gpu.family,
        "vendor": gpu.vendor,
        "architecture": gpu.architecture,
        "compute_capability": gpu.compute_capability.value,
        "memory_bytes": gpu.memory_bytes,
        "mem_bandwidth_bytes_per_s": gpu.mem_bandwidth_bytes_per_s,
        "mem_bandwidth_measured_bytes_per_s": gpu.mem_bandwidth_measured_bytes_per_s,
        "dense_flops_per_s": {dtype: q.si("flop_per_s") for dtype, q in gpu.tensor_dense.items()},
        "host_link": gpu.host_link.value,
        "gpu_link": gpu.gpu_link.value,
        "p2p": gpu.p2p.value,
        "tdp_w": gpu.tdp.si("W"),
        "facts": gpu.model_dump(mode="json", exclude_none=True),
    }


def link_payload(link: LinkProfile) -> dict[str, Any]:
    return {
        "name": link.name,
        "display_name": link.display_name,
        "kind": link.kind,
        "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
        "collective_bandwidth_bytes_per_s": link.collective_bandwidth_bytes_per_s,
        "step_latency_s": link.step_latency_s,
        "facts": link.model_dump(mode="json", exclude_none=True),
    }


def collective_payload(cost: CollectiveCost) -> dict[str, Any]:
    return {
        "op": cost.op.value,
        "impl": cost.impl,
        "gpus": cost.n_gpus,
        "size_bytes": cost.size_bytes,
        "time_s": cost.time_s,
        "method": cost.method,
        "source": cost.source,
        "bus_bandwidth_bytes_per_s": cost.bandwidth_bytes_per_s,
    }


def cluster_payload(cluster: ClusterSpec, costs: list[CollectiveCost]) -> dict[str, Any]:
    return {
        "cluster": cluster.name,
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "num_gpus": cluster.num_gpus,
        "gpu": cluster.gpu.name,
        "memory_bytes_total": cluster.gpu.memory_bytes * cluster.num_gpus,
        "intra_node": {
            "link": link_payload(cluster.intra.link),
            "p2p": cluster.intra.p2p,
            "numa_nodes": cluster.intra.numa_nodes,
            "pcie_switches": cluster.intra.pcie_switches,
        },
        "inter_node": None
        if cluster.inter is None
        else {
            "network": link_payload(cluster.inter.network),
            "nics_per_node": cluster.inter.nics_per_node,
            "assumed": cluster.inter.assumed,
            "bytes_per_s_per_gpu": cluster.network_bytes_per_s_per_gpu,
        },
        "measured_collectives": cluster.collectives.name if cluster.collectives else None,
        "collectives": [collective_payload(c) for c in costs],
    }
