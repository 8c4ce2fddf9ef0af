"""Engine-neutral layouts: groups of GPUs and component splits."""

from shardwise import load_model
from shardwise.engines.layout import EngineOptions, Layout, groups, shape_key, sized_alike_key, splits


def sglang(**kw) -> Layout:
    tp = kw.pop("stage_gpus", 8)
    fields = {"dense_tp": tp, "shared_tp": tp, "lm_head_tp": tp, **kw}
    return Layout(engine="sglang", version="0.5.23", stage_gpus=tp, **fields)


def test_ep_groups_stride_by_moe_tp():
    # tp 8, ep 4 → moe_tp 2: EP groups [0,2,4,6] and [1,3,5,7]; MoE-TP groups [0,1] [2,3] [4,5] [6,7]
    g = groups(sglang(moe_ep=4))
    assert g["moe_ep"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert g["moe_tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["attn_tp"] == [list(range(8))]


def test_pipeline_and_replica_groups():
    g = groups(sglang(stage_gpus=2, pp=2, replicas=2))
    assert g["stage"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_vllm_dp_outside_pp():
    # vLLM orders ranks DP × PP × TP: dp 2, pp 2, tp 2 → stage 0 of DP rank 1 is GPUs 4, 5
    lay = Layout(
        engine="vllm",
        version="0.33.0",
        pp=2,
        stage_gpus=4,
        attn_dp=2,
        dense_tp=2,
        shared_tp=2,
        lm_head_tp=2,
        dp_outside_pp=True,
    )
    g = groups(lay)
    assert g["stage"] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert g["attn_tp"] == [[0, 1], [4, 5], [2, 3], [6, 7]]


def test_splits_of_kimi_at_attention_dp():
    parts = {s.component: s for s in splits(sglang(attn_dp=8, moe_ep=8), load_model("kimi-k2.6"))}
    assert parts["attention heads (q, k/v up-projections, o)"].ways == 1  # replicated per attention-DP rank
    assert parts["routed experts"].ways == 8
    assert parts["KV cache"].ways == 1


def test_describe():
    assert sglang().describe() == "TP8"
    assert sglang(moe_ep=8).describe() == "TP8 EP8"
    assert sglang(moe_ep=4).describe() == "TP8 EP4×TP2"
    assert sglang(attn_dp=8, moe_ep=8).describe() == "DP8 EP8 dense-TP8"  # dense layers still over all 8 GPUs
    assert sglang(attn_dp=8, moe_ep=8, dense_tp=1).describe() == "DP8 EP8"
    assert sglang(dense_tp=1).describe() == "TP8 dense-TP1"
    assert sglang(stage_gpus=1, pp=8).describe() == "PP8"
    assert sglang(stage_gpus=4, replicas=2).describe() == "2× TP4"


def test_family_names_the_mechanisms_without_their_degrees():
    assert sglang().family() == "TP"
    assert sglang(moe_ep=8).family() == sglang(moe_ep=4).family() == "TP EP"
    assert sglang(attn_dp=8, moe_ep=8, dense_tp=1).family() == "attention-DP EP"  # nothing split by TP
    assert sglang(attn_dp=8, moe_ep=8).family() == "attention-DP TP EP"  # dense layers over all 8 GPUs
    assert sglang(stage_gpus=1, pp=8, dense_tp=1, shared_tp=1, lm_head_tp=1).family() == "PP"
    assert sglang(stage_gpus=4, attn_dp=2, moe_ep=2, dense_tp=1, pp=2, dcp=2).family() == "attention-DP TP EP PP DCP"
    assert sglang(stage_gpus=4, replicas=2).family() == "replicas TP"
    assert sglang(stage_gpus=1, dense_tp=1, shared_tp=1, lm_head_tp=1).family() == "one GPU"


def test_layouts_alike_in_their_weight_split_hold_every_tensor_alike():
    """The weights a GPU holds are remembered by `weight_split` (ops/build.py, cost/memory.py): it must name every
    degree `weight_ways` reads. Over the SGLang and vLLM layouts of Kimi K2.6 and DeepSeek-V3 on 64 GPUs, those equal in
    it split every tensor alike, and the split takes more than one value (the check has layouts to tell apart)."""
    from shardwise.engines.base import get_engine
    from shardwise.engines.layout import weight_split, weight_ways
    from shardwise.spec.cluster import load_cluster
    from shardwise.spec.weights import model_weights

    cluster = load_cluster("8x8xh100")
    for name in ("kimi-k2.6", "deepseek-v3"):
        model = load_model(name)
        weights = model_weights(model)
        first: dict[tuple[int, ...], list[float]] = {}
        for engine in ("sglang", "vllm"):
            eng = get_engine(engine)
            for given in eng.candidates(model, cluster):
                setup = eng.setup(dict(given), model=model, cluster=cluster, version=eng.version(None))
                if setup.layout is None:
                    continue
                ways = [weight_ways(w, setup.layout, model) for w in weights]
                assert first.setdefault(weight_split(setup.layout), ways) == ways
        assert len(first) > 10


def _other(value: object) -> object:
    """A value of the same kind as `value` but not equal to it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return (*value, 1)
    return 1  # None, or a nested setting


def test_the_keys_of_a_layout_cover_every_field_they_say():
    """A search shares step costs by `shape_key` (and the options that change what an op costs) and step times by
    `sized_alike_key`: a field left out of either would let layouts that cost differently share them."""
    layout = Layout(engine="sglang", version="0.5.23", stage_gpus=8, attn_dp=8, moe_ep=8, dense_tp=1, shared_tp=1,
                    lm_head_tp=8)  # fmt: skip
    for name in Layout.model_fields:
        if name == "options":
            continue
        changed = layout.model_copy(update={name: _other(getattr(layout, name))})
        assert shape_key(changed) != shape_key(layout), name
        assert sized_alike_key(changed) != sized_alike_key(layout), name
    for name in EngineOptions.model_fields:
        options = layout.options.model_copy(update={name: _other(getattr(layout.options, name))})
        changed = layout.model_copy(update={"options": options})
        assert shape_key(changed) == shape_key(layout), name
        assert (sized_alike_key(changed) == sized_alike_key(layout)) == (name == "memory_fraction"), name
