"""Measure a live OpenAI-compatible server the way the engines' own benchmark tools do.

Each request streams from /v1/completions (or /v1/chat/completions) with `max_tokens` = the output length and
`ignore_eos`, so the server produces exactly that many tokens. Per request: TTFT = first streamed content
after the send; ITL = the gaps between content chunks; E2E = the last chunk after the send; TPOT =
(E2E − TTFT) / (output tokens − 1). Token counts come from the server's `usage` (asked for with
`stream_options.include_usage`), else one token per content chunk. A level is a closed loop of C clients
(`--max-concurrency`) and/or an open loop at a request rate (gamma gaps, `burstiness` 1 = Poisson); its
throughput counts completed requests over the level's wall time. Failures (HTTP errors, timeouts, streams cut
short) are counted by kind and never mixed into the latencies; what completed is kept. Before timing, a
short request and then one per client open the connections (kept alive) and warm the server. Each request in
flight has its own connection. The client sends requests one at a time on its event loop, about a
millisecond each, so when many are sent at the same instant the last ones read that much later on TTFT.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from shardwise.errors import BenchError
from shardwise.serve.simulate import Stats

WORD = " hi"  # one token in the common BPE vocabularies; a prompt of n of them is about n tokens


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One request as the client saw it."""

    ok: bool
    error: str | None = None
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    itl_s: tuple[float, ...] = ()
    prompt_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class LevelResult:
    """One load level, in the benchmark tools' terms."""

    concurrency: int | None
    request_rate: float | None
    num_prompts: int
    completed: int
    failed: int
    errors: dict[str, int]
    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    isl: int
    osl: int

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0

    @property
    def total_token_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s if self.duration_s else 0.0


@dataclass(frozen=True, kw_only=True)
class Target:
    url: str  # base, e.g. http://localhost:30000
    model: str | None = None
    chat: bool = False
    timeout_s: float = 600.0


def _payload(target: Target, isl: int, osl: int) -> tuple[str, dict[str, Any]]:
    prompt = WORD * isl
    body: dict[str, Any] = {
        "max_tokens": osl,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
    }
    if target.model:
        body["model"] = target.model
    if target.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = prompt
    return "/v1/completions", body


def _content(chunk: dict[str, Any], chat: bool) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    first = choices[0]
    if chat:
        return (first.get("delta") or {}).get("content") or ""
    return first.get("text") or ""


async def one_request(client: httpx.AsyncClient, target: Target, *, isl: int, osl: int) -> Outcome:
    """Send one streaming request and time its chunks."""
    path, body = _payload(target, isl, osl)
    start = time.perf_counter()
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    done = False
    try:
        async with client.stream("POST", target.url.rstrip("/") + path, json=body, timeout=target.timeout_s) as r:
            if r.status_code != 200:
                await r.aread()
                return Outcome(ok=False, error=f"http {r.status_code}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    return Outcome(ok=False, error="bad stream data")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if _content(chunk, target.chat):
                    stamps.append(time.perf_counter())
    except httpx.TimeoutException:
        return Outcome(ok=False, error="timeout")
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return Outcome(ok=False, error="stream cut short")
    except httpx.ConnectError:
        return Outcome(ok=False, error="cannot connect")
    if not done or not stamps:
        return Outcome(ok=False, error="stream cut short" if stamps else "no tokens")
    output = int(usage.get("completion_tokens") or len(stamps))
    return Outcome(
        ok=True,
        ttft_s=stamps[0] - start,
        e2e_s=stamps[-1] - start,
        itl_s=tuple(np.diff(stamps).tolist()),
        prompt_tokens=int(usage.get("prompt_tokens") or isl),
        output_tokens=output,
    )


class _Clients:
    """One HTTP client per request in flight: httpx's shared connection pool queues concurrent streams behind
    each other (tens of milliseconds at 32 at once); a client per stream keeps each on its own connection."""

    def __init__(self) -> None:
        self.free: list[httpx.AsyncClient] = []
        self.all: list[httpx.AsyncClient] = []

    def take(self) -> httpx.AsyncClient:
        if self.free:
            return self.free.pop()
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        self.all.append(client)
        return client

    def give(self, client: httpx.AsyncClient) -> None:
        self.free.append(client)

    async def close(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.all))


async def run_level(
    target: Target,
    *,
    isl: int,
    osl: int,
    num_prompts: int,
    concurrency: int | None,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int = 0,
    warmup: bool = True,
    progress: Callable[[int], None] | None = None,
) -> LevelResult:
    """One level: `num_prompts` requests, at most `concurrency` in flight, sent at `request_rate`."""
    clients = _Clients()
    try:
        if warmup:  # one short request, then one per client at once: the server warms up, connections open
            client = clients.take()
            first = await one_request(client, target, isl=isl, osl=min(osl, 8))
            clients.give(client)
            if not first.ok:
                raise BenchError(f"the server at {target.url} does not serve a test request: {first.error}")
            width = min(concurrency or num_prompts, num_prompts)
            opened = [clients.take() for _ in range(width)]
            await asyncio.gather(*(one_request(c, target, isl=8, osl=2) for c in opened))
            for c in opened:
                clients.give(c)
        gate = asyncio.Semaphore(concurrency) if concurrency else None
        rng = np.random.default_rng(seed)
        finished = 0

        async def send(delay: float) -> Outcome:
            nonlocal finished
            await asyncio.sleep(delay)
            if gate is not None:
                await gate.acquire()
            client = clients.take()
            try:
                out = await one_request(client, target, isl=isl, osl=osl)
            finally:
                clients.give(client)
                if gate is not None:
                    gate.release()
            finished += 1
            if progress:
                progress(finished)
            return out

        if math.isinf(request_rate):
            delays = np.zeros(num_prompts)
        else:
            gaps = rng.gamma(burstiness, 1.0 / (request_rate * burstiness), size=num_prompts)
            delays = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        gc.freeze()  # objects made so far are not scanned again: no collector pause of the caller's heap mid-level
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(send(float(d)) for d in delays))
        duration = time.perf_counter() - start
    finally:
        gc.unfreeze()
        await clients.close()
    return summarise_level(
        outcomes, isl=isl, osl=osl, concurrency=concurrency, request_rate=request_rate, duration_s=duration
    )


def summarise_level(
    outcomes: list[Outcome], *, isl: int, osl: int, concurrency: int | None, request_rate: float, duration_s: float
) -> LevelResult:
    good = [o for o in outcomes if o.ok]
    tpots = [(o.e2e_s - o.ttft_s) / (o.output_tokens - 1) for o in good if o.output_tokens > 1]
    itls = [gap for o in good for gap in o.itl_s]
    return LevelResult(
        concurrency=concurrency,
        request_rate=None if math.isinf(request_rate) else request_rate,
        num_prompts=len(outcomes),
        completed=len(good),
        failed=len(outcomes) - len(good),
        errors=dict(Counter(o.error for o in outcomes if not o.ok and o.error)),
        duration_s=duration_s,
        input_tokens=sum(o.prompt_tokens for o in good),
        output_tokens=sum(o.output_tokens for o in good),
        ttft_s=Stats.of(np.array([o.ttft_s for o in good])),
        tpot_s=Stats.of(np.array(tpots)),
        itl_s=Stats.of(np.array(itls)),
        e2e_s=Stats.of(np.array([o.e2e_s for o in good])),
        isl=isl,
        osl=osl,
    )
