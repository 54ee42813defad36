"""Images through /v1/messages (an Anthropic `image` block, with the anthropic client) and
/v1/responses (an `input_image` part, with the openai client) on a tiny multimodal
checkpoint: the same prompt tokens and the same greedy tokens as the chat path's image_url
part, so the translation reaches the vision tower."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest

from tests.engine.vision.support import write_pair
from tests.service.test_image_api import _client, data_url, part, png

IMAGE = png(112, 84, seed=5)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model = write_pair(tmp_path_factory.mktemp("apis-vision"))[0]
    with _client(model) as c:
        yield c


def chat_reference(client) -> dict:
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"}, part(data_url(IMAGE))]}],
        "max_tokens": 4, "temperature": 0}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_anthropic_image_block(client):
    ref = chat_reference(client)
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="x", http_client=client,
                              max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(IMAGE).decode()}}
    msg = sdk.messages.create(model=ref["model"], max_tokens=4, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": [
                                  {"type": "text", "text": "describe"}, block]}])
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == \
        ref["usage"]["prompt_tokens"]
    assert "".join(b.text for b in msg.content if b.type == "text") == \
        ref["choices"][0]["message"]["content"]
    count = sdk.messages.count_tokens(model=ref["model"], messages=[
        {"role": "user", "content": [{"type": "text", "text": "describe"}, block]}])
    assert count.input_tokens == ref["usage"]["prompt_tokens"]


def test_responses_input_image(client):
    ref = chat_reference(client)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    r = sdk.responses.create(model=ref["model"], max_output_tokens=4, temperature=0,
                             input=[{"role": "user", "content": [
                                 {"type": "input_text", "text": "describe"},
                                 {"type": "input_image", "image_url": data_url(IMAGE)}]}])
    assert r.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert r.output_text == ref["choices"][0]["message"]["content"]
