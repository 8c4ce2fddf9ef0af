"""Rebuild src/shardwise/data/measurements/pcie.csv: the rows of the PCIe RTX PRO 6000 reference set
(`other-models.csv` of reference/pcie-rtx-pro-6000, community measurements from local-inference-lab/rtx6kpro) as
validate replays them, each with an engine command line recovered from what the row records, or why it has none.

The set records its launches in several forms, and each is turned into one command line the way it reads:
- a command line (`vllm serve …`, `python3 -m sglang.launch_server …`), with the environment assignments before it
  and the notes after it (`; env …`, a bracketed remark) cut off; `TP8` / `TP=8` written for the TP flag;
- vLLM's own log of its non-default arguments (`non-default args: {…}`), each key written as its flag;
- a short SGLang form (`sglang 0.5.9 TP4: --flag …`, `NEXTN steps=4 topk=1 draft=3`);
- the set's launcher scripts (`run-glm51-vllm`, `serve-gilded-gnosis.sh`, a compose file), whose variables name
  vLLM's options one to one: TP, DCP, MTP (MTP draft tokens), MAX_NUM_SEQS, MAX_(NUM_)BATCHED_TOKENS,
  MAX_MODEL_LEN, GPU_MEMORY_UTILIZATION (GMU), GRAPH (the CUDA-graph capture size), and 'FP8 KV'; a launcher
  row that does not state its memory fraction or context length has no command (the script's defaults are not in
  the set).
The custom images' own kernels (B12X attention, MoE and GEMM backends, whether or not an upstream release knows
the name), their P2P all-reduce switches and loaders are taken out of the command and kept in `not_modelled`; the
replay prices the upstream engine's default kernels instead. A row whose launch is prose ("FP8, 4× GPUs
(SGLang)") has no command.

    python scripts/pcie_launches.py ../shared/reference/pcie-rtx-pro-6000/other-models.csv \
        src/shardwise/data/measurements/pcie.csv

Columns kept: id, source, model, n_gpus, engine, benchmark, context_tokens, concurrency, output_tok_s,
per_user_tok_s, prefill_tok_s, kv_tokens, accept_rate. Added: `checkpoint` (the model column's Hub id),
`kind` (decode_only, kv_capacity, prefill, single_stream, serving, other), `prompt_tokens` (the prompt the
engine held, where the notes give the real size of a label), `max_tokens`, `window_s`, `release`, `image` (the
engine column up to its first bracket: rows are grouped by it), `mtp_tokens` (draft tokens per step), `command`,
`not_modelled`, `waived` (engine rules the build's own kernels lift), `launch_problem`, `excluded` (why a row is
left out of error figures: the source flags it INVALID, capacity-limited or a warm-up).
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import sys
from pathlib import Path

KEPT = (
    "id", "source", "model", "n_gpus", "engine", "benchmark", "context_tokens", "concurrency", "output_tok_s",
    "per_user_tok_s", "prefill_tok_s", "kv_tokens", "accept_rate",
)  # fmt: skip
ADDED = (
    "checkpoint", "kind", "prompt_tokens", "max_tokens", "window_s", "release", "image", "mtp_tokens", "command",
    "not_modelled", "waived", "launch_problem", "excluded",
)  # fmt: skip

# Option values naming the custom images' own kernels (B12X builds; upstream vLLM 0.33 also has a b12x MoE backend,
# but not these builds'): the option is dropped and listed.
CUSTOM_VALUES = {
    "--attention-backend": {"B12X_MLA_SPARSE", "b12x"},
    "--moe-backend": {"b12x"},
    "--moe-runner-backend": {"b12x"},
    "--fp4-gemm-backend": {"b12x"},
    "--nsa-prefill-backend": {"b12x"},
    "--nsa-decode-backend": {"b12x"},
    "--load-format": {"fastsafetensors", "instanttensor"},
}
# Options only the set's custom images have (flag alone, or flag and value).
CUSTOM_SWITCHES = {"--enable-pcie-oneshot-allreduce", "--enable-pcie-oneshot-allreduce-fusion"}
CUSTOM_WITH_VALUE = {"--model-loader-extra-config", "--dcp-comm-backend"}
# Options that only shape the API server's replies (parsers, names): no effect on speed.
QUIET = {"--host", "--port", "--served-model-name", "--reasoning-parser", "--tool-call-parser"}
QUIET_SWITCHES = {"--enable-auto-tool-choice", "--trust-remote-code"}


def checkpoint_of(model: str) -> str:
    """The Hub id at the start of the model column ('lukealonso/X (page lists …)' → 'lukealonso/X')."""
    head = model.split(" (")[0].strip()
    return head if re.fullmatch(r"[\w.-]+/[\w.-]+", head) else ""


def kind_of(benchmark: str) -> str:
    b = benchmark.lower()
    if "warmup" in b:
        return "other"
    if b.startswith("decode-only") or b.startswith("decode only"):
        return "decode_only"
    if b.startswith("kv capacity"):
        return "kv_capacity"
    if b.startswith("prefill"):
        return "prefill"
    if "single-stream" in b or "single stream" in b or "single-batch" in b:
        return "single_stream"
    if b.startswith("serving"):
        return "serving"
    return "other"


# Before 2026-05-07 the benchmark's prompt generator under-filled long contexts: the labels 16k / 32k / 64k / 128k
# held about these many tokens (the set's README).
UNDER_FILLED = {"16384": "10500", "32768": "20800", "65536": "41500", "131072": "82800"}
FILL_FIXED = "2026-05-07"
# Builds the set used in March-April 2026 only, whose rows carry no date of their own.
EARLY_BUILDS = ("voipmonitor/sglang:cu130", "voipmonitor/vllm:cu130", "llm-pytorch-blackwell")
MONTHS = {m: i for i, m in enumerate(("January", "February", "March", "April", "May", "June", "July", "August",
                                      "September", "October", "November", "December"), 1)}  # fmt: skip


def date_of(row: dict[str, str]) -> str:
    """The earliest date the row's source path, engine, benchmark or notes give (ISO), or blank."""
    text = " ".join(row[k] for k in ("source", "engine", "benchmark", "notes"))
    dates = [f"{y}-{m}-{d}" for y, m, d in re.findall(r"\b(202\d)-?(\d\d)-?(\d\d)\b", text)]
    dates += [f"{y}-{MONTHS[m]:02d}-01" for m, y in re.findall(rf"\b({'|'.join(MONTHS)}) (202\d)\b", text)]
    return min(dates) if dates else ""


