"""Request fields (OpenAI's; Anthropic's on /v1/messages) this server does not implement:
a 400 naming the field, unless the value is a listed no-op; a top-level field no class
names is a 400 too, and so is one of an option's object (a message's or content part's is
logged). The SDK walk fails when the openai or
anthropic package grows a request field nobody classified."""

import logging

import pytest
from anthropic.types import message_count_tokens_params as count_params
from anthropic.types import message_create_params as msg_params
from anthropic.types import tool_param
from openai.types import completion_create_params as cmpl_params
from openai.types.chat import chat_completion_stream_options_param as stream_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import input_token_count_params as count_in_params
from openai.types.responses import response_create_params as resp_params
from openai.types.responses import response_text_config_param as text_params

from service import unsupported
from service.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    TokenizeRequest,
)
from service.translate.schemas import (
    AnthropicTool,
    CountTokensRequest,
    MessagesRequest,
    ResponsesInputTokensRequest,
    ResponsesRequest,
    TextConfig,
)
from tests.service.test_api import client, error_of

# being added to ChatCompletionRequest by the tool-call / structured-output work
LANDING = {"tools", "tool_choice", "parallel_tool_calls", "response_format"}
SDK = {
    unsupported.COMPLETIONS: (CompletionRequest, [cmpl_params.CompletionCreateParamsStreaming,
                                                  cmpl_params.CompletionCreateParamsNonStreaming]),
    unsupported.CHAT: (ChatCompletionRequest, [chat_params.CompletionCreateParamsStreaming,
                                               chat_params.CompletionCreateParamsNonStreaming]),
    unsupported.STREAM_OPTIONS: (StreamOptions,
                                 [stream_params.ChatCompletionStreamOptionsParam]),
    unsupported.RESPONSES: (ResponsesRequest, [resp_params.ResponseCreateParamsStreaming,
                                               resp_params.ResponseCreateParamsNonStreaming]),
    unsupported.MESSAGES: (MessagesRequest, [msg_params.MessageCreateParamsStreaming,
                                             msg_params.MessageCreateParamsNonStreaming]),
    unsupported.COUNT_TOKENS: (CountTokensRequest, [count_params.MessageCountTokensParams]),
    unsupported.RESPONSES_INPUT_TOKENS: (ResponsesInputTokensRequest,
                                         [count_in_params.InputTokenCountParams]),
    unsupported.RESPONSES_TEXT: (TextConfig, [text_params.ResponseTextConfigParam]),
    unsupported.ANTHROPIC_TOOL: (AnthropicTool, [tool_param.ToolParam]),
}
# Anthropic's API fields this anthropic SDK no longer types (its clients send them as
# extra_body; other clients send them as they are)
NOT_IN_SDK = {unsupported.MESSAGES: {"temperature", "top_p", "top_k", "mcp_servers",
                                     "context_management"},
              unsupported.COUNT_TOKENS: {"mcp_servers", "context_management"}}
CHAT_BASE = {"messages": [{"role": "user", "content": "3"}], "max_tokens": 1}
BASE = {unsupported.COMPLETIONS: {"prompt": "3", "max_tokens": 1}, unsupported.CHAT: CHAT_BASE,
        unsupported.MESSAGES: CHAT_BASE, unsupported.COUNT_TOKENS: {"messages": [
            {"role": "user", "content": "3"}]},
        unsupported.RESPONSES: {"input": "3", "max_output_tokens": 1},
        unsupported.TOKENIZE: {"messages": [{"role": "user", "content": "3"}]},
        unsupported.RESPONSES_INPUT_TOKENS: {"input": "3"}}
# vLLM's own routes (no SDK types them)
VLLM_ONLY = {unsupported.TOKENIZE: TokenizeRequest}


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def sdk_fields(typed_dicts) -> set[str]:
    return set().union(*(t.__required_keys__ | t.__optional_keys__ for t in typed_dicts))


