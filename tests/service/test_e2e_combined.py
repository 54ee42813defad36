"""Every exactness path at once: one real server with n-gram speculation, the FP8 KV cache,
the prefix cache, a KV cache small enough to preempt and a step budget that chunks every
prompt; one plain server (the same FP8 KV cache, nothing else). Each feature has its own
end-to-end file; here they run in the same steps, so a draft is verified beside another
stream's prompt chunk, a preempted stream that was speculating recomputes through the
cache, and a prefix hit feeds a speculating stream. Every greedy answer (text, token
logprobs and top logprobs: the logits' own bits) must equal the plain server's. On hosts
above AVX2 the pair runs twice: at the host's dispatch and at FP8SERVE_ISA=avx2 (the
AVX2 kernels, fused layers and attention, which only AVX2 hosts reach otherwise)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

import ext
from engine.demo_model import ensure_demo_model
from tests.service.conftest import SPEC
from tests.service.serve_process import server_pair
from tests.service.test_e2e_kv_fp8 import complete
from tests.service.test_e2e_prefix_cache import HEADERS, KEY, answer, cached, metric
from tests.service.test_e2e_spec import FUNC, PASSAGE
from tests.service.test_e2e_spec import _stream as spec_stream
from tests.service.test_e2e_spec_grammar import ASK, CASES, _answer, by_grammar

MAX_TOKENS = 48
# one shared opening (its whole blocks come from the prefix cache), then a task of each
# prompt's own that the demo model answers by copying, where n-gram drafts are accepted
SHARED = f"Text: {PASSAGE}\n\n"
TASKS = ["Copy the text exactly.\nCopy: ", f"Now this code.\n{FUNC}\nThe same code:\n",
         "Copy the first sentence twice.\n", "Repeat the text word for word:\n"]


# the host's own dispatch, and AVX2 where the host dispatches above it
ISAS = ["host"] + (["avx2"] if ext.load().built and ext.isa() not in ("scalar", "avx2")
                   else [])


@pytest.fixture(scope="module", params=ISAS)
def servers(request):
    model = ensure_demo_model()
    env = None if request.param == "host" else {"FP8SERVE_ISA": request.param}
    common = ("--api-key", KEY, "--max-model-len", "512", "--max-num-seqs", "8",
              "--served-model-name", "tiny", "--kv-cache-dtype", "fp8")
    # the demo model's fp8 blocks of 16 tokens: 30 layers x 2 (K, V) x 3 KV heads x (64
    # codes + 4 scale bytes) x 16 = 195840 bytes; 0.003 GiB is 16 blocks, fewer than 8
    # streams of 50-110 prompt + 48 generated tokens need; a step of 40 tokens cuts every
    # prompt into chunks
    with server_pair(model, (*common, "--kv-cache-gib", "0.003", "--max-num-batched-tokens",
                             "40", "--speculative-config", json.dumps(SPEC)),
                     (*common, "--kv-cache-gib", "0.1", "--no-enable-prefix-caching"),
                     env) as pair:
        yield request.param, pair


def prompt(i: int) -> str:
    return SHARED + TASKS[i % len(TASKS)] + " " * (i // len(TASKS))


async def _stream(client: httpx.AsyncClient, text: str) -> list:
    """The greedy tokens of ``text`` with their logprobs (test_e2e_spec's stream)."""
    got, _ = await spec_stream(client, text, model="tiny", max_tokens=MAX_TOKENS,
                               ignore_eos=True)
    return got


def _complete(srv: dict, text: str) -> dict:
    return complete(srv, text, MAX_TOKENS)


def test_both_servers_run_the_dispatch_under_test(servers):
    isa, pair = servers
    for srv in pair:
        kernels = httpx.get(srv["url"] + "/kernels", headers=HEADERS).json()
        fp8 = {lay["kernel_id"] for lay in kernels["layers"] if lay["layer"] != "lm_head"}
        if isa == "avx2":
            assert fp8 == {"avx2_w8a16"}, fp8
        elif len(ISAS) > 1:  # the host dispatches above AVX2
            assert "avx2_w8a16" not in fp8, fp8


def test_eight_streams_through_every_path_equal_the_plain_server(servers):
    on, off = servers[1]
    before = {name: metric(on, name) for name in (
        "fp8serve_num_preemptions_total", "fp8serve_spec_decode_num_accepted_tokens_total")}
    prompts = [prompt(i) for i in range(8)]

    async def all_at_once(srv: dict) -> list[list]:
        async with httpx.AsyncClient(base_url=srv["url"], headers=HEADERS,
                                     timeout=600) as client:
            return await asyncio.gather(*(_stream(client, p) for p in prompts))

    got = asyncio.run(all_at_once(on))
    assert metric(on, "fp8serve_num_preemptions_total") > \
        before["fp8serve_num_preemptions_total"], "must preempt"
    assert metric(on, "fp8serve_spec_decode_num_accepted_tokens_total") > \
        before["fp8serve_spec_decode_num_accepted_tokens_total"], "drafts must be accepted"
    want = asyncio.run(all_at_once(off))
    assert all(len(w) == MAX_TOKENS for w in want)
    assert [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w] == []


def test_a_prefix_hit_that_speculates_answers_as_the_plain_server(servers):
    on, off = servers[1]
    accepted0 = metric(on, "fp8serve_spec_decode_num_accepted_tokens_total")
    first = _complete(on, prompt(20) + "!")
    hit = _complete(on, prompt(20) + "!")
    other = _complete(on, prompt(21) + "!")  # the same opening, its own task
    # the opening's two whole blocks at least (cached by the test above, or by first)
    assert cached(hit) >= max(cached(first), 32) and cached(other) >= 32
    assert metric(on, "fp8serve_spec_decode_num_accepted_tokens_total") > accepted0
    for body, i in ((first, 20), (hit, 20), (other, 21)):
        assert answer(body) == answer(_complete(off, prompt(i) + "!"))


def test_constrained_and_free_chats_at_once_equal_the_plain_server(servers):
    """Grammars (JSON, a seeded schema) speculating beside free chats, in a KV cache that
    preempts: every answer as the plain server's (the same batch there). Tool prompts do
    not fit this server's 256-token KV cache: test_e2e_spec_grammar.py runs them."""
    on, off = servers[1]
    cases = [CASES["json_object"], CASES["seeded_schema"]]
    jobs = [cases[i % len(cases)] if i % 2 else
            {"messages": [{"role": "user", "content": f"{ASK} ({i})"}]} for i in range(8)]

    async def main(srv: dict) -> list[dict]:
        client = openai.AsyncOpenAI(base_url=srv["url"] + "/v1", api_key=KEY, max_retries=0,
                                    timeout=600)

        async def one(kw: dict) -> dict:
            kw = {"model": "tiny", "messages": [{"role": "user", "content": ASK}],
                  "temperature": 0, "max_tokens": 40, **kw}
            return _answer(await client.chat.completions.create(**kw))
        return await asyncio.gather(*(one(kw) for kw in jobs))

    def accepted() -> float:
        return sum(by_grammar(on, "fp8serve_spec_decode_num_accepted_tokens_total", kind)
                   for kind in ("json_object", "json_schema"))

    accepted0 = accepted()
    assert asyncio.run(main(on)) == asyncio.run(main(off))
    assert accepted() > accepted0, "drafts under the grammars must be accepted"
