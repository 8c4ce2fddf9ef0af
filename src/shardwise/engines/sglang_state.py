"""SGLang's pool of recurrent states for linear-attention layers (its "mamba" pool), beside the KV pool.

A hybrid model (Qwen3-Next, Qwen3.5: Gated DeltaNet layers beside full-attention layers) keeps one fixed-size state
per request in each linear-attention layer. SGLang gives the states a pool of their own, sized from the memory left
for both pools: K state slots fill ratio / (1 + ratio) of it (--mamba-full-memory-ratio, 0.9 unset), the KV pool the
rest (mem_cache/kv_cache_configurator.py _handle_max_mamba_cache), and each running request holds a few slots (the
"mamba ratio": its own, and with the radix cache those the cache tracks), so K over that caps the running requests
(resolve_max_num_reqs). The facts, by release, are in data/engines/sglang_state.yaml; the ledger
(cost/memory.py) sizes both pools from the `StatePool` made here.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.version import Version
from pydantic import Field

from shardwise.engines.layout import StatePool, stage_layers
from shardwise.frozen import Frozen
from shardwise.hardware.load import read_yaml, validate
from shardwise.spec.model import ModelSpec


class StateRelease(Frozen):
    since: str
    padding_slots: int = Field(ge=0, description="slots the pool holds besides K")
    extra_buffer_architectures: tuple[str, ...] = Field(
        description="architectures whose radix cache resolves to the extra_buffer strategy unset (with the overlap "
        "scheduler and the triton linear-attention backend); the others take no_buffer, which turns the overlap "
        "scheduler off"
    )
    source: str


class StateTable(Frozen):
    architectures: tuple[str, ...] = Field(description="the hybrid architectures SGLang gives a mamba pool")
    memory_ratio: float = Field(gt=0, description="--mamba-full-memory-ratio unset")
    ssm_dtype: str = Field(description="the recurrent state's dtype where the config names none")
    base_slots: int = Field(ge=1, description="slots per running request with the radix cache")
    tracking_slots: dict[str, int] = Field(description="extra_buffer's added slots, with and without overlap")
    releases: tuple[StateRelease, ...]

    def release(self, version: Version) -> StateRelease | None:
        held = [r for r in self.releases if Version(r.since) <= version]
        return held[-1] if held else None


@cache
def state_table() -> StateTable:
    path = Path(str(resources.files("shardwise") / "data" / "engines" / "sglang_state.yaml"))
    return validate(StateTable, read_yaml(path), origin=str(path))


def state_pool(f: dict[str, Any], model: ModelSpec, version: Version) -> tuple[StatePool | None, bool]:
    """The state pool SGLang gives this configuration (None for a model without linear-attention layers, or an
    architecture or release not read), and whether its radix-cache strategy turns the overlap scheduler off
    (no_buffer: arg_groups/overrides.py _mamba_radix_cache_resolution)."""
    table = state_table()
    arch = model.wrapper_architecture or model.architecture
    release = table.release(version)
    if model.linear_attention is None or arch not in table.architectures or release is None:
        return None, False
    overlap = not f.get("disable_overlap_schedule") and f["pp_size"] == 1
    if f.get("disable_radix_cache"):
        slots, no_overlap = 1, False
    elif arch in release.extra_buffer_architectures and (overlap or (f["page_size"] or 1) > 1):
        slots, no_overlap = table.base_slots + table.tracking_slots["overlap" if overlap else "no_overlap"], False
    else:
        slots, no_overlap = table.base_slots, True
    # under PP every rank charges the fullest stage's share of the linear layers (_handle_max_mamba_cache)
    linear = [i for i, kind in enumerate(model.layer_attention) if kind == "linear"]
    stages = stage_layers(model.num_layers, f["pp_size"], "last")
    fullest = max(sum(i in r for i in linear) for r in stages)
    attn_tp = f["tp_size"] // f["attn_dp_size"] // f["attn_cp_size"]
    state = model.linear_state_bytes_as(table.ssm_dtype, layers=fullest) / attn_tp
    fixed = f.get("max_mamba_cache_size")
    pool = StatePool(
        state_bytes=state,
        memory_ratio=f.get("mamba_full_memory_ratio") or table.memory_ratio,
        slots_per_request=slots,
        padding_slots=release.padding_slots,
        fixed_slots=max(1, fixed // f["attn_dp_size"]) if fixed else None,
    )
    return pool, no_overlap
