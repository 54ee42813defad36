"""Which whole outputs each grammar accepts, token by token with the real tokenizers: the
hermes grammars on tokenizer.json, the mistral ones on tekken.json (special tokens by id),
the schema the openai SDK's parse() sends, and a response_format together with tools."""

from __future__ import annotations

import json

import pytest

from engine.structured import (
    GrammarMatchError,
    compiler_for,
    json_schema_spec,
    spec_from_response_format,
    tool_call_grammar,
)
from tests.engine.structured.conftest import PARSE_SCHEMA, TOOLS

W = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
A = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
NAMED_ADD = {"type": "function", "function": {"name": "add"}}


def _h(*bodies):
    return "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in bodies)


def _m(*calls):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in calls)


MW, MA = ("get_weather", '{"city": "Lyon", "unit": "F"}'), ("add", '{"a": -3, "b": 40}')


def accepts(tok, spec, text):
    """True when the grammar takes every token of ``text`` and may end there."""
    m = compiler_for(tok).compile(spec).new_matcher()
    try:
        for t in tok.encode(text, add_special_tokens=False):
            m.advance(t)
    except GrammarMatchError:
        return False
    return m.is_done or m.llg.is_accepting()


@pytest.mark.parametrize("choice, parallel, text, ok", [
    ("auto", True, "Just text, no call.", True),
    ("auto", True, "Let me check.\n" + _h(W), True),
    ("auto", True, _h(W, A), True),
    ("auto", True, "text " + _h(W) + " trailing text", False),
    ("auto", True, _h('{"name": "nope", "arguments": {}}'), False),
    ("auto", False, _h(W, A), False),
    ("required", True, _h(A, W), True),
    ("required", True, "Sure: " + _h(W), False),
    ("required", False, _h(A), True),
    ("required", False, _h(A, A), False),
    ("required", True, _h('{"name": "add", "arguments": {"a": 1}}'), False),
    ("required", True, _h('{"name": "get_weather", "arguments": {"city": "Rome", '
                          '"unit": "C"}}'), False),  # the non-strict tool's enum holds
    (NAMED_ADD, True, _h(A), True),
    (NAMED_ADD, True, _h(W), False),
    (NAMED_ADD, True, _h(A, A), False),
])
def test_hermes(demo_tokenizer, choice, parallel, text, ok):
    spec = tool_call_grammar(TOOLS, choice, parallel, "hermes")
    assert accepts(demo_tokenizer, spec, text) is ok


@pytest.mark.parametrize("choice, parallel, text, ok", [
    ("auto", True, "Plain answer.", True),
    ("auto", True, "Checking." + _m(MW, MA), True),
    ("auto", True, _m(MW) + "then text", False),
    ("auto", False, _m(MW, MA), False),
    ("required", True, _m(MA, MW, MA), True),
    ("required", True, "x" + _m(MA), False),
    ("required", False, _m(MW), True),
    ("required", True, _m(("add", '{"a": 1, "b": 2, "c": 3}')), False),
    ("required", True, _m(("get_weather", '{"city": "Lyon"}')), False),
    (NAMED_ADD, True, _m(MA), True),
    (NAMED_ADD, True, _m(MW), False),
])
def test_mistral(tekken_tokenizer, choice, parallel, text, ok):
    spec = tool_call_grammar(TOOLS, choice, parallel, "mistral", tekken_tokenizer)
    assert accepts(tekken_tokenizer, spec, text) is ok


VALID = {"name": "Ada", "age": 36, "color": "green",
         "home": {"city": "London", "zip": None}, "grid": [[1, 2], [], [3]]}


@pytest.mark.parametrize("change, ok", [
    ({}, True),
    ({"home": {"city": "Oslo", "zip": "0150"}}, True),
    ({"color": "pink"}, False),
    ({"extra": 1}, False),
    ({"grid": [1, 2]}, False),
    ({"age": 3.5}, False),
])
def test_parse_schema(any_tokenizer, change, ok):
    rf = {"type": "json_schema",
          "json_schema": {"name": "Person", "schema": PARSE_SCHEMA, "strict": True}}
    spec = spec_from_response_format(rf)
    assert accepts(any_tokenizer, spec, json.dumps({**VALID, **change})) is ok


def test_missing_required_field_rejected(demo_tokenizer):
    body = {k: v for k, v in VALID.items() if k != "grid"}
    assert not accepts(demo_tokenizer, json_schema_spec(PARSE_SCHEMA), json.dumps(body))


@pytest.mark.parametrize("tokenizer, style, call", [("demo_tokenizer", "hermes", _h(A)),
                                                    ("tekken_tokenizer", "mistral", _m(MA))])
def test_format_with_tools_is_answer_or_calls(request, tokenizer, style, call):
    tok = request.getfixturevalue(tokenizer)
    rf = {"type": "json_schema", "json_schema": {"name": "P", "schema": PARSE_SCHEMA}}
    spec = tool_call_grammar(TOOLS, "auto", True, style, tok, response_format=rf)
    assert accepts(tok, spec, json.dumps(VALID))
    assert accepts(tok, spec, call)
    assert not accepts(tok, spec, "free text")
    assert not accepts(tok, spec, json.dumps({**VALID, "color": "pink"}))


@pytest.mark.parametrize("parameters, args, ok", [
    # a schema without a root type allowed any JSON value as the arguments
    ({"properties": {"city": {"type": "string"}}, "required": ["city"]}, '{"city": "x"}',
     True),
    ({"properties": {"city": {"type": "string"}}, "required": ["city"]}, "false", False),
    ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, "[1]", False),
    ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, '{"b": 1}', True),
    # no parameters: no arguments (OpenAI's reading), not any invented object
    (None, "{}", True),
    (None, '{"city": "Paris"}', False),
])
def test_a_calls_arguments_are_an_object_of_its_schema(demo_tokenizer, parameters, args, ok):
    fn = {"name": "f"} if parameters is None else {"name": "f", "parameters": parameters}
    spec = tool_call_grammar([{"type": "function", "function": fn}], "required", True,
                             style="hermes", vocab=demo_tokenizer)
    text = _h(f'{{"name": "f", "arguments": {args}}}')
    assert accepts(demo_tokenizer, spec, text) is ok


@pytest.mark.parametrize("mode, text, ok", [
    ("auto", "Plain answer.", True),
    ("auto", "Checking." + _m(MA), True),
    ("auto", _m(MA, MA), True),
    ("auto", "Checking." + _m(MW), False),  # shown in the prompt, not allowed
    ("auto", _m(MA, MW), False),
    ("required", _m(MA), True),
    ("required", _m(MW), False),
    ("required", "x" + _m(MA), False),
])
def test_allowed_tools_narrow_the_calls_mistral(tekken_tokenizer, mode, text, ok):
    spec = tool_call_grammar(TOOLS, mode, True, "mistral", tekken_tokenizer, allowed=["add"])
    assert accepts(tekken_tokenizer, spec, text) is ok


@pytest.mark.parametrize("mode, text, ok", [
    ("auto", "Just text, no call.", True),
    ("auto", "Let me check.\n" + _h(A), True),
    ("auto", _h(W), False),
    ("required", _h(A, A), True),
    ("required", _h(A, W), False),
])
def test_allowed_tools_narrow_the_calls_hermes(demo_tokenizer, mode, text, ok):
    spec = tool_call_grammar(TOOLS, mode, True, "hermes", allowed=["add"])
    assert accepts(demo_tokenizer, spec, text) is ok
