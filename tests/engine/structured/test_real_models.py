"""Constrained greedy generation with the real runner: the demo model (SmolLM2-135M,
tokenizer.json, hermes tool calls) and a tiny random v13-tekken checkpoint (mistral tool
calls). Kept short: each decode step of the demo model costs tens of milliseconds."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine.config import EngineConfig
from engine.demo_model import ensure_demo_model
from engine.engine import Engine
from engine.request import FinishReason
from engine.runner import load_runner
from engine.sampling_params import SamplingParams
from engine.structured import compiler_for, json_schema_spec, tool_call_grammar
from engine.text.tokenizer import Tokenizer
from tests.engine.structured.conftest import PARSE_SCHEMA, TOOLS
from tests.engine.structured.test_engine_grammar import CALL, ids, run, text

HERMES = re.compile(r'<tool_call>\n(\{.*?\})\n</tool_call>', re.S)


def _config(model_dir):
    return EngineConfig(model_dir=model_dir, max_model_len=384, kv_cache_gib=0.02,
                        max_num_seqs=4)


def _engine(model_dir, tok, runner=None):
    """A fresh engine (own scheduler and KV bookkeeping), reusing ``runner`` if given."""
    cfg = _config(model_dir)
    return Engine(runner or load_runner(model_dir, cfg), tok, cfg)


def _schema_of(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


@pytest.mark.slow
def test_demo_model_schema_and_hermes_call(demo_tokenizer):
    tok = demo_tokenizer
    eng = _engine(ensure_demo_model(), tok)
    c = compiler_for(tok)
    person = tok.encode_chat([{"role": "user", "content": "Describe a person as JSON."}])
    ask = tok.encode_chat([{"role": "user", "content": "Weather in Paris, in Celsius?"}])
    named = {"type": "function", "function": {"name": "get_weather"}}
    outs = run(eng, {
        "json": (person, SamplingParams(max_tokens=60, temperature=0.0, grammar=c.compile(
            json_schema_spec(PARSE_SCHEMA)))),
        "tool": (ask, SamplingParams(max_tokens=40, temperature=0.0, grammar=c.compile(
            tool_call_grammar(TOOLS, named, False, "hermes"))))})
    assert outs["json"][-1].finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(text(outs["json"])), PARSE_SCHEMA)
    assert outs["tool"][-1].finish_reason is FinishReason.STOP
    (call,) = HERMES.findall(text(outs["tool"]))
    call = json.loads(call)
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], _schema_of("get_weather"))


@pytest.fixture(scope="module")
def tekken_model(tiny_checkpoint):
    d = tiny_checkpoint(tokenizer="tekken", vocab_size=1024)
    return d, Tokenizer.from_dir(d), load_runner(d, _config(d))


def test_tekken_model_mistral_calls_batched_equals_alone(tekken_model):
    d, tok, runner = tekken_model
    c = compiler_for(tok)
    # required, one call; only get_weather's arguments are bounded (enums): random weights
    # would write add's integers up to max_tokens
    spec = tool_call_grammar(TOOLS[:1], "required", False, "mistral", tok)
    reqs = {
        "call": ([1, 3, 500, 501, 4], SamplingParams(
            max_tokens=40, temperature=0.0, skip_special_tokens=False,
            grammar=c.compile(spec))),
        "json": ([1, 3, 502, 4], SamplingParams(max_tokens=30, temperature=0.0,
                                                grammar=c.compile(json_schema_spec(
                                                    {"type": "array", "maxItems": 3,
                                                     "items": {"type": "boolean"}})))),
        "free": ([1, 3, 503, 4], SamplingParams(max_tokens=12, temperature=0.0,
                                                ignore_eos=True))}
    together = run(_engine(d, tok, runner), reqs)
    for rid, req in reqs.items():
        alone = run(_engine(d, tok, runner), {rid: req})[rid]
        assert ids(together[rid]) == ids(alone), rid
    out = together["call"]
    assert out[-1].finish_reason is FinishReason.STOP
    (name, args), = CALL.findall(text(out))
    assert name == "get_weather"
    jsonschema.validate(json.loads(args), _schema_of(name))
    assert together["json"][-1].finish_reason is FinishReason.STOP
    assert all(isinstance(v, bool) for v in json.loads(text(together["json"])))
