"""Serving benchmark (like `vllm bench serve`): drive a running server with streaming
completions at a fixed concurrency and report TTFT, TPOT, ITL, E2EL (mean / p50 / p99),
request and output-token throughput.

TTFT: request sent -> first token chunk. ITL: gaps between token chunks. TPOT per request:
(latency - TTFT) / (output_tokens - 1). Prompts are random token ids of exactly
``input_len`` tokens and generation ignores EOS, so every request costs the same.

On a shared host the speed drifts between runs, so a sweep over concurrency levels can run
in several rounds (each round visits every level once, interleaved in time) and
:func:`combine_rounds` reports each level by the median over its rounds.

The request client is service/bench_client.py, the summaries and tables
service/bench_report.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from service.bench_client import RequestResult, one_request
from service.bench_report import summarize


@dataclass(frozen=True)
class BenchConfig:
    url: str
    concurrency: int = 1
    num_prompts: int = 16
    input_len: int = 128
    output_len: int = 64
    model: str | None = None  # None: the first of GET /v1/models
    api_key: str | None = None
    seed: int = 0
    vocab_lo: int = 1000  # prompt ids drawn from [vocab_lo, vocab_hi)
    vocab_hi: int = 20000

    def endpoint(self, path: str) -> str:
        """The server URL + path ("/v1/...")."""
        return self.url.rstrip("/") + path

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


async def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """The load: num_prompts random-token prompts, at most ``concurrency`` in flight.
    Raises aiohttp.ClientError when the server cannot be reached or has no model."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    connector = aiohttp.TCPConnector(limit=cfg.concurrency + 2)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=timeout) as session:
        model = cfg.model
        if model is None:
            async with session.get(cfg.endpoint("/v1/models"), raise_for_status=True) as r:
                model = (await r.json())["data"][0]["id"]
        rng = random.Random(cfg.seed)
        prompts = [[rng.randrange(cfg.vocab_lo, cfg.vocab_hi) for _ in range(cfg.input_len)]
                   for _ in range(cfg.num_prompts)]
        sem = asyncio.Semaphore(cfg.concurrency)

        async def limited(p: list[int]) -> RequestResult:
            async with sem:
                return await one_request(session, cfg, model, p)

        start = time.perf_counter()
        results = await asyncio.gather(*(limited(p) for p in prompts))
        return summarize(cfg, list(results), time.perf_counter() - start)
