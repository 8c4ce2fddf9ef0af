"""What one speculative step runs, and acceptance arithmetic, against hand counts."""

import pytest

from shardwise.engines.layout import SpecDecode
from shardwise.errors import SpecError
from shardwise.serve.speculative import DraftPass, accept_length_from_rate, check_accept_length, spec_plan


def test_eagle_chain_drafts_steps_minus_one_then_extends():
    """SGLang eagle_worker: 3 steps, top-k 1 → 2 draft forwards of 1 token (the first token came from the last
    extend), verify 4 tokens, extend the draft over the 4 newest tokens."""
    plan = spec_plan(SpecDecode(algorithm="EAGLE", kind="eagle", num_steps=3, topk=1, num_draft_tokens=4))
    assert plan.passes == (DraftPass(tokens_per_request=1, count=2), DraftPass(tokens_per_request=4, count=1))
    assert (plan.verify_tokens, plan.drafted) == (4, 3)


def test_dflash_drafts_a_block_in_one_forward():
    plan = spec_plan(SpecDecode(algorithm="DFLASH", kind="block", num_steps=1, topk=1), block_size=8)
    assert plan.passes == (DraftPass(tokens_per_request=8, count=1),)
    assert (plan.verify_tokens, plan.drafted) == (8, 7)


def test_ngram_has_no_drafter_forward():
    plan = spec_plan(SpecDecode(algorithm="NGRAM", kind="lookup", num_draft_tokens=8))
    assert plan.passes == () and not plan.needs_drafter and plan.verify_tokens == 8


def test_acceptance_rate_to_length_by_hand():
    assert accept_length_from_rate(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert accept_length_from_rate(1.0, 7) == 8
    assert accept_length_from_rate(0.0, 7) == 1


def test_impossible_acceptance_is_a_clear_error():
    plan = spec_plan(SpecDecode(algorithm="EAGLE", kind="eagle", num_steps=3, topk=1))
    assert check_accept_length(4.0, plan) == 4.0
    with pytest.raises(SpecError, match="from 1 to 4"):
        check_accept_length(4.5, plan)
    with pytest.raises(SpecError, match="between 0 and 1"):
        accept_length_from_rate(1.5, 3)
    with pytest.raises(SpecError, match="not modelled"):
        spec_plan(SpecDecode(algorithm="LOOKAHEAD"))
    with pytest.raises(SpecError, match="block size"):
        spec_plan(SpecDecode(algorithm="DFLASH", kind="block"))
