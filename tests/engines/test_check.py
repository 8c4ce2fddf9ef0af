def test_a_command_without_its_speculative_options():
    from shardwise.engines.check import without_speculative

    sglang = (
        "python -m sglang.launch_server --model-path m --speculative-algorithm DFLASH --tp 8 "
        "--speculative-draft-model-path=z/d --speculative-num-steps 3"
    )
    assert without_speculative(sglang) == ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8"]
    vllm = ["vllm", "serve", "m", "--speculative-config", '{"method": "ngram"}', "-tp", "2"]
    assert without_speculative(vllm) == ["vllm", "serve", "m", "-tp", "2"]
