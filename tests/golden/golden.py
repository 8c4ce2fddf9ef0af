"""The golden figures: what `theorise`, `check`, `simulate` and `validate` print as JSON on four cases with both
engines, kept in `tests/golden/data/` byte for byte and held there by `test_golden.py`.

A change meant to move no figure (a restructuring, a speed-up) leaves them as they are. A change that moves figures
on purpose writes them again, and its commit shows what moved:

    .venv/bin/python tests/golden/golden.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from shardwise.cli import app

DATA = Path(__file__).parent / "data"
CASES = {  # name: (model, cluster)
    "kimi-k2.6-8xrtx-pro-6000": ("kimi-k2.6", "8xrtx-pro-6000"),  # the user's case, the default
    "deepseek-v3-8xh200": ("deepseek-v3", "8xh200"),
    "qwen3-235b-a22b-8xh100": ("qwen3-235b-a22b", "8xh100"),
    "llama-3.1-70b-2x8xh100": ("llama-3.1-70b", "2x8xh100"),
}
ENGINES = ("sglang", "vllm")
SIMULATED_LOADS = ("--concurrency", "1,64", "--num-prompts", "128")  # a short run at either end of the screen


def _json(*args: str, command: tuple[str, ...] = (), refusable: bool = False) -> dict:
    """What `shardwise *args --json [-- command]` prints, read as JSON (with its exit status where a refusal is an
    answer: `check` exits 1 on a command that will not start)."""
    argv = [*args, "--json", *(("--", *command) if command else ())]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "120"})
    assert result.exit_code in ((0, 1) if refusable else (0,)), f"shardwise {' '.join(argv)}: {result.output[-2000:]}"
    printed = json.loads(result.stdout)
    return {"exit_code": result.exit_code, "printed": printed} if refusable else printed


def _text(payload: object) -> str:
    return json.dumps(payload, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def render(case: str) -> dict[str, str]:
    """File name → text for one case: the ranking of both engines together; `check` of every launch command it
    ranks or excludes and of each engine's own ten best; `simulate` of each engine's best."""
    model, cluster = CASES[case]
    theorise = _json("theorise", "--model", model, "--gpus", cluster, "--framework", "all")
    own = {e: _json("theorise", "--model", model, "--gpus", cluster, "--framework", e)["ranked"] for e in ENGINES}
    rows = [*theorise["ranked"], *theorise["excluded"], *(row for ranked in own.values() for row in ranked)]
    launches = list(dict.fromkeys(tuple(row["launch"]) for row in rows))
    checked = {" ".join(cmd): _json("check", "--gpus", cluster, command=cmd, refusable=True) for cmd in launches}
    best = [tuple(ranked[0]["launch"]) for ranked in own.values() if ranked]
    simulated = {" ".join(cmd): _json("simulate", "--gpus", cluster, *SIMULATED_LOADS, command=cmd) for cmd in best}
    return {
        f"{case}.theorise.json": _text(theorise),
        f"{case}.check.json": _text(checked),
        f"{case}.simulate.json": _text(simulated),
    }


def render_validate() -> dict[str, str]:
    return {"validate.json": _text(_json("validate"))}


def main() -> None:
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: golden.py --write   (writes tests/golden/data/ from this checkout)")
    DATA.mkdir(exist_ok=True)
    files = render_validate()
    for case in CASES:
        files |= render(case)
    for name, text in files.items():
        (DATA / name).write_text(text, encoding="utf-8")
        print(f"{DATA / name}: {len(text):,} bytes")


if __name__ == "__main__":
    main()
