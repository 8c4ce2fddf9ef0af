"""A real HTTP server on localhost that streams OpenAI-style completions at configured speeds, for testing the
benchmark client. It is built the way SGLang's and vLLM's servers are (an ASGI app under uvicorn, streaming
server-sent events) and runs in its own process. It sends token n at `ttft_s` + n × `tpot_s` after a request
arrives (on that schedule whatever its event loop did meanwhile), reports usage, and can cut every `drop_every`-th
stream short after `drop_after` tokens."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from itertools import count


@dataclass
class Speed:
    ttft_s: float = 0.1
    tpot_s: float = 0.02
    drop_every: int = 0  # 0: never
    drop_after: int = 3
    fail_every: int = 0  # every n-th request answers 500 (0: never)
    stall_every: int = 0  # every n-th request stops sending after its first token and never ends (0: never)
    stall_from: int = 0  # the n-th request and every later one stop after their first token (0: never)


def app(speed: Speed):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    served = count(1)

    class Cut(Exception):
        """Raised inside the stream: uvicorn then closes the connection without ending the response."""

    async def complete(request: Request) -> StreamingResponse | JSONResponse:
        body = await request.json()
        arrived = time.perf_counter()
        chat = request.url.path.endswith("/chat/completions")
        index = next(served)
        tokens = int(body.get("max_tokens", 16))
        prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        drop = speed.drop_every and index % speed.drop_every == 0
        stall = speed.stall_every and index % speed.stall_every == 0
        stall = stall or (speed.stall_from and index >= speed.stall_from)
        if speed.fail_every and index % speed.fail_every == 0:
            return JSONResponse({"error": "overloaded"}, status_code=500)

        async def events():
            for n in range(tokens):
                due = arrived + speed.ttft_s + n * speed.tpot_s  # on schedule, whatever the loop did meanwhile
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                if drop and n == speed.drop_after:
                    raise Cut
                if stall and n == 1:
                    await asyncio.sleep(3600)
                piece = {"delta": {"content": "x"}} if chat else {"text": "x"}
                yield f"data: {json.dumps({'choices': [{'index': 0, **piece}]})}\n\n"
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    routes = [Route(p, complete, methods=["POST"]) for p in ("/v1/completions", "/v1/chat/completions")]
    routes.append(Route("/health", health))
    return Starlette(routes=routes)


GRACE_S = 5.0


class FakeServer:
    """The server in its own process, on a free port."""

    def __init__(self, speed: Speed) -> None:
        self.speed = speed
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = [sys.executable, __file__, str(self.port), json.dumps(asdict(self.speed))]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the test server did not start")

    def __exit__(self, *exc) -> None:
        """SIGTERM, as an engine's server is stopped; uvicorn then cancels what still streams after a second
        (`timeout_graceful_shutdown`: a stalled stream would otherwise hold it open for an hour). A server still
        running after GRACE_S more (a loaded machine) is killed: the test is about the client, not the stop."""
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app(Speed(**json.loads(sys.argv[2]))), host="127.0.0.1", port=int(sys.argv[1]), log_level="error",
                timeout_graceful_shutdown=1)  # fmt: skip
