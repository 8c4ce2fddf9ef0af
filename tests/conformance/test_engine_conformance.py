"""Every command shardwise emits, checked by the real SGLang and vLLM packages (conformance/README.md).

For each command the engine's own parser and start-up resolution run on faked GPUs (SGLang: prepare_server_args →
resolution → check_server_args; vLLM: make_arg_parser → create_engine_config). Then:
- what the engine refuses, shardwise refuses;
- what shardwise refuses with a check the engine makes at that point (stage "arguments"), the engine refuses;
  refusals shardwise knows to come later (at model load, or at the first steps) the oracle cannot see;
- where both accept it, the sizes the engine resolves are shardwise's: SGLang's memory fraction, chunked-prefill
  size, CUDA-graph batch, running-request cap, EP / attention-DP / replica sizes, page size; vLLM's memory
  utilization, batched-token budget, sequence cap, max_model_len, KV block size, CUDA-graph batch.

By default a slice runs (the user's case and one of each other kind); SHARDWISE_CONFORMANCE=full runs all five
models on all four clusters and both vLLM releases, SHARDWISE_CONFORMANCE=ci the part CI has time for. Without
the oracle environments (conformance/setup-*.sh) the tests skip, unless SHARDWISE_REQUIRE_ORACLES=1 (CI), when
that is a failure.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from emitted import MODELS as MODEL_DIRS
from emitted import Emitted, _argv, ask, emitted, oracle_python, shardwise_view

from shardwise.engines.base import Setup
from shardwise.engines.check import check_command
from shardwise.engines.flags import split_command
from shardwise.errors import SpecError
from shardwise.spec.cluster import load_cluster

MODELS = ["kimi-k2.6", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b"]
CLUSTERS = ["8xrtx-pro-6000", "8xh100", "8xh200", "2x8xh100"]
ENGINES = [("sglang", "0.5.23"), ("vllm", "0.33.0"), ("vllm", "0.34.0")]
SLICE = [
    ("kimi-k2.6", "8xrtx-pro-6000", "sglang", "0.5.23"),
    ("kimi-k2.6", "8xrtx-pro-6000", "vllm", "0.33.0"),
    ("kimi-k2.6", "8xrtx-pro-6000", "vllm", "0.34.0"),
    ("gpt-oss-120b", "8xh100", "sglang", "0.5.23"),
    ("llama-3.1-70b", "8xh200", "vllm", "0.33.0"),
    ("deepseek-v3", "2x8xh100", "sglang", "0.5.23"),
    ("qwen3-235b-a22b", "2x8xh100", "vllm", "0.33.0"),
]
CI = [  # what CI's time allows: the user's case on both engines' default releases, and a multi-node launch
    ("kimi-k2.6", "8xrtx-pro-6000", "sglang", "0.5.23"),
    ("kimi-k2.6", "8xrtx-pro-6000", "vllm", "0.33.0"),
    ("llama-3.1-70b", "2x8xh100", "sglang", "0.5.23"),
]
CASES = {
    "full": [(m, c, e, v) for m in MODELS for c in CLUSTERS for e, v in ENGINES],
    "ci": CI,
}.get(os.environ.get("SHARDWISE_CONFORMANCE", ""), SLICE)


def _available(engine: str, version: str) -> bool:
    if oracle_python(engine, version).exists():
        return True
    if os.environ.get("SHARDWISE_REQUIRE_ORACLES"):
        pytest.fail(f"the {engine} {version} oracle is not installed: run conformance/setup-{engine}.sh {version}")
    pytest.skip(f"no {engine} {version} oracle here (conformance/setup-{engine}.sh {version})")


def sglang_sizes(setup: Setup, resolved: dict) -> list[tuple[str, object, object]]:
    f = setup.flags
    return [
        ("mem_fraction_static", f["mem_fraction_static"], resolved["mem_fraction_static"]),
        ("chunked_prefill_size", f["chunked_prefill_size"], resolved["chunked_prefill_size"]),
        ("cuda_graph_max_bs", f["cuda_graph_max_bs"], resolved.get("cuda_graph_max_bs")),
        ("max_running_requests", f.get("max_running_requests"), resolved["max_running_requests"]),
        ("ep_size", f["ep_size"], resolved["ep_size"]),
        ("attn_dp_size", f["attn_dp_size"], resolved["attn_dp_size"]),
        ("dp_size", f["dp_size"], resolved["dp_size"]),
        ("page_size", f["page_size"], resolved["page_size"]),
        ("enable_dp_lm_head", bool(f.get("enable_dp_lm_head")), bool(resolved["enable_dp_lm_head"])),
        (
            "dcp_comm_backend",
            setup.layout.dcp_comm if setup.layout else None,  # FlashInfer's a2a is an all-to-all
            {"fi_a2a": "a2a"}.get(resolved["dcp_comm_backend"], resolved["dcp_comm_backend"]),
        ),
    ]


def vllm_sizes(setup: Setup, resolved: dict) -> list[tuple[str, object, object]]:
    f, layout = setup.flags, setup.layout
    assert layout is not None
    opts = layout.options
    max_len = resolved["max_model_len"] if opts.max_model_len is not None else None  # auto: fitted later
    return [
        ("gpu_memory_utilization", opts.memory_fraction,  # 0.33 has no resolved_ property: its field is the value
         resolved.get("resolved_gpu_memory_utilization") or resolved["gpu_memory_utilization"]),
        ("max_num_batched_tokens", f["max_num_batched_tokens"], resolved["max_num_batched_tokens"]),
        ("max_num_seqs", f["max_num_seqs"], resolved["max_num_seqs"]),
        ("max_model_len", opts.max_model_len, max_len),
        ("block_size", opts.page_size, resolved["block_size"]),
        ("cuda_graph_max_bs", opts.cuda_graph_max_bs, resolved["max_cudagraph_capture_size"] if opts.cuda_graph
         else None),
    ]  # fmt: skip


def disagreements(items: list[tuple[Emitted, object]], answers: list[dict]) -> list[str]:
    out = []
    for (e, cluster), answer in zip(items, answers, strict=True):
        setup = shardwise_view(e, cluster)
        if not answer["ok"]:
            if setup.valid:
                out.append(f"engine refuses, shardwise accepts: {e.text}\n    {answer['error']}")
            continue
        early = [r for r in setup.rejections if r.stage == "arguments"]
        if early:
            out.append(f"shardwise refuses ({early[0].rule}), the engine accepts: {e.text}\n    {early[0].reason}")
            continue
        if not setup.valid:
            continue  # refused later than the oracle can see (model load, first steps)
        sizes = sglang_sizes if e.engine == "sglang" else vllm_sizes
        for name, ours, theirs in sizes(setup, answer["resolved"]):
            same = math.isclose(ours, theirs, rel_tol=1e-9) if isinstance(ours, float) and theirs else ours == theirs
            if not same:
                out.append(f"{name}: shardwise {ours!r}, the engine {theirs!r}: {e.text}")
    return out


@cache
def _answers(engine: str, version: str) -> dict[tuple[str, str], list[tuple[Emitted, dict]]]:
    """Every case's commands for one engine release, asked of one oracle process (it starts once: 7 s for SGLang,
    about 30 s for vLLM), by (model, cluster)."""
    cases = [(m, c) for m, c, e, v in CASES if (e, v) == (engine, version)]
    items = [(m, c, e) for m, c in cases for e in emitted(m, c, engine, version)]
    answers = ask(engine, version, [(e, load_cluster(c)) for _, c, e in items])
    out: dict[tuple[str, str], list[tuple[Emitted, dict]]] = {}
    for (m, c, e), answer in zip(items, answers, strict=True):
        out.setdefault((m, c), []).append((e, answer))
    return out


@pytest.mark.parametrize("model, cluster, engine, version", CASES)
def test_every_emitted_command_agrees_with_the_engine(model, cluster, engine, version):
    _available(engine, version)
    box = load_cluster(cluster)
    pairs = _answers(engine, version)[(model, cluster)]
    answers = [a for _, a in pairs]
    problems = disagreements([(e, box) for e, _ in pairs], answers)
    refused = sum(not a["ok"] for a in answers)
    print(f"\n{engine} {version}, {model} on {cluster}: {len(pairs)} commands, the engine refuses {refused}")
    kinds = Counter(p.split(":")[0] for p in problems)
    assert not problems, f"{len(problems)} disagreements ({dict(kinds)}):\n" + "\n".join(problems[:40])


def _emitted_from(engine: str, version: str, command: str) -> Emitted:
    """A launch command as the oracle takes it: the model path replaced by the bundled folder of that model."""
    import shlex

    tokens = tuple(shlex.split(command))
    model = check_command(command, cluster=load_cluster("8xh100")).model.name
    return Emitted(engine, version, tokens, _argv(engine, list(tokens), MODEL_DIRS / model))


def _engine_of(command: str) -> str | None:
    try:
        return split_command(command)[0]
    except SpecError:  # a row about a launcher shardwise does not know
        return None


def _checked_rows() -> list[tuple[str, str, str]]:
    """The `shardwise check` rows of docs/bad-inputs.md: (cluster, launch command, what shardwise says)."""
    import re
    import shlex

    doc = Path(__file__).parents[2] / "docs" / "bad-inputs.md"
    out = []
    for line in doc.read_text().splitlines():
        m = re.match(r"^\| *\d+ *\| .+? \| `shardwise check (.*?)` \| *\d *\| (.+?) \|$", line)
        if m:
            args = shlex.split(m.group(1))
            cluster = args[args.index("--gpus") + 1] if "--gpus" in args else "8xrtx-pro-6000"
            out.append((cluster, shlex.join(args[args.index("--") + 1 :]), m.group(2)))
    return out


@pytest.mark.parametrize("engine, version", [("sglang", "0.5.23"), ("vllm", "0.33.0")])
def test_the_documented_refusals_are_the_engines(engine, version):
    """Each refusal docs/bad-inputs.md shows for `check`: where shardwise says the engine refuses it while
    resolving its arguments, the engine does; where it says later (model load, first steps), the engine's argument
    resolution lets it through, as the oracle cannot see further."""
    _available(engine, version)  # (a row with no flags at all is about shardwise's own usage line)
    rows = [(c, cmd) for c, cmd, _ in _checked_rows() if _engine_of(cmd) == engine and len(cmd.split()) > 4]
    items = [(_emitted_from(engine, version, cmd), load_cluster(c)) for c, cmd in rows]
    answers = ask(engine, version, items)
    stages = []
    for (e, box), answer in zip(items, answers, strict=True):
        setup = shardwise_view(e, box)
        stage = setup.rejections[0].stage if setup.rejections else None
        stages.append(stage)
        if stage == "arguments":
            assert not answer["ok"], f"shardwise: refused while resolving arguments; the engine accepts: {e.text}"
        elif stage is not None:  # refused at model load or at the first steps: the arguments resolve
            assert answer["ok"], f"shardwise places it at {stage}; the engine refuses its arguments: {e.text}"
        else:
            assert answer["ok"] or not setup.valid, f"the engine refuses, shardwise does not: {e.text}"
    assert "arguments" in stages and {"load", "run"} & set(stages)  # both kinds are covered
