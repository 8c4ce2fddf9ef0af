def test_a_command_without_its_speculative_options():
    from shardwise.engines.check import without_speculative

    sglang = (
        "python -m sglang.launch_server --model-path m --speculative-algorithm DFLASH --tp 8 "
        "--speculative-draft-model-path=z/d --speculative-num-steps 3"
    )
    assert without_speculative(sglang) == ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8"]
    vllm = ["vllm", "serve", "m", "--speculative-config", '{"method": "ngram"}', "-tp", "2"]
    assert without_speculative(vllm) == ["vllm", "serve", "m", "-tp", "2"]


def test_chunked_prefill_off_and_the_prefill_budget():
    """--chunked-prefill-size -1 turns chunking off (scheduler.py init_chunked_prefill), so --enable-mixed-chunk has
    nothing to mix (is_mixed_chunk needs a chunk) and every prompt after a batch's first must fit the prefill budget
    whole; --max-prefill-tokens reaches the scheduler as given, 16,384 unset; chunked, the whole-prompt test holds
    before 0.5.13 only."""
    from shardwise.engines.check import check_command
    from shardwise.spec.cluster import load_cluster

    box = load_cluster("1xh100")
    base = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --enable-mixed-chunk "

    def options(flags: str, version: str = "0.5.23"):
        return check_command(base + flags, cluster=box, version=version).setup.layout.options

    off = options("--chunked-prefill-size -1 --max-prefill-tokens 4096")
    assert off.chunked_prefill_tokens is None and off.prefill_plan_tokens == 4096
    assert (off.scheduler.mixed_batches, off.scheduler.max_prefill_tokens, off.scheduler.whole_prompts) == (
        False, 4096, True)  # fmt: skip
    on = options("")
    assert on.chunked_prefill_tokens == 8192 and on.prefill_plan_tokens == 8192
    assert (on.scheduler.mixed_batches, on.scheduler.max_prefill_tokens, on.scheduler.whole_prompts) == (
        True, 16384, False)  # fmt: skip
    assert options("", "0.5.12").scheduler.whole_prompts


def test_an_option_set_apart_from_its_default_is_told_by_value_and_type():
    """A partly modelled option is listed where a command sets it: an int set to 0 is set (0 == False in Python, so
    comparing by value alone would drop it), a switch left off and the default itself are not."""
    from shardwise.engines.flags import Option, _set_apart_from_default

    count = Option(flags=("--n",), type="int", default=16384)
    switch = Option(flags=("--x",), type="bool", default=False)
    assert _set_apart_from_default(count, 0) and _set_apart_from_default(count, 1)
    assert not _set_apart_from_default(count, 16384) and not _set_apart_from_default(count, None)
    assert _set_apart_from_default(switch, True) and not _set_apart_from_default(switch, False)
    fraction = Option(flags=("--f",), type="float", default=1)  # a float option with an int default: the same number
    assert not _set_apart_from_default(fraction, 1.0) and _set_apart_from_default(fraction, 0.5)
