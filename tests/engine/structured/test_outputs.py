"""engine/structured/outputs.py: vLLM's structured_outputs as grammars, judged by which whole
outputs they accept token by token on the real tokenizers, and by what they refuse."""

from __future__ import annotations

import json
import re

import pytest

from engine.structured import (
    GrammarError,
    compiler_for,
    spec_from_response_format,
    spec_from_structured_outputs,
    tool_call_grammar,
)
from engine.structured.outputs import closed_objects
from tests.engine.structured.test_grammar_language import accepts

POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x", "y"]}
GBNF = 'root ::= answer " " digit\nanswer ::= "yes" | "no"\ndigit ::= [0-9]'
LARK = 'start: answer " " DIGIT\nanswer: "yes" | "no"\nDIGIT: /[0-9]/'


@pytest.mark.parametrize("params, text, ok", [
    ({"regex": r"[a-z]+-\d{3}"}, "abc-123", True),
    ({"regex": r"[a-z]+-\d{3}"}, "abc-12", False),
    ({"regex": r"[a-z]+-\d{3}"}, "abc-1234", False),
    ({"regex": "a/b|c"}, "a/b", True),  # a slash, escaped for Lark's /.../ by llguidance
    ({"regex": "a/b|c"}, "c", True),
    ({"choice": ["positive", "negative"]}, "negative", True),
    ({"choice": ["positive", "negative"]}, "neutral", False),
    ({"choice": ["positive", "negative"]}, "positive negative", False),
    ({"choice": ['say "hi"', "a\\b"]}, 'say "hi"', True),  # quotes and backslashes
    ({"choice": ['say "hi"', "a\\b"]}, "a\\b", True),
    # more alternatives than the parser's items per row (2000): one terminal, the lexer's
    ({"choice": [f"c{i}" for i in range(3000)]}, "c2999", True),
    ({"choice": [f"c{i}" for i in range(3000)]}, "c3000", False),
    ({"grammar": GBNF}, "yes 7", True),  # llama.cpp's GBNF
    ({"grammar": GBNF}, "maybe 7", False),
    ({"grammar": LARK}, "no 0", True),  # llguidance's Lark
    ({"grammar": LARK}, "no 10", False),
    ({"json": POINT}, '{"x": 1, "y": -2}', True),
    ({"json": json.dumps(POINT)}, '{"x": 1, "y": -2}', True),  # the schema as JSON text
    ({"json": POINT}, '{"x": 1}', False),
    ({"json": POINT}, '{"x": 1, "y": 2, "z": 3}', True),  # open object, as JSON Schema says
    ({"json": POINT, "disable_additional_properties": True}, '{"x": 1, "y": 2, "z": 3}',
     False),
    ({"json": POINT, "disable_additional_properties": True}, '{"x": 1, "y": 2}', True),
    ({"json_object": True}, '{"k": [1, 2]}', True),
    ({"json_object": True}, "[1, 2]", False),
    # without a whitespace pattern JSON is compact, as json.dumps writes it
    ({"json": POINT}, '{ "x": 1, "y": 2 }', False),
    ({"json": POINT, "whitespace_pattern": r"[ ]?"}, '{ "x":1,"y": 2 }', True),
    ({"json": POINT, "whitespace_pattern": r"[ ]?"}, '{\n"x": 1, "y": 2}', False),
    ({"json_object": True, "whitespace_pattern": r"\n?"}, '{\n"k":1}', True),
    # disable_any_whitespace writes no whitespace at all (vLLM's); disable_fallback
    # changes nothing here (one backend)
    ({"json": POINT, "disable_any_whitespace": True, "disable_fallback": True},
     '{"x":1,"y":2}', True),
    ({"json": POINT, "disable_any_whitespace": True}, '{"x": 1, "y": 2}', False),
    ({"json_object": True, "disable_any_whitespace": True}, '{"k":[1,2]}', True),
    ({"json_object": True, "disable_any_whitespace": True}, '{"k": [1, 2]}', False),
    ({"json": POINT, "disable_any_whitespace": False}, '{"x": 1, "y": 2}', True),
])
def test_each_constraint_accepts_its_language(any_tokenizer, params, text, ok):
    assert accepts(any_tokenizer, spec_from_structured_outputs(params), text) is ok


ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TAG = {"triggers": ["<f="], "structures": [{"begin": "<f=add>", "schema": ADD, "end": "</f>"},
                                           {"begin": "<f=neg>", "schema": ADD, "end": "</f>"}]}


@pytest.mark.parametrize("text, ok", [
    ("plain text, no call", True),
    ('x <f=add>{"a": 1}</f> y', True),
    ('<f=neg>{"a": 1}</f><f=add>{"a": 2}</f>\nthen text', True),
    ('x <f=add>{"b": 1}</f>', False),  # the schema holds inside the tag
    ('x <f=sub>{"a": 1}</f>', False),  # the trigger opens a structure: no other text
    ('x <f=add>{"a": 1}', False),  # the end is due
    ('x <f=add> {"a": 1}</f>', False),  # compact JSON right after begin
])
@pytest.mark.parametrize("form", ["object", "json_text", "closed"])
def test_structural_tags_constrain_only_what_follows_a_trigger(any_tokenizer, text, ok, form):
    value = json.dumps(TAG) if form == "json_text" else TAG
    params = {"structural_tag": value, "disable_additional_properties": form == "closed"}
    assert accepts(any_tokenizer, spec_from_structured_outputs(params), text) is ok


