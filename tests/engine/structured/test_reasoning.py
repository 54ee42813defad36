"""A reasoning section before a constraint (engine/structured/reasoning.py), token by token
with the real tokenizers: ``[THINK]`` / ``[/THINK]`` as special tokens of tekken.json, and
``<think>`` / ``</think>`` as text of tokenizer.json, before every kind of constraint."""

from __future__ import annotations

import pytest

from engine.structured import (
    GrammarMatchError,
    compiler_for,
    json_schema_spec,
    tool_call_grammar,
)
from engine.structured.outputs import (
    choice_spec,
    grammar_text_spec,
    regex_spec,
    structural_tag_spec,
)
from engine.structured.reasoning import markers_for, reasoning_first
from tests.engine.structured.conftest import TOOLS
from tests.engine.structured.test_grammar_language import accepts

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
       "additionalProperties": False}
# (constraint, an answer it takes, an answer it refuses)
CONSTRAINTS = {
    "json": (lambda tok, style: json_schema_spec(OBJ), '{"a": 1}', '{"a": "x"}'),
    "regex": (lambda tok, style: regex_spec("[0-9]{3}"), "123", "12a"),
    "choice": (lambda tok, style: choice_spec(["yes", "no"]), "no", "maybe"),
    # braces in the nested grammar's strings and regexes
    "grammar": (lambda tok, style: grammar_text_spec('start: "}" /[a-z]{2}/ "{"'),
                "}ab{", "}abc{"),
    "structural_tag": (lambda tok, style: structural_tag_spec(
        {"triggers": ["<f="], "structures": [{"begin": "<f=x>", "schema": OBJ,
                                               "end": "</f>"}]}),
        'Use <f=x>{"a": 1}</f> now', '<f=x>{"a": "no"}</f>'),
    "tools": (lambda tok, style: tool_call_grammar(TOOLS, "required", True, style=style,
                                                   vocab=tok), None, "plain text"),
}


def _call(style):
    if style == "mistral":
        return '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'
    return '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture(params=["tekken", "hf"])
def case(request):
    """(tokenizer, tool style, begin, end): the special-token markers on tekken.json, the
    text tags on the demo model's tokenizer.json."""
    if request.param == "tekken":
        return request.getfixturevalue("tekken_tokenizer"), "mistral", "[THINK]", "[/THINK]"
    return request.getfixturevalue("demo_tokenizer"), "hermes", "<think>", "</think>"


@pytest.mark.parametrize("kind", CONSTRAINTS)
def test_the_section_is_optional_and_the_answer_after_it_is_constrained(case, kind):
    tok, style, begin, end = case
    build, good, bad = CONSTRAINTS[kind]
    good = good or _call(style)
    spec = reasoning_first(build(tok, style), markers_for(tok, begin, end))
    assert accepts(tok, spec, good)
    assert accepts(tok, spec, f"{begin}Let me think: 1 + 1.\nDone.{end}{good}")
    assert accepts(tok, spec, f"{begin}{end}{good}")  # an empty section
    # whitespace after the section only before JSON or calls, where it is no part of the
    # answer (or where the answer's free text takes it): before a regex, a choice or a
    # grammar the content would not match it
    assert accepts(tok, spec, f"{begin}x{end}\n\n{good}") == (
        kind in ("json", "tools", "structural_tag"))
    assert not accepts(tok, spec, bad)
    assert not accepts(tok, spec, f"{begin}thinking{end}{bad}")
    if kind == "structural_tag" and style == "hermes":
        return  # free text around the tags: text markers in it are text, as a parser reads
    assert not accepts(tok, spec, f"Hi {begin}thinking{end}{good}")  # text before it
    assert not accepts(tok, spec, f"{begin}a{end}{begin}b{end}{good}")  # one section only
    assert not accepts(tok, spec, f"{good}{begin}after{end}")
    assert not accepts(tok, spec, f"{begin}never closed {good}")


def test_the_section_ends_at_its_first_end_marker(case):
    tok, _, begin, end = case
    spec = reasoning_first(json_schema_spec(OBJ), markers_for(tok, begin, end))
    assert not accepts(tok, spec, f'{begin}a{end}b{end}{{"a": 1}}')
    assert not accepts(tok, spec, '{"a": 1}' + end)


