"""The 400s a schema-valid request can still get are part of the contract: each operation's
400 response in /openapi.json names its rules (service/rejections.py), and a request the
schema accepts but a rule refuses gets a 400 that names the field, in the route's error
shape, and matches one of its operation's rules."""

import jsonschema
import pytest

from service.openapi import RULES_KEY
from service.rejections import Rule
from service.translate.signature import ThinkingSigner
from tests.engine.fake_runner import VOCAB
from tests.service.test_api import client, error_of


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


@pytest.fixture(scope="module")
def doc(c):
    return c.get("/openapi.json").json()


def operation(doc, path):
    return doc["paths"][path]["post"]


def request_validator(doc, path):
    body = operation(doc, path)["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**body, "components": doc["components"]})


def rules(doc, path):
    return [Rule(r["param"], r["message"], r["rule"])
            for r in operation(doc, path)["responses"]["400"].get(RULES_KEY, [])]


CALL = [{"role": "user", "content": "1"}, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
STRAY = [{"role": "user", "content": "1"}, {"role": "tool", "tool_call_id": "c9", "content": "2"}]
THOUGHT = [{"role": "user", "content": "1"},
           {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm",
                                              "signature": "bm90IG91cnM="}]},
           {"role": "user", "content": "2"}]
LONG = " ".join(["7"] * VOCAB + ["8"] * 20)  # more words than max_model_len (64) holds
# (path, body, the field its 400 names): schema-valid, refused by a documented rule
REFUSED = [
    ("/v1/completions", {"prompt": [3, VOCAB], "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": [[3], [VOCAB + 7]], "max_tokens": 1}, "prompt.1"),
    ("/v1/completions", {"prompt": "3", "logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": CALL, "stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ("/detokenize", {"tokens": [1, VOCAB]}, "tokens"),
    ("/v1/completions", {"prompt": "3", "max_tokens": 64}, "max_tokens"),
    ("/v1/chat/completions", {"messages": CALL[:1], "max_completion_tokens": 64},
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "3", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    # no max_tokens: the limit is what max_model_len leaves (vLLM's 400 too)
    ("/v1/chat/completions", {"messages": CALL, "min_tokens": 64}, "min_tokens"),
    ("/v1/completions", {"prompt": "3", "max_tokens": None, "min_tokens": 64}, "min_tokens"),
    ("/v1/chat/completions", {"messages": STRAY}, "messages.1.tool_call_id"),
    ("/tokenize", {"messages": STRAY}, "messages.1.tool_call_id"),
    ("/tokenize", {"prompt": "3", "add_generation_prompt": False}, "add_generation_prompt"),
    ("/v1/chat/completions", {"messages": CALL, "metadata": {"k": "v"}}, "metadata"),
    ("/v1/messages", {"messages": THOUGHT, "max_tokens": 2}, "messages.1.content.0.signature"),
    ("/v1/messages/count_tokens", {"messages": THOUGHT}, "messages.1.content.0.signature"),
    ("/v1/responses", {"input": [{"type": "reasoning"}]}, "input"),
    # the chat run's refusals name the field of the API the client spoke
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    ("/v1/responses", {"input": "3", "max_output_tokens": 64}, "max_output_tokens"),
    ("/v1/responses", {"input": LONG}, "input"),
    ("/v1/responses", {"input": [{"role": "user", "content": "1"}, {
        "type": "function_call_output", "call_id": "c9", "output": "2"}]}, "input.1.call_id"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t9", "content": "2"}]}], "max_tokens": 2},
     "messages.0.content.0.tool_use_id"),
    # max_tokens past the window stops there (model_context_window_exceeded); no room is not
    ("/v1/messages", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 64},
     "messages"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "3"}], "max_tokens": 20,
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                      "tool_choice": {"type": "any"},
                      "thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking"),
    ("/v1/messages/count_tokens", {"messages": [
        {"role": "user", "content": "3"}, {"role": "assistant", "content": "4"}],
        "thinking": {"type": "enabled", "budget_tokens": 10}}, "messages.1.content"),
    ("/v1/completions", {"prompt": "3", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "3", "truncate_prompt_tokens": 10**6},
     "truncate_prompt_tokens"),
    ("/v1/responses", {"input": "3", "conversation": "conv_nope"}, "conversation"),
    ("/v1/conversations", {"items": [{"type": "function_call_output", "call_id": "c9",
                                      "output": "2"}]}, "items.0.call_id"),
    ("/v1/chat/completions", {"messages": CALL, "truncate_prompt_tokens": 0},
     "truncate_prompt_tokens"),
    ("/v1/chat/completions", {"messages": CALL, "truncate_prompt_tokens": 10**6},
     "truncate_prompt_tokens"),
    ("/v1/chat/completions", {"messages": CALL, "chat_template_kwargs": {"x": 1}},
     "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": CALL, "chat_template_kwargs": {"tools": 1}},
     "chat_template_kwargs.tools"),
    ("/v1/chat/completions", {"messages": CALL, "continue_final_message": True,
                              "add_generation_prompt": False}, "continue_final_message"),
    ("/v1/chat/completions", {"messages": STRAY[:1], "continue_final_message": True},
     "continue_final_message"),
    # vLLM's structured_outputs and the fields it replaced
    ("/v1/completions", {"prompt": "3", "structured_outputs": {}}, "structured_outputs"),
    ("/v1/chat/completions", {"messages": CALL, "structured_outputs": {
        "structural_tag": "{}"}}, "structured_outputs"),
    ("/v1/chat/completions", {"messages": CALL, "guided_choice": ["a"],
                              "guided_decoding_backend": "outlines"},
     "guided_decoding_backend"),
    ("/v1/completions", {"prompt": "3", "guided_regex": "a", "response_format": {
        "type": "json_object"}}, "guided_regex"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "1"}], "max_tokens": 2,
                      "output_config": {"format": {"type": "json_schema", "schema": {}}}},
     "output_config.format"),
    # vLLM's use_beam_search: what it cannot honour
    ("/v1/completions", {"prompt": "3", "use_beam_search": True, "top_k": 5}, "top_k"),
    ("/v1/completions", {"prompt": "3", "use_beam_search": True, "n": 11}, "n"),
    ("/v1/completions", {"prompt": "3", "use_beam_search": True, "echo": True,
                         "logprobs": 1}, "echo"),
    ("/v1/completions", {"prompt": "3", "use_beam_search": True, "guided_regex": "a"},
     "guided_regex"),
    ("/v1/chat/completions", {"messages": CALL, "use_beam_search": True, "stop": "x"},
     "stop"),
    ("/v1/chat/completions", {"messages": CALL, "use_beam_search": True,
                              "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"prompt": "3", "length_penalty": 0.5}, "length_penalty"),
]


@pytest.mark.parametrize("path,body,field", REFUSED)
def test_a_refusal_of_a_schema_valid_request_is_documented(c, doc, path, body, field):
    request_validator(doc, path).validate(body)
    r = c.post(path, json=body)
    if path.startswith("/v1/messages"):  # Anthropic's shape: the message starts with the field
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
        param, message = err["message"].split(":", 1)[0], err["message"]
    else:
        err = error_of(r, 400)
        param, message = err["param"], err["message"]
    assert param == field, err
    assert [x for x in rules(doc, path) if x.matches(param, message)], (path, err)


def test_a_signed_thinking_block_is_accepted(c):
    """The documented signature rule refuses only blocks that do not verify."""
    signer = c.app.state.serving.signer
    ok = [THOUGHT[0], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": signer.sign("hm")}]}, THOUGHT[2]]
    assert c.post("/v1/messages/count_tokens", json={"messages": ok}).status_code == 200
    other = ThinkingSigner(b"another key").sign("hm")
    bad = [ok[0], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": other}]}, ok[2]]
    assert c.post("/v1/messages/count_tokens", json={"messages": bad}).status_code == 400


def test_the_400_description_names_each_rule(doc):
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                 "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
                 "/v1/conversations"):
        bad = operation(doc, path)["responses"]["400"]
        assert bad[RULES_KEY], path
        for r in rules(doc, path):
            assert f"- `{r.param}`: {r.why}" in bad["description"], (path, r)
    vocab = [r.param for r in rules(doc, "/v1/completions") if "vocabulary" in r.why]
    assert set(vocab) == {"prompt", "logit_bias", "stop_token_ids", "allowed_token_ids"}
    assert any("signature" in r.why for r in rules(doc, "/v1/messages"))
    assert not any("signature" in r.why for r in rules(doc, "/v1/chat/completions"))
