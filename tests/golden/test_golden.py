"""Every figure `theorise`, `check`, `simulate` and `validate` print on the golden cases, byte for byte as recorded
(`golden.py` says how to record them again when a change moves figures on purpose)."""

import difflib

import pytest
from golden import CASES, DATA, render, render_validate


def _same(files: dict[str, str]) -> None:
    for name, text in files.items():
        kept = (DATA / name).read_text(encoding="utf-8")
        if text != kept:
            diff = difflib.unified_diff(kept.splitlines(), text.splitlines(), f"kept {name}", "now", n=2, lineterm="")
            pytest.fail(f"{name} moved:\n" + "\n".join(list(diff)[:60]))


@pytest.mark.parametrize("case", CASES)
def test_the_figures_of_each_case_are_as_kept(case):
    _same(render(case))


def test_validate_is_as_kept():
    _same(render_validate())
