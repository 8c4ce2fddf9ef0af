"""The theorise report at the widths people read it at: piped into a file or a pager (no terminal: 80 columns)
and a 100-column terminal. Every line fits, every figure of the ranked table and every word of a setup's name
is whole, and the commands to start it paste back into the very commands the search chose."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from shardwise import theorise


@pytest.fixture(scope="module")
def theory():
    return theorise()


def _report(columns: int | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    run = subprocess.run([sys.executable, "-m", "shardwise", "theorise"], capture_output=True, text=True, env=env,
                         timeout=300, check=True)  # fmt: skip
    return run.stdout


@pytest.mark.parametrize(("columns", "width"), [(None, 80), (100, 100)])
def test_the_report_fits_and_keeps_every_figure_whole(theory, columns, width):
    text = _report(columns)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # nothing cut short
    words = set(re.split(r"[\s│┃]+", text))
    for s in theory.ranking.scores[:10]:
        assert f"{s.value:,.0f}" in words, s.candidate.name
        for word in s.candidate.name.replace(",", " ").split():
            assert word in words or word + "," in words, (word, s.candidate.name)
    # the commands, wrapped with continuations, are the commands the search chose
    start = lines.index("Start it and check it:")
    joined = "\n".join(line.strip() for line in lines[start + 1 :]).replace(" \\\n", " ")
    commands = [shlex.split(line) for line in joined.splitlines()]
    assert commands == [list(cmd) for cmd in theory.verify]
