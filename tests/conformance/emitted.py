"""Every launch command shardwise emits for a model on a cluster, and how to ask the real engine about it.

The commands are what `theorise` prints (each setup it ranks, every option set it tries that starts, one command per
node for multi-node setups, and every excluded command with its reason), which includes what `layouts --all` lists.
Each goes to the real engine package (conformance/*_oracle.py, run in its own virtual environment on faked GPUs) with
the model path replaced by the bundled config's folder and the multi-node placeholders filled in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise.cost.memory import memory_ledger, runtime_bytes
from shardwise.decide.search import search
from shardwise.engines.check import Checked, check_command
from shardwise.engines.flags import flag_table, split_command
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import ClusterSpec, load_cluster

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "src" / "shardwise" / "data" / "models"
ENGINES_DIR = Path(os.environ.get("SHARDWISE_ENGINES_DIR", ROOT / ".engines"))
ORACLES = {
    ("sglang", "0.5.23"): ("sglang-0.5.23", "sglang_oracle.py"),
    ("vllm", "0.33.0"): ("vllm-0.33.0", "vllm_oracle.py"),
    ("vllm", "0.34.0"): ("vllm-0.34.0", "vllm_oracle.py"),
}
HEAD = {"HEAD_IP": "10.0.0.1"}  # what a user sets before running a multi-node command


@dataclass(frozen=True)
class Emitted:
    engine: str
    version: str
    command: tuple[str, ...]  # as shardwise prints it, with the multi-node placeholders filled in
    argv: tuple[str, ...]  # after the launcher, the model replaced by its bundled folder

    @property
    def text(self) -> str:
        return " ".join(self.command)


def oracle_python(engine: str, version: str) -> Path:
    return ENGINES_DIR / ORACLES[(engine, version)][0] / "bin" / "python"


def _filled(token: str) -> str:
    """A ${NAME:?…} / ${NAME:-default} placeholder as the shell expands it with HEAD set."""

    def value(m: re.Match[str]) -> str:
        name, op, rest = m.group(1), m.group(2), m.group(3) or ""
        return HEAD.get(name) or (rest if op == ":-" else name)

    return re.sub(r"\$\{(\w+)(:[-?])?([^}]*)\}", value, token)


def _argv(engine: str, command: list[str], model_dir: Path) -> tuple[str, ...]:
    """The flags as the engine gets them, the model replaced by its bundled folder. That folder holds config.json
    alone, not the checkpoint's own code, so --trust-remote-code is left out: the engines then read the config with
    their own classes (SGLang's KimiK25Config, vLLM's registry), as they do for these architectures anyway."""
    argv = split_command(command).argv
    out = [a for a in argv if a != "--trust-remote-code"]
    if engine == "vllm":  # `vllm serve MODEL …`: the model is the first positional
        out[0] = str(model_dir)
    else:
        i = out.index(flag_table(engine).model_flag)
        out[i + 1] = str(model_dir)
    return tuple(out)


def emitted(model_name: str, cluster_name: str, engine: str, version: str) -> list[Emitted]:
    """theorise's commands for one engine version, each once."""
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    result = search(model, cluster, model_ref=model_name, engines=[engine], isl=1024, osl=1024, concurrency=[1],
                    version=version)  # fmt: skip
    commands = [list(cmd) for c in result.candidates for cmd in c.launches]
    commands += [list(e.launch) for e in result.excluded]
    seen: dict[tuple[str, ...], Emitted] = {}
    for cmd in commands:
        filled = tuple(_filled(token) for token in cmd)
        if filled not in seen:
            seen[filled] = Emitted(engine, version, filled, _argv(engine, list(filled), MODELS / model_name))
    return list(seen.values())


