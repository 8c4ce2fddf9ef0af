"""Speed of the main job: `shardwise theorise` on its default case, start-up included, as a user runs it.

Run: python benchmarks/bench_theorise.py   (prints wall time of 3 runs; the target is under 3 s on a 2-core
machine; not a test)
"""

from __future__ import annotations

import subprocess
import sys
import time


def main() -> None:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "shardwise", "theorise"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    print("shardwise theorise (default case): " + ", ".join(f"{t:.2f} s" for t in times) + f"; best {min(times):.2f} s")


if __name__ == "__main__":
    main()