def prompt_tokens(row: dict[str, str]) -> str:
    """The prompt the engine held: the notes' average where they give it; a long label the generator under-filled
    (a row dated before FILL_FIXED, or of a build the set used only then), as the README sizes it; else the label."""
    notes = row["notes"]
    for pattern in (r"actual prompt tokens avg (\d[\d,]*)", r"actual prompt (\d[\d,]*) tokens"):
        found = re.search(pattern, notes)
        if found:
            return found.group(1).replace(",", "")
    date = date_of(row)
    early = (date and date < FILL_FIXED) or (not date and any(b in row["engine"] for b in EARLY_BUILDS))
    if early and row["context_tokens"] in UNDER_FILLED and kind_of(row["benchmark"]) == "decode_only":
        return UNDER_FILLED[row["context_tokens"]]
    return row["context_tokens"]


def max_tokens(benchmark: str) -> str:
    for pattern in (r"max[_-]tokens (\d+)", r"up to (\d+) tokens"):
        found = re.search(pattern, benchmark)
        if found:
            return found.group(1)
    return ""


def window_s(benchmark: str) -> str:
    found = re.search(r"--duration (\d+)", benchmark) or re.search(r"(?<![\d.])(\d+) s(?: per cell|\b)", benchmark)
    return found.group(1) if found else ""


# SGLang builds that state no release, by when they were built: the release SGLang had then (the InferenceX runs
# take up 0.5.9 from 2026-02-27 and 0.5.10 from 2026-04-17), whose options and rules the build carries.
SGLANG_BUILDS = (
    ("voipmonitor/sglang:cu130", "0.5.9"),  # the March-April 2026 image of the set's GLM-5 and Qwen3.5 pages
    ("luke-main-f4b7830", "0.5.10"),  # built 2026-04-19
    ("glm51-nsa-luke-a2573ab", "0.5.10"),  # built 2026-04-30
)


def release_of(engine: str) -> str:
    """The upstream release an image states ('vllm 0.17.0rc1 …' → 0.17.0, 'SGLang 0.5.10.post2.dev584' → 0.5.10),
    or an SGLang build's by its date (SGLANG_BUILDS); blank for custom trees without one (0.0.0+local)."""
    found = re.search(r"(?:vllm|sglang|SGLang)\s+(\d+\.\d+\.\d+)", engine)
    if found and found.group(1) != "0.0.0":
        return found.group(1)
    if engine.lower().startswith("sglang"):
        return next((release for image, release in SGLANG_BUILDS if image in engine), "")
    return ""


