"""Every row of docs/bad-inputs.md, run as written: its exit code, its message, one line, no traceback."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).parent.parent / "docs" / "bad-inputs.md"
ROW = re.compile(r"^\| *(\d+) *\| (.+?) \| `shardwise (.*?)` \| *(\d) *\| (.+?) \|$")


def rows() -> list[tuple[int, str, str, int, str]]:
    out = []
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            n, what, command, code, says = match.groups()
            out.append((int(n), what, command, int(code), says))
    return out


FILES = {
    "bad_json": "{not json",
    "json_list": "[1, 2]",
    "no_sizes": '{"architectures": ["LlamaForCausalLM"]}',
    "bad_yaml": "gpu: [unclosed\n",
    "no_count": "gpu: h100\n",
    "zero_count": "gpu: h100\ngpus_per_node: 0\n",
    "bad_lengths": "not json\n",
    "unknown_results": '{"hello": 1}\n',
    "bench_results": json.dumps({"tool": "shardwise bench", "max_concurrency": 1, "completed": 1,
                                 "total_input_tokens": 8, "total_output_tokens": 8, "output_throughput": 10.0}),
    "h100_profile": "gpu: h100-sxm\nconstants: {eager_kernel_cpu_s: 1.0e-5}\nfitted_on: [x]\n",
    "wrong_types": '{"architectures": true, "hidden_size": 4096}',
    "wrong_results": json.dumps({"model_id": "m", "output_throughput": [1], "mean_e2el_ms": 1.0, "completed": 1,
                                 "total_input_tokens": 8, "total_output_tokens": 8}),
}  # fmt: skip
SUFFIX = {"bad_json": ".json", "json_list": ".json", "no_sizes": ".json", "bad_yaml": ".yaml", "no_count": ".yaml",
          "zero_count": ".yaml", "bad_lengths": ".jsonl", "unknown_results": ".json", "bench_results": ".jsonl",
          "h100_profile": ".yaml", "wrong_types": ".json", "wrong_results": ".json"}  # fmt: skip


def test_the_table_lists_at_least_25_bad_inputs():
    numbers = [n for n, *_ in rows()]
    assert len(numbers) >= 25 and numbers == list(range(1, len(numbers) + 1))


@pytest.mark.parametrize("n, what, command, code, says", rows(), ids=[f"{r[0]}-{r[1][:40]}" for r in rows()])
def test_each_bad_input(tmp_path, n, what, command, code, says):
    paths = {"out": str(tmp_path / "out.yaml")}
    for name, text in FILES.items():
        path = tmp_path / f"{name}{SUFFIX[name]}"
        path.write_text(text)
        paths[name] = str(path)
    args = [a.format(**paths) for a in shlex.split(command)]
    result = subprocess.run([sys.executable, "-m", "shardwise", *args], capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert " ".join(says.split()) in " ".join(output.split()), output
    assert "Traceback" not in output
    if code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # one line
