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
