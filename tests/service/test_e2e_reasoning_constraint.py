"""Reasoning before a constraint, end to end with the official SDKs on a tiny random v13
tekken checkpoint (its reasoning parser reads [THINK] ... [/THINK]): the answer may open
with a reasoning section, which a budget caps, and what follows is constrained (a JSON
schema, a forced call); a budget of 0 constrains from the first token. (The Messages
API refuses thinking with a forced tool use, as Anthropic does.)

The chat requests bias [THINK] so the random model opens the section; the grammar allows
it only first, so the bias changes nothing after."""

from __future__ import annotations

import json
import re
from typing import Literal

import anthropic
import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings
from tests.engine.structured.think_tokens import think_model_dir
from tests.service.test_e2e_tools import TOOLS, WEATHER, e2e_model_dir

ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tools."}]
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY,
                                                 "strict": True}}


class City(BaseModel):
    city: Literal["Paris", "Rome"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = e2e_model_dir("tekken", tmp_path_factory)
    settings = Settings(model=model_dir, max_model_len=1024, max_num_seqs=4)
    with TestClient(create_app(settings)) as client:
        chat = openai.OpenAI(base_url="http://testserver/v1", api_key="x",
                             http_client=client, max_retries=0)
        messages = anthropic.Anthropic(base_url="http://testserver", api_key="x",
                                       http_client=client, max_retries=0)
        yield chat, messages, chat.models.list().data[0].id


@pytest.fixture(scope="module")
def think_bias(served, tmp_path_factory) -> dict[str, int]:
    """A logit bias that makes the random model open a reasoning section."""
    tok = Tokenizer.from_dir(e2e_model_dir("tekken", tmp_path_factory))
    return {str(tok.token_to_id("[THINK]")): 30}


def _chat(served, bias, budget, **kw):
    chat, _, name = served
    kw = {"model": name, "messages": ASK, "temperature": 0, "max_tokens": 60,
          "logprobs": True, "logit_bias": bias, **kw,
          "extra_body": {"thinking_token_budget": budget}}
    return chat.chat.completions.create(**kw)


def _tokens(choice) -> list[str]:
    return [t.token for t in choice.logprobs.content]


def test_a_json_schema_answer_follows_the_reasoning(served, think_bias):
    r = _chat(served, think_bias, 3, response_format=FORMAT)
    c = r.choices[0]
    tokens = _tokens(c)
    assert tokens[0] == "[THINK]" and tokens[4] == "[/THINK]", tokens
    assert r.usage.completion_tokens_details.reasoning_tokens == 3
    assert c.message.reasoning_content  # the three tokens' text
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), CITY)
    # streamed: the same reasoning and answer
    chat, _, name = served
    stream = chat.chat.completions.create(
        model=name, messages=ASK, temperature=0, max_tokens=60, response_format=FORMAT,
        logit_bias=think_bias, stream=True,
        extra_body={"thinking_token_budget": 3})
    parts = {"content": "", "reasoning_content": ""}
    for chunk in stream:
        for d in chunk.choices:
            for k in parts:
                parts[k] += getattr(d.delta, k, None) or ""
    assert parts == {"content": c.message.content,
                     "reasoning_content": c.message.reasoning_content}


def test_parse_reads_the_answer_after_the_reasoning(served, think_bias):
    chat, _, name = served
    r = chat.chat.completions.parse(
        model=name, messages=ASK, temperature=0, max_tokens=60, response_format=City,
        logit_bias=think_bias, extra_body={"thinking_token_budget": 2})
    msg = r.choices[0].message
    assert isinstance(msg.parsed, City) and msg.reasoning_content


def test_a_forced_call_follows_the_reasoning(served, think_bias):
    c = _chat(served, think_bias, 3, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False).choices[0]
    assert _tokens(c)[0] == "[THINK]" and c.message.reasoning_content
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather"  # the bias would otherwise pick nothing
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_a_budget_of_zero_constrains_from_the_first_token(served, think_bias):
    c = _chat(served, think_bias, 0, response_format=FORMAT).choices[0]
    assert _tokens(c)[0] == "{"  # the bias toward [THINK] cannot open a section
    assert not getattr(c.message, "reasoning_content", None) and c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), CITY)


