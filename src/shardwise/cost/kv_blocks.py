"""How a KV pool's bytes become blocks, and how the blocks are shared out, where the engine sizes them its own way.

vLLM (v1/core/kv_cache_planning.py) puts a hybrid model's layers in KV-cache groups of equal size, one attention
type each (_get_kv_cache_groups_uniform_page_size), and backs a stage with one tensor per slot, shared by one layer of
every group (get_kv_cache_config_from_groups): a block costs the largest group's layers on the stage
(_get_kv_cache_bytes_per_block), and each group of a request takes its own blocks from the one pool
(get_max_concurrency_for_kv_cache_config). With the extensible cache (0.34) each tensor is mapped in whole granules
(v1/worker/extensible_kv_cache.py ExtensibleKVCache.blocks_within).
"""

from __future__ import annotations

import math
from functools import cache

from shardwise.engines.layout import Layout
from shardwise.spec.model import ModelSpec

KvGroups = tuple[tuple[str, tuple[int, ...]], ...]  # (attention kind, layer indices) of each group


def grouped(model: ModelSpec, layout: Layout) -> bool:
    """Whether the engine keeps sliding-window and full-attention layers in KV groups of their own (vLLM's hybrid KV
    cache manager; off with --disable-hybrid-kv-cache-manager, when every layer keeps every token in one group)."""
    return layout.options.window_kv and "sliding" in model.layer_attention and "linear" not in model.layer_attention


@cache
def kv_groups(kinds: tuple[str, ...]) -> KvGroups:
    """vLLM's KV-cache groups of a model whose layers are `kinds` (kv_cache_planning.py
    _get_kv_cache_groups_uniform_page_size): the layers of each attention type, in the order the types first appear,
    split into groups of one size, the fewest layers of any type (or the most, where that is under 1.5 × the
    fewest); of n groups of a type, the i-th takes its layers i::n."""
    by_kind: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        if kind != "linear":
            by_kind.setdefault(kind, []).append(i)
    sizes = [len(layers) for layers in by_kind.values()]
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    out = []
    for kind, layers in by_kind.items():
        n = -(-len(layers) // size)
        out += [(kind, tuple(layers[i::n])) for i in range(n)]
    return tuple(out)


def stage_tensors(model: ModelSpec, layout: Layout, layers: range) -> int:
    """KV-cache tensors on one GPU of the stage holding `layers`: one per caching layer, or, where the layers are
    grouped, one per slot shared by a layer of every group: the most layers any group has on the stage."""
    kinds = model.layer_attention[layers.start : layers.stop : layers.step]
    if not grouped(model, layout):
        return len(kinds) - kinds.count("linear")
    return max(sum(i in layers for i in group) for _, group in kv_groups(model.layer_attention))


def request_groups(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """The groups each request takes blocks in: (those whose layers keep every token, those of sliding-window
    layers); (1, 0) where every layer keeps every token in one group."""
    if not grouped(model, layout):
        return 1, 0
    kinds = [kind for kind, _ in kv_groups(model.layer_attention)]
    return kinds.count("full"), kinds.count("sliding")


def stage_blocks(
    pool_bytes: float,
    *,
    cell_bytes: float,
    tensors: int,
    page: int,
    granule_bytes: int | None,
    index: tuple[int, float] = (0, 0.0),
) -> int:
    """Blocks of `page` tokens a stage's pool of `pool_bytes` holds at `cell_bytes` a token: whole blocks, or, where
    each of its KV tensors is mapped in whole granules, the most blocks whose tensors' granules fit
    (ExtensibleKVCache.physical_bytes_for: each segment's blocks × stride rounded up to granules). The `tensors`
    attention tensors have one stride, so they cross granule boundaries together and each gets
    ⌊pool / tensors / granule⌋ granules; `index` (tensors, bytes a token each) are the sparse-attention indexer's
    caches, layers of their own with a narrower stride (cell_bytes holds their bytes too)."""
    if pool_bytes <= 0 or cell_bytes <= 0:
        return 0
    if granule_bytes is None:
        return int(pool_bytes // cell_bytes) // page
    keys, key_bytes = index
    if not keys:
        stride = page * cell_bytes / tensors  # one tensor's bytes per block
        granules = pool_bytes // (tensors * granule_bytes)
        return int(granules * granule_bytes // stride)
    kinds = ((tensors, (cell_bytes - keys * key_bytes) / tensors), (keys, key_bytes))
    blocks = int(pool_bytes // (page * cell_bytes))  # the most without rounding; each tensor rounds up from there

    def mapped(n: int) -> float:
        return sum(count * math.ceil(n * page * each / granule_bytes) * granule_bytes for count, each in kinds)

    while blocks > 0 and mapped(blocks) > pool_bytes:
        blocks -= 1
    return blocks
