"""Speculative decoding: what one engine step runs, and how many tokens it keeps.

One step drafts, verifies and keeps the accepted prefix plus one token of the target's own:
- EAGLE / NEXTN (MTP), EAGLE3, STANDALONE with n steps and top-k k: n − 1 draft forwards of k tokens per
  request (the first draft token comes from the previous step's extend), the target verifies
  `num_draft_tokens`, then the draft re-reads the n + 1 newest tokens in one extend forward
  (sglang speculative/eagle_worker.py: draft_forward, verify, forward_draft_extend_after_decode).
- DFLASH: one drafter forward over the whole block, the target verifies the block
  (sglang speculative/dflash_worker.py).
- NGRAM: drafts come from a lookup on the host; the target verifies `num_draft_tokens`.
The mean accepted length τ (tokens kept per step, the target's own token included) is a property of the
model pair and the text, not of the hardware: the user gives it, or a per-position acceptance rate α, from
which τ = (1 − α^(d+1)) / (1 − α) for a chain of d drafted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.engines.layout import SpecDecode
from shardwise.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class DraftPass:
    tokens_per_request: int  # new tokens each request carries through the drafter in this forward
    count: int  # forwards of this shape per step


@dataclass(frozen=True, kw_only=True)
class SpecPlan:
    algorithm: str
    passes: tuple[DraftPass, ...]  # drafter forwards of one step
    verify_tokens: int  # tokens per request the target checks
    drafted: int  # tokens drafted along the accepted path: the most a step can keep is drafted + 1

    @property
    def needs_drafter(self) -> bool:
        return bool(self.passes)


def spec_plan(spec: SpecDecode, *, block_size: int | None = None) -> SpecPlan:
    """The forwards of one speculative step as `spec` configures them."""
    name = spec.algorithm.upper()
    if spec.kind == "block":
        block = spec.num_draft_tokens or block_size
        if not block:
            raise SpecError(f"{name} drafting needs its block size: give --speculative-dflash-block-size")
        return SpecPlan(
            algorithm=name,
            passes=(DraftPass(tokens_per_request=block, count=1),),
            verify_tokens=block,
            drafted=block - 1,
        )
    if spec.kind == "lookup":
        drafted = spec.num_draft_tokens or 0
        if drafted < 1:
            raise SpecError("NGRAM drafting needs --speculative-num-draft-tokens")
        return SpecPlan(algorithm=name, passes=(), verify_tokens=drafted, drafted=drafted - 1)
    if spec.kind in ("eagle", "draft_model"):
        steps, topk = spec.num_steps or 0, spec.topk or 1
        if steps < 1:
            raise SpecError(f"{name} drafting needs --speculative-num-steps (1 or more)")
        verify = spec.num_draft_tokens or steps + 1
        passes = [DraftPass(tokens_per_request=steps + 1, count=1)]  # the extend over the newest tokens
        if steps > 1:
            passes.insert(0, DraftPass(tokens_per_request=topk, count=steps - 1))
        return SpecPlan(algorithm=name, passes=tuple(passes), verify_tokens=verify, drafted=steps)
    raise SpecError(
        f"speculative algorithm {spec.algorithm!r} is not modelled; "
        "modelled: chains drafted by EAGLE heads, MTP layers or a draft model; DFlash blocks; n-gram lookup"
    )


def accept_length_from_rate(rate: float, drafted: int) -> float:
    """Mean tokens kept per step when each drafted token is accepted with probability `rate`, independently,
    until the first rejection: 1 + α + α² + … + α^d."""
    if not 0 <= rate <= 1:
        raise SpecError(f"an acceptance rate is a probability between 0 and 1; got {rate}")
    return float(sum(rate**i for i in range(drafted + 1)))


def check_accept_length(length: float, plan: SpecPlan) -> float:
    """A mean accepted length is at least 1 (the target's own token) and at most drafted + 1."""
    if not 1 <= length <= plan.drafted + 1:
        raise SpecError(
            f"a mean accepted length of {length} is impossible for {plan.algorithm} drafting {plan.drafted} "
            f"tokens: give a value from 1 to {plan.drafted + 1}"
        )
    return length
