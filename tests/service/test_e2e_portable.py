"""Below AVX2 (FP8SERVE_ISA=scalar: the extension's dispatch as on an x86-64-v2 virtual CPU
or a host it has no ISA kernels for), a real server on the demo model: /kernels shows the
portable kernels on every FP8 layer and the head, and greedy answers stay exact where a
step verifies many rows at once: with a prediction (the answer itself, an edited one) they
equal the answers without one, logprobs included, alone and six at once. With the torch
kernels this host class had before, these answers differed."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from engine.demo_model import ensure_demo_model
from tests.service.serve_process import start_server, stop_server
from tests.service.test_e2e_prediction import COPY, EDIT, answer, edited, request
from tests.service.test_e2e_spec_grammar import sdk


@pytest.fixture(scope="module")
def server():
    srv = start_server(ensure_demo_model(), "--max-model-len", "1024", "--max-num-seqs", "8",
                       "--served-model-name", "demo", "--kv-cache-gib", "0.25",
                       env={"FP8SERVE_ISA": "scalar"})
    yield srv
    stop_server(srv)


def ask(srv: dict, messages: list, prediction: str | None = None):
    return sdk(srv).chat.completions.create(**request(messages, prediction, logprobs=True,
                                                      top_logprobs=2))


def test_kernels_are_the_portable_ones(server):
    kernels = httpx.get(server["url"] + "/kernels").json()
    linears = {c["layer"]: c["kernel_id"] for c in kernels["layers"]}
    assert linears.pop("lm_head") == "bf16_portable"
    assert set(linears.values()) == {"portable_w8a16"}, linears
    assert all(d["path"] == "python" for d in kernels["decoder_layers"])


def test_greedy_answers_with_predictions_equal_plain(server):
    for messages in (EDIT, COPY):
        plain = ask(server, messages)
        text = plain.choices[0].message.content
        for prediction in (text, edited(text)):
            assert answer(ask(server, messages, prediction)) == answer(plain)


def test_six_at_once_equal_alone(server):
    alone = [answer(ask(server, m, p)) for m, p in ((EDIT, None), (COPY, None))]
    client = sdk(server, openai.AsyncOpenAI)

    async def one(messages, prediction):
        return answer(await client.chat.completions.create(
            **request(messages, prediction, logprobs=True, top_logprobs=2)))

    async def main():
        jobs = [one(m, p) for m, p in ((EDIT, None), (COPY, None), (EDIT, "def rect_area("),
                                       (COPY, "Repeat"), (EDIT, None), (COPY, None))]
        return await asyncio.gather(*jobs)

    got = asyncio.run(main())
    assert got == [alone[0], alone[1], alone[0], alone[1], alone[0], alone[1]]
