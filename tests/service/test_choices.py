"""Several choices per request (n) on /v1/completions and /v1/chat/completions, on the demo
model, as vLLM and OpenAI serve them: greedy choices are all the same answer; seeded ones
(choice j samples with seed + j) differ from each other while the whole response repeats,
streamed or not; a stream opens every choice (its role, on chat) before any text, each
choice ends with its own finish_reason, and the usage chunk is the whole answer's (prompt
counted once, completion_tokens summed over the choices); logprobs come per choice. The
APIs without several choices (Responses, Messages) refuse n, best_of and beam search with a
400 naming the field."""

from __future__ import annotations

import json
import random

import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from service.app import create_app
from service.settings import Settings

CMPL = {"prompt": ["Once upon a time", "The weather today"], "max_tokens": 6}
CHAT = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 6}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def c():
    with TestClient(create_app(Settings(model=ensure_demo_model(), max_model_len=256,
                                        kv_cache_gib=0.05))) as cl:
        yield cl


def events(r) -> list[dict]:
    assert r.status_code == 200, r.text
    return [json.loads(ln[6:]) for ln in r.text.splitlines()
            if ln.startswith("data: ") and ln != "data: [DONE]"]


def texts(answer: dict) -> list[str]:
    return [ch["text"] if "text" in ch else ch["message"]["content"]
            for ch in answer["choices"]]


def streamed(chunks: list[dict], count: int) -> tuple[list[str], list[str | None]]:
    """Each choice's text and finish_reason, put together from a stream's chunks."""
    text, reasons = [""] * count, [None] * count
    for chunk in chunks:
        for ch in chunk["choices"]:
            i = ch["index"]
            text[i] += ch["text"] if "text" in ch else ch["delta"].get("content") or ""
            assert reasons[i] is None, "a choice went on after its finish_reason"
            reasons[i] = ch["finish_reason"]
    return text, reasons


@pytest.mark.parametrize("route,body", [("/v1/completions", CMPL),
                                        ("/v1/chat/completions", CHAT)])
def test_greedy_choices_are_one_answer(c, route, body):
    one = c.post(route, json={**body, "temperature": 0}).json()
    many = c.post(route, json={**body, "temperature": 0, "n": 3, "logprobs": 1 if
                               route == "/v1/completions" else True}).json()
    per_prompt = len(texts(one))
    assert [ch["index"] for ch in many["choices"]] == list(range(3 * per_prompt))
    for p, want in enumerate(texts(one)):
        assert texts(many)[3 * p:3 * p + 3] == [want] * 3
    assert len({json.dumps(ch["logprobs"]) for ch in many["choices"][:3]}) == 1
    assert many["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert many["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]


@pytest.mark.parametrize("route,body", [("/v1/completions", CMPL),
                                        ("/v1/chat/completions", CHAT)])
def test_seeded_choices_differ_and_the_response_repeats_streamed_or_not(c, route, body):
    seeded = {**body, "n": 3, "seed": 11, "temperature": 1.3}
    whole = c.post(route, json=seeded).json()
    again = c.post(route, json=seeded).json()
    assert texts(whole) == texts(again)
    per_prompt = len(texts(whole)) // 3
    for p in range(per_prompt):
        assert len(set(texts(whole)[3 * p:3 * p + 3])) > 1  # seed + j: not one answer
    chunks = events(c.post(route, json={**seeded, **USAGE}))
    text, reasons = streamed(chunks[:-1], len(whole["choices"]))
    assert text == texts(whole)
    assert reasons == [ch["finish_reason"] for ch in whole["choices"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_a_chat_stream_opens_every_choice_before_its_text(c):
    chunks = events(c.post("/v1/chat/completions", json={**CHAT, "n": 3, "seed": 2, **USAGE}))
    opening = [ch["choices"][0] for ch in chunks[:3]]
    assert [(o["index"], o["delta"].get("role")) for o in opening] == [
        (0, "assistant"), (1, "assistant"), (2, "assistant")]
    assert all("role" not in ch["choices"][0]["delta"] for ch in chunks[3:-1])
    assert all(len(ch["choices"]) == 1 for ch in chunks[:-1])


def test_each_choice_ends_with_its_own_finish_reason(c):
    """A stop string ends some choices; max_tokens the others."""
    body = {**CMPL, "prompt": CMPL["prompt"][0], "n": 6, "seed": 5, "temperature": 1.3,
            "stop": ["s"], "max_tokens": 3}
    whole = c.post("/v1/completions", json=body).json()
    reasons = [ch["finish_reason"] for ch in whole["choices"]]
    assert set(reasons) == {"stop", "length"}, whole
    for ch in whole["choices"]:
        assert "s" not in ch["text"]
        assert (ch["stop_reason"] == "s") == (ch["finish_reason"] == "stop")
    _, streamed_reasons = streamed(events(c.post("/v1/completions",
                                                 json={**body, "stream": True})),
                                   len(reasons))
    assert streamed_reasons == reasons


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
])
@pytest.mark.parametrize("field,value", [("n", 2), ("best_of", 2), ("use_beam_search", True),
                                         ("length_penalty", 0.5)])
