import pytest

from shardwise.engines import base
from shardwise.engines.base import engine_names, get_engine, register_engine
from shardwise.errors import SpecError


def test_builtins_are_registered_with_their_capabilities():
    assert {"sglang", "vllm"} <= set(engine_names())
    sglang = get_engine("sglang")
    assert sglang.supports_expert_parallel and sglang.supports_attention_dp and sglang.kv_budget == "of_total"


def test_a_new_engine_registers_the_same_way(monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # leave the real registry as it was

    @register_engine("toy-engine")
    class Toy:
        supports_expert_parallel = False

    assert isinstance(get_engine("toy-engine"), Toy) and "toy-engine" in engine_names()


def test_unknown_engine():
    with pytest.raises(SpecError, match="unknown engine 'tgi'"):
        get_engine("tgi")