@pytest.mark.parametrize("endpoint", list(SDK))
def test_every_sdk_field_is_classified_once(endpoint):
    model, typed_dicts = SDK[endpoint]
    fields = sdk_fields(typed_dicts)
    assert len(fields) > 1
    classes = {"implemented": unsupported.IMPLEMENTED[endpoint],
               "noop": set(unsupported.NOOP[endpoint]), "hint": unsupported.HINTS[endpoint]}
    for name in fields:
        where = [k for k, v in classes.items() if name in v]
        assert len(where) == 1, f"{endpoint} field {name!r} is in {where or 'no class'}"
    # the lists speak of this SDK's fields only (a typo would classify nothing)
    assert set().union(*classes.values()) <= fields | NOT_IN_SDK.get(endpoint, set())
    implemented = unsupported.IMPLEMENTED[endpoint]
    assert implemented - set(model.model_fields) <= LANDING
    # a no-op field the model declared would skip the check: it must be implemented then
    assert not set(unsupported.NOOP[endpoint]) & set(model.model_fields)


REJECTED = [
    (unsupported.CHAT, "modalities", ["text", "audio"]),
    (unsupported.CHAT, "modalities", ["audio"]), (unsupported.CHAT, "service_tier", "flex"),
    (unsupported.CHAT, "reasoning_effort", "low"), (unsupported.CHAT, "verbosity", "low"),
    (unsupported.CHAT, "audio", {"voice": "alloy", "format": "wav"}),
    (unsupported.CHAT, "web_search_options", {}),
    (unsupported.CHAT, "functions", [{"name": "f"}]),
    (unsupported.CHAT, "function_call", "auto"),
    (unsupported.CHAT, "moderation", {"model": "omni-moderation-latest"}),
    (unsupported.COMPLETIONS, "suffix", " the end"),
]


@pytest.mark.parametrize("endpoint,name,value", REJECTED)
def test_not_implemented_value_is_a_400_naming_the_field(c, endpoint, name, value):
    err = error_of(c.post(endpoint, json={**BASE[endpoint], name: value}), 400)
    assert err["param"] == name and err["type"] == "invalid_request_error"
    assert "not supported" in err["message"] and err["message"].startswith(f"{name}: ")


def test_a_nested_config_names_its_field(c):
    """The Responses API's text.verbosity, as chat's verbosity: null or left out only."""
    base = BASE[unsupported.RESPONSES]
    err = error_of(c.post(unsupported.RESPONSES, json={**base, "text": {"verbosity": "high"}}),
                   400)
    assert err["param"] == "text.verbosity", err
    ok = c.post(unsupported.RESPONSES, json={**base, "text": {"verbosity": None,
                                                                "format": {"type": "text"}}})
    assert ok.status_code == 200, ok.text


ACCEPTED = [
    (unsupported.CHAT, "modalities", ["text"]),
    (unsupported.CHAT, "service_tier", "auto"), (unsupported.CHAT, "service_tier", "default"),
    (unsupported.CHAT, "reasoning_effort", "none"), (unsupported.CHAT, "functions", []),
    (unsupported.CHAT, "audio", None), (unsupported.COMPLETIONS, "best_of", 1),
    (unsupported.COMPLETIONS, "best_of", 2),
    (unsupported.COMPLETIONS, "suffix", ""), (unsupported.COMPLETIONS, "suffix", None),
    (unsupported.CHAT, "metadata", {}), (unsupported.CHAT, "prompt_cache_key", "k"),
    (unsupported.CHAT, "safety_identifier", "h"), (unsupported.CHAT, "user", "u"),
    (unsupported.COMPLETIONS, "user", "u"),
    (unsupported.CHAT, "stream_options", {"include_usage": True,
                                          "include_obfuscation": False}),
]


@pytest.mark.parametrize("endpoint,name,value", ACCEPTED)
def test_noop_values_and_hints_are_accepted(c, endpoint, name, value):
    body = {**BASE[endpoint], name: value}
    if name == "stream_options":  # OpenAI's rule: only with stream true
        body["stream"] = True
    r = c.post(endpoint, json=body)
    assert r.status_code == 200, r.text


