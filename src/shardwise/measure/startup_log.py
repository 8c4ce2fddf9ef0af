"""The memory an engine reports while it starts, read from its log.

SGLang 0.5.23 (sizes in GiB, printed as "GB": utils/common.py get_available_gpu_memory divides by 1 << 30):
- model_runner.py: "Load weight begin. avail mem=X GB" — free before any weight loads;
- model_runner.py: "Load weight end. … avail mem=X GB, mem usage=W GB." — the weights as loaded;
- mem_cache/memory_pool.py: "KV Cache is allocated. dtype: …, #tokens: N, KV size: K GB" (MLA) or
  "… K size: K GB, V size: V GB";
- model_runner_components/cuda_graph_setup.py: "Capture decode CUDA graph end. elapsed=…, mem usage=G GB, …".
vLLM 0.33 / 0.34 (GiB):
- v1/worker/gpu_model_runner.py: "Model loading took W GiB memory and … seconds";
- v1/worker/gpu_worker.py: "Available KV cache memory: K GiB";
- v1/core/kv_cache_utils.py: "GPU KV cache size: N tokens, Maximum concurrency …";
- v1/worker/gpu_model_runner.py: "Graph capturing finished in … secs, took G GiB".
Every rank prints its own lines; the first of each (rank 0, or the first to print) is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from shardwise.errors import SpecError

GiB = 2**30
_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
PATTERNS = {
    "sglang": {
        "free_before_weights": rf"Load weight begin\. avail mem={_NUMBER} GB",
        "weights": rf"Load weight end\..*?mem usage={_NUMBER} GB",
        "kv_tokens": rf"KV Cache is allocated\..*?#tokens: {_NUMBER}",
        "kv": rf"KV Cache is allocated\..*?KV size: {_NUMBER} GB",
        "k": rf"KV Cache is allocated\..*? K size: {_NUMBER} GB",
        "v": rf"KV Cache is allocated\..*? V size: {_NUMBER} GB",
        "graphs": rf"Capture (?:decode )?CUDA graph end\..*?mem usage={_NUMBER} GB",
    },
    "vllm": {
        "weights": rf"Model loading took {_NUMBER} GiB",
        "kv": rf"Available KV cache memory: {_NUMBER} GiB",
        "kv_tokens": rf"KV cache size: {_NUMBER} tokens",
        "graphs": rf"Graph capturing finished in .*?took {_NUMBER} GiB",
    },
}


@dataclass(frozen=True)
class StartupMemory:
    """What one start-up log says about memory, per GPU (bytes) and in tokens."""

    engine: str
    source: str
    free_before_weights_bytes: float | None
    weights_bytes: float | None
    kv_bytes: float | None
    kv_tokens: int | None
    graphs_bytes: float | None


def _first(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else None


def read_startup_log(path: Path) -> StartupMemory:
    """The memory lines of an SGLang or vLLM start-up log; which engine wrote it is read from the lines."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise SpecError(f"cannot read the start-up log {path}: {exc.strerror}") from exc
    readings = {
        engine: {name: _first(p, text) for name, p in patterns.items()} for engine, patterns in PATTERNS.items()
    }
    engine = next((e for e, f in readings.items() if f["kv_tokens"] is not None or f["weights"] is not None), None)
    if engine is None:
        raise SpecError(
            f"{path}: no memory lines of SGLang ('Load weight end', 'KV Cache is allocated') or vLLM ('Model "
            "loading took', 'Available KV cache memory'); give the log the server printed while it started"
        )
    found = readings[engine]
    kv = found.get("kv")
    if kv is None and found.get("k") is not None:
        kv = found["k"] + (found.get("v") or 0.0)
    scale = GiB
    return StartupMemory(
        engine=engine,
        source=path.name,
        free_before_weights_bytes=_scaled(found.get("free_before_weights"), scale),
        weights_bytes=_scaled(found["weights"], scale),
        kv_bytes=_scaled(kv, scale),
        kv_tokens=int(found["kv_tokens"]) if found["kv_tokens"] is not None else None,
        graphs_bytes=_scaled(found["graphs"], scale),
    )


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale
