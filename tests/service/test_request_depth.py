"""A body nested deeper than the server's code recurses (but within what the JSON parser
reads) is a 400 on every route that takes one, not a 500 from a RecursionError."""

import json

import pytest

from tests.service.test_api import client

USER = [{"role": "user", "content": "hi"}]
DEEP = "__deep__"  # written as text: json.dumps of it would recurse in the test itself
DEEP_JSON = '{"a": ' * 950 + '"x"' + "}" * 950


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2,
                              "chat_template_kwargs": {"k": DEEP}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "x": DEEP}]}], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": DEEP}}}}]}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 16, "tools": [
        {"type": "function", "name": "f", "parameters": {
            "type": "object", "properties": {"a": DEEP}}}]}),
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": USER, "tools": [
        {"name": "f", "input_schema": {"type": "object", "properties": {"a": DEEP}}}]}),
])
def test_a_deeply_nested_body_is_a_400(c, path, body):
    raw = json.dumps(body).replace(json.dumps(DEEP), DEEP_JSON)
    r = c.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nests deeper" in r.text
