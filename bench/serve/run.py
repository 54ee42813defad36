"""Serving benchmark (like `vllm bench serve`): drive a running server with streaming
completions at a fixed concurrency and report TTFT, TPOT, ITL, E2EL (mean / p50 / p99),
request and output-token throughput.

TTFT: request sent -> first token chunk. ITL: gaps between token chunks. TPOT per request:
(latency - TTFT) / (output_tokens - 1). Prompts are random token ids of exactly
``input_len`` tokens and generation ignores EOS, so every request costs the same.

On a shared host the speed drifts between runs, so a sweep over concurrency levels can run
in several rounds (each round visits every level once, interleaved in time) and
:func:`combine_rounds` reports each level by the median over its rounds.

The request client is bench/serve/client.py, the summaries and tables
bench/serve/report.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp

from bench.common.errors import BenchError
from bench.serve.client import one_request
from bench.serve.config import BenchConfig
from bench.serve.report import summarize
from bench.serve.workloads import UNCACHED, pass_salts, random_ids

T = TypeVar("T")


@asynccontextmanager
async def bench_session(cfg: BenchConfig) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """An HTTP session for ``concurrency`` streams and the model to name: cfg.model, else
    the first of GET /v1/models. Raises aiohttp.ClientError when the server cannot be
    reached or refuses the list, BenchError when it serves no model or not cfg.model
    (before any request is sent: every one would be a 404)."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    # a connection per request: a server that closes idle keep-alive connections on its
    # own clock (llama-server's HTTP library) never races the client's reuse of one
    connector = aiohttp.TCPConnector(limit=cfg.concurrency + 2, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=timeout) as session:
        yield session, await served_model(session, cfg)


async def served_model(session: aiohttp.ClientSession, cfg: BenchConfig) -> str:
    """cfg.model when the server lists it in GET /v1/models, else (None) the first model
    it lists; BenchError when it lists none, or not cfg.model."""
    async with session.get(cfg.endpoint("/v1/models"), params={"limit": "1000"},
                           raise_for_status=True) as r:
        served = [str(m["id"]) for m in (await r.json()).get("data") or []]
    if not served:
        raise BenchError(f"{cfg.url} serves no model (GET /v1/models lists none)")
    if cfg.model is None:
        return served[0]
    if cfg.model not in served:
        raise BenchError(f"--model {cfg.model}: {cfg.url} does not serve it (it serves "
                         f"{', '.join(served)})")
    return cfg.model


async def gather_limited(concurrency: int, jobs: Sequence[Callable[[], Awaitable[T]]]
                         ) -> list[T]:
    """Each job's result, in order, with at most ``concurrency`` running at once."""
    sem = asyncio.Semaphore(concurrency)

    async def limited(job: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await job()

    return list(await asyncio.gather(*(limited(j) for j in jobs)))


async def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """The random workload: num_prompts random-token prompts, at most ``concurrency`` in
    flight, each with its own cache salt (nothing shared, even across rounds). The
    prompts are drawn per (seed, round, concurrency): each server of a round and level
    gets the same ones, and no pass repeats another's, so a server without cache_salt
    (llama-server) finds nothing either. Raises aiohttp.ClientError when the server
    cannot be reached or has no model."""
    async with bench_session(cfg) as (session, model):
        prompts = random_prompts(cfg)
        return await run_uncached(session, cfg, model, prompts) | {"pass": UNCACHED}


def random_prompts(cfg: BenchConfig) -> list[list[int]]:
    """The random workload's prompts for cfg's seed, round and concurrency level."""
    rng = random.Random(f"{cfg.seed}/{cfg.round}/{cfg.concurrency}")
    return [random_ids(rng, cfg.input_len, cfg.vocab_lo, cfg.vocab_hi)
            for _ in range(cfg.num_prompts)]


async def run_uncached(session: aiohttp.ClientSession, cfg: BenchConfig, model: str,
                       prompts: list[list[int]],
                       messages: list[list[dict[str, str]]] | None = None) -> dict[str, Any]:
    """``prompts`` at most ``concurrency`` in flight, each with its own cache salt; the
    summary of the timed requests. ``messages``: sent as chat requests (bench/serve/
    client.py one_request), ``prompts`` being their ids."""
    salts = pass_salts(UNCACHED, len(prompts))
    chats = messages if messages is not None else [None] * len(prompts)
    jobs = [lambda p=p, s=s, m=m: one_request(session, cfg, model, p, s[0], m)
            for p, s, m in zip(prompts, salts, chats, strict=True)]
    start = time.perf_counter()
    results = await gather_limited(cfg.concurrency, jobs)
    return summarize(cfg, results, time.perf_counter() - start)