def image_of(engine: str) -> str:
    """The build a row ran on: its image tag where the engine column names one, else the column up to its first
    bracket or semicolon."""
    found = re.search(r"image (voipmonitor/[\w./:-]+)", engine) or re.search(r"(voipmonitor/[\w./:-]+)", engine)
    if found:
        return found.group(1)
    return engine.split(";")[0].strip()


def excluded(row: dict[str, str]) -> str:
    notes = row["notes"]
    if "INVALID" in notes:
        return "flagged INVALID by the source"
    if re.search(r"capacity_limited True|capacity-limited", notes):
        return "capacity-limited: the cell did not reach its concurrency"
    if "warmup" in row["benchmark"].lower():
        return "a warm-up cell"
    return ""


def _protect_json(text: str) -> tuple[str, list[str]]:
    """Replace each balanced {…} by a placeholder, so that splitting the line keeps JSON values whole."""
    blobs, out, depth, start = [], [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                blobs.append(text[start : i + 1])
                out.append(f"@JSON{len(blobs) - 1}@")
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out), blobs


def _speculative_shorthand(words: list[str]) -> list[str]:
    """'--speculative-config mtp num_speculative_tokens=3 probabilistic …' → the JSON vLLM reads."""
    out, i = [], 0
    while i < len(words):
        w = words[i]
        if w == "--speculative-config" and i + 1 < len(words) and not words[i + 1].startswith("{"):
            method, k, j = words[i + 1], None, i + 2
            while j < len(words) and not words[j].startswith("--"):
                found = re.fullmatch(r"num_speculative_tokens=(\d+)", words[j])
                k = int(found.group(1)) if found else k
                j += 1
            out += [w, json.dumps({"method": method, "num_speculative_tokens": k or 1})]
            i = j
            continue
        out.append(w)
        i += 1
    return out


def _nextn_shorthand(words: list[str]) -> list[str]:
    """'NEXTN steps=4 topk=1 draft=3' → SGLang's speculative options."""
    names = {
        "steps": "--speculative-num-steps",
        "topk": "--speculative-eagle-topk",
        "draft": "--speculative-num-draft-tokens",
    }
    out = []
    for w in words:
        found = re.fullmatch(r"(steps|topk|draft)=(\d+)", w)
        out += [names[found.group(1)], found.group(2)] if found else [w]
    return out


def _clean(words: list[str], checkpoint: str) -> tuple[list[str], list[str]]:
    """Drop what only the custom images accept (returned as not modelled), quiet options, and fix TP shorthand."""
    out, dropped, i = [], [], 0
    while i < len(words):
        w, nxt = words[i], words[i + 1] if i + 1 < len(words) else None
        tp, dcp = re.fullmatch(r"TP=?(\d+)", w), re.fullmatch(r"DCP=(\d+)", w)
        if tp:
            out += ["--tensor-parallel-size", tp.group(1)]
        elif dcp:
            out += ["--decode-context-parallel-size", dcp.group(1)]
        elif w in CUSTOM_VALUES and nxt in CUSTOM_VALUES[w]:
            dropped.append(f"{w} {nxt}")
            i += 1
        elif w in CUSTOM_SWITCHES:
            dropped.append(w)
        elif w in CUSTOM_WITH_VALUE:
            dropped.append(f"{w} {nxt}")
            i += 1
        elif w in QUIET:
            i += 1
        elif w in QUIET_SWITCHES:
            pass
        elif w == "--hf-overrides" and nxt is not None and not nxt.startswith("{"):
            i += 1  # the set names the override without its value: the indexer pattern of the checkpoint itself
        else:
            out.append(w)
        i += 1
    return out, dropped


ENV = re.compile(r"^[A-Z][A-Z0-9_]*=\S*$")