def test_a_prompt_that_opened_the_section_makes_its_end_come_first(demo_tokenizer):
    tok = demo_tokenizer
    spec = reasoning_first(json_schema_spec(OBJ), markers_for(tok, "<think>", "</think>",
                                                             starts_inside=True))
    assert accepts(tok, spec, 'still thinking</think>\n{"a": 1}')
    assert accepts(tok, spec, '</think>{"a": 1}')
    assert not accepts(tok, spec, '{"a": 1}')  # the section is open: an answer is reasoning
    assert not accepts(tok, spec, '<think>x</think>{"a": 1}</think>')


def test_the_whitespace_after_the_section_is_no_part_of_a_regex_or_choice_answer(
        tekken_tokenizer):
    tok = tekken_tokenizer
    for inner, answer in ((regex_spec("[0-9]{3}"), "123"), (choice_spec(["yes", "no"]), "no")):
        spec = reasoning_first(inner, markers_for(tok, "[THINK]", "[/THINK]"))
        assert accepts(tok, spec, f"[THINK]x[/THINK]{answer}")
        assert not accepts(tok, spec, f"[THINK]x[/THINK] {answer}")
        assert not accepts(tok, spec, f"[THINK]x[/THINK]\n{answer}")


def _ids(tok, *parts):
    """Token ids of ``parts``: a str is encoded, an int is that token."""
    out = []
    for p in parts:
        out += [p] if isinstance(p, int) else tok.encode(p, add_special_tokens=False)
    return out


def _takes(tok, spec, ids):
    m = compiler_for(tok).compile(spec).new_matcher()
    try:
        for t in ids:
            m.advance(t)
    except GrammarMatchError:
        return False
    return m.is_done or m.llg.is_accepting()


def test_markers_that_are_single_tokens_are_those_tokens(think_tokenizer):
    """<think> / </think> as added tokens (special or not): the section opens and ends
    with those very tokens, which the thinking budget and the reasoning-token count look
    for; the same text spelled in pieces is no marker (the budget would never see the
    section, so it would never be cut)."""
    tok = think_tokenizer
    b, e = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    spec = reasoning_first(json_schema_spec(OBJ), markers_for(tok, "<think>", "</think>",
                                                             read_in_text=True))
    assert _takes(tok, spec, _ids(tok, b, "plan", e, '{"a": 1}'))
    assert _takes(tok, spec, _ids(tok, '{"a": 1}'))
    pieces = [tok.encode(c, add_special_tokens=False)[0] for c in "<>"]
    think = tok.encode("think", add_special_tokens=False)
    assert not _takes(tok, spec, [pieces[0], *think, pieces[1]])  # "<think>" in pieces
    # inside the section, "</think>" in pieces would end it for the parser, not the budget
    assert not _takes(tok, spec, _ids(tok, b, "plan</", "think", ">", e, '{"a": 1}'))
    assert not _takes(tok, spec, _ids(tok, b, "plan</", "think", '>{"a": 1}'))


def test_special_markers_are_tokens_and_text_markers_are_literals(tekken_tokenizer,
                                                                   demo_tokenizer):
    m = markers_for(tekken_tokenizer, "[THINK]", "[/THINK]")
    ids = tekken_tokenizer.token_to_id("[THINK]"), tekken_tokenizer.token_to_id("[/THINK]")
    assert (m.begin, m.end, m.end_text) == (f"<[{ids[0]}]>", f"<[{ids[1]}]>", None)
    m = markers_for(demo_tokenizer, "<think>", "</think>")
    assert (m.begin, m.end, m.end_text) == ('"<think>"', '"</think>"', "</think>")


def test_the_wrapped_spec_keeps_its_name_and_kind(tekken_tokenizer):
    inner = json_schema_spec(OBJ, "answer")
    spec = reasoning_first(inner, markers_for(tekken_tokenizer, "[THINK]", "[/THINK]"))
    assert (spec.name, spec.kind) == (inner.name, inner.kind) and spec != inner
