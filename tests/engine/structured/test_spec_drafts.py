"""Speculative decoding under a grammar, in the engine loop (real sampler, detokenizer,
tekken tokenizer and llguidance matchers; a model stand-in that copies its prompt,
tests.engine.structured.copy_runner.py): outputs equal plain decoding's for every grammar kind,
alone and batched with unconstrained requests, greedy and seeded; drafts are cut where the
grammar rejects them and filled where it forces tokens; a draft's masks cost at most one
fill per draft position; the matcher leaves drafting where it entered."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampling_params import SamplingParams, ThinkingBudget
from engine.spec.config import SpeculativeConfig
from engine.spec.constraint import DraftConstraint
from engine.structured import (
    compiler_for,
    json_object_spec,
    json_schema_spec,
    tool_call_grammar,
)
from tests.engine.spec.test_spec_engine import FixedShare
from tests.engine.structured.conftest import PARSE_SCHEMA, TOOLS
from tests.engine.structured.copy_runner import CopyRunner

SPEC = SpeculativeConfig("ngram", 4, 3, 1)
DOC = {"name": "Ada Lovelace", "age": 36, "color": "green",
       "home": {"city": "London", "zip": None}, "grid": [[1, 2], [3, 4]]}


def make_engine(tok, spec=SPEC, max_num_seqs=8):
    cfg = EngineConfig(model_dir=".", max_num_seqs=max_num_seqs, max_model_len=256,
                       max_num_batched_tokens=128, enable_prefix_caching=False,
                       speculative_config=spec)
    eng = Engine(CopyRunner(tok.vocab_size), tok, cfg)
    if eng.spec is not None:  # drafting is free: every sequence drafts what it may
        eng.spec.cost = FixedShare(0.0)
    return eng


def run(engine, reqs):
    outs = {rid: [] for rid in reqs}
    for rid, (prompt, params) in reqs.items():
        engine.add_request(rid, prompt, params, outs[rid].append)
    for _ in range(3000):
        engine.step()
        if not engine._live and engine.stats().num_waiting == 0:
            return {rid: ([t for o in got for t in o.token_ids], got[-1].finish_reason,
                          got[-1].error) for rid, got in outs.items()}
    raise AssertionError("engine did not finish")


def specs(tok):
    return {"json_object": json_object_spec(),
            "json_schema": json_schema_spec(PARSE_SCHEMA, "Person"),
            "mistral_required": tool_call_grammar(TOOLS, "required", True, "mistral", tok),
            "mistral_named": tool_call_grammar(
                TOOLS, {"type": "function", "function": {"name": "get_weather"}}, True,
                "mistral", tok),
            "mistral_auto": tool_call_grammar(TOOLS, "auto", True, "mistral", tok),
            "hermes_required": tool_call_grammar(TOOLS, "required", False, "hermes", tok)}


def prompt(tok, kind):
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    if kind.startswith("mistral"):  # the call as the model writes it: special tokens
        body = [tok.token_to_id("[TOOL_CALLS]"), *enc("get_weather"),
                tok.token_to_id("[ARGS]"), *enc('{"city": "Paris", "unit": "C"}')]
    else:
        body = enc('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", '
                   '"unit": "F"}}\n</tool_call>' if kind.startswith("hermes")
                   else json.dumps(DOC))
    return [*enc("Example: "), *body, *enc("\nAgain: "), *body, *enc("\nOnce more:")]


def params(tok, kind, **kw):
    g = compiler_for(tok).compile(specs(tok)[kind])
    return SamplingParams(**{"max_tokens": 60, "temperature": 0.0, "grammar": g,
                             "skip_special_tokens": False, **kw})


KINDS = ["json_object", "json_schema", "mistral_required", "mistral_named", "mistral_auto",
         "hermes_required"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_grammar_kind_equals_plain_and_keeps_drafts(tekken_tokenizer, kind):
    tok = tekken_tokenizer
    req = {"a": (prompt(tok, kind), params(tok, kind))}
    want = run(make_engine(tok, None), req)
    eng = make_engine(tok)
    assert run(eng, req) == want and want["a"][2] is None
    s, steps = eng.spec.stats, eng.steps
    label = specs(tok)[kind].kind
    assert s.by_grammar[label][2] > 0  # drafts under the grammar were kept
    assert s.num_accepted_tokens / s.num_draft_tokens > 0.5  # cut drafts rarely fail
    assert 0 < steps.draft_mask_fills <= s.num_draft_tokens  # <= K fills per K drafts


@pytest.mark.parametrize("seed", [3, 11])
def test_seeded_sampling_equals_plain(tekken_tokenizer, seed):
    tok = tekken_tokenizer
    reqs = {k: (prompt(tok, k), params(tok, k, temperature=0.7, seed=seed + i))
            for i, k in enumerate(("json_schema", "mistral_required"))}
    eng = make_engine(tok)
    assert run(eng, reqs) == run(make_engine(tok, None), reqs)
    assert eng.spec.stats.num_accepted_tokens > 0


def test_batch_of_sixteen_with_unconstrained_equals_each_alone_plain(tekken_tokenizer):
    tok = tekken_tokenizer
    reqs = {}
    for i in range(16):
        kind = KINDS[i % len(KINDS)]
        if i % 2:  # unconstrained, some sampled with a seed
            kw = {"temperature": 0.8, "seed": i} if i % 4 == 1 else {}
            reqs[f"u{i}"] = (prompt(tok, kind), SamplingParams(max_tokens=40, **{
                "temperature": 0.0, **kw}))
        else:
            reqs[f"g{i}"] = (prompt(tok, kind) + [400 + i], params(tok, kind, max_tokens=40))
    eng = make_engine(tok, max_num_seqs=16)
    together = run(eng, reqs)
    for rid, req in reqs.items():
        assert together[rid] == run(make_engine(tok, None), {rid: req})[rid], rid
    assert eng.spec.stats.num_accepted_tokens > 0


def test_thinking_budget_end_is_forced_into_drafts(tekken_tokenizer):
    """The copy model would copy the long reasoning; the budget cuts it: drafts stop at
    the budget, the end token is drafted without a lookup, and the output is plain's."""
    tok = tekken_tokenizer
    start, end = tok.token_to_id("[THINK]"), tok.token_to_id("[/THINK]")
    thought = tok.encode(" the weather in Paris is mild and the unit is C" * 3,
                         add_special_tokens=False)
    p = [*tok.encode("Q:", add_special_tokens=False), start, *thought, end, start]
    tb = ThinkingBudget(start, end, 6, starts_inside=True)
    reqs = {"t": (p, SamplingParams(max_tokens=30, temperature=0.0, thinking=tb,
                                    skip_special_tokens=False))}
    eng = make_engine(tok)
    got = run(eng, reqs)
    assert got == run(make_engine(tok, None), reqs)
    assert got["t"][0][:7] == [*thought[:6], end]  # the budget's forced end
    assert eng.spec.stats.num_forced_tokens >= 1 and "thinking" in eng.spec.stats.by_grammar


