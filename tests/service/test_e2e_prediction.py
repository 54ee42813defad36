"""Predicted outputs end to end on the demo model, through the openai SDK, on the shared
servers (tests/service/conftest.py ``spec_servers``): the plain one (no
--speculative-config: a prediction is its only source of drafts) and the n-gram one.
Answers with a prediction (the answer itself, an edited answer, an unrelated text) equal
the plain server's answers without one: greedy with logprobs, seeded sampling, under a
JSON schema, and eight requests at once beside requests without predictions; usage and
/metrics count the prediction's tokens."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.service.test_e2e_spec import FUNC, PASSAGE, metric
from tests.service.test_e2e_spec_grammar import Minutes, sdk

EDIT = [{"role": "user", "content": f"{FUNC}\nRewrite this function with the name rect_area "
         "instead of area. Answer with the code only."}]
COPY = [{"role": "user", "content": f"Repeat this text exactly: {PASSAGE}"}]
UNRELATED = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def servers(spec_servers):
    return spec_servers


def request(messages: list, prediction: str | None = None, **kw) -> dict:
    """The chat request's arguments (greedy, 64 tokens), with ``prediction`` as content."""
    extra = {} if prediction is None else {"prediction": {"type": "content",
                                                          "content": prediction}}
    return {"model": "demo", "messages": messages, "max_tokens": 64, "temperature": 0,
            **extra, **kw}


def ask(srv: dict, messages: list, prediction: str | None = None, **kw):
    return sdk(srv).chat.completions.create(**request(messages, prediction, **kw))


def answer(r) -> list:
    """What must not change: each choice's text, logprobs, finish reason; the token counts."""
    return [(c.message.content, c.logprobs and c.logprobs.model_dump(), c.finish_reason)
            for c in r.choices] + [(r.usage.prompt_tokens, r.usage.completion_tokens)]


def edited(text: str) -> str:
    """The answer with one line changed and one added: a prediction partly right."""
    lines = text.split("\n")
    lines[len(lines) // 2] = lines[len(lines) // 2].replace("e", "a")
    return "\n".join(lines[:2] + ["# checked"] + lines[2:])


def prediction_tokens(r) -> tuple[int, int]:
    d = r.usage.completion_tokens_details
    return d.accepted_prediction_tokens, d.rejected_prediction_tokens


def test_greedy_answers_equal_plain_with_any_prediction(servers):
    on, off = servers
    accepted = "fp8serve_spec_decode_prediction_tokens_total"
    before = metric(off, accepted)
    for messages in (EDIT, COPY):
        plain = ask(off, messages, logprobs=True, top_logprobs=2)
        want, text = answer(plain), plain.choices[0].message.content
        assert plain.usage.completion_tokens_details is None
        right = ask(off, messages, text, logprobs=True, top_logprobs=2)
        assert answer(right) == want
        acc, rej = prediction_tokens(right)
        assert rej == 0 and acc >= plain.usage.completion_tokens // 2
        for pred in (edited(text), UNRELATED):
            for srv in (off, on):  # on: the n-gram lookup where the prediction has nothing
                r = ask(srv, messages, pred, logprobs=True, top_logprobs=2)
                assert answer(r) == want, (srv["url"], pred[:40])
        assert prediction_tokens(ask(off, messages, edited(text)))[0] > 0
    assert metric(off, accepted) > before


def test_seeded_sampling_and_a_schema_equal_plain(servers):
    on, off = servers
    seeded = {"temperature": 0.9, "top_p": 0.95, "seed": 11, "n": 2}
    plain = ask(off, COPY, **seeded)
    text = plain.choices[0].message.content
    assert answer(ask(off, COPY, text, **seeded)) == answer(plain)
    schema = [{"role": "user", "content": f"Text: {PASSAGE}\n\nWhen did the committee meet, "
               "what did it approve and what did it delay? Answer with the words of the "
               "text."}]
    plain = sdk(off).chat.completions.parse(model="demo", response_format=Minutes,
                                            temperature=0, max_tokens=80, messages=schema)
    pred = plain.choices[0].message.content
    for srv in (off, on):
        r = sdk(srv).chat.completions.parse(
            model="demo", response_format=Minutes, temperature=0, max_tokens=80,
            messages=schema, prediction={"type": "content", "content": pred})
        assert r.choices[0].message.content == pred
        assert r.choices[0].message.parsed == plain.choices[0].message.parsed
        assert prediction_tokens(r)[0] > 0


def test_eight_at_once_with_and_without_predictions_equal_alone(servers):
    _, off = servers
    plain = {name: ask(off, m) for name, m in (("edit", EDIT), ("copy", COPY))}
    jobs = []
    for i in range(8):
        name = ("edit", "copy")[i % 2]
        text = plain[name].choices[0].message.content
        pred = [text, edited(text), UNRELATED, None][i // 2]
        jobs.append((name, pred))

    async def main():
        client = sdk(off, openai.AsyncOpenAI)
        return await asyncio.gather(*(
            client.chat.completions.create(**request(EDIT if name == "edit" else COPY, pred))
            for name, pred in jobs))

    for (name, pred), r in zip(jobs, asyncio.run(main()), strict=True):
        assert answer(r) == answer(plain[name]), (name, (pred or "")[:30])
        assert (r.usage.completion_tokens_details is None) == (pred is None)