def test_structural_tag_closed_objects_and_response_format_form(demo_tokenizer):
    extra = 'x <f=add>{"a": 1, "b": 2}</f>'
    spec = spec_from_structured_outputs({"structural_tag": TAG})
    assert spec.kind == "structural_tag" and accepts(demo_tokenizer, spec, extra)
    closed = spec_from_structured_outputs({"structural_tag": TAG,
                                           "disable_additional_properties": True})
    assert not accepts(demo_tokenizer, closed, extra)
    rf = spec_from_response_format({"type": "structural_tag", **TAG})
    assert rf == spec


@pytest.mark.parametrize("value, words", [
    ("{oops", "structural_tag: not JSON"),
    ([TAG], "an object with triggers and structures"),
    ({**TAG, "format": {"type": "triggered_tags"}}, "format form is not served"),
    ({**TAG, "type": "regex"}, "must be 'structural_tag'"),
    ({**TAG, "tags": []}, "structural_tag.tags: not a field"),
    ({"structures": TAG["structures"]}, "structural_tag.triggers"),
    ({"triggers": ["<f="], "structures": []}, "structural_tag.structures"),
    ({"triggers": ["<f="], "structures": [{"begin": "<g>", "end": ""}]},
     "structures[0].begin: '<g>' starts with none of the triggers"),
    ({"triggers": ["<f="], "structures": [{"begin": "<f=a>", "end": "", "args": {}}]},
     "structures[0].args: not a field"),
    ({"triggers": ["<f="], "structures": [{"begin": "<f=a>", "schema": "[", "end": ""}]},
     "structures[0].schema: the schema text is not JSON"),
    ({"triggers": ["<f="], "structures": [{"begin": "<f=a>", "end": None}]},
     "begin and end must be strings"),
])
def test_malformed_structural_tags_are_refused_naming_the_part(value, words):
    with pytest.raises(GrammarError, match=re.escape(words)):
        spec_from_structured_outputs({"structural_tag": value})


def test_tool_calls_and_a_structural_tag_format_do_not_mix():
    tool = {"type": "function", "function": {"name": "add", "parameters": ADD}}
    with pytest.raises(GrammarError, match="goes alone"):
        tool_call_grammar([tool], "auto", response_format={"type": "structural_tag", **TAG})


def test_specs_name_their_kind_and_equal_ones_compile_once(demo_tokenizer):
    kinds = {k: spec_from_structured_outputs(p).kind for k, p in {
        "regex": {"regex": "a+"}, "choice": {"choice": ["a"]}, "grammar": {"grammar": GBNF},
        "json": {"json": POINT}, "json_object": {"json_object": True}}.items()}
    assert kinds == {"regex": "regex", "choice": "choice", "grammar": "grammar",
                     "json": "json_schema", "json_object": "json_object"}
    compiler = compiler_for(demo_tokenizer)
    a = compiler.compile(spec_from_structured_outputs({"choice": ["x", "y"]}))
    assert compiler.compile(spec_from_structured_outputs({"choice": ["x", "y"]})) is a
    assert spec_from_structured_outputs(None) is None


@pytest.mark.parametrize("params, words", [
    ({}, "exactly one of"),
    ({"json_object": False}, "exactly one of"),
    ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
    ({"structural_tag": '{"type": "structural_tag"}'}, "structural_tag.triggers: a non-empty"),
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", ""]}, "non-empty list"),
    ({"choice": "ab"}, "non-empty list"),
    ({"regex": ""}, "non-empty string"),
    ({"grammar": "  "}, "non-empty string"),
    ({"grammar": "root ::= ::="}, "not Lark, and not GBNF"),
    ({"grammar": 'answer: "x"'}, "not Lark, and not GBNF"),  # Lark needs start
    ({"json": "{not json"}, "not JSON"),
    ({"json": "[1]"}, "must be an object"),
    ({"regex": "a", "whitespace_pattern": " "}, "applies to json"),
    ({"json": POINT, "whitespace_pattern": ""}, "non-empty regex"),
    ({"choice": ["a"], "disable_any_whitespace": True},
     "disable_any_whitespace: applies to json"),
    ({"json": POINT, "whitespace_pattern": " ", "disable_any_whitespace": True},
     "contradicts whitespace_pattern"),
    ({"regex": "a", "backend": "xgrammar"}, "backend: not a structured_outputs field"),
])
def test_malformed_constraints_are_grammar_errors_naming_the_field(params, words):
    with pytest.raises(GrammarError, match=words):
        spec_from_structured_outputs(params)


def test_a_regex_llguidance_rejects_fails_to_compile(demo_tokenizer):
    spec = spec_from_structured_outputs({"regex": "(unclosed"})
    with pytest.raises(GrammarError):
        compiler_for(demo_tokenizer).compile(spec)


def test_closed_objects_reaches_nested_schemas_and_keeps_the_input():
    schema = {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"a": {"type": "string"}}},
        "open": {"type": "object", "additionalProperties": True},
        "list": {"type": "array", "items": {"properties": {"b": {}}}},
        "properties": {"type": "string"}},  # a property named like the keyword
        "$defs": {"D": {"type": "object"}}}
    out = closed_objects(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["inner"]["additionalProperties"] is False
    assert out["properties"]["open"]["additionalProperties"] is True  # said otherwise
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert out["properties"]["properties"] == {"type": "string"}
    assert set(out["properties"]) == {"inner", "open", "list", "properties"}
    assert "additionalProperties" not in schema  # a copy
