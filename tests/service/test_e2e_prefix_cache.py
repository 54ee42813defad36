"""Prefix caching end to end: two real servers on the same tiny checkpoint, one with the
cache (and a KV cache small enough to evict and preempt), one with
--no-enable-prefix-caching. Every answer the cached server gives (text, token logprobs
and top logprobs, which are the logits' own bits) must equal the uncached server's, for
full hits, partial hits, hits after eviction, requests preempted and recomputed through
the cache, seeded sampling, streaming and chat; prompt logprobs are scored at every
position; usage, metrics and /reset_prefix_cache report what happened."""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx
import pytest

from tests.service.serve_process import server_pair

KEY = "k"
BLOCK = 16
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def servers(tiny_checkpoint):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    common = ("--api-key", KEY, "--max-model-len", "512", "--max-num-seqs", "8",
              "--served-model-name", "tiny", "--max-num-batched-tokens", "256")
    # 0.0006 GiB of 16 KiB blocks (2 layers x 2 KV heads x 64 x bf16 x 16 tokens): 39
    # blocks, 624 tokens: a few prompts evict each other and 8 streams preempt
    with server_pair(model, (*common, "--kv-cache-gib", "0.0006"),
                     (*common, "--kv-cache-gib", "0.05", "--no-enable-prefix-caching")) as pair:
        yield pair


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 20000) for _ in range(n)]


