"""SGLang's hybrid sliding-window memory: which models keep their sliding-window layers' tokens in a pool of their own,
how large that pool is beside the full layers' pool, and how many of its tokens one request keeps.

SGLang 0.5.23 sizes two pools for such a model (model_executor/pool_configurator.py HybridSWAPoolConfigurator): the
full-attention layers' pool of max_total_num_tokens, and the sliding-window layers' pool of swa_full_tokens_ratio × as
many. A request holds every one of its tokens in the first; in the second, its window and what has passed out of it
since the scheduler last freed (managers/schedule_batch.py maybe_evict_swa). The facts are in
data/engines/sglang_swa.yaml; the ledger (cost/memory.py) sizes both pools from the `WindowPool` made here.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field

from shardwise.engines.layout import WindowPool
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate
from shardwise.spec.model import ModelSpec


class SwaArchitecture(Frozen):
    window_offset_tokens: int = Field(0, description="the window SGLang's model class reports less the config's")
    source: str


class SwaTable(Frozen):
    architectures: dict[str, SwaArchitecture] = Field(description="architectures SGLang gives the two pools")
    eviction_interval_tokens: int = Field(ge=1, description="tokens past the window before the scheduler frees them")


@cache
def swa_table() -> SwaTable:
    path = Path(str(resources.files("shardwise") / "data" / "engines" / "sglang_swa.yaml"))
    return validate(SwaTable, read_yaml(path), origin=str(path))


def window_pool(f: dict[str, Any], model: ModelSpec) -> WindowPool | None:
    """The sliding-window pool SGLang gives this configuration, or None where every layer keeps its tokens in one
    pool: an architecture SGLang does not split (is_hybrid_swa_model, asked of the checkpoint's architectures, the
    multimodal wrapper's first), a model without sliding-window layers, or --disable-hybrid-swa-memory."""
    arch = swa_table().architectures.get(model.wrapper_architecture or model.architecture)
    sliding = model.sliding_window and "sliding" in model.layer_attention
    if arch is None or not sliding or f.get("disable_hybrid_swa_memory"):
        return None
    window = model.sliding_window + arch.window_offset_tokens
    return WindowPool(
        full_tokens_ratio=f["swa_full_tokens_ratio"], window_tokens=window, kept_tokens=kept_tokens(f, window=window)
    )


def kept_tokens(f: dict[str, Any], *, window: int) -> int:
    """Sliding-window tokens one running request keeps at most: its window, the eviction interval's tokens (per
    draft token) that pass out of it before they are freed, a page of alignment and what one decode step allocates
    (pool_configurator.py compute_swa_request_cap, the engine's own worst case per request)."""
    page = f["page_size"] or 1
    draft = f.get("speculative_num_draft_tokens") or 1
    return window + swa_table().eviction_interval_tokens * draft + page + _decode_step_tokens(f, page)


def _decode_step_tokens(f: dict[str, Any], page: int) -> int:
    """KV tokens one decode step allocates per request: a page, or with speculative decoding (which runs without the
    overlap scheduler here) the larger of the draft tree and the verified tokens, page-aligned
    (utils/common.py spec_decode_alloc_len_per_request)."""
    if not f.get("speculative_algorithm"):
        return page
    steps, topk = f.get("speculative_num_steps") or 1, f.get("speculative_eagle_topk") or 1
    draft = f.get("speculative_num_draft_tokens") or 1
    if page > 1:
        steps = -(-(steps + (page if topk > 1 else 0)) // page) * page
        draft = -(-draft // page) * page
    return max(steps * topk, draft)
