"""The theorise report and the layouts list at the widths people read them at: piped into a file or a pager (no
terminal: 80 columns) and a 100-column terminal. In the report every line fits, every figure of the ranked table and
every word of a setup's name is whole, and the commands to start it paste back into the very commands the search
chose; in the layouts list every cell is whole, so each row's flags paste back into its launch command."""

import json
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


def _report(columns: int | None, command: tuple[str, ...] = ("theorise",)) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    run = subprocess.run([sys.executable, "-m", "shardwise", *command], capture_output=True, text=True, env=env,
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


def _cells(line: str, bar: str) -> list[str]:
    parts = line.split(bar)
    return parts[1:-1] if line.startswith(bar) else parts  # with or without the table's outer edge


def _table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """A printed table's header and rows, each cell's lines joined by spaces (a cell wrapped inside a word would
    come back with a space in it)."""
    top = next(i for i, line in enumerate(lines) if "┃" in line)
    rule = next(i for i in range(top, len(lines)) if "╇" in lines[i])
    header = [_cells(line, "┃") for line in lines[top:rule]]
    rows: list[list[list[str]]] = []
    for line in lines[rule + 1 :]:
        if "│" not in line:
            break
        cells = _cells(line, "│")
        if cells[0].strip():
            rows.append([[] for _ in cells])
        for parts, cell in zip(rows[-1], cells, strict=True):
            parts += [cell.strip()] if cell.strip() else []
    return [" ".join(c.strip() for c in col if c.strip()) for col in zip(*header, strict=True)], [
        [" ".join(parts) for parts in row] for row in rows
    ]


@pytest.mark.parametrize("columns", [None, 100])
@pytest.mark.parametrize("args", [(), ("--all",), ("--framework", "vllm", "--all")])
def test_the_layouts_list_keeps_every_cell_whole(columns, args):
    text = _report(columns, ("layouts", *args))
    expected = json.loads(_report(columns, ("layouts", *args, "--json")))
    lines = text.splitlines()
    assert "…" not in text
    start = next(i for i, line in enumerate(lines) if line.startswith("launch: "))
    end = next(i for i, line in enumerate(lines) if "┃" in line or line.startswith("┏"))  # the table's first line
    head, tail = " ".join(lines[start:end]).removeprefix("launch: ").split(" FLAGS ")
    header, rows = _table(lines)
    assert header[:4] == ["#", "layout", "memory", "KV tokens"] and header[-1] == "flags"
    assert len(rows) == len(expected) > 0
    for row, want in zip(rows, expected, strict=True):
        assert row[1] == want["layout"]["description"] and row[header.index("memory")] == want["verdict"]
        assert shlex.split(f"{head} {row[-1]} {tail}") == shlex.split(want["launch_command"]), row[-1]


def test_catalog_tables_keep_names_whole_when_wider_than_the_console():
    """Rich, left to itself, narrows a table's widest column below its longest name (`rtx-pro-6…`)."""
    for command, field in (("gpus", "name"), ("models", "repo")):
        text = _report(None, (command,))
        names = [row[field] for row in json.loads(_report(None, (command, "--json")))]
        assert "…" not in text and all(re.search(rf"(^|\s){re.escape(n)}(\s|$)", text, re.M) for n in names), command