def assert_accepted(c, tables) -> None:
    """Every value of every field of ``tables`` ({endpoint: {field: values}}) is a 200."""
    for endpoint, table in tables.items():
        for name, values in table.items():
            for value in values:
                if endpoint == unsupported.RESPONSES_TEXT:  # a config inside Responses
                    r = c.post(unsupported.RESPONSES, json={**BASE[unsupported.RESPONSES],
                                                            "text": {name: value}})
                elif endpoint == unsupported.ANTHROPIC_TOOL:  # a /v1/messages tool
                    tool = {"name": "f", "input_schema": {"type": "object"}, name: value}
                    r = c.post(unsupported.MESSAGES, json={**BASE[unsupported.MESSAGES],
                                                           "tools": [tool]})
                    # this fake model reads no tool calls: the tools are refused as such
                    # (tests/service/test_messages_api.py serves them on the scripted one)
                    if "no tool-call format" in r.text and name not in r.text:
                        continue
                else:
                    r = c.post(endpoint, json={**BASE[endpoint], name: value})
                assert r.status_code == 200, (endpoint, name, value, r.text)


def test_every_listed_noop_value_is_accepted(c):
    assert_accepted(c, unsupported.NOOP)


@pytest.mark.parametrize("endpoint", list(BASE))
def test_an_unknown_field_is_a_400_naming_it(c, endpoint):
    """As OpenAI ("Unrecognized request argument supplied") and Anthropic answer: a typo
    such as max_token must not quietly generate the default length."""
    r = c.post(endpoint, json={**BASE[endpoint], "max_token": 5, "top_a": 0.5})
    if endpoint in (unsupported.MESSAGES, unsupported.COUNT_TOKENS):  # Anthropic's shape
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["message"].startswith("max_token: unrecognized request")
    else:
        err = error_of(r, 400)
        assert err["param"] == "max_token" and "unrecognized request argument" in err["message"]
    # null is a field left out
    r = c.post(endpoint, json={**BASE[endpoint], "frobnicate": None})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,body", [
    ("/detokenize", {"tokens": [3]}),
    ("/v1/conversations", {}),
    ("/v1/conversations", {"items": [{"type": "message", "role": "user", "content": "3"}]}),
])
def test_other_route_bodies_refuse_unknown_fields_too(c, path, body):
    err = error_of(c.post(path, json={**body, "max_token": 5}), 400)
    assert err["param"] == "max_token" and "unrecognized request argument" in err["message"]
    assert c.post(path, json=body).status_code == 200
    conv = c.post("/v1/conversations", json={}).json()["id"]
    err = error_of(c.post(f"/v1/conversations/{conv}", json={"metadata": {}, "x": 1}), 400)
    assert err["param"] == "x"


def test_a_server_tool_is_refused_for_its_type_not_its_fields(c):
    r = c.post(unsupported.MESSAGES, json={**CHAT_BASE, "tools": [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("tools.0.type")


def test_unknown_nested_fields_are_a_400_or_logged(c, caplog):
    """Nested config objects of an endpoint (stream_options, text) refuse them as the body
    does; messages and content parts, which clients echo back from earlier answers, log
    them."""
    err = error_of(c.post(unsupported.CHAT, json={
        **CHAT_BASE, "stream": True, "stream_options": {"include_usage": True, "x": 1}}), 400)
    assert err["param"] == "stream_options.x", err
    with caplog.at_level(logging.DEBUG, logger="service.unsupported"):
        r = c.post(unsupported.CHAT, json={**CHAT_BASE, "messages": [
            {"role": "user", "content": "3", "annotations": [], "frobnicate": 1}]})
    assert r.status_code == 200, r.text
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "service.unsupported"]
    assert any("frobnicate" in m for m in logged), logged


TOOL = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
SCHEMA = {"name": "a", "schema": {"type": "object"}}


@pytest.mark.parametrize("path,body,field", [
    (unsupported.CHAT, {"response_format": {"type": "json_object", "x": 1}},
     "response_format.x"),
    (unsupported.CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        **SCHEMA, "stirct": True}}}, "response_format.json_schema.stirct"),
    (unsupported.CHAT, {"tools": TOOL, "tool_choice": {
        "type": "function", "function": {"name": "f", "x": 1}}}, "tool_choice.function.x"),
    (unsupported.CHAT, {"tools": TOOL, "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "f"}}], "x": 1}}},
     "tool_choice.allowed_tools.x"),
    (unsupported.CHAT, {"prediction": {"type": "content", "content": "3", "x": 1}},
     "prediction.x"),
    (unsupported.MESSAGES, {"thinking": {"type": "enabled", "budget_tokens": 1, "x": 1}},
     "thinking.x"),
    (unsupported.MESSAGES, {"tool_choice": {"type": "auto", "x": 1}}, "tool_choice.x"),
    (unsupported.MESSAGES, {"output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object"}, "x": 1}}}, "output_config.format.x"),
    (unsupported.RESPONSES, {"reasoning": {"effort": "none", "x": 1}}, "reasoning.x"),
    (unsupported.RESPONSES, {"text": {"format": {"type": "text", "x": 1}}}, "text.format.x"),
    (unsupported.RESPONSES, {"tools": [{"type": "function", "name": "f"}], "tool_choice": {
        "type": "function", "name": "f", "x": 1}}, "tool_choice.x"),
    (unsupported.RESPONSES, {"conversation": {"id": "conv_1", "x": 1}}, "conversation.x")])
