"""The serving benchmark's client side of one request: a streamed completion timed per
token event (TTFT, inter-token latencies), and the server-sent-event framing it reads.

Every request asks for the final usage chunk (``stream_options.include_usage``): its
``prompt_tokens`` and ``prompt_tokens_details.cached_tokens`` (OpenAI's field; absent from a
server without a prefix cache) give the cache hit rate. A request may carry a
``cache_salt`` (vLLM's field): requests with different salts never share cached blocks.

A client on the server's host takes CPU the server would use, so it is kept light: aiohttp
(a C HTTP parser) reading whole network chunks, not a line iterator per event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from bench.serve.config import BenchConfig


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None
    text: str = ""  # the generated text
    prompt_tokens: int = 0  # the usage chunk's, else the prompt's length
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    last_token_s: float = 0.0  # the latest token event, seconds after the request was sent
    events: int = 0  # token events (chunks); a speculative server may put several tokens in one

    def take(self, chunk: dict[str, Any], elapsed: float) -> None:
        """One stream chunk, ``elapsed`` seconds after the request was sent. A chunk with
        text is one token event (one token, or several from a verified speculative draft);
        a chunk whose every choice only finishes (no text, a finish_reason: llama-server
        ends that way) is none. The usage chunk (last; llama-server puts it on the
        finishing chunk) gives the token counts, whatever the chunking."""
        choices = chunk.get("choices") or []
        if choices and "delta" in choices[0]:  # a chat chunk: an event when it has text
            texts = [(c.get("delta") or {}).get("content") or "" for c in choices]
            event = any(texts)
        else:
            texts = [c.get("text") or "" for c in choices]
            event = any(t or not c.get("finish_reason") for t, c in zip(texts, choices,
                                                                         strict=True))
        if event:
            if self.events == 0:
                self.ttft = elapsed
            else:
                self.itl.append(elapsed - self.last_token_s)
            self.last_token_s = elapsed
            self.events += 1
            self.output_tokens += 1
            self.text += "".join(texts)
        usage = chunk.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = details.get("cached_tokens", self.cached_tokens)
            self.output_tokens = usage.get("completion_tokens", self.output_tokens)


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
                      prompt: list[int], salt: str | None = None,
                      messages: list[dict[str, str]] | None = None) -> RequestResult:
    """One streamed completion: TTFT at the first token's event, then one inter-token
    latency per event. Events that arrive in one read share that read's time. ``salt``:
    the request's ``cache_salt`` (None: none sent). ``messages``: a chat request of them
    instead (``prompt``: their ids, for the count), with ``cfg.prediction`` if any."""
    body: dict[str, Any] = {"model": model, "max_tokens": cfg.output_len, "stream": True,
                            "temperature": 0.0, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}
    path = "/v1/completions"
    if messages is None:
        body["prompt"] = prompt
    else:
        path, body["messages"] = "/v1/chat/completions", messages
        if cfg.prediction is not None:
            body["prediction"] = {"type": "content", "content": cfg.prediction}
    if salt is not None:
        body["cache_salt"] = salt
    start = time.perf_counter()
    res = RequestResult(ok=False, prompt_tokens=len(prompt))
    try:
        async with session.post(cfg.endpoint(path), json=body) as r:
            if r.status != 200:
                return RequestResult(False, error=f"HTTP {r.status}: {await r.read()!r}")
            buffered = b""
            async for received in r.content.iter_any():
                elapsed = time.perf_counter() - start
                payloads, buffered = sse_data(buffered, received)
                for data in payloads:
                    if data == b"[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        return RequestResult(False, error=chunk["error"]["message"])
                    res.take(chunk, elapsed)
    except aiohttp.ClientError as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    res.latency, res.ok = time.perf_counter() - start, True
    return res


async def tokenize_chat(session: aiohttp.ClientSession, cfg: BenchConfig, model: str,
                        messages: list[dict[str, str]]) -> list[int]:
    """The server's prompt ids for a chat (POST /tokenize with messages: its template).
    Raises aiohttp.ClientError when the server refuses."""
    async with session.post(cfg.endpoint("/tokenize"), json={"model": model,
                                                             "messages": messages},
                            raise_for_status=True) as r:
        return list((await r.json())["tokens"])


async def tokenize(session: aiohttp.ClientSession, cfg: BenchConfig, model: str,
                   text: str) -> list[int]:
    """The server's token ids of ``text`` (POST /tokenize, no special tokens added).
    Raises aiohttp.ClientError when the server refuses."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    async with session.post(cfg.endpoint("/tokenize"), json=body,
                            raise_for_status=True) as r:
        return list((await r.json())["tokens"])
