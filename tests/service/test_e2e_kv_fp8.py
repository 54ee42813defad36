"""The FP8 KV cache end to end: two real servers with --kv-cache-dtype fp8 on the same tiny
checkpoint, one with the prefix cache and a KV cache small enough to preempt, one with
--no-enable-prefix-caching and room to spare. A token's e4m3 bytes and scale depend on its
own K/V only, so every greedy answer (text and token logprobs, the logits' own bits) must be
the same served from the prefix cache, batched with 7 other streams (and preempted), or
alone on the plain server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.service.serve_process import server_pair
from tests.service.test_e2e_prefix_cache import HEADERS, KEY, answer, cached, ids, metric

BLOCK = 16


@pytest.fixture(scope="module")
def servers(tiny_checkpoint):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    common = ("--api-key", KEY, "--max-model-len", "512", "--max-num-seqs", "8",
              "--served-model-name", "tiny", "--max-num-batched-tokens", "256",
              "--kv-cache-dtype", "fp8")
    # fp8 blocks of 16 tokens: 2 layers x 2 (K, V) x 2 KV heads x (64 codes + 4 scale
    # bytes) x 16 = 8704 bytes; 0.0003 GiB holds 37 blocks (592 tokens), fewer than 8
    # streams of 88 prompt + 40 generated tokens need, so some are preempted
    with server_pair(model, (*common, "--kv-cache-gib", "0.0003"),
                     (*common, "--kv-cache-gib", "0.05", "--no-enable-prefix-caching")) as pair:
        yield pair


def complete(srv: dict, prompt: list[int] | str, max_tokens: int = 8) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 2, "ignore_eos": True}
    r = httpx.post(srv["url"] + "/v1/completions", json=body, headers=HEADERS, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_prefix_cache_hits_answer_as_the_plain_fp8_server(servers):
    on, off = servers
    for srv in servers:  # the runner's start-up line names the store's element type
        assert "float8_e4m3fn" in Path(srv["log"]).read_text()
    system = ids(100, 21)
    first = complete(on, system + ids(7, 22))
    hit = complete(on, system + ids(7, 22))
    other = complete(on, system + ids(12, 23))
    assert cached(first) == 0
    assert cached(hit) == 6 * BLOCK and cached(other) == 100 // BLOCK * BLOCK
    for body, prompt in ((first, system + ids(7, 22)), (hit, system + ids(7, 22)),
                         (other, system + ids(12, 23))):
        assert answer(body) == answer(complete(off, prompt))


def test_concurrent_and_preempted_streams_answer_as_each_alone(servers):
    on, off = servers
    prompts = [ids(88, 30 + i) for i in range(8)]
    preempted0 = metric(on, "fp8serve_num_preemptions_total")

    async def all_at_once() -> list[dict]:
        async with httpx.AsyncClient(base_url=on["url"], headers=HEADERS,
                                     timeout=600) as client:
            async def one(p: list[int]) -> dict:
                body = {"model": "tiny", "prompt": p, "max_tokens": 40, "temperature": 0,
                        "logprobs": 2, "ignore_eos": True}
                r = await client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()
            return await asyncio.gather(*(one(p) for p in prompts))

    together = asyncio.run(all_at_once())
    assert metric(on, "fp8serve_num_preemptions_total") > preempted0, "must preempt"
    for body, prompt in zip(together, prompts, strict=True):
        assert answer(body) == answer(complete(off, prompt, max_tokens=40))
