"""/openapi.json says what the server does: a request the published schema accepts is
served, one it refuses is a 400 naming the field; every route documents its error
statuses with the OpenAI error body, and none documents FastAPI's 422."""

import json

import jsonschema
import pytest

from tests.engine.fake_runner import expected_tokens
from tests.service.test_api import MODEL, client, error_of


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


@pytest.fixture(scope="module")
def doc(c):
    return c.get("/openapi.json").json()


def validator(doc, component):
    return jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{component}", "components": doc["components"]})


ERRORS = {
    ("post", "/v1/completions"): {400, 401, 404, 408, 429, 503},
    ("post", "/v1/chat/completions"): {400, 401, 404, 408, 429, 503},
    ("post", "/invocations"): {400, 401, 404, 408, 429, 503},
    ("post", "/v1/responses"): {400, 401, 404, 408, 429, 503},
    ("post", "/v1/responses/input_tokens"): {400, 401, 404, 503},
    ("get", "/v1/responses/{response_id}"): {400, 401, 404},
    ("delete", "/v1/responses/{response_id}"): {400, 401, 404},
    ("post", "/v1/responses/{response_id}/cancel"): {400, 401, 404},
    ("get", "/v1/responses/{response_id}/input_items"): {400, 401, 404},
    ("get", "/v1/chat/completions"): {400, 401},
    ("get", "/v1/chat/completions/{completion_id}"): {400, 401, 404},
    ("post", "/v1/chat/completions/{completion_id}"): {400, 401, 404},
    ("delete", "/v1/chat/completions/{completion_id}"): {400, 401, 404},
    ("get", "/v1/chat/completions/{completion_id}/messages"): {400, 401, 404},
    ("post", "/v1/conversations"): {400, 401},
    ("get", "/v1/conversations/{conversation_id}"): {400, 401, 404},
    ("post", "/v1/conversations/{conversation_id}"): {400, 401, 404},
    ("delete", "/v1/conversations/{conversation_id}"): {400, 401, 404},
    ("post", "/v1/conversations/{conversation_id}/items"): {400, 401, 404},
    ("get", "/v1/conversations/{conversation_id}/items"): {400, 401, 404},
    ("get", "/v1/conversations/{conversation_id}/items/{item_id}"): {400, 401, 404},
    ("delete", "/v1/conversations/{conversation_id}/items/{item_id}"): {400, 401, 404},
    ("post", "/v1/messages"): {400, 401, 404, 408, 429, 503},
    ("post", "/v1/messages/count_tokens"): {400, 401, 404, 503},
    ("get", "/v1/models"): {400, 401, 503},
    ("get", "/v1/models/{model}"): {400, 401, 404, 503},
    ("post", "/tokenize"): {400, 401, 404, 503},
    ("post", "/detokenize"): {400, 401, 404, 503},
    ("get", "/kernels"): {401, 503},
    ("get", "/version"): {401},
    ("post", "/reset_prefix_cache"): {401, 503},
    ("get", "/metrics"): {503},
}


def test_every_route_documents_its_errors_and_no_422(doc):
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert "422" not in op["responses"], (method, path)
            # Anthropic's routes answer in Anthropic's error shape
            shape = ("AnthropicErrorResponse" if path.startswith("/v1/messages")
                     else "ErrorResponse")
            for status in ERRORS.get((method, path), set()):
                body = op["responses"][str(status)]["content"]["application/json"]["schema"]
                assert body == {"$ref": f"#/components/schemas/{shape}"}, (path, status)
            errors = {int(s) for s in op["responses"] if s.startswith(("4", "5"))}
            if path not in ("/health", "/ping"):
                assert errors == ERRORS[(method, path)], (method, path)


def test_real_error_bodies_match_the_documented_schema(c, doc):
    check = validator(doc, "ErrorResponse")
    for r, status in ((c.post("/v1/completions", json={"prompt": []}), 400),
                      (c.post("/v1/completions", json={"prompt": "1", "model": "x"}), 404),
                      (c.post("/v1/chat/completions", json={**M, "verbosity": "low"}), 400),
                      (c.post("/v1/completions", content=b"{"), 400)):
        assert r.status_code == status, r.text
        check.validate(r.json())
    check = validator(doc, "AnthropicErrorResponse")
    for r, status in ((c.post("/v1/messages", json=M), 400),
                      (c.post("/v1/messages", json={**M, "max_tokens": 2, "model": "x"}), 404),
                      (c.post("/v1/messages/count_tokens", content=b"{"), 400)):
        assert r.status_code == status, r.text
        check.validate(r.json())