def complete(srv: dict, prompt: list[int], **kw) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "logprobs": 2, "ignore_eos": True, **kw}
    r = httpx.post(srv["url"] + "/v1/completions", json=body, headers=HEADERS, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def answer(body: dict) -> list:
    """What must be bit-identical: per choice its text and its logprobs."""
    return [(c["text"], c["logprobs"]) for c in body["choices"]]


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(srv: dict, name: str) -> float:
    text = httpx.get(srv["url"] + "/metrics").text
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def reset(srv: dict) -> dict:
    r = httpx.post(srv["url"] + "/reset_prefix_cache", headers=HEADERS)
    assert r.status_code == 200, r.text
    return r.json()


def test_full_partial_and_missed_prefixes_answer_as_without_the_cache(servers):
    on, off = servers
    reset(on)
    system = ids(100, 1)
    first = complete(on, system + ids(7, 2))
    assert cached(first) == 0
    repeat = complete(on, system + ids(7, 2))  # 107 tokens, 6 full blocks, all cached
    longer = complete(on, system + ids(7, 2) + ids(30, 3))
    other_user = complete(on, system + ids(12, 4))
    miss = complete(on, ids(100, 5))
    assert cached(repeat) == 6 * BLOCK
    # the first request also computed 7 of its 8 generated tokens: 6 blocks of the 107
    # prompt tokens, then the prompt continues with other tokens than it generated
    assert cached(longer) == 6 * BLOCK
    assert cached(other_user) == 100 // BLOCK * BLOCK and cached(miss) == 0
    for body, prompt in ((repeat, system + ids(7, 2)),
                         (longer, system + ids(7, 2) + ids(30, 3)),
                         (other_user, system + ids(12, 4)), (miss, ids(100, 5))):
        plain = complete(off, prompt)
        assert cached(plain) == 0
        assert answer(body) == answer(plain)


def test_seeded_sampling_from_the_cache_is_unchanged(servers):
    on, off = servers
    prompt = ids(90, 6)
    kw = {"temperature": 1.0, "top_p": 0.9, "seed": 1234, "n": 2}
    complete(on, prompt, **kw)
    hit = complete(on, prompt, **kw)
    assert cached(hit) == 80
    assert answer(hit) == answer(complete(off, prompt, **kw))
    assert hit["choices"][0]["text"] != hit["choices"][1]["text"]  # seeds 1234, 1235


def test_hits_after_eviction_pressure(servers):
    on, off = servers
    reset(on)
    a = ids(200, 7)  # 13 blocks of the 39
    complete(on, a, max_tokens=4)
    for seed in (8, 9, 10):  # 39 more blocks: every block of a is evicted
        complete(on, ids(200, seed), max_tokens=4)
    again = complete(on, a, max_tokens=4)
    assert cached(again) == 0
    third = complete(on, a, max_tokens=4)
    assert cached(third) == 12 * BLOCK
    want = answer(complete(off, a, max_tokens=4))
    assert answer(again) == want and answer(third) == want


async def _stream(client: httpx.AsyncClient, prompt: list[int]) -> list[str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 60, "temperature": 0,
            "ignore_eos": True, "stream": True, "logprobs": 0}
    tokens = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                tokens += json.loads(line[6:])["choices"][0]["logprobs"]["tokens"]
    return tokens


def test_preempted_streams_recompute_through_the_cache(servers):
    """8 streams of a shared 96-token prefix + 16 own tokens + 60 generated need ~8 x 11
    blocks; with 39 the newest are preempted, recomputed (through the cache) and must
    still produce their solo outputs."""
    on, off = servers
    shared = ids(96, 11)
    prompts = [shared + ids(16, 20 + i) for i in range(8)]
    preempted0 = metric(on, "fp8serve_num_preemptions_total")
    hits0 = metric(on, "fp8serve_prefix_cache_hits_total")

    async def main():
        async with httpx.AsyncClient(base_url=on["url"], headers=HEADERS,
                                     timeout=300) as client:
            return await asyncio.gather(*(_stream(client, p) for p in prompts))

    together = asyncio.run(main())
    assert metric(on, "fp8serve_num_preemptions_total") > preempted0, "must preempt"
    assert metric(on, "fp8serve_prefix_cache_hits_total") > hits0
    for prompt, got in zip(prompts, together, strict=True):
        solo = complete(off, prompt, max_tokens=60, logprobs=0)
        assert got == solo["choices"][0]["logprobs"]["tokens"]


def test_streaming_usage_and_chat_report_cached_tokens(servers):
    on, off = servers
    msgs = [{"role": "system", "content": "You answer briefly. " * 12},
            {"role": "user", "content": "Name a colour."}]
    chat = {"model": "tiny", "messages": msgs, "max_tokens": 6, "temperature": 0}
    r1 = httpx.post(on["url"] + "/v1/chat/completions", json=chat, headers=HEADERS).json()
    r2 = httpx.post(on["url"] + "/v1/chat/completions", json=chat, headers=HEADERS).json()
    ref = httpx.post(off["url"] + "/v1/chat/completions", json=chat, headers=HEADERS).json()
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert r1["choices"][0]["message"] == r2["choices"][0]["message"] \
        == ref["choices"][0]["message"]
    body = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", on["url"] + "/v1/chat/completions", json=body,
                      headers=HEADERS) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
    usage = json.loads(lines[-1][6:])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == \
        r2["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_prompt_logprobs_score_every_position(servers):
    on, off = servers
    prompt = ids(70, 12)
    complete(on, prompt)
    scored = complete(on, prompt, echo=True, logprobs=1, max_tokens=2)
    assert cached(scored) == 0  # bypassed: every position runs through the model
    lps = scored["choices"][0]["logprobs"]
    assert len(lps["token_logprobs"]) == 72 and lps["token_logprobs"][0] is None
    assert all(v is not None for v in lps["token_logprobs"][1:])
    assert answer(scored) == answer(complete(off, prompt, echo=True, logprobs=1,
                                             max_tokens=2))


def test_cache_salt_separates_tenants(servers):
    on, _ = servers
    prompt = ids(80, 13)
    complete(on, prompt, cache_salt="a")
    assert cached(complete(on, prompt, cache_salt="b")) == 0
    assert cached(complete(on, prompt)) == 0
    assert cached(complete(on, prompt, cache_salt="a")) == 64
    r = httpx.post(on["url"] + "/v1/completions", headers=HEADERS,
                   json={"model": "tiny", "prompt": prompt, "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_metrics_count_queried_and_hit_tokens(servers):
    on, off = servers
    prompt = ids(50, 14)
    complete(on, prompt)
    q0 = metric(on, "fp8serve_prefix_cache_queries_total")
    h0 = metric(on, "fp8serve_prefix_cache_hits_total")
    complete(on, prompt)
    assert metric(on, "fp8serve_prefix_cache_queries_total") - q0 == 50
    assert metric(on, "fp8serve_prefix_cache_hits_total") - h0 == 48
    complete(off, prompt)
    assert metric(off, "fp8serve_prefix_cache_queries_total") == 0


def test_reset_endpoint(servers):
    on, off = servers
    prompt = ids(40, 15)
    complete(on, prompt)
    assert httpx.post(on["url"] + "/reset_prefix_cache").status_code == 401
    body = reset(on)
    assert body["enabled"] is True and body["num_blocks_dropped"] > 0
    assert cached(complete(on, prompt)) == 0
    assert reset(off) == {"enabled": False, "num_blocks_dropped": 0}