def _command_line(text: str, checkpoint: str) -> tuple[list[str], list[str], dict[str, str]] | str:
    """(argv, dropped, environment) from a launch written as a command line, or why not."""
    program = re.search(r"(python3? -m )?sglang\.launch_server|vllm serve", text)
    if program is None:
        return "no command line"
    head, rest = text[: program.start()], text[program.start() :]
    env = {}
    for word in head.split(";")[-1].split():
        if ENV.match(word):
            key, value = word.split("=", 1)
            env[key] = value
    protected, blobs = _protect_json(rest)
    protected = re.sub(r"\s\([^()]*\)", " ", protected)  # bracketed remarks
    protected, *notes = protected.split("; ")
    for note in notes:  # the environment the notes after the line list
        for word in note.replace(";", " ").split():
            if ENV.match(word):
                key, value = word.split("=", 1)
                env.setdefault(key, value)
    words = [re.sub(r"@JSON(\d+)@", lambda m: blobs[int(m.group(1))], w) for w in protected.split()]
    if words[0] in ("python3", "python"):
        words = ["python3", "-m", "sglang.launch_server", *words[3:]]
    elif words[0] == "sglang.launch_server":
        words = ["python3", "-m", "sglang.launch_server", *words[1:]]
    words = _nextn_shorthand(_speculative_shorthand(words))
    if words[:2] == ["vllm", "serve"] and (len(words) < 3 or words[2].startswith("-") or "=" in words[2]):
        words = ["vllm", "serve", checkpoint, *words[2:]]
    words, dropped = _clean(words, checkpoint)
    if "sglang.launch_server" in words and "--model-path" not in words and "--model" not in words:
        words[3:3] = ["--model-path", checkpoint]
    return words, dropped, env


def _dotted(prefix: str, value: object) -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _dotted(f"{prefix}.{k}", v)]
    return [(prefix, value)]


def _vllm_args(text: str) -> tuple[list[str], list[str], dict[str, str]] | str:
    """vLLM's log of its non-default arguments as a command line."""
    start = text.index("non-default args:") + len("non-default args:")
    _, blobs = _protect_json(text[start:])
    args = json.loads(blobs[0])
    words = ["vllm", "serve", str(args.pop("model"))]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if key.startswith("compilation_config."):  # logged nested: written in vLLM's dotted form, -cc.a.b=value
            for name, setting in _dotted(key.split(".", 1)[1], value):
                words.append(f"-cc.{name}={json.dumps(setting) if not isinstance(setting, bool) else setting}")
            continue
        if value is True:
            words.append(flag)
        elif value is False:  # an option on by default, turned off
            words.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        elif isinstance(value, (dict, list)):
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                words += [flag, *value]
            else:
                words += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            words += [flag, str(value)]
    dcp = re.search(r"DCP_SIZE=(\d+)", text)
    if dcp and "--decode-context-parallel-size" not in words:
        words += ["--decode-context-parallel-size", dcp.group(1)]
    env = {}
    tail = re.search(r"; env (.*)$", text)
    if tail:
        for word in tail.group(1).split():
            if ENV.match(word):
                key, value = word.split("=", 1)
                env[key] = value
    words, dropped = _clean(words, "")
    return words, dropped, env


LAUNCHER_FLAGS = {
    "TP": "--tensor-parallel-size",
    "TP_SIZE": "--tensor-parallel-size",
    "DCP": "--decode-context-parallel-size",
    "DCP_SIZE": "--decode-context-parallel-size",
    "MAX_NUM_SEQS": "--max-num-seqs",
    "MAX_BATCHED_TOKENS": "--max-num-batched-tokens",
    "MAX_NUM_BATCHED_TOKENS": "--max-num-batched-tokens",
    "MAX_MODEL_LEN": "--max-model-len",
    "GPU_MEMORY_UTILIZATION": "--gpu-memory-utilization",
    "GMU": "--gpu-memory-utilization",
    "GRAPH": "--max-cudagraph-capture-size",
    "MAX_CUDAGRAPH_CAPTURE_SIZE": "--max-cudagraph-capture-size",
}


