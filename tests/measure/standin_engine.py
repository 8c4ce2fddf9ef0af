"""A stand-in for an engine's launcher: it takes SGLang's flags, fails the way SGLang fails for the user's
two bad setups (--tp-size 4 --ep-size 2: CUDA out of memory; --tp-size 2 --ep-size 4: ZeroDivisionError),
and otherwise serves the OpenAI-compatible API of the test server, faster with more tensor parallelism."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_server import Speed, app  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--ep-size", "--ep", type=int, default=1)
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    print(f"stand-in engine: tp {args.tp_size}, ep {args.ep_size}", flush=True)
    if (args.tp_size, args.ep_size) == (4, 2):
        print("Loading weights...", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if args.ep_size > args.tp_size:
        print('Traceback (most recent call last):\n  File "server_args.py", line 1, in <module>', flush=True)
        print("ZeroDivisionError: integer division or modulo by zero", flush=True)
        sys.exit(1)
    import uvicorn

    speed = Speed(ttft_s=0.02, tpot_s=0.02 / args.tp_size)
    uvicorn.run(app(speed), host="127.0.0.1", port=args.port, log_level="error")
