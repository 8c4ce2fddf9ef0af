"""The help as people read it, at 80 and 120 columns: every command's description reads as whole sentences, its
lines broken where the width breaks them and nowhere else (rich keeps a docstring's own line breaks in the list of
commands unless the help is written to be reflowed)."""

import pytest
from typer.testing import CliRunner

from shardwise.cli import app

runner = CliRunner()


def _help(columns: int, *args: str) -> list[str]:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": str(columns), "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _commands(lines: list[str]) -> tuple[dict[str, list[str]], int]:
    """Each command's description lines in the Commands panel, and the width the panel gives them."""
    start = next(i for i, line in enumerate(lines) if "─ Commands ─" in line)
    panel = [line.rstrip()[1:-1] for line in lines[start + 1 :]]  # between the panel's borders
    panel = panel[: next(i for i, line in enumerate(lines[start + 1 :]) if line.startswith("╰"))]
    name, description = panel[0].split(maxsplit=1)
    column = panel[0].index(description)
    rows: dict[str, list[str]] = {}
    for line in panel:
        if line[:column].strip():
            name = line[:column].strip()
        rows.setdefault(name, []).append(line[column:].rstrip())
    return rows, len(panel[0]) - column - 1  # less the panel's padding


def _broken_by_hand(lines: list[str], width: int) -> list[tuple[str, str]]:
    """Lines ended before the next word had to go to the next line: where a docstring's own line break survived."""
    return [(line, after.split()[0]) for line, after in zip(lines, lines[1:], strict=False)
            if len(line) + 1 + len(after.split()[0]) <= width]  # fmt: skip


@pytest.mark.parametrize("columns", [80, 120])
def test_the_commands_are_described_in_whole_sentences(columns):
    rows, width = _commands(_help(columns))
    assert {"check", "layouts", "simulate", "theorise"} <= set(rows)
    for name, lines in rows.items():
        assert not _broken_by_hand(lines, width), name
        assert lines[-1].endswith((".", ")")), (name, lines[-1])  # the description is whole


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", sorted(c.name or c.callback.__name__ for c in app.registered_commands))
def test_each_command_s_own_help_reflows_too(command, columns):
    lines = _help(columns, command)
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 2
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    text = [line.rstrip()[1:] for line in lines[start:end] if line.strip()]  # one space of padding
    assert text and not _broken_by_hand(text, columns - 2), command


@pytest.mark.parametrize("command", sorted(c.name or c.callback.__name__ for c in app.registered_commands))
def test_every_option_s_help_is_printed_whole(command):
    """Rich reads square brackets as markup: an option's help with "[a, b]" in it loses those words unless escaped."""
    import typer.main

    click_command = typer.main.get_command(app).commands[command]
    printed = " ".join(" ".join(line.strip("│ ") for line in _help(400, command)).split())
    for param in click_command.params:
        help_text = " ".join((getattr(param, "help", None) or "").replace("\\[", "[").split())
        assert help_text in printed, (command, param.name, help_text)
