"""A JSON string with a lone UTF-16 surrogate ("\\ud800") is valid JSON but no text: every
route answers it 400 naming the field (it used to be a 500 from the tokenizer, a regex or
a stored conversation rendered back), and nothing is stored; a surrogate pair and an
escaped backslash before "ud800" are ordinary text."""

from __future__ import annotations

import pytest

from service.body_text import lone_surrogate_path
from tests.service.test_api import client, error_of

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BAD = '"\\ud800"'  # as it appears in the body: an escape, so the raw JSON stays ASCII


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def post(c, path: str, raw: str, **headers):
    return c.post(path, content=raw.encode(), headers={"content-type": "application/json",
                                                       **headers})


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", f'{{"prompt": {BAD}, "max_tokens": 2}}', "prompt"),
    ("/v1/completions", f'{{"prompt": ["ok", {BAD}], "max_tokens": 2}}', "prompt.1"),
    ("/tokenize", f'{{"prompt": {BAD}}}', "prompt"),
    ("/invocations", f'{{"prompt": {BAD}, "max_tokens": 2}}', "prompt"),
    ("/v1/chat/completions",
     f'{{"messages": [{{"role": "user", "content": {BAD}}}], "max_tokens": 2}}',
     "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], '
     f'"prediction": {{"type": "content", "content": {BAD}}}, "max_tokens": 2}}',
     "prediction.content"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 2, '
     f'"structured_outputs": {{"regex": {BAD}}}}}', "structured_outputs.regex"),
    ("/v1/responses", f'{{"input": "hi", "instructions": {BAD}, "max_output_tokens": 2}}',
     "instructions"),
    ("/v1/conversations",
     f'{{"items": [{{"type": "message", "role": "user", "content": {BAD}}}]}}',
     "items.0.content"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(c, path, raw, param):
    err = error_of(post(c, path, raw), 400)
    assert err["param"] == param
    assert err["message"].startswith(f"{param}: ") and "surrogate" in err["message"]


def test_the_messages_api_answers_in_its_own_shape(c):
    r = post(c, "/v1/messages", '{"model": "m", "max_tokens": 2, "messages": '
             f'[{{"role": "user", "content": {BAD}}}]}}', **{"anthropic-version": "2023-06-01"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and "messages.0.content" in body["error"]["message"]


def test_nothing_is_stored_and_the_server_serves_on(c):
    store = c.app.state.serving.conversations
    before = len(store)
    assert post(c, "/v1/conversations", '{"items": [{"type": "message", "role": "user", '
                f'"content": [{{"type": "input_text", "text": {BAD}}}]}}]}}').status_code == 400
    assert len(store) == before
    assert c.post("/v1/conversations", json={}).status_code == 200
    assert len(store) == before + 1  # the store counts what it keeps
    ok = c.post("/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200, ok.text


def test_a_surrogate_pair_and_an_escaped_backslash_are_text(c):
    for content in ('"\\ud83d\\ude00 smile"', '"\\\\ud800 is how JSON spells it"'):
        r = post(c, "/v1/chat/completions",
                 f'{{"messages": [{{"role": "user", "content": {content}}}], "max_tokens": 2}}')
        assert r.status_code == 200, r.text


def test_the_walk_names_keys_and_indices():
    assert lone_surrogate_path({"a": [1, {"b": "ok", "c": "x\ud800"}]}) == ("a", "1", "c")
    assert lone_surrogate_path({"k\udc00": 1}) == ("k\\udc00",)
    assert lone_surrogate_path({"a": "\U0001f600", "b": ["é"]}) is None
    assert lone_surrogate_path("\udfff") == ()


def test_a_body_that_is_not_json_says_where(c):
    err = error_of(post(c, "/v1/completions", '{"prompt": "hi", "max_tokens": }'), 400)
    assert err["param"] is None
    assert err["message"].startswith("the request body is not valid JSON: ")
    assert err["message"].endswith("at character 31")
    # an empty body (curl without -d) too, on every route that takes one (it was "Field
    # required", naming nothing)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                 "/tokenize", "/invocations"):
        r = c.post(path, content=b"", headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        body = r.json()["error"]
        assert body["message"] == ("the request body is not valid JSON: Expecting value at "
                                   "character 0"), (path, body)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/invocations"])
def test_a_body_nested_past_the_parser_is_a_400(c, path):
    """Nested 100,000 deep (with a lone surrogate escape, which the guard reads first; on
    /invocations without): a 400, not a 500 (RecursionError)."""
    deep = '{"messages": ' + "[" * 100_000 + '"\\ud800"' + "]" * 100_000 + "}"
    for body in (deep, deep.replace("\\ud800", "x")):
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text[:200])


@pytest.mark.parametrize("path", ["/ping", "/health", "/metrics"])
def test_a_route_open_without_a_key_never_has_its_body_read(path):
    """POST /ping (and a POST to the other open routes, a 405) takes no body: a client
    without a key made the server hold up to --max-request-body-mib of one first."""
    import asyncio

    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(api_keys=("k",), max_request_body_mib=1))
    pulled, sent = [], []
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [], "app": app, "scheme": "http",
             "server": ("127.0.0.1", 18700), "client": ("127.0.0.1", 1), "root_path": "",
             "http_version": "1.1"}

    async def receive():
        pulled.append(1)
        return {"type": "http.request", "body": b"x" * 65536, "more_body": len(pulled) < 64}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start"
    assert len(pulled) <= 1, f"{len(pulled)} body chunks read"
