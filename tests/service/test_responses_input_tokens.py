"""OpenAI's POST /v1/responses/input_tokens (the SDK's responses.input_tokens.count): the
prompt /v1/responses would build for the same fields, counted; equal to the
usage.input_tokens of the response itself, with instructions and tools, after
previous_response_id, in a conversation, and cut by truncation "auto"."""

from __future__ import annotations

import openai
import pytest

from tests.service.test_chat_tools_api import make_client
from tests.service.test_responses_api import TOOLS


@pytest.fixture(scope="module")
def sdk():
    with make_client() as c:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c,
                            max_retries=0), c


def both(sdk, **kw) -> tuple[int, object]:
    client, _ = sdk
    counted = client.responses.input_tokens.count(model="scripted-model", **kw)
    assert counted.object == "response.input_tokens"
    made = client.responses.create(model="scripted-model", temperature=0, **kw)
    return counted.input_tokens, made


@pytest.mark.parametrize("kw", [
    {"input": "<script1>"},
    {"input": "<script0>", "instructions": "Be brief.", "tools": TOOLS},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": "<script1>"}]}]}])
def test_the_count_is_the_responses_input_tokens(sdk, kw):
    n, made = both(sdk, **kw)
    assert n == made.usage.input_tokens > 0


def test_earlier_turns_are_counted(sdk):
    client, _ = sdk
    first = client.responses.create(model="scripted-model", input="<script1>")
    n, made = both(sdk, input="<script2>", previous_response_id=first.id)
    assert n == made.usage.input_tokens > first.usage.input_tokens
    conv = client.conversations.create(items=[{"role": "user", "content": "<script1>"}])
    n, made = both(sdk, input="<script2>", conversation=conv.id)
    alone = client.responses.input_tokens.count(model="scripted-model", input="<script2>")
    assert n == made.usage.input_tokens > alone.input_tokens


def test_nothing_is_generated_or_stored_and_errors_name_the_field(sdk):
    client, c = sdk
    before = c.app.state.serving.engine.stats()
    client.responses.input_tokens.count(model="scripted-model", input="<script1>")
    assert c.app.state.serving.engine.stats().num_running == before.num_running == 0
    for extra, param in (({"previous_response_id": "resp_nope"}, "previous_response_id"),
                         ({"personality": "friendly"}, "personality"),
                         # a /v1/responses field the count does not take (OpenAI's 400)
                         ({"max_output_tokens": 5}, "max_output_tokens")):
        r = c.post("/v1/responses/input_tokens", json={"input": "<script1>", **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