P, M = {"prompt": "3 4", "max_tokens": 2}, {"messages": [{"role": "user", "content": "3"}]}
CALL = [{"role": "user", "content": "1"}, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
# (body, accepted): the values on either side of each bound the engine enforces
BOUNDS = [
    ({**P, "temperature": 0}, True), ({**P, "temperature": -0.01}, False),
    # OpenAI's range, and vLLM's (its SamplingParams refuses more than 2)
    ({**P, "temperature": 2}, True), ({**P, "temperature": 2.01}, False),
    ({**M, "temperature": 2.01}, False),
    ({**P, "top_p": 1}, True), ({**P, "top_p": 0}, False), ({**P, "top_p": 1.01}, False),
    ({**P, "top_k": -1}, True), ({**P, "top_k": -2}, False), ({**P, "top_k": 2**70}, True),
    ({**P, "min_p": 1}, True), ({**P, "min_p": 1.01}, False), ({**P, "min_p": -0.1}, False),
    ({**P, "presence_penalty": 2}, True), ({**P, "presence_penalty": 2.01}, False),
    ({**P, "frequency_penalty": -2}, True), ({**P, "frequency_penalty": -2.01}, False),
    ({**P, "repetition_penalty": 0.01}, True), ({**P, "repetition_penalty": 0}, False),
    # extreme but valid factors: finite logprobs (JSON has no NaN), not a 500
    ({"prompt": "1", "repetition_penalty": 5e-324, "logprobs": 5}, True),
    ({"prompt": "1", "repetition_penalty": 1e300, "logprobs": 5}, True),
    ({"prompt": "1", "temperature": 5e-324, "logprobs": 5}, True),
    # every token seen, the one the model wants (EOS) banned by min_tokens: the penalty
    # pushes all the rest past fp32 (they saturate; an all -inf row was a 500)
    ({"prompt": [*range(1, 50), 25], "repetition_penalty": 1e300, "min_tokens": 2,
      "max_tokens": 2, "logprobs": 5}, True),
    ({**P, "max_tokens": 1}, True), ({**P, "max_tokens": 0}, False),
    # max_tokens 0 answers with the prompt alone: with echo
    ({**P, "max_tokens": 0, "echo": True}, True), ({**P, "max_tokens": 0, "echo": False}, False),
    ({**M, "max_completion_tokens": 0}, False), ({**M, "max_tokens": 0}, False),
    ({**P, "n": 32, "max_tokens": 1}, True), ({**P, "n": 33}, False),
    ({**P, "logprobs": 20}, True), ({**P, "logprobs": 21}, False),
    ({**M, "logprobs": True, "top_logprobs": 21}, False),
    ({**P, "min_tokens": 0}, True), ({**P, "min_tokens": -1}, False),
    ({**P, "seed": 2**63 - 1, "n": 2}, True), ({**P, "seed": 2**64 - 1, "n": 2}, True),
    ({**P, "seed": -(2**70)}, True), ({**P, "seed": 1.5}, False),
    ({**P, "stop": "x"}, True), ({**P, "stop": ""}, False), ({**P, "stop": ["x", ""]}, False),
    ({**P, "logit_bias": {"3": 100}}, True), ({**P, "logit_bias": {"3": 100.5}}, False),
    ({**P, "logit_bias": {"x": 1}}, False), ({**P, "stop_token_ids": [-1]}, False),
    ({"prompt": [], "max_tokens": 1}, False),
    ({"prompt": [[]], "max_tokens": 1}, False), ({"prompt": [-1]}, False),
    ({"prompt": [3.0], "max_tokens": 1}, True), ({**P, "max_tokens": 2.5}, False),
    ({**P, "max_tokens": "2"}, False), ({**P, "echo": 1}, False),
    ({"messages": []}, False), ({"messages": [{"role": "robot", "content": "1"}]}, False),
    # an empty text prompt is the start of a document, as in OpenAI's API
    ({"prompt": "", "max_tokens": 1}, True), ({"prompt": ["", "3"], "max_tokens": 1}, True),
    ({"prompt": " ", "max_tokens": 1}, True),
    # a tool message names the call it answers; only assistant messages carry calls
    ({"messages": [*CALL, {"role": "tool", "tool_call_id": "c1", "content": "2"}]}, True),
    ({"messages": [*CALL, {"role": "tool", "content": "2"}]}, False),
    ({"messages": [*CALL, {"role": "tool", "tool_call_id": None, "content": "2"}]}, False),
    ({"messages": [*CALL, {"role": "tool", "tool_call_id": "", "content": "2"}]}, False),
    ({"messages": [{"role": "user", "content": "1", "tool_calls": []}]}, False),
    ({"messages": [{**CALL[1], "role": "user"}]}, False),
]


@pytest.mark.parametrize("body,accepted", BOUNDS)
def test_schema_and_server_agree_on_bounds(c, doc, body, accepted):
    endpoint, component = (("/v1/completions", "CompletionRequest") if "prompt" in body
                           else ("/v1/chat/completions", "ChatCompletionRequest"))
    assert validator(doc, component).is_valid(body) is accepted
    r = c.post(endpoint, json=body)
    if accepted:
        assert r.status_code == 200, r.text
    else:
        err = error_of(r, 400)
        named = {k for k in body if err["param"] and err["param"].startswith(k)}
        assert named, err


def test_non_finite_numbers_are_a_400(c):
    for raw in (b'{"prompt": "1", "temperature": NaN}', b'{"prompt": "1", "top_p": Infinity}'):
        err = error_of(c.post("/v1/completions", content=raw,
                              headers={"content-type": "application/json"}), 400)
        assert err["param"] in ("temperature", "top_p")


def test_success_bodies_match_their_schemas(c, doc):
    validator(doc, "Completion").validate(c.post("/v1/completions", json={
        **P, "logprobs": 1, "echo": True, "n": 2}).json())
    validator(doc, "ChatCompletion").validate(c.post("/v1/chat/completions", json={
        **M, "max_tokens": 2, "logprobs": True, "top_logprobs": 1}).json())
    validator(doc, "ModelList").validate(c.get("/v1/models").json())
    validator(doc, "Model").validate(c.get(f"/v1/models/{MODEL}").json())
    validator(doc, "Tokens").validate(c.post("/tokenize", json={
        "prompt": "3", "return_token_strs": True}).json())
    validator(doc, "Health").validate(c.get("/health").json())


def events(r):
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = [ln[len("data: "):] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_stream_chunks_match_their_schemas(c, doc):
    usage = {"stream": True, "stream_options": {"include_usage": True,
                                                "continuous_usage_stats": True}}
    chunks = events(c.post("/v1/completions", json={**P, **usage, "logprobs": 1}))
    assert chunks[-1]["choices"] == [] and "usage" in chunks[-1]
    for chunk in chunks:
        validator(doc, "CompletionChunk").validate(chunk)
    for chunk in events(c.post("/v1/chat/completions", json={**M, **usage, "max_tokens": 2})):
        validator(doc, "ChatCompletionChunk").validate(chunk)
    assert not validator(doc, "ChatCompletionChunk").is_valid(chunks[0])  # schemas differ


def test_stream_error_event_matches_the_error_schema(doc):
    with client(fail_on_token=expected_tokens([5, 6], 1)[0]) as cl:
        last = events(cl.post("/v1/completions", json={
            "prompt": "5 6", "max_tokens": 3, "temperature": 0, "stream": True}))[-1]
    validator(doc, "ErrorResponse").validate(last)


def test_fields_that_would_be_ignored_are_a_400(c):
    """top_logprobs without logprobs (OpenAI's and vLLM's rule; 0 asks for nothing and
    passes) and a text part whose text is not a string: both used to be served, the
    first without logprobs, the second with the number rendered as text."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    err = error_of(c.post("/v1/chat/completions", json={**chat, "top_logprobs": 5}), 400)
    assert err["param"] == "top_logprobs" and "needs logprobs true" in err["message"]
    assert c.post("/v1/chat/completions", json={**chat, "top_logprobs": 0}).status_code == 200
    r = c.post("/v1/chat/completions", json={**chat, "top_logprobs": 5, "logprobs": True})
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["content"][0][
        "top_logprobs"]) == 5
    for part, got in (({"type": "text", "text": 5}, "got int"), ({"type": "text"}, "got none")):
        err = error_of(c.post("/v1/chat/completions", json={
            **chat, "messages": [{"role": "user", "content": [part]}]}), 400)
        assert err["param"] == "messages.0.content.0.text" and err["message"].endswith(got)


def test_a_value_no_union_branch_takes_names_the_broken_constraint(c):
    """A prompt of token ids with a -1: the ids branch's bound, not the string branch's
    'Input should be a valid string' under the param 'prompt.str'."""
    for prompt, param in (([-1], "prompt.0"), ([[1, -2]], "prompt.0.1")):
        err = error_of(c.post("/v1/completions", json={"prompt": prompt}), 400)
        assert err["param"] == param and "greater than or equal to 0" in err["message"], err
    err = error_of(c.post("/v1/completions", json={"prompt": 5}), 400)
    assert err["param"] == "prompt", err


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages.0.content.0.text"),
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "x", "name": "f", "input": "notobj"}]}]},
     "messages.1.content.0.input"),
    ("/v1/responses", {"input": [{"role": "user", "content": "hi"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
     "input.1.arguments"),
    ("/v1/responses", {"input": [{"type": "message", "role": "user",
                                  "content": [{"type": "input_text"}]}]}, "input.0.content.0.text"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tool_choice": {"type": "function"}}, "tool_choice.function"),
])
def test_a_wrong_value_inside_a_union_of_blocks_names_its_field(c, path, body, param):
    """Not the parent with the first branch's complaint ('messages.0.content: Input should
    be a valid string'), and no branch or tag names in the path."""
    r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    message = err["message"]
    assert err.get("param", param) == param and message.startswith(f"{param}: "), err
