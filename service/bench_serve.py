"""Serving benchmark (like `vllm bench serve`): drive a running server with streaming
completions at a fixed concurrency and report TTFT, TPOT, ITL, E2EL (mean / p50 / p99),
request and output-token throughput.

TTFT: request sent -> first token chunk. ITL: gaps between token chunks. TPOT per request:
(latency - TTFT) / (output_tokens - 1). Prompts are random token ids of exactly
``input_len`` tokens and generation ignores EOS, so every request costs the same.

On a shared host the speed drifts between runs, so a sweep over concurrency levels can run
in several rounds (each round visits every level once, interleaved in time) and
:func:`combine_rounds` reports each level by the median over its rounds.

A client on the server's host takes CPU the server would use, so it is kept light: aiohttp
(a C HTTP parser) reading whole network chunks, not a line iterator per event.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


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


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    s = sorted(xs)

    def pct(p: float) -> float:
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.5), "p99": pct(0.99)}


def sse_data(buffered: bytes, received: bytes) -> tuple[list[bytes], bytes]:
    """Server-sent events split out of a byte stream: (the data payload of each event
    completed by ``received``, the bytes of the incomplete event to carry to the next
    call). Events end with a blank line; within one, ``data:`` lines (one optional space
    after the colon) are joined with newlines, other fields are ignored."""
    events = (buffered + received).replace(b"\r\n", b"\n").split(b"\n\n")
    rest = events.pop()
    payloads = []
    for event in events:
        data = [line[5:].removeprefix(b" ") for line in event.split(b"\n")
                if line.startswith(b"data:")]
        if data:
            payloads.append(b"\n".join(data))
    return payloads, rest


async def one_request(session: aiohttp.ClientSession, cfg: BenchConfig, model: str,
                      prompt: list[int]) -> RequestResult:
    """One streamed completion: TTFT at the first token's event, then one inter-token
    latency per event. Events that arrive in one read share that read's time."""
    body = {"model": model, "prompt": prompt, "max_tokens": cfg.output_len, "stream": True,
            "temperature": 0.0, "ignore_eos": True}
    start = time.perf_counter()
    res, last = RequestResult(ok=False), start
    try:
        async with session.post(cfg.endpoint("/v1/completions"), json=body) as r:
            if r.status != 200:
                return RequestResult(False, error=f"HTTP {r.status}: {await r.read()!r}")
            buffered = b""
            async for received in r.content.iter_any():
                now = time.perf_counter()
                payloads, buffered = sse_data(buffered, received)
                for data in payloads:
                    if data == b"[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        return RequestResult(False, error=chunk["error"]["message"])
                    if res.output_tokens == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.output_tokens += 1
    except aiohttp.ClientError as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    res.latency, res.ok = time.perf_counter() - start, True
    return res


def summarize(cfg: BenchConfig, results: list[RequestResult], duration: float
              ) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "config": asdict(cfg) | {"api_key": None},
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_output_tokens": out_tokens,
        "ttft_s": percentiles([r.ttft for r in ok]),
        "tpot_s": percentiles(tpot),
        "itl_s": percentiles([x for r in ok for x in r.itl]),
        "e2el_s": percentiles([r.latency for r in ok]),
    }


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


def format_table(s: dict[str, Any]) -> str:
    c = s["config"]
    rows = [f"concurrency {c['concurrency']}, {c['num_prompts']} prompts, input "
            f"{c['input_len']}, output {c['output_len']}",
            f"{'completed / failed':<28}{s['completed']} / {s['failed']}",
            f"{'duration (s)':<28}{s['duration_s']:.2f}",
            f"{'request throughput (req/s)':<28}{s['request_throughput']:.3f}",
            f"{'output throughput (tok/s)':<28}{s['output_token_throughput']:.2f}",
            f"{'metric (ms)':<28}{'mean':>10}{'p50':>10}{'p99':>10}"]
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"),
                      ("e2el_s", "E2EL")):
        v = s[key]
        rows.append(f"{name:<28}{v['mean'] * 1e3:>10.1f}{v['p50'] * 1e3:>10.1f}"
                    f"{v['p99'] * 1e3:>10.1f}")
    rows += [f"error: {e}" for e in s["errors"]]
    return "\n".join(rows)


MEDIAN_KEYS = ("output_token_throughput", "request_throughput", "duration_s")
MEDIAN_PCT_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2el_s")


def combine_rounds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per concurrency level (in first-seen order) from runs that may repeat
    levels: throughputs, durations and each latency percentile are the medians over that
    level's runs; completed / failed / tokens are summed; ``rounds`` counts the runs and
    ``output_token_throughput_rounds`` lists each run's throughput."""
    levels: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        levels.setdefault(r["config"]["concurrency"], []).append(r)
    out = []
    for group in levels.values():
        s = {k: v for k, v in group[0].items() if k != "round"}
        for key in MEDIAN_KEYS:
            s[key] = statistics.median(r[key] for r in group)
        for key in MEDIAN_PCT_KEYS:
            s[key] = {p: statistics.median(r[key][p] for r in group) for p in group[0][key]}
        for key in ("completed", "failed", "total_output_tokens"):
            s[key] = sum(r[key] for r in group)
        s["errors"] = sorted({e for r in group for e in r["errors"]})[:5]
        s["rounds"] = len(group)
        s["output_token_throughput_rounds"] = [r["output_token_throughput"] for r in group]
        out.append(s)
    return out
