"""Token masks against the whole vocabulary, both tokenizer backends, with oracles that do
not use llguidance: after a prefix, a token is allowed exactly when prefix + its text is
still a prefix of some valid output."""

from __future__ import annotations

import re

import pytest
import torch

from engine.structured import (
    GrammarMatchError,
    compiler_for,
    fill_token_mask,
    json_schema_spec,
    tool_call_grammar,
)
from tests.engine.structured.conftest import TOOLS

ENUM = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "not sure"]}},
        "required": ["answer"], "additionalProperties": False}
COMPLETE = ['{"answer": "yes"}', '{"answer": "no"}', '{"answer": "not sure"}']


def _texts(tok):
    """id -> text for the ids whose text is whole (no partial UTF-8), and the special ids."""
    texts, special = {}, set()
    for i in range(tok.vocab_size):
        if tok.is_special(i):
            special.add(i)
            continue
        t = tok.decode([i], skip_special_tokens=False)
        if t and "\ufffd" not in t:
            texts[i] = t
    return texts, special


def _allowed(tok, spec, prefix_text):
    m = compiler_for(tok).compile(spec).new_matcher()
    for t in tok.encode(prefix_text, add_special_tokens=False):
        m.advance(t)
    mask = fill_token_mask([0], [m])
    return set(torch.nonzero(mask.allowed(tok.vocab_size)[0]).flatten().tolist())


@pytest.mark.parametrize("prefix", ['{"answer": "', '{"answer": "n', '{"answer": "no'])
def test_enum_mask_is_exactly_the_valid_continuations(any_tokenizer, prefix):
    tok = any_tokenizer
    texts, special = _texts(tok)
    allowed = _allowed(tok, json_schema_spec(ENUM), prefix)
    for i, t in texts.items():
        ok = any(c.startswith(prefix + t) for c in COMPLETE)
        assert (i in allowed) == ok, (i, t, prefix)
    assert not allowed & special  # EOS only once the object is complete


def test_eos_allowed_only_when_complete(any_tokenizer):
    tok = any_tokenizer
    spec = json_schema_spec({"type": "array", "items": {"type": "integer"}})
    eos = set(tok.eos_token_ids)
    assert not _allowed(tok, spec, "[1, 2") & eos
    m = compiler_for(tok).compile(spec).new_matcher()
    for t in tok.encode("[1, 2]", add_special_tokens=False):
        m.advance(t)
    assert m.is_done  # nothing may follow the closing bracket


def test_integer_continuations(any_tokenizer):
    tok = any_tokenizer
    texts, _ = _texts(tok)
    spec = json_schema_spec({"type": "object", "properties": {"n": {"type": "integer"}},
                             "required": ["n"], "additionalProperties": False})
    allowed = _allowed(tok, spec, '{"n": 1')
    for i, t in texts.items():
        assert (i in allowed) == bool(re.fullmatch(r"1[0-9]*\}?", "1" + t)), (i, t)


def test_mistral_call_needs_the_special_token(tekken_tokenizer):
    tok = tekken_tokenizer
    texts, special = _texts(tok)
    calls, args = tok.token_to_id("[TOOL_CALLS]"), tok.token_to_id("[ARGS]")
    required = tool_call_grammar(TOOLS, "required", True, "mistral", tok)
    assert _allowed(tok, required, "") == {calls}
    names = ["get_weather", "add"]
    after = _allowed(tok, required, "[TOOL_CALLS]")
    for i, t in texts.items():
        assert (i in after) == any(n.startswith(t) for n in names), (i, t)
    assert _allowed(tok, required, "[TOOL_CALLS]add") == {args}
    auto = _allowed(tok, tool_call_grammar(TOOLS, "auto", True, "mistral", tok), "")
    assert calls in auto and set(texts) <= auto and args not in auto


def test_rejected_token_raises(demo_tokenizer):
    tok = demo_tokenizer
    m = compiler_for(tok).compile(json_schema_spec(ENUM)).new_matcher()
    with pytest.raises(GrammarMatchError):
        m.advance(tok.encode("hello", add_special_tokens=False)[0])
    with pytest.raises(GrammarMatchError):
        fill_token_mask([0], [m])


def test_batched_fill_matches_single(demo_tokenizer):
    tok = demo_tokenizer
    g = compiler_for(tok).compile(json_schema_spec(ENUM))
    prefixes = ["", '{"answer": "', '{"answer": "n', '{"answer": "no"']
    ms = []
    for p in prefixes:
        m = g.new_matcher()
        for t in tok.encode(p, add_special_tokens=False):
            m.advance(t)
        ms.append(m)
    batched = fill_token_mask([5, 1, 0, 3], ms)
    assert batched.rows == (5, 1, 0, 3)
    for j, m in enumerate(ms):
        assert torch.equal(batched.bits[j], fill_token_mask([0], [m]).bits[0])
