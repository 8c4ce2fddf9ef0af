"""Speed and memory of the main job: `shardwise theorise` as a user runs it, start-up included.

Run: python benchmarks/bench_theorise.py           the default case, three times (target: under 3 s on a 2-core
                                                    machine)
     python benchmarks/bench_theorise.py --large   also 8x8 H100 with both engines, twice (target: under 5 s and
                                                    300 MB peak resident memory)
Prints the wall time of each run and the peak resident memory of the largest; not a test. One untimed run first
writes the package's bytecode, as Python does on a user's first run (even where PYTHONDONTWRITEBYTECODE is set here):
the timed runs are every run after that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

CASES = {
    "default case": [],
    "8x8 H100, both engines": ["--gpus", "8x8xh100", "--framework", "all"],
}


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(name: str, args: list[str], times: int) -> None:
    seconds, peaks = [], []
    for _ in range(times):
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "shardwise", "theorise", *args], stdout=subprocess.DEVNULL,
                                 env=ENV)  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        seconds.append(time.perf_counter() - start)
        if status:
            raise SystemExit(f"shardwise theorise {' '.join(args)} failed with status {status}")
        peaks.append(usage.ru_maxrss / 1024)  # KiB on Linux
    print(f"shardwise theorise ({name}): " + ", ".join(f"{t:.2f} s" for t in seconds)
          + f"; best {min(seconds):.2f} s; peak memory {max(peaks):.0f} MiB")  # fmt: skip


def main() -> None:
    subprocess.run([sys.executable, "-m", "shardwise", "theorise", "--concurrency", "1"], stdout=subprocess.DEVNULL,
                   env=ENV, check=True)  # fmt: skip
    run("default case", CASES["default case"], 3)
    if "--large" in sys.argv[1:]:
        run("8x8 H100, both engines", CASES["8x8 H100, both engines"], 2)


if __name__ == "__main__":
    main()
