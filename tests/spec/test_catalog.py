"""The bundled catalog and Hub loading (the Hub itself is replaced by a stand-in: tests run offline)."""

import huggingface_hub
import pytest

from shardwise import catalog, load_model
from shardwise.errors import SpecError
from shardwise.spec.catalog import find_by_repo

REQUIRED_ALIASES = {
    "kimi-k2.6",
    "kimi-k2.5",
    "kimi-k2-thinking",
    "kimi-k2-instruct",
    "deepseek-v3",
    "deepseek-r1",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "qwen3-next-80b-a3b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mixtral-8x7b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "glm-4.5",
    "minimax-m2",
}


def test_catalog_has_every_required_model_and_each_loads():
    entries = catalog()
    assert REQUIRED_ALIASES <= set(entries)
    for alias, entry in entries.items():
        assert entry.provenance in {"verbatim", "sibling", "derived", "reconstructed"}
        assert entry.source and "/" in entry.repo
        assert load_model(alias).name == alias


def test_a_renamed_hub_repo_finds_its_entry_under_either_name():
    assert find_by_repo("amd/DeepSeek-R1-0528-MXFP4").alias == "deepseek-r1-mxfp4"
    assert find_by_repo("AMD/DeepSeek-R1-0528-MXFP4-Preview").alias == "deepseek-r1-mxfp4"
    assert find_by_repo("nvidia/DeepSeek-R1-0528-FP4-V2").alias == "deepseek-r1-nvfp4"
    assert find_by_repo("amd/DeepSeek-R1-0528") is None


def test_no_bundled_model_falls_back_to_the_generic_reader():
    assert not [alias for alias in catalog() if load_model(alias).generic]


def test_hub_id_is_fetched_through_huggingface_hub(monkeypatch, write_config):
    path = write_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
        }
    )
    calls = []

    def fake_download(*, repo_id, filename):
        calls.append((repo_id, filename))
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert load_model("someorg/tiny-llama").name == "someorg/tiny-llama"
    assert load_model("Qwen/Qwen2.5-0.5B").name == "Qwen/Qwen2.5-0.5B"  # dots belong to the name
    assert calls == [("someorg/tiny-llama", "config.json"), ("Qwen/Qwen2.5-0.5B", "config.json")]


def test_hub_offline_is_one_clear_error(monkeypatch):
    def offline(**_):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline and not cached")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(SpecError, match="cannot fetch config.json of 'someorg/model'.*offline"):
        load_model("someorg/model")
