"""engine/structured/spec.py and tool_grammar.py: pure builders (no tokenizer compiled)."""

from __future__ import annotations

import json

import pytest

from engine.structured import (
    GrammarError,
    GrammarSpec,
    json_object_spec,
    json_schema_spec,
    spec_from_response_format,
    tool_call_grammar,
)
from tests.engine.structured.conftest import ADD, TOOLS, WEATHER


class Vocab:
    def __init__(self, ids):
        self.ids = ids

    def token_to_id(self, token):
        return self.ids.get(token)


V13 = Vocab({"[TOOL_CALLS]": 9, "[ARGS]": 32})


def test_response_format_kinds():
    assert spec_from_response_format(None) is None
    assert spec_from_response_format({"type": "text"}) is None
    assert spec_from_response_format({"type": "json_object"}) == json_object_spec()
    rf = {"type": "json_schema", "json_schema": {"name": "P", "schema": {"type": "object"},
                                                 "strict": True}}
    spec = spec_from_response_format(rf)
    assert spec == json_schema_spec({"type": "object"}, "P", strict=True)
    assert "'P'" in spec.name and '"lenient": false' in spec.lark
    loose = spec_from_response_format({**rf, "json_schema": {"schema": {"type": "object"}}})
    assert '"lenient": true' in loose.lark


def test_a_json_schema_format_without_schema_is_any_json():
    """OpenAI's json_schema.schema is optional: without one the answer is any JSON value."""
    for body in ({"name": "P"}, {"name": "P", "schema": None}):
        spec = spec_from_response_format({"type": "json_schema", "json_schema": body})
        assert spec == json_schema_spec({}, "P", strict=False)


@pytest.mark.parametrize("rf", [{"type": "xml"}, {"type": "json_schema"},
                                {"type": "json_schema", "json_schema": {"schema": 3}}])
def test_bad_response_format(rf):
    with pytest.raises(GrammarError):
        spec_from_response_format(rf)


def test_spec_equality_ignores_name_and_needs_start():
    assert GrammarSpec("start: \"a\"", "x") == GrammarSpec("start: \"a\"", "y")
    assert hash(GrammarSpec("start: \"a\"", "x")) == hash(GrammarSpec("start: \"a\""))
    with pytest.raises(GrammarError):
        GrammarSpec("root: \"a\"")


def test_schema_keeps_caller_options_and_json_style():
    lark = json_schema_spec({"type": "object", "x-guidance": {"item_separator": ","}}).lark
    opts = json.loads(lark.split("%json", 1)[1])["x-guidance"]
    assert opts["item_separator"] == "," and opts["key_separator"] == ": "
    assert opts["whitespace_flexible"] is False


def test_tool_choice_none_and_no_tools():
    assert tool_call_grammar(TOOLS, "none", style="hermes") is None
    assert tool_call_grammar([], "auto", style="hermes") is None
    fmt = {"type": "json_object"}
    assert tool_call_grammar(TOOLS, "none", response_format=fmt) == json_object_spec()


@pytest.mark.parametrize("kwargs, words", [
    (dict(tools=[], tool_choice="required"), "needs at least one tool"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "'nope'"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "not supported"),
    (dict(tools=[{"type": "function"}], tool_choice="auto"), "tools[0]"),
    (dict(tools=TOOLS, tool_choice="auto", style="xml"), "style"),
    (dict(tools=TOOLS, tool_choice="auto", style="mistral", vocab=Vocab({})), "[TOOL_CALLS]"),
])
def test_tool_grammar_errors(kwargs, words):
    kwargs.setdefault("style", "mistral")
    kwargs.setdefault("vocab", V13)
    with pytest.raises(GrammarError, match=words.replace("[", r"\[").replace("]", r"\]")):
        tool_call_grammar(**kwargs)


def test_mistral_grammar_uses_special_ids_and_every_schema():
    lark = tool_call_grammar(TOOLS, "required", True, "mistral", V13).lark
    assert lark.count("<[9]>") == 2 and lark.count("<[32]>") == 2
    assert "calls: call+" in lark and "start: calls\n" in lark
    # the non-strict tool's schema is enforced too (leniently), not replaced by {}
    assert '"enum": ["Paris", "Lyon"]' in lark and '"lenient": true' in lark
    one = tool_call_grammar(TOOLS, "required", False, "mistral", V13).lark
    assert "calls: call\n" in one


def test_named_choice_keeps_only_that_tool():
    named = {"type": "function", "function": {"name": "add"}}
    lark = tool_call_grammar(TOOLS, named, True, "hermes").lark
    assert '\\"add\\"' in lark and "get_weather" not in lark
    assert 'calls: call\n' in lark  # exactly one call even with parallel_tool_calls


def test_auto_with_format_is_calls_or_answer():
    spec = tool_call_grammar([WEATHER, ADD], "auto", True, "hermes",
                             response_format={"type": "json_object"})
    assert spec.lark.startswith("start: calls | answer\n") and "answer: %json" in spec.lark
