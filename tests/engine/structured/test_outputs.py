"""engine/structured/outputs.py: vLLM's structured_outputs as grammars, judged by which whole
outputs they accept token by token on the real tokenizers, and by what they refuse."""

from __future__ import annotations

import json

import pytest

from engine.structured import GrammarError, compiler_for, spec_from_structured_outputs
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
    # the options that change nothing here are accepted
    ({"json": POINT, "disable_any_whitespace": True, "disable_fallback": True},
     '{"x": 1, "y": 2}', True),
])
def test_each_constraint_accepts_its_language(any_tokenizer, params, text, ok):
    assert accepts(any_tokenizer, spec_from_structured_outputs(params), text) is ok


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
    ({"structural_tag": '{"type": "structural_tag"}'}, "structural_tag: not supported"),
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