def test_a_request_options_unknown_field_is_a_400_naming_it(c, path, body, field):
    """docs/api.md: any field of a body is a 400 naming it but inside messages, content
    parts and tool definitions (objects clients send back from earlier answers); an
    option's object (response_format, tool_choice, prediction, thinking, reasoning, ...)
    took a typo such as json_schema.stirct and went on without it."""
    base = CHAT_BASE if path != unsupported.RESPONSES else BASE[unsupported.RESPONSES]
    r = c.post(path, json={**base, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    if path == unsupported.MESSAGES:
        assert err["message"].startswith(f"{field}: unrecognized request argument"), err
    else:
        assert err["param"] == field, err


def test_the_contract_forbids_other_fields(c):
    schemas = c.get("/openapi.json").json()["components"]["schemas"]
    for name in ("ChatCompletionRequest", "MessagesRequest", "ConversationCreateRequest"):
        assert schemas[name]["additionalProperties"] == {"type": "null"}, name


def test_openapi_documents_the_noop_values(c):
    props = c.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"][
        "properties"]
    assert props["service_tier"]["enum"] == [None, "auto", "default"]
    assert props["audio"]["enum"] == [None]
    assert "safety_identifier" in props and "type" not in props["safety_identifier"]  # hint
    assert props["user"]["anyOf"] == [{"type": "string"}, {"type": "null"}]  # declared


# vLLM's request extensions (clients send them as extra_body): its default is accepted,
# anything else names the field; its request and session ids are hints
VLLM_REJECTED = [
    (unsupported.CHAT, "logits_processors", ["x"]),
    (unsupported.CHAT, "return_token_offsets", True),
    (unsupported.COMPLETIONS, "prompt_embeds", "AAAA"),
    (unsupported.COMPLETIONS, "spaces_between_special_tokens", "yes"),
    (unsupported.COMPLETIONS, "kv_transfer_params", {"do_remote_prefill": True}),
]


@pytest.mark.parametrize("endpoint,name,value", VLLM_REJECTED)
def test_a_vllm_extension_this_server_lacks_is_a_400_naming_it(c, endpoint, name, value):
    err = error_of(c.post(endpoint, json={**BASE[endpoint], name: value}), 400)
    assert err["param"] == name and "not supported" in err["message"]


def test_every_vllm_default_and_hint_is_accepted(c):
    assert_accepted(c, unsupported.VLLM_NOOP)
    assert_accepted(c, {endpoint: {name: ("abc-1",) for name in names}
                        for endpoint, names in unsupported.VLLM_HINTS.items()})
    r = c.post(unsupported.CHAT, json={**CHAT_BASE, "vllm_xargs": {}})
    assert r.status_code == 200, r.text


def test_vllm_extensions_are_classified_apart_from_the_sdk_fields():
    for endpoint, table in unsupported.VLLM_NOOP.items():
        model, typed = SDK.get(endpoint) or (VLLM_ONLY[endpoint], [])
        sdk = sdk_fields(typed)
        for name in set(table) | unsupported.VLLM_HINTS.get(endpoint, frozenset()):
            assert name not in sdk, (endpoint, name)  # an OpenAI field goes in NOOP
            assert name not in model.model_fields, (endpoint, name)  # implemented: declared


def test_a_query_parameter_is_named_as_sent(c):
    """A 400's param names a query parameter as the client wrote it (not as a body
    path: tags[0], not tags.0)."""
    err = error_of(c.get("/v1/chat/completions", params={"tags[0]": "1"}), 400)
    assert err["param"] == "tags[0]", err
