#!/usr/bin/env python3
"""Print the probe commands from SGLANG_NOTES.md as oracle input (JSON lines), the KV-pool probes with "memory".

python3 conformance/sglang_cases.py | .engines/sglang-0.5.23/bin/python conformance/sglang_oracle.py
"""

import json
import os

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "shardwise", "data", "models")
GPUS = {
    "rtx6000": {
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "memory_mib": 97887,
        "count": 8,
        "capability": [12, 0],
        "sm_count": 188,
        "nvlink": False,
        "p2p": True,
    },
    "h100": {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "count": 8,
        "capability": [9, 0],
        "sm_count": 132,
        "nvlink": True,
        "p2p": True,
    },
    "h200": {
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "count": 8,
        "capability": [9, 0],
        "sm_count": 132,
        "nvlink": True,
        "p2p": True,
    },
}
EAGLE = (
    "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4"
)
CASES = [
    ("kimi-tp8", "rtx6000", "kimi-k2.6", "--tp-size 8"),
    ("kimi-tp8-h200", "h200", "kimi-k2.6", "--tp-size 8"),
    ("kimi-dcp8", "rtx6000", "kimi-k2.6", "--tp-size 8 --dcp-size 8"),
    ("kimi-dcp8-h200", "h200", "kimi-k2.6", "--tp-size 8 --dcp-size 8"),
    ("kimi-dcp8-eagle", "rtx6000", "kimi-k2.6", "--tp-size 8 --dcp-size 8 " + EAGLE),
    ("kimi-dcp8-eagle-h200", "h200", "kimi-k2.6", "--tp-size 8 --dcp-size 8 " + EAGLE),
    ("kimi-lmonly", "rtx6000", "kimi-k2.6", "--tp-size 8 --language-model-only"),
    ("gptoss-attndp-nocg", "h100", "gpt-oss-120b", "--tp-size 8 --attn-dp-size 8 --disable-cuda-graph"),
    ("gptoss-attndp", "h100", "gpt-oss-120b", "--tp-size 8 --attn-dp-size 8"),
    ("gptoss-tp8", "h100", "gpt-oss-120b", "--tp-size 8"),
    ("memfrac-1.5", "h100", "llama-3.1-70b", "--tp-size 8 --mem-fraction-static 1.5"),
    ("dp-lm-head-no-attndp", "h100", "deepseek-v3", "--tp-size 8 --enable-dp-lm-head"),
    ("moe-dp2-no-cp", "h200", "deepseek-v3", "--tp-size 8 --moe-dp-size 2"),
    ("moe-dp2-cp2", "h200", "deepseek-v3", "--tp-size 8 --moe-dp-size 2 --attn-cp-size 2"),
    ("nnodes2-bare", "h100", "deepseek-v3", "--nnodes 2 --tp-size 16"),
    ("nnodes2-full", "h100", "deepseek-v3", "--nnodes 2 --tp-size 16 --node-rank 0 --dist-init-addr 10.0.0.1:5000"),
    ("llama-attndp", "h100", "llama-3.1-70b", "--tp-size 8 --attn-dp-size 8"),
    ("llama-enable-dpattn", "h100", "llama-3.1-70b", "--tp-size 8 --enable-dp-attention --dp-size 8"),
    ("deepep-tp8-ep8", "rtx6000", "qwen3-235b-a22b", "--tp-size 8 --ep-size 8 --moe-a2a-backend deepep"),
    ("deepep-attndp", "rtx6000", "deepseek-v3", "--tp-size 8 --attn-dp-size 8 --ep-size 8 --moe-a2a-backend deepep"),
    ("qwen3-tp8", "h200", "qwen3-235b-a22b", "--tp-size 8"),
    ("dsv3-tp8-h200", "h200", "deepseek-v3", "--tp-size 8"),
    ("bad-flag", "h100", "llama-3.1-70b", "--tp-size 8 --no-such-flag"),
]

# KV-pool probes ("memory": per GPU, bytes). The figures are shardwise's ledger for the same command on the suite's
# cluster (capacity; capacity − its CUDA-stack estimate; each stage's weights), so the answers can be set against
# memory_ledger(...).kv_tokens_per_rank (SGLANG_NOTES.md, "KV pool").
RTX, H100, H200 = 102641958912, 85520809984, 150754820096
RUNTIME = 3843995730  # shardwise's non-torch estimate, several GPUs
KV_CASES = [
    ("kv-kimi-tp8-mfs95", "rtx6000", "kimi-k2.6", "--tp-size 8 --mem-fraction-static 0.95", RTX, [77124830688]),
    (
        "kv-dsv3-pp8",
        "h200",
        "deepseek-v3",
        "--tp-size 1 --pp-size 8",
        H200,
        [49652072992, 80583628832, 80583628832, 92095575808, 92095575808, 92095575808, 92095575808, 93948948224],
    ),
    ("kv-gptoss-tp8-hybrid-swa", "rtx6000", "gpt-oss-120b", "--tp-size 8", RTX, [8179702272]),
    (
        "kv-dsv3-dcp4",
        "h200",
        "deepseek-v3",
        "--tp-size 8 --dcp-size 4 --attention-backend flashinfer",
        H200,
        [85140101152],
    ),
    ("kv-llama-tp2-no-room", "h100", "llama-3.1-70b", "--tp-size 2", H100, [70555025408]),
]

for cid, gpu, model, flags in CASES:
    argv = ["--model-path", os.path.normpath(os.path.join(MODELS, model))] + flags.split()
    print(json.dumps({"id": cid, "gpu": GPUS[gpu], "argv": argv}))
for cid, gpu, model, flags, capacity, weights in KV_CASES:
    argv = ["--model-path", os.path.normpath(os.path.join(MODELS, model))] + flags.split()
    memory = {"capacity_bytes": capacity, "free_before_load_bytes": capacity - RUNTIME, "weights_bytes": weights}
    print(json.dumps({"id": cid, "gpu": GPUS[gpu], "argv": argv, "memory": memory}))
