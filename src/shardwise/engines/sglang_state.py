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
    spec_joint: bool = Field(description="K solved with speculative decoding's scratch states (else reserved first)")
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


_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # --mamba-ssm-dtype's choices


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
    # the strategy is resolved with the model's adjustments, before PP turns the overlap scheduler off (0.5.14
    # server_args.py __post_init__: _handle_model_specific_adjustments, then _handle_pipeline_parallelism; 0.5.23
    # arg_groups/pipeline.py run_resolution_pipeline: handle_model_specific_adjustments, then
    # _pipeline_parallel_overlap_disable); the slots it tracks follow the scheduler that runs
    wanted = not f.get("disable_overlap_schedule")
    overlap = wanted and f["pp_size"] == 1
    strategy = f.get("mamba_radix_cache_strategy") or "auto"
    if strategy == "auto":  # extra_buffer where the model and the triton backend support it, else no_buffer
        supported = arch in release.extra_buffer_architectures and f.get("linear_attn_backend", "triton") == "triton"
        strategy = "extra_buffer" if supported and (wanted or (f["page_size"] or 1) > 1) else "no_buffer"
        no_overlap = strategy == "no_buffer"  # which turns the overlap scheduler off
    else:
        no_overlap = False
    spec = bool(f.get("speculative_algorithm"))
    # before 0.5.14 speculative decoding under no_buffer runs without the radix cache (0.5.9 server_args.py
    # _handle_mamba_radix_cache): a slot per running request
    radix_off = f.get("disable_radix_cache") or (spec and strategy == "no_buffer" and not release.spec_joint)
    if radix_off:
        slots = 1
    elif strategy == "extra_buffer_lazy":
        slots = table.base_slots + 1
    elif strategy == "extra_buffer":
        slots = table.base_slots + table.tracking_slots["overlap" if overlap else "no_overlap"]
    else:
        slots = table.base_slots
    no_overlap = no_overlap and not radix_off
    # under PP every rank charges the fullest stage's share of the linear layers (_handle_max_mamba_cache)
    linear = [i for i, kind in enumerate(model.layer_attention) if kind == "linear"]
    stages = stage_layers(model.num_layers, f["pp_size"], "last")
    fullest = max(sum(i in r for i in linear) for r in stages)
    attn_tp = f["tp_size"] // f["attn_dp_size"] // f["attn_cp_size"]
    # the recurrent state's dtype: the flag's, else the config's, else FP32 (configs/mamba_utils.py mamba2_state_dtype)
    given = f.get("mamba_ssm_dtype")
    ssm = _DTYPES[given] if given else model.linear_attention.ssm_dtype or table.ssm_dtype
    # a GPU's whole-model state, scaled by the fullest stage's share in floating point and truncated, as SGLang does
    whole = model.with_overrides(ssm_dtype=ssm).linear_state_bytes_of(len(linear)) / attn_tp
    state = float(int(whole * (fullest / max(len(linear), 1))))
    dp, running = f["attn_dp_size"], f.get("max_running_requests")
    fixed, ratio = f.get("max_mamba_cache_size"), f.get("mamba_full_memory_ratio")
    if fixed is None and radix_off and running:
        fixed = running  # one slot per running request, as many as it allows (_handle_max_mamba_cache)
    draft = f.get("speculative_num_draft_tokens") or 0 if spec else 0
    pool = StatePool(
        state_bytes=state,
        ssm_dtype=ssm,
        memory_ratio=table.memory_ratio if ratio is None else max(0.0, ratio),
        slots_per_request=slots,
        padding_slots=release.padding_slots,
        fixed_slots=max(0, fixed // dp) if fixed is not None else None,
        draft_tokens=draft,
        reserve_requests=max(1, running // dp) if draft and running else 0,
        spec_joint=release.spec_joint,
    )
    return pool, no_overlap
