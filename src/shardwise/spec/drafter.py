"""Draft models of speculative decoding, as specs: a drafter checkpoint, or the target's own MTP layers.

A drafter is priced like any model (its layers, its lm_head); what it adds is the block it drafts at once
(DFlash's `block_size`, read from its config.json). MTP drafting runs the checkpoint's next-token-prediction
layer, a decoder layer shaped like the target's last one that shares the target's embedding and lm_head.
"""

from __future__ import annotations

from pydantic import Field

from shardwise.frozen import Frozen
from shardwise.spec.catalog import find_by_repo, resolve_config
from shardwise.spec.hf_config import model_from_config
from shardwise.spec.model import ModelSpec


class Drafter(Frozen):
    model: ModelSpec
    block_size: int | None = Field(None, description="tokens drafted in one forward (block-diffusion drafters)")


def load_drafter(ref: str) -> Drafter:
    """The drafter a launch command names (path, bundled alias or Hub id; a bundled checkpoint's repo id finds
    its bundled config)."""
    entry = find_by_repo(ref)
    name, config = resolve_config(entry.alias if entry else ref)
    block = config.get("block_size")
    return Drafter(model=model_from_config(config, name=name), block_size=int(block) if block else None)


def mtp_drafter(model: ModelSpec) -> Drafter:
    """The target's own MTP layer as a one-layer model (DeepSeek-style checkpoints: num_nextn_predict_layers)."""
    update = {
        "name": f"{model.name} MTP layer",
        "num_layers": 1,
        "layer_attention": model.layer_attention[-1:],
        "layer_mlp": model.layer_mlp[-1:],
        "num_mtp_layers": 0,
        "vision": None,
    }
    return Drafter(model=model.model_copy(update=update))


def drafter_block(ref: str | None) -> int | None:
    """The block size of the drafter a launch command names, if it drafts in blocks."""
    return load_drafter(ref).block_size if ref else None