def test_apis_of_one_answer_refuse_several(c, path, body, field, value):
    r = c.post(path, json={**body, field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.get("param", field) == field and error["message"].startswith(field)


# request fields whose combinations the property below draws (chat takes the ones it has)
OPTIONS = {"n": [1, 2, 3], "best_of": [1, 2, 4], "use_beam_search": [True], "logprobs": [0, 2],
           "echo": [True], "stream": [True], "seed": [3], "stop": [[" "], ["e"]],
           "max_tokens": [0, 1, 3], "temperature": [0, 0.8, 1], "prompt_logprobs": [0, 1],
           "length_penalty": [0.5], "top_logprobs": [0, 2], "min_tokens": [1],
           "stop_token_ids": [[13]], "include_stop_str_in_output": [True],
           "ignore_eos": [True], "stream_options": [{"include_usage": True},
                                                    {"include_usage": True,
                                                     "continuous_usage_stats": True}]}


def drawn(rng, chat: bool) -> dict:
    body = {k: rng.choice(OPTIONS[k]) for k in rng.sample(sorted(OPTIONS), rng.randint(1, 6))}
    body.setdefault("max_tokens", 3)
    body["return_token_ids"] = True
    if not chat:
        body.pop("top_logprobs", None)
        return {**body, "prompt": CMPL["prompt"]}
    body.pop("best_of", None), body.pop("echo", None)
    if "logprobs" in body or "top_logprobs" in body:
        body["logprobs"] = True
    body["max_tokens"] = max(body["max_tokens"], 1)
    return {**body, "messages": CHAT["messages"]}


def check_answer(r, body: dict, count: int) -> None:
    """Every choice once, in order, ended once; usage counts the tokens the choices carry
    (best_of's dropped candidates aside)."""
    if body.get("stream"):
        chunks = events(r)
        ends = [ch["index"] for e in chunks for ch in e["choices"] if ch["finish_reason"]]
        assert sorted(ends) == list(range(count)), (body, ends)
        if body.get("stream_options"):
            carried = sum(len(ch.get("token_ids") or ()) for e in chunks for ch in e["choices"])
            assert chunks[-1]["choices"] == [], body
            assert chunks[-1]["usage"]["completion_tokens"] == carried, body
        return
    answer = r.json()
    assert [ch["index"] for ch in answer["choices"]] == list(range(count)), body
    assert all(ch["finish_reason"] in ("stop", "length") for ch in answer["choices"]), body
    if body.get("best_of", 1) <= body.get("n", 1):
        carried = sum(len(ch["token_ids"]) for ch in answer["choices"])
        assert answer["usage"]["completion_tokens"] == carried, body


def test_any_combination_is_answered_whole_or_refused_naming_a_field(c):
    """Drawn combinations of the fields that shape the choices: a 200 with every choice
    once (a stream ending each choice once) and usage matching the tokens the choices
    carry, or a 400 naming one of the fields sent; never another status."""
    rng = random.Random(7)
    for _ in range(150):
        chat = rng.random() < 0.5
        body = drawn(rng, chat)
        r = c.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
        if r.status_code == 400:
            param = r.json()["error"]["param"] or ""
            assert any(param.startswith(k) for k in body), (body, r.text)
            continue
        assert r.status_code == 200, (body, r.text)
        check_answer(r, body, (1 if chat else 2) * body.get("n", 1))
