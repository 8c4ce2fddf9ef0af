"""shardwise: what is the best way to serve this LLM on these GPUs, and why.

The main job, as `shardwise theorise` does it (every argument optional; these are the defaults):

    theory = theorise("kimi-k2.6", "8xrtx-pro-6000", engines=["sglang"], isl=1024, osl=1024)
    theory.best                                # the winning Candidate: its setup, launch commands, predictions
    theory.ranking, theory.explanation, theory.ceiling, theory.what_ifs, theory.winners

The public API, one layer at a time:

    model = load_model("kimi-k2.6")            # or a config.json path, or a Hub id
    ledger = weight_ledger(model)              # params and bytes per component
    cluster = load_cluster("8xrtx-pro-6000")   # or "2x8xh100", or a cluster YAML file
    cost = collective_cost(cluster, Collective.ALL_REDUCE, size_bytes=14_336, gpus=8)
    checked = check_command("python -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 --tp 8 --ep 8",
                            cluster=cluster)
    memory = memory_ledger(checked.model, checked.setup.layout, cluster)
    predictions = predict(checked.model, checked.setup.layout, cluster, memory,
                          concurrency=[1, 8, 64], isl=1024, osl=1024)
    steps = StepTimes(checked.model, checked.setup.layout, cluster)
    result = simulate(steps, memory, WorkloadSpec(input=Lengths.fixed(1024), output=Lengths.fixed(1024),
                                                  num_requests=1000, concurrency=64))
"""

from shardwise.cost.comm import CollectiveCost, collective_cost
from shardwise.cost.memory import MemoryLedger, memory_ledger
from shardwise.decide.theory import Theory, theorise
from shardwise.engines.check import check_command
from shardwise.errors import DataError, ShardwiseError, SpecError
from shardwise.hardware.collectives import Collective
from shardwise.hardware.load import load_gpu, load_link
from shardwise.hardware.profile import GpuProfile, LinkProfile
from shardwise.serve.simulate import ServeResult, simulate
from shardwise.serve.steady import Prediction, predict
from shardwise.serve.steps import StepTimes
from shardwise.spec.catalog import catalog, load_model
from shardwise.spec.cluster import ClusterSpec, load_cluster
from shardwise.spec.model import ModelSpec
from shardwise.spec.weights import WeightLedger, model_weights, weight_ledger
from shardwise.spec.workload import Lengths, WorkloadSpec

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec",
    "Collective",
    "CollectiveCost",
    "DataError",
    "GpuProfile",
    "Lengths",
    "LinkProfile",
    "MemoryLedger",
    "ModelSpec",
    "Prediction",
    "ServeResult",
    "ShardwiseError",
    "SpecError",
    "StepTimes",
    "Theory",
    "WeightLedger",
    "WorkloadSpec",
    "catalog",
    "check_command",
    "collective_cost",
    "load_cluster",
    "load_gpu",
    "load_link",
    "load_model",
    "memory_ledger",
    "model_weights",
    "predict",
    "simulate",
    "theorise",
    "weight_ledger",
]
