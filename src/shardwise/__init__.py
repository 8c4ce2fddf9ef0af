"""shardwise: what is the best way to serve this LLM on these GPUs, and why.

The public API, one layer at a time:

    model = load_model("kimi-k2.6")            # or a config.json path, or a Hub id
    ledger = weight_ledger(model)              # params and bytes per component
    cluster = load_cluster("8xrtx-pro-6000")   # or "2x8xh100", or a cluster YAML file
    cost = collective_cost(cluster, Collective.ALL_REDUCE, size_bytes=14_336, gpus=8)
"""

from shardwise.cost.comm import CollectiveCost, collective_cost
from shardwise.errors import DataError, ShardwiseError, SpecError
from shardwise.hardware.collectives import Collective
from shardwise.hardware.load import load_gpu, load_link
from shardwise.hardware.profile import GpuProfile, LinkProfile
from shardwise.spec.catalog import catalog, load_model
from shardwise.spec.cluster import ClusterSpec, load_cluster
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import WeightLedger, model_weights, weight_ledger

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec",
    "Collective",
    "CollectiveCost",
    "DataError",
    "GpuProfile",
    "LinkProfile",
    "ModelSpec",
    "ShardwiseError",
    "SpecError",
    "WeightLedger",
    "catalog",
    "collective_cost",
    "load_cluster",
    "load_gpu",
    "load_link",
    "load_model",
    "model_weights",
    "weight_ledger",
]
