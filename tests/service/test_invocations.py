"""vLLM's (SageMaker's) POST /invocations: a body with messages is answered as
/v1/chat/completions answers it, one with prompt as /v1/completions, streamed or not;
anything else is a 400 in the OpenAI error shape."""

from __future__ import annotations

import pytest

from tests.service.test_api import client, error_of, sse_events

CHAT = {"messages": [{"role": "user", "content": "4 5"}], "max_tokens": 4, "temperature": 0,
        "ignore_eos": True}
CMPL = {"prompt": "4 5", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def _same(a: dict, b: dict) -> None:
    for k in ("id", "created"):
        a.pop(k), b.pop(k)
    assert a == b


@pytest.mark.parametrize("body, route", [(CHAT, "/v1/chat/completions"),
                                         (CMPL, "/v1/completions")])
def test_answered_as_its_route_answers(c, body, route):
    r = c.post("/invocations", json=body)
    assert r.status_code == 200, r.text
    _same(r.json(), c.post(route, json=body).json())
    other = "prompt" if "messages" in body else "messages"  # null: left out
    assert c.post("/invocations", json={**body, other: None}).status_code == 200
    streamed = sse_events(c.post("/invocations", json={**body, "stream": True}))
    direct = sse_events(c.post(route, json={**body, "stream": True}))
    assert len(streamed) == len(direct)
    for a, b in zip(streamed, direct, strict=True):
        _same(a, b)


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 1}, None), ({**CHAT, "prompt": "1"}, None),
    ({**CHAT, "n": 0}, "n"), ({**CMPL, "suffix": "x"}, "suffix"),
    ({**CHAT, "model": "other"}, "model")])
def test_what_fits_neither_route_is_refused(c, body, param):
    err = error_of(c.post("/invocations", json=body), 404 if param == "model" else 400)
    assert err["param"] == param, err
    if param is None:
        assert "messages" in err["message"] and "prompt" in err["message"]
    # the message says where, as the chat and completion routes' do
    for path in ("/invocations", "/v1/completions"):
        err = error_of(c.post(path, content=b"{not json",
                              headers={"content-type": "application/json"}), 400)
        assert err["message"] == ("the request body is not valid JSON: Expecting property "
                                  "name enclosed in double quotes at character 1"), err


def test_it_needs_the_api_key():
    with client(api_keys=("k1",)) as cl:
        error_of(cl.post("/invocations", json=CMPL), 401)
        r = cl.post("/invocations", json=CMPL, headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200, r.text