def _launcher(text: str, checkpoint: str) -> tuple[list[str], list[str], dict[str, str]] | str:
    """A launcher script's variables as the vLLM options they set."""
    values = dict(re.findall(r"\b([A-Z][A-Z0-9_]*)[= ]([\d.]+)\b", text))
    for name in ("GMU", "TP", "DCP"):  # 'GMU 0.95', 'TP8 DCP1 MTP3'
        found = re.search(rf"\b{name}\s?(\d[\d.]*)\b", text)
        if found and name not in values:
            values[name] = found.group(1)
    if re.search(r"MODE=dspark|DSPARK", text):
        return "DSpark drafting (the launcher's MODE), which the recovered command cannot carry"
    mtp = re.search(r"(?<![\w.-])MTP[= ]?(\d+)\b", text)  # not a model name's -MTP78
    if "GLM51_DISABLE_MTP=0" in text:
        mtp = re.search(r"num_speculative_tokens=(\d+)", text)
    if not any(k in values for k in ("GPU_MEMORY_UTILIZATION", "GMU")):
        return "a launcher row that does not state its memory fraction (the script's default is not in the set)"
    if "MAX_MODEL_LEN" not in values:
        return "a launcher row that does not state its context length (the script's default is not in the set)"
    if not any(k in values for k in ("TP", "TP_SIZE")):
        return "a launcher row that does not state its TP size"
    model = re.search(r"MODEL=([\w.-]+/[\w.-]+)", text) or re.search(r"([\w-]+/GLM-[\w.-]+)@", text)
    words = ["vllm", "serve", model.group(1) if model else checkpoint]
    seen = set()
    for key, flag in LAUNCHER_FLAGS.items():
        if key in values and flag not in seen:
            words += [flag, values[key]]
            seen.add(flag)
    if mtp and int(mtp.group(1)) > 0:
        words += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": int(mtp.group(1))})]
    kv = re.search(r"KV_CACHE_(?:DTYPE|QUANT)=(\w+)", text)
    if kv:
        words += ["--kv-cache-dtype", kv.group(1)]
    elif re.search(r"FP8 (?:MLA )?KV", text):
        words += ["--kv-cache-dtype", "fp8"]
    words += ["--enable-prefix-caching", "--enable-chunked-prefill"]
    return words, [f"launcher {m.group(0)}" for m in [re.search(r"[\w./-]+\.(?:sh|yml)|run-glm51-vllm", text)] if m], {}


def command_of(row: dict[str, str], checkpoint: str) -> tuple[str, str, str]:
    """(command, not modelled, launch problem) of a row."""
    text = row["launch_command"]
    if not checkpoint:
        return "", "", "the row does not name its checkpoint"
    if "non-default args:" in text:
        parsed = _vllm_args(text)
    elif re.search(r"sglang\.launch_server|vllm serve", text):
        parsed = _command_line(text, checkpoint)
    elif re.match(r"sglang \d+\.\d+\.\d+ TP\d+:", text):
        tp = re.match(r"sglang \S+ TP(\d+):", text).group(1)
        parsed = _command_line(f"python3 -m sglang.launch_server --tp {tp} " + text.split(":", 1)[1], checkpoint)
    elif re.search(r"run-glm51-vllm|serve-gilded-gnosis|docker-compose|docker run", text):
        parsed = _launcher(text, checkpoint)
    else:
        return "", "", "the launch is described, not given as a command"
    if isinstance(parsed, str):
        return "", "", parsed
    words, dropped, env = parsed
    assignments = [f"{k}={v}" for k, v in env.items()]
    return shlex.join([*assignments, *words]), "; ".join(dropped), ""


def waived(row: dict[str, str], command: str) -> str:
    """Engine rules a build's own kernels lift: a vLLM image with the B12X sparse-MLA backend (its launch or image
    names B12X) serves DCP and every cache layout on SM 12.x, where upstream vLLM's sparse backend does neither."""
    text = row["launch_command"] + " " + row["engine"]
    return "sparse_mla_sm120" if "vllm serve" in command and "B12X" in text else ""


def mtp_tokens(command: str) -> str:
    found = re.search(r'"num_speculative_tokens":\s*(\d+)', command)
    if found:
        return found.group(1)
    found = re.search(r"--speculative-num-draft-tokens (\d+)", command)
    return str(int(found.group(1)) - 1) if found else ""


def convert(source: Path, target: Path) -> None:
    with source.open(newline="") as f:
        rows = list(csv.DictReader(f))
    with target.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*KEPT, *ADDED], lineterminator="\n")
        writer.writeheader()
        for row in rows:
            checkpoint = checkpoint_of(row["model"])
            command, dropped, problem = command_of(row, checkpoint)
            writer.writerow(
                {
                    **{k: row[k] for k in KEPT},
                    "checkpoint": checkpoint,
                    "kind": kind_of(row["benchmark"]),
                    "prompt_tokens": prompt_tokens(row),
                    "max_tokens": max_tokens(row["benchmark"]),
                    "window_s": window_s(row["benchmark"]),
                    "release": release_of(row["engine"]),
                    "image": image_of(row["engine"]),
                    "mtp_tokens": mtp_tokens(command),
                    "command": command,
                    "not_modelled": dropped,
                    "waived": waived(row, command),
                    "launch_problem": problem,
                    "excluded": excluded(row),
                }
            )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/pcie_launches.py OTHER-MODELS.csv OUT.csv")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