def test_messages_thinking_with_a_forced_tool_use_is_a_400(served):
    """Anthropic's rule (thinking may not be enabled when tool_choice forces tool use);
    with thinking disabled the forced call is made."""
    _, sdk, name = served
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    kw = {"model": name, "max_tokens": 60, "messages": ASK, "tools": tools,
          "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
          "extra_body": {"temperature": 0}}
    with pytest.raises(anthropic.BadRequestError) as err:
        sdk.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 4})
    assert "forces tool use" in err.value.body["error"]["message"]
    m = sdk.messages.create(**kw, thinking={"type": "disabled"})
    assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use", m
    schema = {t["name"]: t["input_schema"] for t in tools}[m.content[0].name]
    jsonschema.validate(m.content[0].input, schema)


@pytest.mark.parametrize("constraint", [{"choice": ["yes", "no"]}, {"regex": "[0-9]{3}"}])
def test_a_choice_or_regex_answer_is_exactly_what_follows_the_reasoning(served, think_bias,
                                                                        constraint):
    """No whitespace between the section and a regex or choice answer: the content is
    one of the choices, or matches the regex, whole."""
    chat, _, name = served
    c = chat.chat.completions.create(
        model=name, messages=ASK, temperature=0, max_tokens=30, logprobs=True,
        logit_bias=think_bias,
        extra_body={"thinking_token_budget": 3, "structured_outputs": constraint}).choices[0]
    assert _tokens(c)[0] == "[THINK]" and c.message.reasoning_content
    assert c.finish_reason == "stop"
    if "choice" in constraint:
        assert c.message.content in constraint["choice"], c.message.content
    else:
        assert re.fullmatch(constraint["regex"], c.message.content), c.message.content


@pytest.fixture(scope="module", params=[False, True], ids=["added", "special"])
def think_served(request, tmp_path_factory):
    """The demo model whose <think> / </think> are single added tokens (special or not),
    with a template that mentions <think> (the think reasoning parser)."""
    model_dir = think_model_dir(tmp_path_factory.mktemp("think-model"), request.param)
    settings = Settings(model=model_dir, max_model_len=1024, max_num_seqs=4)
    with TestClient(create_app(settings)) as client:
        chat = openai.OpenAI(base_url="http://testserver/v1", api_key="x",
                             http_client=client, max_retries=0)
        yield chat, chat.models.list().data[0].id, Tokenizer.from_dir(model_dir)


def test_think_tokens_open_and_close_the_section_the_budget_caps(think_served):
    """<think> as one token of the vocabulary: the grammar takes only that token as the
    section's marker (spelled in pieces, the budget would never see the section and never
    cut it), the budget closes it, and the parser reads the reasoning out of the JSON
    answer whether the tags are special tokens (no text) or not."""
    chat, name, tok = think_served
    begin = tok.token_to_id("<think>")
    kw = {"model": name, "messages": ASK, "temperature": 0, "max_tokens": 40,
          "response_format": FORMAT, "extra_body": {"thinking_token_budget": 2}}
    r = chat.chat.completions.create(**kw, logprobs=True, logit_bias={str(begin): 30})
    c = r.choices[0]
    assert [t.token for t in c.logprobs.content][:4] == ["<think>", *_tokens(c)[1:3],
                                                         "</think>"]
    assert c.finish_reason == "stop" and c.message.reasoning_content
    assert r.usage.completion_tokens_details.reasoning_tokens == 2
    jsonschema.validate(json.loads(c.message.content), CITY)
    # "<" is what the model writes first unbiased: it may not open the section in pieces
    r = chat.chat.completions.create(**kw, logprobs=True)
    c = r.choices[0]
    assert not getattr(c.message, "reasoning_content", None) and c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), CITY)


@pytest.mark.parametrize("reasoning", [{}, {"reasoning_effort": "none"}])
def test_a_bad_grammar_is_named_at_its_own_lines(served, reasoning):
    """The error names the place in the client's grammar, whether or not the reasoning
    section's rules come before it."""
    chat, _, name = served
    with pytest.raises(openai.BadRequestError) as err:
        chat.chat.completions.create(
            model=name, messages=ASK, max_tokens=5,
            extra_body={"structured_outputs": {"grammar": 'start: "a" b\nb: "c" bar\n'},
                        **reasoning})
    assert err.value.body["param"] == "structured_outputs"
    assert 'at 2(4): unknown name: "bar"' in err.value.body["message"], err.value.body


