"""Convert aiter's tuned block-FP8 GEMM configs into kernel tables shardwise reads (data/hardware/kernel-tables/).

aiter, the kernel library SGLang calls on AMD GPUs, ships the result of its GEMM tuner: for each shape it tuned
(M tokens, N output and K input widths) and each CU count, the kernel it chose and the time the tuner measured for
it, in microseconds (`aiter/configs/a8w8_blockscale_tuned_gemm.csv`: cu_num, M, N, K, kernelId, splitK, us,
kernelName). Those are the times of the CK kernel `gemm_a8w8_blockscale` that SGLang's block-FP8 linear layers run
on ROCm through 0.5.5.post3 (layers/quantization/fp8_utils.py `aiter_w8a8_block_fp8_linear`, with SGLANG_USE_AITER,
which SGLang's ROCm images set). This script writes them in the layout of the kernel tables shardwise already reads,
<system>/gemm/sglang/<release>/gemm_perf.parquet with the columns kernel_source, m, n, k, latency (ms) and
gemm_dtype, for 304 CUs (MI300X and MI325X) as the system `mi300x`. The 256-CU rows (MI355X) are left out: at
v0.1.7.post1 they lack DeepSeek's o_proj and q_b shapes at TP8 and time the others from 16 tokens where other shapes
start at 1, so a decode batch under 16 finds no time for any of them.

    git -C aiter show v0.1.7.post1:aiter/configs/a8w8_blockscale_tuned_gemm.csv > tuned.csv
    python scripts/aiter_gemm_tables.py tuned.csv src/shardwise/data/hardware/kernel-tables --release 0.5.5.post3

v0.1.7.post1 is the aiter SGLang 0.5.5.post3's ROCm images build (docker/rocm.Dockerfile AITER_COMMIT); the rows for
DeepSeek-V3/R1's TP8 shapes are the same in every release from v0.1.5 (2025-08-28, before the 0.5.2 images of
2025-09-15, whose own pin is not published) to v0.1.7.post1.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SYSTEMS = {"304": "mi300x"}  # aiter keys its tuned kernels by CU count
KERNEL = "aiter_ck_gemm_a8w8_blockscale"


def tables(rows: list[dict[str, str]]) -> dict[str, pa.Table]:
    """One table per system from aiter's tuned rows (those of other CU counts, or without a time, left out)."""
    found: dict[str, list[tuple[int, int, int, float]]] = {system: [] for system in SYSTEMS.values()}
    for row in rows:
        system = SYSTEMS.get(row["cu_num"])
        if system is not None and row.get("us"):
            found[system].append((int(row["M"]), int(row["N"]), int(row["K"]), float(row["us"]) / 1e3))  # ms
    return {
        system: pa.table(
            {
                "kernel_source": [KERNEL] * len(shapes),
                "m": [m for m, _, _, _ in shapes],
                "n": [n for _, n, _, _ in shapes],
                "k": [k for _, _, k, _ in shapes],
                "latency": [ms for _, _, _, ms in shapes],
                "gemm_dtype": ["fp8_block"] * len(shapes),
            }
        )
        for system, shapes in found.items()
        if shapes
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tuned_csv", type=Path, help="aiter's a8w8_blockscale_tuned_gemm.csv")
    parser.add_argument("root", type=Path, help="the kernel-tables folder to write under")
    parser.add_argument("--release", required=True, help="the SGLang release whose images ran these kernels")
    args = parser.parse_args(argv)
    try:
        with args.tuned_csv.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        found = tables(rows)
    except (OSError, KeyError, ValueError) as exc:
        print(
            f"{args.tuned_csv}: not an aiter tuned-GEMM CSV shardwise can read ({exc!r}); it needs the columns "
            "cu_num, M, N, K and us, as aiter/configs/a8w8_blockscale_tuned_gemm.csv has",
            file=sys.stderr,
        )
        return 2
    for system, table in found.items():
        folder = args.root / system / "gemm" / "sglang" / args.release
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / "gemm_perf.parquet")
        print(f"{system}: {table.num_rows} shapes -> {folder / 'gemm_perf.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
