"""Constrained generation through the engine loop (real sampler, detokenizer and tekken
tokenizer; a seeded stand-in for the model, tests/engine/structured/seeded_runner.py)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from engine.stream import EngineObserver
from engine.structured import GrammarMatchError, compiler_for, json_schema_spec, tool_call_grammar
from tests.engine.structured.conftest import TOOLS
from tests.engine.structured.seeded_runner import SeededRunner

BOUNDED = {"type": "object", "additionalProperties": False,
           "properties": {"answer": {"enum": ["yes", "no"]},
                          "n": {"type": "integer", "minimum": 0, "maximum": 99},
                          "ok": {"type": "boolean"},
                          "tags": {"type": "array", "maxItems": 3,
                                   "items": {"enum": ["a", "b"]}}},
           "required": ["answer", "n", "ok", "tags"]}
CALL = re.compile(r"\[TOOL_CALLS\]([A-Za-z_]+)\[ARGS\](\{.*?\})(?=\[TOOL_CALLS\]|$)", re.S)
PROMPT = [1, 3, 300, 301, 4]


def make_engine(tok, **kw):
    runner = SeededRunner(tok.vocab_size, num_kv_blocks=kw.pop("num_kv_blocks", 256))
    observer = kw.pop("observer", None)
    cfg = EngineConfig(model_dir=".", max_num_seqs=kw.pop("max_num_seqs", 8),
                       max_model_len=128, max_num_batched_tokens=64,
                       enable_prefix_caching=False)
    return Engine(runner, tok, cfg, observer=observer)


def run(engine, reqs):
    """reqs: {rid: (prompt, params)} -> {rid: outputs}, all submitted before stepping."""
    outs = {rid: [] for rid in reqs}
    for rid, (prompt, params) in reqs.items():
        engine.add_request(rid, prompt, params, outs[rid].append)
    for _ in range(2000):
        engine.step()
        if not engine._live and engine.stats().num_waiting == 0:
            return outs
    raise AssertionError("engine did not finish")


def ids(outs):
    return [t for o in outs for t in o.token_ids]


def text(outs):
    return "".join(o.text for o in outs)


def grammar(tok, spec):
    return compiler_for(tok).compile(spec)


def test_json_schema_output_is_valid_and_ends_with_stop(tekken_tokenizer):
    tok = tekken_tokenizer
    params = SamplingParams(max_tokens=100, temperature=0.0,
                            grammar=grammar(tok, json_schema_spec(BOUNDED)))
    outs = run(make_engine(tok), {"a": (PROMPT, params)})["a"]
    assert outs[-1].finish_reason is FinishReason.STOP and outs[-1].error is None
    jsonschema.validate(json.loads(text(outs)), BOUNDED)
    assert all(t < tok.vocab_size for t in ids(outs))  # padding never sampled


def test_sampled_eos_ends_the_request_and_is_not_in_the_text(tekken_tokenizer):
    tok = tekken_tokenizer
    eos = min(tok.eos_token_ids)
    spec = tool_call_grammar(TOOLS, "required", True, "mistral", tok)
    params = SamplingParams(max_tokens=100, temperature=0.0, skip_special_tokens=False,
                            logit_bias={eos: 100.0}, grammar=grammar(tok, spec))
    outs = run(make_engine(tok), {"a": (PROMPT, params)})["a"]
    assert ids(outs)[-1] == eos and outs[-1].finish_reason is FinishReason.STOP
    calls = CALL.findall(text(outs))
    assert len(calls) == 1 and "</s>" not in text(outs)  # EOS as soon as it was allowed


@pytest.mark.parametrize("choice, parallel, names", [
    ("required", False, {"get_weather", "add"}),
    ({"type": "function", "function": {"name": "get_weather"}}, True, {"get_weather"}),
])
def test_tool_calls_are_valid(tekken_tokenizer, choice, parallel, names):
    tok = tekken_tokenizer
    spec = tool_call_grammar(TOOLS, choice, parallel, "mistral", tok)
    params = SamplingParams(max_tokens=100, temperature=0.0, skip_special_tokens=False,
                            grammar=grammar(tok, spec))
    outs = run(make_engine(tok), {"a": (PROMPT, params)})["a"]
    assert outs[-1].finish_reason is FinishReason.STOP  # one call completes the grammar
    (name, args), = CALL.findall(text(outs))
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
    assert name in names
    jsonschema.validate(json.loads(args), schema)


def test_max_tokens_cut_is_length(tekken_tokenizer):
    tok = tekken_tokenizer
    params = SamplingParams(max_tokens=3, temperature=0.0,
                            grammar=grammar(tok, json_schema_spec(BOUNDED)))
    outs = run(make_engine(tok), {"a": (PROMPT, params)})["a"]
    assert outs[-1].finish_reason is FinishReason.LENGTH and len(ids(outs)) == 3


def _mixed(tok):
    specs = [json_schema_spec(BOUNDED),
             tool_call_grammar(TOOLS, "required", True, "mistral", tok),
             json_schema_spec({"type": "array", "maxItems": 4, "items": {"type": "boolean"}})]
    reqs = {f"g{i}": ([*PROMPT, 400 + i], SamplingParams(
        max_tokens=40, temperature=0.0, grammar=grammar(tok, s))) for i, s in enumerate(specs)}
    reqs |= {f"u{i}": ([*PROMPT, 500 + i], SamplingParams(max_tokens=40, temperature=0.0))
             for i in range(2)}
    return reqs


def test_batched_equals_alone(tekken_tokenizer):
    tok = tekken_tokenizer
    reqs = _mixed(tok)
    together = run(make_engine(tok), reqs)
    for rid, req in reqs.items():
        alone = run(make_engine(tok), {rid: req})[rid]
        assert ids(together[rid]) == ids(alone) and together[rid][-1].error is None, rid
    plain = run(make_engine(tok), {r: v for r, v in reqs.items() if r.startswith("u")})
    for rid, outs in plain.items():
        assert ids(together[rid]) == ids(outs)


class Preemptions(EngineObserver):
    count = 0

    def on_preempted(self, n):
        self.count += n


def test_preemption_keeps_matchers_consistent(tekken_tokenizer):
    tok = tekken_tokenizer
    reqs = _mixed(tok)
    roomy = run(make_engine(tok), reqs)
    seen = Preemptions()
    tight = run(make_engine(tok, num_kv_blocks=24, observer=seen), reqs)
    assert seen.count > 0
    for rid in reqs:
        assert ids(tight[rid]) == ids(roomy[rid]) and tight[rid][-1].error is None, rid


class _Breaking:
    """A compiled grammar whose matchers fail on their third token."""

    def __init__(self, inner):
        self.inner, self.vocab_size = inner, inner.vocab_size

    def new_matcher(self):
        m = self.inner.new_matcher()
        real, calls = m.advance, []

        def advance(token):
            calls.append(token)
            if len(calls) == 3:
                raise GrammarMatchError("boom")
            real(token)
        m.advance = advance
        return m


def test_matcher_error_ends_only_that_request(tekken_tokenizer):
    tok = tekken_tokenizer
    good = grammar(tok, json_schema_spec(BOUNDED))
    reqs = {"bad": (PROMPT, SamplingParams(max_tokens=50, temperature=0.0,
                                           grammar=_Breaking(good))),
            "ok": ([*PROMPT, 7], SamplingParams(max_tokens=50, temperature=0.0, grammar=good))}
    eng = make_engine(tok)
    outs = run(eng, reqs)
    assert outs["bad"][-1].finish_reason is FinishReason.ERROR
    assert "boom" in outs["bad"][-1].error
    assert outs["ok"][-1].finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(text(outs["ok"])), BOUNDED)
    assert eng.stats().state == "ready"


# required properties that recurse with no end: the first tokens are allowed ('{"a": '),
# then no token is; llguidance then allows EOS alone and takes it as if the grammar were done
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}},
           "required": ["a"]}


def test_a_grammar_no_output_completes_is_an_error_of_the_request(tekken_tokenizer):
    """Not a STOP with '{"a": ' as the answer: an ERROR the request's own input caused
    (the server answers 400), and the request beside it is served."""
    tok = tekken_tokenizer
    good = grammar(tok, json_schema_spec(BOUNDED))
    reqs = {"endless": (PROMPT, SamplingParams(max_tokens=50, temperature=0.0,
                                               grammar=grammar(tok, json_schema_spec(ENDLESS)))),
            "ok": ([*PROMPT, 7], SamplingParams(max_tokens=50, temperature=0.0, grammar=good))}
    outs = run(make_engine(tok), reqs)
    last = outs["endless"][-1]
    assert last.finish_reason is FinishReason.ERROR and last.error_from_request, last
    assert "no output satisfies it" in last.error and text(outs["endless"]).startswith('{"a":')
    assert outs["ok"][-1].finish_reason is FinishReason.STOP
    assert not outs["ok"][-1].error_from_request


def test_ending_eos_has_no_text_unconstrained_too(tekken_tokenizer):
    tok = tekken_tokenizer
    eos = min(tok.eos_token_ids)
    params = SamplingParams(max_tokens=10, temperature=0.0, skip_special_tokens=False,
                            min_tokens=2, logit_bias={eos: 100.0})
    outs = run(make_engine(tok), {"a": (PROMPT, params)})["a"]
    assert ids(outs)[-1] == eos and len(ids(outs)) == 3  # EOS as soon as min_tokens allows
    assert outs[-1].finish_reason is FinishReason.STOP and "</s>" not in text(outs)
    assert text(outs) == tok.decode(ids(outs)[:-1], skip_special_tokens=False)