@pytest.fixture(scope="module", params=["think", "think-open"])
def think_tag_served(request, tmp_path_factory):
    """The demo model with <think> / </think> as added tokens, started with either
    text-tag parser: the prompt, not the flag, says whether the answer starts inside."""
    model_dir = think_model_dir(tmp_path_factory.mktemp("think-tags"), False)
    settings = Settings(model=model_dir, max_model_len=1024, max_num_seqs=4,
                        reasoning_parser=request.param)
    with TestClient(create_app(settings)) as client:
        chat = openai.OpenAI(base_url="http://testserver/v1", api_key="x",
                             http_client=client, max_retries=0)
        yield chat, chat.models.list().data[0].id


def _prefilled(served, prefill, **kw):
    chat, name = served
    return chat.chat.completions.create(
        model=name, temperature=0, max_tokens=30,
        messages=[*ASK, {"role": "assistant", "content": prefill}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False, **kw})


def test_a_prefill_past_the_section_is_answered_under_the_constraint(think_tag_served):
    c = _prefilled(think_tag_served, '<think>Paris.</think>{"city": ',
                   structured_outputs={"regex": r'"(Paris|Rome)"\}'}).choices[0]
    assert re.fullmatch(r'"(Paris|Rome)"\}', c.message.content), c.message
    assert not getattr(c.message, "reasoning_content", None)


def test_a_prefill_inside_the_section_goes_on_reasoning_first(think_tag_served):
    c = _prefilled(think_tag_served, "<think>The city is", response_format=FORMAT,
                   thinking_token_budget=2).choices[0]
    assert c.message.reasoning_content and c.finish_reason == "stop", c.message
    jsonschema.validate(json.loads(c.message.content), CITY)


# a request's own template (--trust-request-chat-template) whose generation prompt opens
# the section: its [THINK] is the template's markup, so the special token
OPENS_THINK = ("{{ bos_token }}{% for m in messages %}[INST]{{ m['content'] }}[/INST]"
               "{% endfor %}[THINK]")


def test_a_prompt_that_opened_think_makes_the_answer_start_inside(tiny_checkpoint):
    """The published file set (tokenizer.json, the mistral reasoning parser) with a
    template that opens [THINK] for the answer: the answer is reasoning until its end
    (the budget's 2 tokens), then the JSON the schema asks for."""
    model_dir = tiny_checkpoint(tokenizer="published")
    settings = Settings(model=model_dir, max_model_len=512, max_num_seqs=4,
                        trust_request_chat_template=True)
    with TestClient(create_app(settings)) as client:
        chat = openai.OpenAI(base_url="http://testserver/v1", api_key="x",
                             http_client=client, max_retries=0)
        r = chat.chat.completions.create(
            model=chat.models.list().data[0].id, messages=ASK, temperature=0,
            max_tokens=40, response_format=FORMAT, logprobs=True,
            extra_body={"chat_template": OPENS_THINK, "thinking_token_budget": 2})
    c = r.choices[0]
    assert _tokens(c)[2] == "[/THINK]" and c.message.reasoning_content, _tokens(c)
    assert r.usage.completion_tokens_details.reasoning_tokens == 2
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), CITY)


def test_the_published_file_set_reasons_before_a_schema_and_a_call(tiny_checkpoint):
    """The same on tokenizer.json and the published chat_template.jinja (its own
    rendering of the prompt; [THINK] a special token of tokenizer.json): the section
    first, then the JSON schema or the forced call."""
    model_dir = tiny_checkpoint(tokenizer="published")
    tok = Tokenizer.from_dir(model_dir)
    bias = {str(tok.token_to_id("[THINK]")): 30}
    # the template's own system prompt takes about 1100 tokens
    settings = Settings(model=model_dir, max_model_len=2048, max_num_seqs=4)
    with TestClient(create_app(settings)) as client:
        chat = openai.OpenAI(base_url="http://testserver/v1", api_key="x",
                             http_client=client, max_retries=0)
        served = (chat, None, chat.models.list().data[0].id)
        r = _chat(served, bias, 3, response_format=FORMAT)
        call = _chat(served, bias, 3, tools=TOOLS, tool_choice="required",
                     parallel_tool_calls=False).choices[0]
    c = r.choices[0]
    assert _tokens(c)[0] == "[THINK]" and _tokens(c)[4] == "[/THINK]", _tokens(c)
    assert r.usage.completion_tokens_details.reasoning_tokens == 3
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), CITY)
    assert _tokens(call)[0] == "[THINK]" and call.message.reasoning_content
    assert call.finish_reason == "tool_calls" and len(call.message.tool_calls) == 1
    fn = call.message.tool_calls[0].function
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[fn.name]
    jsonschema.validate(json.loads(fn.arguments), schema)
