"""The AVX2 path end to end on any AVX2+ host (FP8SERVE_ISA=avx2: the extension's dispatch as
on a CPU with AVX2 but no AVX-512), real servers on a tiny checkpoint: /kernels shows the
AVX2 FP8 kernel on every layer, the bf16_avx2 head and every decoder layer fused (the AVX2
GEMM, norms and attention), and greedy answers are exact there: eight at once equal each
alone, a prompt prefilled in 16-token chunks equals it prefilled whole, and a prefix-cache
hit equals the miss. The other end-to-end tests run at the host's dispatch, so on AVX-512
and AMX hosts only these requests reach the AVX2 kernels."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

import ext
from tests.ext.support import AVX2_HOST
from tests.service.serve_process import start_server, stop_server

pytestmark = pytest.mark.skipif(not all(f in ext.cpuid_features() for f in AVX2_HOST),
                                reason="host CPU lacks AVX2/FMA/F16C")

BASE = ("The lighthouse keepers of the northern coast kept a log of every storm, every "
        "ship and every light they saw over forty winters. ")
PROMPTS = [BASE + "What did they write first?", BASE + "Who kept it?",
           "Write a short poem about the sea.", "List three colors:", BASE * 3 + "Summarize.",
           "1, 2, 3, 4,", "def fib(n):", "Once upon a time " * 10]
ENV = {"FP8SERVE_ISA": "avx2"}
COMMON = ("--max-num-seqs", "8", "--max-model-len", "1024", "--kv-cache-gib", "0.1",
          "--served-model-name", "tiny", "--threads", "1")


@pytest.fixture(scope="module")
def servers(tiny_checkpoint):
    """(whole prompts, no prefix cache; 16-token chunks with the prefix cache)"""
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    whole = start_server(model, *COMMON, "--no-enable-prefix-caching", env=ENV)
    try:
        chunked = start_server(model, *COMMON, "--max-num-batched-tokens", "16",
                               "--enable-prefix-caching", env=ENV)
    except BaseException:
        stop_server(whole)
        raise
    yield whole, chunked
    stop_server(whole)
    stop_server(chunked)


async def _one(client: openai.AsyncOpenAI, prompt: str) -> list:
    r = await client.completions.create(model="tiny", prompt=prompt, max_tokens=12,
                                        temperature=0, logprobs=1,
                                        extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    return list(zip(lp.tokens, lp.token_logprobs, strict=True))


def _answers(srv: dict, together: bool) -> list[list]:
    async def main():
        client = openai.AsyncOpenAI(base_url=srv["url"] + "/v1", api_key="x", max_retries=0)
        if together:
            return await asyncio.gather(*(_one(client, p) for p in PROMPTS))
        return [await _one(client, p) for p in PROMPTS]

    return asyncio.run(main())


def test_kernels_are_the_avx2_ones(servers):
    for srv in servers:
        kernels = httpx.get(srv["url"] + "/kernels").json()
        linears = {c["layer"]: c["kernel_id"] for c in kernels["layers"]}
        assert linears.pop("lm_head") == "bf16_avx2"
        assert set(linears.values()) == {"avx2_w8a16"}, linears
        assert kernels["decoder_layers"]
        assert all(d["path"] == "fused" for d in kernels["decoder_layers"])


def test_greedy_answers_alone_batched_chunked_and_cached_are_equal(servers):
    whole, chunked = servers
    alone = _answers(whole, together=False)
    assert all(len(a) == 12 for a in alone)
    assert _answers(whole, together=True) == alone  # eight at once
    assert _answers(chunked, together=False) == alone  # 16-token chunks, cache misses
    assert _answers(chunked, together=True) == alone  # cache hits, batched
    text = httpx.get(chunked["url"] + "/metrics").text
    hits = [line for line in text.splitlines()
            if line.startswith("fp8serve_prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) > 0, hits
