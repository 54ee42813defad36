"""The serving benchmark's client side of one request: a streamed completion timed per
token event (TTFT, inter-token latencies), and the server-sent-event framing it reads.

A client on the server's host takes CPU the server would use, so it is kept light: aiohttp
(a C HTTP parser) reading whole network chunks, not a line iterator per event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from service.bench_serve import BenchConfig


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


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
