"""Properties over random valid models and clusters, and fuzzing of every reader of user input.

Example counts are bounded so CI stays fast; each property is a statement that must hold for any input.
"""

import json
import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardwise.cost.memory import memory_ledger
from shardwise.engines.base import get_engine
from shardwise.engines.check import check_command
from shardwise.errors import ShardwiseError
from shardwise.measure.importers import read_results
from shardwise.serve.steady import Predictor
from shardwise.serve.steps import StepTimes
from shardwise.spec.cluster import build_cluster, load_cluster
from shardwise.spec.hf_config import model_from_config

# CI runs the same 25 examples every time (derandomized), so a landing never hangs on a newly drawn input; search
# wider by hand: SHARDWISE_FUZZ_EXAMPLES=1000 pytest tests/test_properties.py draws that many, at random
WIDER = int(os.environ.get("SHARDWISE_FUZZ_EXAMPLES", "0"))
FEW = settings(max_examples=WIDER or 25, deadline=None, derandomize=not WIDER,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip


@st.composite
def llama_like(draw) -> dict:
    """A valid dense or MoE decoder config.json (Llama / Qwen3-MoE shaped)."""
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    head_dim = draw(st.sampled_from([64, 128]))
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": heads * head_dim,
        "num_hidden_layers": draw(st.integers(2, 48)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": draw(st.sampled_from([1024, 4096, 11008, 14336])),
        "vocab_size": draw(st.sampled_from([32000, 128256, 151936])),
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    if draw(st.booleans()):
        config.update(architectures=["Qwen3MoeForCausalLM"], num_experts=draw(st.sampled_from([8, 64, 128])),
                      num_experts_per_tok=draw(st.sampled_from([2, 8])), moe_intermediate_size=768,
                      head_dim=head_dim)  # fmt: skip
    return config


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


@FEW
@given(config=llama_like(), gpus=st.sampled_from(["1xh100", "2xh100", "4xh200", "8xrtx-pro-6000", "8xb200"]))
def test_every_layout_of_a_random_model_is_sound(config, gpus):
    """No crash, no NaN or inf; each GPU's memory parts add up to its capacity; every enumerated layout passes
    the engine's rules again when its own launch command is checked, and comes back as the same layout."""
    model = model_from_config(config, name="random")
    cluster = load_cluster(gpus)
    engine = get_engine("sglang")
    path = f"/tmp/shardwise-random-{abs(hash(json.dumps(config, sort_keys=True)))}"
    for setup in engine.enumerate(model, cluster)[:6]:
        memory = memory_ledger(model, setup.layout, cluster)
        for gpu in memory.per_gpu:
            parts = gpu.weights_bytes + gpu.kv_bytes + gpu.other_bytes + gpu.free_bytes
            assert math.isclose(parts, gpu.capacity_bytes, rel_tol=1e-9)
            assert _finite(gpu.weights_bytes, gpu.kv_bytes, gpu.free_bytes)
        launch = engine.launch_command(setup, model_ref=path)
        again = get_engine("sglang").resolve(launch[3:], model=model, cluster=cluster)
        assert again.valid and again.layout.structure() == setup.layout.structure()
        if memory.verdict == "ok" and memory.max_concurrency(isl=256, osl=256) >= 1:
            for p in Predictor(StepTimes(model, setup.layout, cluster), memory).sweep([1, 16], isl=256, osl=256):
                assert _finite(p.output_tok_s, p.tpot_s, p.ttft_s) and p.output_tok_s > 0


@FEW
@given(config=llama_like())
def test_more_gpus_of_the_same_kind_never_lower_the_best_throughput(config):
    """Twice the GPUs can always run two copies of the best smaller setup, so the best throughput, at as many
    clients as the setup can hold, can only rise (at a fixed client count, spreading them thinner may not)."""
    model = model_from_config(config, name="random")
    best = []
    for n in (2, 4, 8):
        cluster = load_cluster(f"{n}xh100")
        peaks = [0.0]
        for setup in get_engine("sglang").enumerate(model, cluster):
            memory = memory_ledger(model, setup.layout, cluster)
            full = min(memory.max_concurrency(isl=256, osl=256), 4096)
            if memory.verdict == "ok" and full >= 1:
                (p,) = Predictor(StepTimes(model, setup.layout, cluster), memory).sweep([full], isl=256, osl=256)
                peaks.append(p.output_tok_s)
        best.append(max(peaks))
    assert best == sorted(best)


# --- fuzzing of the readers: each input is refused with a ShardwiseError or read, never a crash ----------


@FEW
@given(words=st.lists(st.sampled_from(["python", "-m", "sglang.launch_server", "vllm", "serve", "--tp", "8",
                                       "--ep-size", "-tp", "--model-path", "m", "--pp", "=", "x", "--dp", "0", "-1",
                                       "--enable-dp-attention", "--speculative-algorithm", "EAGLE", "'", '"']),
                      max_size=12))  # fmt: skip
def test_the_launch_command_parser_never_crashes(words):
    try:
        check_command(" ".join(words), cluster=load_cluster("8xh100"), model="llama-3.1-8b")
    except ShardwiseError:
        pass


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
CONFIG_KEYS = st.sampled_from(["architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "vocab_size", "intermediate_size", "num_experts",
                               "num_experts_per_tok", "text_config", "quantization_config", "head_dim"])  # fmt: skip


@FEW
@given(config=st.dictionaries(CONFIG_KEYS, JSON_VALUES, max_size=10))
def test_the_config_reader_never_crashes(config):
    try:
        model_from_config(config, name="fuzz")
    except ShardwiseError:
        pass


@FEW
@given(intra=st.dictionaries(st.sampled_from(["link", "p2p", "numa_nodes", "pcie_switches", "speed"]), JSON_VALUES,
                             max_size=4),
       nodes=st.integers(-2, 5), per_node=st.integers(-2, 80))  # fmt: skip
def test_the_cluster_reader_never_crashes(intra, nodes, per_node):
    try:
        build_cluster(name="fuzz", gpu="h100", nodes=nodes, gpus_per_node=per_node, intra_node=intra)
    except ShardwiseError:
        pass


@FEW
@given(records=st.lists(st.dictionaries(st.sampled_from(["tool", "output_throughput", "mean_e2el_ms", "completed",
                                                         "total_input_tokens", "total_output_tokens",
                                                         "max_concurrency", "request_rate", "model_id"]),
                                        JSON_VALUES, max_size=8), max_size=3))  # fmt: skip
def test_the_results_importers_never_crash(tmp_path, records):
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    try:
        read_results(path)
    except ShardwiseError:
        pass