def gpu_spec(cluster: ClusterSpec) -> dict[str, Any]:
    """The GPU as the engine's probes see it: name, memory nvidia-smi reports, capability, SMs, GPUs on this node,
    and how they are joined (NVLink or not, peer-to-peer on or off)."""
    gpu = cluster.gpu
    major, minor = (int(x) for x in gpu.compute_capability.value.split("."))
    if gpu.sm_count is None:
        raise ValueError(f"{gpu.name} has no sm_count: the engines read it (add it to its profile, with a source)")
    return {"name": gpu.display_name, "memory_mib": round(gpu.memory_bytes / 2**20), "count": cluster.gpus_per_node,
            "capability": [major, minor], "sm_count": int(gpu.sm_count.value),
            "nvlink": cluster.intra.link.kind == "nvlink", "p2p": cluster.intra.p2p}  # fmt: skip


def memory_inputs(checked: Checked, cluster: ClusterSpec) -> dict[str, Any] | None:
    """What the engine would measure on the GPU while it starts, as shardwise estimates it (per GPU, bytes), for the
    oracle to fake so that the engine sizes its KV pool with its own code: the memory free before the weights load
    (SGLang sizes from it), the weights of each pipeline stage, and what vLLM's profiling would find beyond them
    (non-torch memory, the activation peak, CUDA graphs). What the engine reserves by its own rules (SGLang's
    multimodal cache) it subtracts itself. The pool compared is then the engine's arithmetic, cell size, layer split
    and rounding on shardwise's estimates. None where shardwise has no layout for the command."""
    layout = checked.setup.layout
    if layout is None:
        return None
    ledger = memory_ledger(checked.model, layout, cluster)
    outside = runtime_bytes(layout, cluster)  # CUDA context, communicators: in use before the weights load
    return {"capacity_bytes": round(ledger.capacity_bytes), "free_before_load_bytes": round(ledger.capacity_bytes
            - outside), "weights_bytes": [round(w) for w in ledger.stage_weights_bytes],
            "non_torch_bytes": round(outside), "activation_peak_bytes": round(ledger.activation_bytes),
            "cuda_graph_bytes": round(ledger.cuda_graph_bytes)}  # fmt: skip


def ask(engine: str, version: str, items: list[tuple[Emitted, ClusterSpec]]) -> list[dict[str, Any]]:
    """The engine's own answer for each command, from one oracle process: ok, or how it refused (its stage, the
    exception and message), or that the oracle itself crashed; the resolved configuration; and the KV pool the
    engine sizes from shardwise's memory estimates (`memory_inputs`)."""
    python = oracle_python(engine, version)
    script = ROOT / "conformance" / ORACLES[(engine, version)][1]
    requests = [_request(e, c) for e, c in items]
    batch = "".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in requests)
    done = subprocess.run([str(python), str(script)], input=batch, capture_output=True, text=True, check=False,
                          timeout=6 * 3600)  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(lines) != len(items):
        raise RuntimeError(f"the {engine} {version} oracle answered {len(lines)} of {len(items)}: "
                           f"{done.stderr[-2000:]}")  # fmt: skip
    return lines


def _request(e: Emitted, cluster: ClusterSpec) -> dict[str, Any]:
    """One command for the oracle: with shardwise's memory figures where it has a layout; where it refuses the command
    while the model is built (and so has none), asking the oracle to build the model all the same."""
    checked = shardwise_check(e, cluster)
    memory = memory_inputs(checked, cluster)
    build = memory is None and any(r.stage == "load" for r in checked.setup.rejections)
    return {"argv": list(e.argv), "gpu": gpu_spec(cluster), "memory": memory, "build": build or None}


def shardwise_check(e: Emitted, cluster: ClusterSpec) -> Checked:
    """What `shardwise check` makes of the same command: the setup and the model."""
    return check_command(list(e.command), cluster=cluster, version=e.version)


def shardwise_view(e: Emitted, cluster: ClusterSpec) -> Any:
    """The setup `shardwise check` makes of the same command."""
    return shardwise_check(e, cluster).setup
