"""Reasoning on /v1/responses, on the scripted model: the reasoning output item in OpenAI's
shape (read back by the openai SDK's own types, streaming included), and the ``reasoning``
request field: effort none closes the reasoning at once, what the server cannot serve
(other efforts, summaries, other context modes) is a 400 naming the field."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from service.app import create_app
from service.settings import Settings
from service.translate.sealed import ReasoningSeal
from tests.service.conformance import final_response
from tests.service.scripted_backend import ScriptTokenizer, scripted_loader
from tests.service.test_chat_tools_api import make_client
from tests.service.test_responses_api import ask, events


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def _sdk(client) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client,
                         max_retries=0)


def test_the_reasoning_item_in_openais_shape(client):
    r = _sdk(client).responses.create(model="scripted-model", input="<script1>",
                                      temperature=0)
    item = r.output[0]
    assert isinstance(item, ResponseReasoningItem) and item.id.startswith("rs_")
    assert item.model_dump(exclude_none=True) == {
        "id": item.id, "type": "reasoning", "summary": [], "status": "completed",
        "content": [{"type": "reasoning_text", "text": "Paris is in France"}]}
    assert r.output_text == "Hello world"


def test_the_stream_helper_reads_the_reasoning_text_events(client):
    with _sdk(client).responses.stream(model="scripted-model", input="<script1>",
                                       temperature=0) as s:
        evs = list(s)
    final = final_response(evs)
    deltas = [e for e in evs if e.type == "response.reasoning_text.delta"]
    done = [e for e in evs if e.type == "response.reasoning_text.done"]
    assert "".join(e.delta for e in deltas) == done[0].text == "Paris is in France"
    assert {(e.item_id, e.output_index, e.content_index) for e in deltas + done} == {
        (final.output[0].id, 0, 0)}
    added = next(e for e in evs if e.type == "response.output_item.added")
    assert (added.item.type, added.item.status) == ("reasoning", "in_progress")
    assert final.output[0].content[0].text == "Paris is in France"


def test_effort_none_closes_the_reasoning_at_once(client):
    body = client.post("/v1/responses", json=ask(1, reasoning={"effort": "none"})).json()
    assert [o["type"] for o in body["output"]] == ["message"]
    assert body["output"][0]["content"][0]["text"] == "Hello world"
    assert body["reasoning"] == {"effort": "none", "summary": None}
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    evs = events(client, ask(1, reasoning={"effort": "none"}))
    assert not [e for e in evs if e["type"].startswith("response.reasoning")]


@pytest.mark.parametrize("reasoning", [{}, {"effort": None, "summary": None},
                                       {"context": "auto", "mode": "standard"}])
def test_what_is_served_as_asked(client, reasoning):
    body = client.post("/v1/responses", json=ask(1, reasoning=reasoning)).json()
    assert [o["type"] for o in body["output"]] == ["reasoning", "message"]


@pytest.mark.parametrize("reasoning, param", [
    ({"effort": "high"}, "reasoning.effort"), ({"effort": "minimal"}, "reasoning.effort"),
    ({"summary": "auto"}, "reasoning.summary"), ({"summary": "detailed"}, "reasoning.summary"),
    ({"generate_summary": "concise"}, "reasoning.generate_summary"),
    ({"context": "all_turns"}, "reasoning.context"), ({"mode": "pro"}, "reasoning.mode")])
def test_what_cannot_be_served_is_a_400_naming_it(client, reasoning, param):
    r = client.post("/v1/responses", json=ask(1, reasoning=reasoning))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param, r.text
    assert err["message"].startswith(f"{param}: ")


def test_a_reasoning_item_given_back_is_listed_with_its_summary_and_text(client):
    """A reasoning item sent back in ``input`` (as the SDK sends an earlier output) is
    listed by input_items with what it held: OpenAI's item has a ``summary`` list."""
    sdk = _sdk(client)
    first = sdk.responses.create(model="scripted-model", input="<script1>", temperature=0)
    summary = [{"type": "summary_text", "text": "about Paris"}]
    given = [{"role": "user", "content": "<script1>"}, *first.output,
             {"type": "reasoning", "id": "rs_other", "summary": summary},
             {"role": "user", "content": "<script5>"}]
    second = sdk.responses.create(model="scripted-model", input=given, temperature=0)
    listed = sdk.responses.input_items.list(second.id, order="asc").data
    reasoning = [i for i in listed if i.type == "reasoning"]
    assert [(i.summary, i.content) for i in reasoning] == [
        (first.output[0].summary, first.output[0].content), (summary_of(summary), None)]


def summary_of(parts: list[dict]) -> list:
    return [Summary(**p) for p in parts]


@pytest.mark.parametrize("parser, section", [("mistral", "[THINK]Paris[/THINK]"),
                                             ("think", "<think>Paris</think>")])
