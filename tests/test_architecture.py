"""The package's shape: the public API, and layers that import only downwards (import-linter contract)."""

import subprocess
import sys
from pathlib import Path

import shardwise

ROOT = Path(__file__).resolve().parents[1]


def test_public_api_names_exist():
    for name in shardwise.__all__:
        assert hasattr(shardwise, name), name


def test_layers_import_only_downwards():
    # import-linter is a test dependency; its console script sits beside this interpreter
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


LINTED = ("src", "tests", "benchmarks", "conformance")


def test_code_passes_the_linter_and_is_formatted():
    ruff = Path(sys.executable).with_name("ruff")
    for args in (["check", *LINTED], ["format", "--check", *LINTED]):
        result = subprocess.run([str(ruff), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
