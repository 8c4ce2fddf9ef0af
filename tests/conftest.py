import json
from pathlib import Path

import pytest


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a config.json (a dict, or raw text) into a fresh folder and return its path."""

    def write(content, name: str = "config.json") -> Path:
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return write


@pytest.fixture
def odd_kv_model(write_config) -> str:
    """A small Llama-shaped model whose 4 KV heads split over 4 GPUs but neither split nor replicate onto 6."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 1536,
        "vocab_size": 1000,
    }
    return str(write_config(cfg))