def test_a_section_the_limit_ends_right_after_is_completed(parser, section):
    """max_output_tokens reached just after the reasoning section closed: the response
    is incomplete, but the reasoning item is whole (completed); one token less cuts it."""
    whole = len(ScriptTokenizer().encode(section))
    app = create_app(Settings(max_model_len=512, reasoning_parser=parser),
                     load_backend=scripted_loader([section + "Hello world"]))
    with TestClient(app) as c:
        for limit, status in ((whole, "completed"), (whole - 1, "incomplete")):
            body = ask(0, max_output_tokens=limit)
            r = c.post("/v1/responses", json=body).json()
            final = events(c, body)[-1]["response"]
            for out in (r, final):
                assert (out["status"], out["incomplete_details"]) == (
                    "incomplete", {"reason": "max_output_tokens"})
                assert [(o["type"], o["status"]) for o in out["output"]] == [
                    ("reasoning", status)], (limit, out["output"])


SEALED = {"include": ["reasoning.encrypted_content"]}


def test_encrypted_content_in_both_modes(client):
    """include reasoning.encrypted_content: the reasoning item carries its text sealed,
    in the body and from the stream's output_item.done on; the text opens again."""
    sdk = _sdk(client)
    r = sdk.responses.create(model="scripted-model", input="<script1>", temperature=0,
                             store=False, **SEALED)
    item = r.output[0]
    assert isinstance(item, ResponseReasoningItem) and item.encrypted_content
    assert "Paris" not in item.encrypted_content
    assert client.app.state.serving.sealer.open(item.encrypted_content) == "Paris is in France"
    with sdk.responses.stream(model="scripted-model", input="<script1>", temperature=0,
                              store=False, **SEALED) as s:
        evs = list(s)
    added = next(e for e in evs if e.type == "response.output_item.added")
    done = next(e for e in evs if e.type == "response.output_item.done")
    assert added.item.encrypted_content is None
    final = final_response(evs).output[0]
    assert done.item.encrypted_content == final.encrypted_content
    assert client.app.state.serving.sealer.open(final.encrypted_content) == \
        "Paris is in France"
    plain = sdk.responses.create(model="scripted-model", input="<script1>", temperature=0)
    assert plain.output[0].encrypted_content is None


def test_a_sealed_item_sent_back_is_opened_and_dropped_from_the_prompt(client):
    """A stateless client (store false) sends the item back as the SDK gives it: served,
    with the prompt of the same history without it; stored, the input items list its
    text (restored where the client left content out)."""
    sdk = _sdk(client)
    first = sdk.responses.create(model="scripted-model", input="<script1>", temperature=0,
                                 store=False, **SEALED)
    item = first.output[0].model_dump(exclude_none=True)
    bare = {k: v for k, v in item.items() if k != "content"}
    turn = [{"role": "user", "content": "<script1>"}]
    later = [{"role": "user", "content": "<script5>"}]
    without = sdk.responses.create(model="scripted-model", input=turn + later, temperature=0)
    for given in (item, bare):
        r = sdk.responses.create(model="scripted-model", input=[*turn, given, *later],
                                 temperature=0, **SEALED)
        assert r.usage.input_tokens == without.usage.input_tokens
        assert r.output_text == without.output_text
        listed = sdk.responses.input_items.list(r.id, order="asc").data
        assert listed[1].type == "reasoning"
        assert listed[1].content[0].text == "Paris is in France"
        assert listed[1].encrypted_content == item["encrypted_content"]


def test_encrypted_content_that_does_not_open_is_a_400_naming_it(client):
    token = client.app.state.serving.sealer.seal("Paris is in France")
    other = ReasoningSeal(b"another server's key, not this one").seal("Paris is in France")
    cut = token[:-4]
    for bad in (other, cut, "not a token", token[:20] + ("A" if token[20] != "A" else "B")
                + token[21:]):
        item = {"type": "reasoning", "summary": [], "encrypted_content": bad}
        r = client.post("/v1/responses", json=ask(1, input=[
            {"role": "user", "content": "<script1>"}, item]))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "input.1.encrypted_content"
        conv = client.post("/v1/conversations", json={"items": [item]})
        assert conv.status_code == 400 and conv.json()["error"]["param"] == \
            "items.0.encrypted_content", conv.text


def test_replicas_sharing_the_key_open_each_others_items():
    key = "a shared signing key of 32 characters"
    tokens = []
    for _ in range(2):
        with make_client(thinking_signature_key=key) as c:
            sealer = c.app.state.serving.sealer
            tokens.append(sealer.seal("thought"))
            assert [sealer.open(t) for t in tokens] == ["thought"] * len(tokens)
    assert ReasoningSeal(key.encode()).open(tokens[0]) == "thought"
    assert ReasoningSeal().open(tokens[0]) is None  # the per-process key of an unset one
