"""Predicted outputs through /v1/chat/completions (the real app and engine over the fake
runner, tests/service/fake_backend.py, whose tokenizer maps " 12 7" to [12, 7] and back):
a prediction never changes an answer; usage.completion_tokens_details reports its accepted
and rejected tokens, whole, streamed and through the openai SDK; bad predictions are 400s
naming the field."""

from __future__ import annotations

import re

import openai
import pytest

from tests.service.fake_backend import MODEL
from tests.service.test_api import client, error_of, sse_events

MESSAGES = [{"role": "user", "content": "3 4 5"}]
BASE = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "temperature": 0,
        "ignore_eos": True}


@pytest.fixture(scope="module")
def c():
    from tests.engine.spec.test_spec_engine import FixedShare

    with client(max_model_len=96) as cl:
        # the fake runner's step times say nothing: drafting is free, so how much is
        # drafted does not depend on the host's load
        cl.app.state.serving.engine.spec.cost = FixedShare(0.0)
        yield cl


def chat(c, **kw):
    r = c.post("/v1/chat/completions", json={**BASE, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def metric(c, name, outcome=None):
    """The sum of a counter's series (those of one outcome)."""
    text = c.get("/metrics").text
    found = re.findall(rf"^fp8serve_{name}_total{{([^}}]*)}} (\S+)$", text, re.M)
    got = [float(v) for labels, v in found if outcome is None or f'outcome="{outcome}"' in labels]
    assert got, name
    return sum(got)


def edit(text):
    """The answer with its fourth word replaced and two words inserted after the tenth."""
    words = text.split()
    words[3] = "49" if words[3] != "49" else "48"
    words[10:10] = ["1", "2"]
    return " " + " ".join(words)


def test_a_prediction_changes_no_answer_and_usage_reports_it(c):
    plain = chat(c)
    text = plain["choices"][0]["message"]["content"]
    assert "completion_tokens_details" not in plain["usage"]
    accepted0 = metric(c, "spec_decode_prediction_tokens", "accepted")
    for content in (text, [{"type": "text", "text": text[:20]}, {"type": "text",
                                                                 "text": text[20:]}]):
        drafts0 = metric(c, "spec_decode_num_drafts")
        got = chat(c, prediction={"type": "content", "content": content})
        assert got["choices"] == plain["choices"]
        details = got["usage"].pop("completion_tokens_details")
        assert got["usage"] == plain["usage"]
        # every token but the first (the prompt's step) and the one each verified draft
        # adds after its accepted tokens came from the prediction
        drafts = metric(c, "spec_decode_num_drafts") - drafts0
        assert 1 <= drafts <= 4
        assert details == {"accepted_prediction_tokens": 24 - 1 - drafts,
                           "rejected_prediction_tokens": 0}
    assert metric(c, "spec_decode_prediction_tokens", "accepted") > accepted0 + 30
    got = chat(c, prediction={"type": "content", "content": edit(text)})
    assert got["choices"] == plain["choices"]
    details = got["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 10
    assert details["rejected_prediction_tokens"] > 0
    # a prediction with nothing to offer, and an empty one, report zeros
    for content in (" 77 77 77", ""):
        got = chat(c, prediction={"type": "content", "content": content})
        assert got["choices"] == plain["choices"]
        assert got["usage"]["completion_tokens_details"] == {
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}


def test_streamed_and_n_choices_sum_their_prediction_tokens(c):
    plain = chat(c, n=2, seed=5, temperature=0.7)
    texts = [ch["message"]["content"] for ch in plain["choices"]]
    got = chat(c, n=2, seed=5, temperature=0.7,
               prediction={"type": "content", "content": texts[0]})
    assert got["choices"] == plain["choices"]
    whole = got["usage"]["completion_tokens_details"]
    assert whole["accepted_prediction_tokens"] > 0
    events = sse_events(c.post("/v1/chat/completions", json={
        **BASE, "n": 2, "seed": 5, "temperature": 0.7, "stream": True,
        "stream_options": {"include_usage": True},
        "prediction": {"type": "content", "content": texts[0]}}))
    streamed = ["", ""]
    for e in events:
        for ch in e["choices"]:
            streamed[ch["index"]] += ch["delta"].get("content") or ""
    assert streamed == texts
    assert events[-1]["usage"]["completion_tokens_details"] == whole


@pytest.mark.parametrize("prediction,where", [
    ({"type": "text", "content": "1 2"}, "prediction.type"),
    ({"type": "content", "content": 5}, "prediction.content"),
    ({"type": "content", "content": [{"type": "image_url", "text": "x"}]},
     "prediction.content"),
    ({"type": "content"}, "prediction.content"),
    ("1 2 3", "prediction"),
])
def test_a_malformed_prediction_is_a_400_naming_it(c, prediction, where):
    err = error_of(c.post("/v1/chat/completions", json={**BASE, "prediction": prediction}),
                   400)
    assert err["param"].startswith(where), err


def test_a_prediction_longer_than_the_context_is_a_400(c):
    err = error_of(c.post("/v1/chat/completions", json={
        **BASE, "prediction": {"type": "content", "content": " 7" * 97}}), 400)
    assert err["param"] == "prediction" and "longer than max_model_len" in err["message"]
    chat(c, prediction={"type": "content", "content": " 7" * 96})  # the limit itself is fine


def test_the_openai_sdk_sends_and_reads_a_prediction(c):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c,
                        max_retries=0)
    plain = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24,
                                        temperature=0, extra_body={"ignore_eos": True})
    text = plain.choices[0].message.content
    got = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24,
                                      temperature=0, extra_body={"ignore_eos": True},
                                      prediction={"type": "content", "content": text})
    assert got.choices[0].message.content == text
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 24 - 1 - 4
    assert details.rejected_prediction_tokens == 0
