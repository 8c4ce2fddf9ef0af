"""Every command shardwise emits, checked by the real SGLang and vLLM packages (conformance/README.md).

For each command the engine's own parser and start-up resolution run on faked GPUs (SGLang: prepare_server_args →
resolution → check_server_args; vLLM: make_arg_parser → create_engine_config, then the model built on the meta
device), and then its own KV-pool sizing, from the memory shardwise estimates the engine would measure
(emitted.memory_inputs). Then:
- an answer the engine never gave (the oracle, a stub or a fake crashed) is an error of the suite, never a refusal;
- what the engine refuses, shardwise refuses at the same stage (resolving the arguments; building the model) and
  for the same reason: the same exception, and shardwise's message in the engine's;
- what shardwise refuses while resolving the arguments, the engine refuses; what it refuses later (at model load,
  or at the first steps) resolves its arguments in the engine;
- where both resolve it, the sizes the engine resolves are shardwise's: SGLang's memory fraction, chunked-prefill
  size, CUDA-graph batch, running-request cap, EP / attention-DP / replica sizes, page size, DCP backend; vLLM's
  memory utilization, batched-token budget, sequence cap, max_model_len, KV block size, CUDA graphs and their
  batch;
- where shardwise says it starts, the engine's KV pool holds as many tokens per attention-DP rank within one page,
  or neither has room, for the same reason.

By default a slice runs (the user's case and one of each other kind); SHARDWISE_CONFORMANCE=full runs all five
models on all four clusters and both vLLM releases, SHARDWISE_CONFORMANCE=ci the part CI has time for. Without
the oracle environments (conformance/setup-*.sh) the tests skip, unless SHARDWISE_REQUIRE_ORACLES=1 (CI), when
that is a failure.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from emitted import MODELS as MODEL_DIRS
from emitted import Emitted, _argv, ask, emitted, oracle_python, shardwise_check, shardwise_view

from shardwise.cost.memory import memory_ledger
from shardwise.engines.base import Rejection, Setup
from shardwise.engines.check import Checked, check_command
from shardwise.engines.flags import split_command
from shardwise.errors import SpecError
from shardwise.spec.cluster import ClusterSpec, load_cluster

MODELS = ["kimi-k2.6", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b"]
# the newest models run on the user's class of box: sparse MLA (GLM-5.x), hybrid linear attention (Qwen3.5). The
# vLLM oracle builds them on SM 12.x for 0.34 (not Qwen3.5: its vision tower needs torchvision, which has no CPU
# build here); on SM 9.0 vLLM's sparse backend needs FlashInfer's SM90 MLA, and 0.33 resolves them otherwise
NEW_MODELS = ["glm-5.1-nvfp4", "glm-5.2-nvfp4", "qwen3.5-397b-a17b-nvfp4", "minimax-m2.5"]
NEW_ON_VLLM = ["glm-5.1-nvfp4", "glm-5.2-nvfp4", "minimax-m2.5"]
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
CI = [  # what CI's time allows: the user's case on each engine release, and a multi-node launch
    ("kimi-k2.6", "8xrtx-pro-6000", "sglang", "0.5.23"),
    ("kimi-k2.6", "8xrtx-pro-6000", "vllm", "0.33.0"),
    ("kimi-k2.6", "8xrtx-pro-6000", "vllm", "0.34.0"),
    ("llama-3.1-70b", "2x8xh100", "sglang", "0.5.23"),
    ("glm-5.1-nvfp4", "8xrtx-pro-6000", "sglang", "0.5.23"),
    ("qwen3.5-397b-a17b-nvfp4", "8xrtx-pro-6000", "sglang", "0.5.23"),
    ("glm-5.1-nvfp4", "8xrtx-pro-6000", "vllm", "0.34.0"),
]
ARGUMENT_STAGES = ("parse", "post_init", "resolve", "check", "publish", "config")  # the oracles' stages before any load
VLLM_PARALLEL = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "decode_context_parallel_size",
    "all2all_backend",
)  # as both name them
CASES = {
    "full": [(m, c, e, v) for m in MODELS for c in CLUSTERS for e, v in ENGINES]
    + [(m, c, "sglang", "0.5.23") for m in NEW_MODELS for c in ("8xrtx-pro-6000", "8xh200")]
    + [(m, "8xrtx-pro-6000", "vllm", "0.34.0") for m in NEW_ON_VLLM],
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
        ("max_prefill_tokens", f["max_prefill_tokens"], resolved["max_prefill_tokens"]),
        ("cuda_graph_max_bs", f["cuda_graph_max_bs"], resolved.get("cuda_graph_max_bs")),
        ("max_running_requests", f.get("max_running_requests"), resolved["max_running_requests"]),
        ("ep_size", f["ep_size"], resolved["ep_size"]),
        ("attn_dp_size", f["attn_dp_size"], resolved["attn_dp_size"]),
        ("dp_size", f["dp_size"], resolved["dp_size"]),
        ("page_size", f["page_size"], resolved["page_size"]),
        ("enable_dp_lm_head", bool(f.get("enable_dp_lm_head")), bool(resolved["enable_dp_lm_head"])),
        # the overlap scheduler (off with pipeline stages; kept or not with speculative decoding, by release)
        ("disable_overlap_schedule", not setup.layout.options.overlap_schedule, resolved["disable_overlap_schedule"]),
        (
            "dcp_comm_backend",
            setup.layout.dcp_comm if setup.layout else None,  # FlashInfer's a2a is an all-to-all
            {"fi_a2a": "a2a"}.get(resolved["dcp_comm_backend"], resolved["dcp_comm_backend"]),
        ),
    ]


def vllm_sizes(setup: Setup, resolved: dict) -> list[tuple[str, object, object]]:
    """vLLM's resolved sizes against shardwise's. --max-model-len auto (-1) is fitted to the pool later, which
    both record as such; CUDA graphs off is eager mode, with no capture size."""
    f, layout = setup.flags, setup.layout
    assert layout is not None
    opts = layout.options
    graphs = resolved["cudagraph_mode"] not in (None, "NONE") and not resolved["enforce_eager"]
    auto = resolved.get("original_max_model_len") == -1
    return [
        ("gpu_memory_utilization", opts.memory_fraction,  # 0.33 has no resolved_ property: its field is the value
         resolved.get("resolved_gpu_memory_utilization") or resolved["gpu_memory_utilization"]),
        ("max_num_batched_tokens", f["max_num_batched_tokens"], resolved["max_num_batched_tokens"]),
        ("max_num_seqs", f["max_num_seqs"], resolved["max_num_seqs"]),
        ("max_model_len", opts.max_model_len or "auto", "auto" if auto else resolved["max_model_len"]),
        ("block_size", opts.page_size, resolved["block_size"]),
        *[(name, f[name], resolved[name]) for name in VLLM_PARALLEL],
        ("enable_expert_parallel", bool(f.get("enable_expert_parallel")), resolved["enable_expert_parallel"]),
        ("cuda_graphs", opts.cuda_graph, graphs),
        ("cuda_graph_max_bs", opts.cuda_graph_max_bs if opts.cuda_graph else None,
         resolved["max_cudagraph_capture_size"] if graphs else None),
    ]  # fmt: skip


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_.]+", text.lower())


def same_reason(rejection: Rejection | None, refusal: dict) -> bool:
    """The engine refused as shardwise says it does: the same exception type, and shardwise's message (its first
    sentence, figures included) found word for word in the engine's (punctuation and line breaks aside: the oracle
    joins a message's lines). A rejection without the engine's error says nothing to compare."""
    if rejection is None or rejection.engine_error is None:
        return False
    kind, _, message = rejection.engine_error.partition(": ")
    ours, theirs = _words(re.split(r"(?<=[.;])\s", message)[0]), _words(refusal["message"])
    found = any(theirs[i : i + len(ours)] == ours for i in range(len(theirs) - len(ours) + 1))
    return kind == refusal["type"] and bool(ours) and found


def _refusal_text(refusal: dict) -> str:
    return f"{refusal['stage']}: {refusal['type']}: {refusal['message'][:300]}"


def disagreements(items: list[tuple[Emitted, ClusterSpec]], answers: list[dict]) -> list[str]:
    """Where shardwise and the engine part ways on a command: whether it starts, why not (the stage, the exception
    and its message), the sizes the engine resolves, and the KV pool it sizes from the same memory figures."""
    out = []
    for (e, cluster), answer in zip(items, answers, strict=True):
        checked = shardwise_check(e, cluster)
        setup, refusal = checked.setup, answer["refusal"]
        stage = "arguments" if refusal and refusal["stage"] in ARGUMENT_STAGES else (refusal or {}).get("stage")
        if _out_of_memory(answer):
            stage = "memory"  # the GPU, faked from shardwise's figures, ran out: compared with the memory verdict
        if stage in ("arguments", "load"):  # the engine refuses the command itself, resolving it or building the model
            same_stage = [r for r in setup.rejections if r.stage == stage]
            if not same_stage:
                where = f"at {setup.rejections[0].stage}" if setup.rejections else "nowhere"
                out.append(f"engine refuses at {stage}, shardwise {where}: {e.text}\n    {_refusal_text(refusal)}")
            elif not any(same_reason(r, refusal) for r in same_stage):
                out.append(f"refusal reason: shardwise {same_stage[0].rule}: {same_stage[0].engine_error!r}, the "
                           f"engine {_refusal_text(refusal)}: {e.text}")  # fmt: skip
            continue
        early = [r for r in setup.rejections if r.stage == "arguments"]
        if early:
            out.append(f"shardwise refuses ({early[0].rule}), the engine accepts: {e.text}\n    {early[0].reason}")
            continue
        built = [r for r in setup.rejections if r.stage == "load"] if answer.get("built") else []
        if built and stage != "memory":  # the oracle built the model on every stage and the engine did not refuse
            out.append(f"shardwise refuses at load ({built[0].rule}), the engine builds the model: {e.text}")
            continue
        # the arguments resolve on both sides (shardwise may still refuse at model load or at the first steps)
        if setup.layout is None:
            continue  # shardwise has no layout to size: a refusal it places later (each cites its engine source)
        sizes = sglang_sizes if e.engine == "sglang" else vllm_sizes
        for name, ours, theirs in sizes(setup, answer["resolved"]) if answer["resolved"] is not None else ():
            same = math.isclose(ours, theirs, rel_tol=1e-9) if isinstance(ours, float) and theirs else ours == theirs
            if not same:
                out.append(f"{name}: shardwise {ours!r}, the engine {theirs!r}: {e.text}")
        if setup.valid:
            out += kv_pool_disagreements(e, checked, cluster, answer)
    return out


def kv_pool_disagreements(e: Emitted, checked: Checked, cluster: ClusterSpec, answer: dict) -> list[str]:
    """The KV pool the engine sizes with its own code from the memory shardwise estimates (emitted.memory_inputs)
    against shardwise's: the same verdict at the same moment (out of memory while loading the weights, or while
    profiling or allocating the pool; no room, for the same reason), and where both size a pool, the same tokens
    per attention-DP rank exactly (the engines' own rounding is shardwise's: pages, vLLM's granules and null block,
    SGLang's float32 free memory), the same window pool and, for SGLang, the same running-request cap."""
    ledger = memory_ledger(checked.model, checked.setup.layout, cluster)
    refusal, pool = answer["refusal"], answer.get("kv_pool")
    if ledger.verdict == "oom":  # the weights, or the profile run's activations, or the pool, do not fit
        when = "load" if "loading weights" in (ledger.engine_error or "") else "kv_pool"
        if not _out_of_memory(answer) or refusal["stage"] != when:
            what = _refusal_text(refusal) if refusal else f"sizes {(pool or {}).get('tokens_per_rank')} tokens"
            return [f"kv pool: shardwise runs out of memory at {when} ({ledger.reason}), the engine {what}: {e.text}"]
        return []
    if _out_of_memory(answer):
        return [f"kv pool: the engine runs out of memory ({_refusal_text(refusal)}), shardwise says {ledger.verdict}: "
                f"{e.text}"]  # fmt: skip
    if ledger.verdict == "no_kv_room":
        if refusal is None or refusal["stage"] != "kv_pool":
            return [f"kv pool: shardwise finds no room ({ledger.reason}), the engine sizes {pool}: {e.text}"]
        if ledger.engine_error and not same_reason(_ledger_rejection(ledger), refusal):
            return [f"kv pool refusal: shardwise {ledger.engine_error!r}, the engine {_refusal_text(refusal)}: "
                    f"{e.text}"]  # fmt: skip
        return []
    if refusal is not None:
        return [f"kv pool: the engine finds no room ({_refusal_text(refusal)}), shardwise sizes "
                f"{ledger.kv_tokens_per_rank:,} tokens per rank: {e.text}"]  # fmt: skip
    if pool is None or pool.get("tokens_per_rank") is None:
        return [f"kv pool: the oracle sized nothing ({(pool or {}).get('not_sized')}): {e.text}"]
    pairs = [("tokens per rank", ledger.kv_tokens_per_rank, pool.get("logical_tokens_per_rank")
              or pool["tokens_per_rank"])]  # fmt: skip
    if "swa_tokens_per_rank" in pool:
        pairs.append(
            ("window-pool tokens per rank", ledger.kv_window_pool_tokens_per_rank, pool["swa_tokens_per_rank"])
        )
    if e.engine == "sglang":  # it sizes its request slots from the pool (vLLM's come from --max-num-seqs)
        pairs.append(("running requests per rank", ledger.max_running_requests_per_rank, pool["max_running_requests"]))
    return [f"kv pool: {name}: shardwise {ours!r}, the engine {theirs!r} (cell {ledger.kv_bytes_per_token:,.1f} "
            f"against {pool.get('cell_bytes_per_token')} bytes per token; unchecked: {pool.get('unchecked')}): "
            f"{e.text}" for name, ours, theirs in pairs if ours != theirs]  # fmt: skip


def _out_of_memory(answer: dict) -> bool:
    """The engine ran out of the memory the oracle gave its faked GPU (vLLM's oracle simulates the device's
    allocations): a memory verdict, not a rule."""
    return (answer["refusal"] or {}).get("by") == "device"


def _ledger_rejection(ledger) -> Rejection:
    return Rejection(rule="kv_pool", reason=ledger.reason or "", engine_error=ledger.engine_error, source="ledger",
                     stage="load")  # fmt: skip


def crashes(items: list[tuple[Emitted, dict]]) -> list[str]:
    """Answers the engine never gave: the oracle, a stub or a fake failed (an error of the suite, not a refusal)."""
    return [f"{a['crash']['where']}: {a['crash']['type']}: {a['crash']['message'][:300]}: {e.text}"
            for e, a in items if a.get("crash")]  # fmt: skip


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
    broken = crashes(pairs)
    assert not broken, f"the oracle did not answer {len(broken)} of {len(pairs)} commands:\n" + "\n".join(broken[:20])
    problems = disagreements([(e, box) for e, _ in pairs], [a for _, a in pairs])
    stages = Counter((a["refusal"] or {}).get("stage", "ok") for _, a in pairs)
    sized = sum(bool((a.get("kv_pool") or {}).get("tokens_per_rank")) for _, a in pairs)
    print(f"\n{engine} {version}, {model} on {cluster}: {len(pairs)} commands; the engine: {dict(stages)}; "
          f"KV pools sized {sized}")  # fmt: skip
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
        return split_command(command).engine
    except SpecError:  # a row about a launcher shardwise does not know
        return None


def _checked_rows() -> list[tuple[str, str, str]]:
    """The `shardwise check` rows of docs/bad-inputs.md: (cluster, launch command, what shardwise says)."""
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


def test_speculative_decoding_keeps_the_overlap_scheduler_as_the_engine_does():
    """Speculative decoding on the engine release CI installs: a draft chain, a draft tree, n-gram lookup, the
    scheduler turned off by hand, and draft steps without a top-k; the overlap scheduler, every size and the refusal
    compared as for the emitted commands."""
    _available("sglang", "0.5.23")
    base = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code "
    commands = [
        "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1",
        "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 "
        "--speculative-num-draft-tokens 8",
        "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4",
        "--speculative-algorithm EAGLE --speculative-num-steps 2 --speculative-eagle-topk 1 --disable-overlap-schedule",
        "--speculative-algorithm EAGLE --speculative-num-steps 2",  # refused: top-k left unset
    ]
    box = load_cluster("8xh200")
    items = [(_emitted_from("sglang", "0.5.23", base + flags), box) for flags in commands]
    answers = ask("sglang", "0.5.23", items)
    broken = crashes([(e, a) for (e, _), a in zip(items, answers, strict=True)])
    assert not broken, "the oracle did not answer:\n" + "\n".join(broken)
    assert [a["resolved"]["disable_overlap_schedule"] for a in answers[:4]] == [False, False, False, True]
    assert answers[4]["refusal"]["type"] == "TypeError"
    problems = disagreements(items, answers)
    assert not problems, "\n".join(problems)


def test_prefill_budgets_are_the_engines():
    """Chunked prefill turned off and prefill budgets of the command's, on the engine release CI installs: where it
    does not chunk, the memory fraction it chooses reserves activations for its prefill budget, not a chunk; the
    resolved chunk and budget, every size and the KV pool compared as for the emitted commands."""
    _available("sglang", "0.5.23")
    base = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code "
    commands = ["--chunked-prefill-size -1", "--chunked-prefill-size -1 --max-prefill-tokens 32768",
                "--max-prefill-tokens 4096"]  # fmt: skip
    box = load_cluster("8xh200")
    items = [(_emitted_from("sglang", "0.5.23", base + flags), box) for flags in commands]
    answers = ask("sglang", "0.5.23", items)
    broken = crashes([(e, a) for (e, _), a in zip(items, answers, strict=True)])
    assert not broken, "the oracle did not answer:\n" + "\n".join(broken)
    assert [(a["resolved"]["chunked_prefill_size"], a["resolved"]["max_prefill_tokens"]) for a in answers] == [
        (-1, 16384), (-1, 32768), (8192, 4096)]  # fmt: skip
    fractions = [a["resolved"]["mem_fraction_static"] for a in answers]
    assert fractions[0] != fractions[2]  # the unchunked reserve reads the budget: the test can tell them apart
    problems = disagreements(items, answers)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("engine, version", ENGINES)
def test_the_documented_refusals_are_the_engines(engine, version):
    """Each refusal docs/bad-inputs.md shows for `check`, asked of the engine: it refuses where shardwise says it
    does (resolving its arguments, or building the model where the oracle goes that far), for the same reason (the
    exception and its message); what shardwise places later lets the engine resolve its arguments."""
    _available(engine, version)  # (a row with no flags at all is about shardwise's own usage line)
    rows = [(c, cmd) for c, cmd, _ in _checked_rows() if _engine_of(cmd) == engine and len(cmd.split()) > 4]
    items = [(_emitted_from(engine, version, cmd), load_cluster(c)) for c, cmd in rows]
    answers = ask(engine, version, items)
    broken = crashes([(e, a) for (e, _), a in zip(items, answers, strict=True)])
    assert not broken, "the oracle did not answer:\n" + "\n".join(broken)
    problems = disagreements(items, answers)
    assert not problems, "\n".join(problems)
    stages = {r.stage for e, box in items for r in shardwise_view(e, box).rejections[:1]}
    assert "arguments" in stages and {"load", "run"} & stages  # both kinds are covered