def _mask(m):
    bits = torch.zeros((m.vocab_size + 31) // 32, dtype=torch.int32)
    m.fill(bits)
    return bits


def test_constraint_cuts_fills_and_rolls_back(tekken_tokenizer):
    tok = tekken_tokenizer
    m = compiler_for(tok).compile(specs(tok)["mistral_named"]).new_matcher()
    before = _mask(m)
    c = DraftConstraint(m, None, [])
    head = c.forced(8)
    assert tok.decode(list(head), skip_special_tokens=False).startswith(
        "[TOOL_CALLS]get_weather[ARGS]")  # forced: no lookup needed
    c.release()
    assert torch.equal(_mask(m), before)
    call = [tok.token_to_id("[TOOL_CALLS]"), *tok.encode("get_weather", False),
            tok.token_to_id("[ARGS]"), *tok.encode('{"city": "Paris", "unit": "K"}', False)]
    c = DraftConstraint(m, None, [])
    kept = c.admit(call)
    assert 0 < len(kept) < len(call) and kept == tuple(call[:len(kept)])
    assert tok.decode(list(kept)).endswith('"unit": "')  # cut where the enum rejects "K"
    assert c.admit(call[len(kept):]) == ()  # and nothing passes it
    c.release()
    assert torch.equal(_mask(m), before) and m.validate(call) == len(kept)


def test_draft_masks_are_the_masks_after_each_draft_prefix(any_tokenizer):
    """fill_draft_masks [K + 1, W] int32: row j = the mask plain decoding fills after the
    first j draft tokens; the matcher is left where it was."""
    from engine.structured.matcher import fill_draft_masks

    tok = any_tokenizer
    g = compiler_for(tok).compile(json_schema_spec(PARSE_SCHEMA))
    draft = tok.encode('{"name": "Bob", "age": 3', add_special_tokens=False)
    a, b = g.new_matcher(), g.new_matcher()
    b.advance(draft[0])
    masks = fill_draft_masks([a, b], [draft, draft[1:3]])
    assert [tuple(m.shape) for m in masks] == [(len(draft) + 1, (g.vocab_size + 31) // 32),
                                               (3, (g.vocab_size + 31) // 32)]
    assert masks[0].dtype == torch.int32
    ref = g.new_matcher()
    for j in range(len(draft) + 1):
        assert torch.equal(masks[0][j], _mask(ref)), j
        if j < len(draft):
            ref.advance(draft[j])
    assert torch.equal(masks[1][0], _mask(b)) and torch.equal(masks[0][0], _mask(a))


class _FailingDrafts:
    """A compiled grammar whose matchers fail whenever drafting reads ahead."""

    def __init__(self, inner):
        self.inner, self.vocab_size = inner, inner.vocab_size

    def new_matcher(self):
        m = self.inner.new_matcher()

        def boom(*_):
            raise RuntimeError("read-ahead failed")
        m.forced = m.validate = boom
        return m


def test_a_failing_read_ahead_costs_only_the_draft(tekken_tokenizer):
    tok = tekken_tokenizer
    p = params(tok, "mistral_named")
    bad = dataclasses.replace(p, grammar=_FailingDrafts(p.grammar))
    reqs = {"bad": (prompt(tok, "mistral_named"), bad),
            "ok": (prompt(tok, "json_schema"), params(tok, "json_schema"))}
    eng = make_engine(tok)
    got = run(eng, reqs)
    assert got == run(make_engine(tok, None), reqs)  # the same tokens, no error
    assert eng.stats().state == "ready" and got["bad"][2] is None
    assert "tool_mistral" not in eng.spec.stats.by_grammar  # it never drafted
