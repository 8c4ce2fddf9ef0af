#!/usr/bin/env python3
"""Emit the vLLM oracle's probe commands (JSON lines) for the bundled configs.

python3 conformance/vllm_cases.py > /tmp/cases.jsonl
.engines/vllm-0.34.0/bin/python conformance/vllm_oracle.py < /tmp/cases.jsonl
"""

import json
import os

MODELS_DIR = os.path.join(os.path.dirname(__file__), "..", "src", "shardwise", "data", "models")
MODELS = ["kimi-k2.6", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b"]
# sm_count / nvlink / p2p: the box's real topology (the SXM boards are NVLinked;
# the RTX PRO 6000 server is PCIe-only with P2P on).
GPUS = {
    "H100": {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "count": 8,
        "capability": [9, 0],
        "sm_count": 132,
        "nvlink": True,
        "p2p": True,
    },
    "H200": {
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "count": 8,
        "capability": [9, 0],
        "sm_count": 132,
        "nvlink": True,
        "p2p": True,
    },
    "RTXPRO6000": {
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "memory_mib": 97887,
        "count": 8,
        "capability": [12, 0],
        "sm_count": 188,
        "nvlink": False,
        "p2p": True,
    },
}
DP = [
    "--data-parallel-size",
    "16",
    "--data-parallel-size-local",
    "8",
    "--data-parallel-address",
    "10.0.0.1",
    "--data-parallel-rpc-port",
    "13345",
]


def cases():
    for gname in GPUS:
        for m in MODELS:
            yield gname, m, ["-tp", "8"]
    per_model = [
        ["-tp", "8", "--max-model-len", "32k"],
        ["-tp", "8", "--max-model-len", "32K"],
        ["-tp", "8", "--max-model-len", "auto"],
        ["-tp", "8", "--max-model-len", "-1"],
        ["-tp", "8", "--max-model-len", "1m"],
        ["-tp", "8", "-pp", "2"],
        ["-tp", "8", "-pp", "2", "--distributed-executor-backend", "ray"],
        ["-tp", "8", "-pp", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"],
        ["-tp", "8", "-pp", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--headless"],
        ["-tp", "16", "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"],
        ["-tp", "1", *DP],
        ["-tp", "1", *DP, "--enable-expert-parallel"],
        ["-tp", "1", *DP, "--enable-expert-parallel", "--headless", "--data-parallel-start-rank", "8"],
        ["-tp", "8", "--enable-dbo"],
        ["-tp", "8", "--enable-expert-parallel", "--enable-dbo"],
        ["-tp", "8", "--enable-expert-parallel", "--enable-dbo", "--all2all-backend", "deepep_low_latency"],
        ["-tp", "8", "--enable-expert-parallel", "--all2all-backend", "deepep_low_latency"],
        ["-tp", "8", "--decode-context-parallel-size", "2"],
        ["-tp", "8", "--decode-context-parallel-size", "4"],
        ["-tp", "8", "--decode-context-parallel-size", "16"],
        ["-tp", "8", "--gpu-memory-utilization", "1.5"],
        ["-tp", "8", "--gpu-memory-utilization", "0.9"],
        ["-tp", "8", "--kv-cache-memory-bytes", "20g"],
        ["-tp", "8", "--limit-mm-per-prompt", '{"image": 0, "video": 0}'],
        ["-tp", "8", "--language-model-only"],
        ["-tp", "8", "--mm-encoder-tp-mode", "data"],
    ]
    for m in MODELS:
        for extra in per_model:
            yield "H100", m, extra


def main():
    for gname, m, extra in cases():
        argv = [os.path.abspath(os.path.join(MODELS_DIR, m)), *extra]
        print(json.dumps({"argv": argv, "gpu": GPUS[gname], "tag": f"{gname} {m} {' '.join(extra)}"}))


if __name__ == "__main__":
    main()
