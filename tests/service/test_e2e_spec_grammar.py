"""Speculative decoding under grammars end to end with the openai SDK: a server with
--speculative-config (n-gram) against the plain one, on the demo model (json_object,
json_schema through ``parse()``, hermes tool calls: required, named, auto) and on a tiny
tekken checkpoint (mistral ``[TOOL_CALLS]name[ARGS]{json}`` calls). Answers must be
identical: greedy alone and 16 at once with unconstrained requests, and seeded sampling;
the spec_decode metrics count the drafts by grammar kind."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest
from pydantic import BaseModel

from engine.synth import SynthSpec, write_checkpoint
from engine.text.tokenizer import Tokenizer
from tests.service.conftest import SPEC
from tests.service.serve_process import server_pair
from tests.service.test_e2e_spec import PASSAGE, metric


class Minutes(BaseModel):
    day: str
    approved: str
    delayed: str


QUOTE = {"type": "function", "function": {
    "name": "save_quote", "description": "Save a sentence quoted from the text",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["quote"],
                   "properties": {"quote": {"type": "string"}}}}}
CITY = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}}}}
ASK = f"Text: {PASSAGE}\n\nCopy the first sentence of the text exactly."
NAMED = {"type": "function", "function": {"name": "save_quote"}}


def by_grammar(srv: dict, name: str, grammar: str) -> float:
    """The counter's value for one grammar kind (0 before its first draft)."""
    text = httpx.get(srv["url"] + "/metrics").text
    found = re.findall(rf'^{name}{{[^}}]*grammar="{grammar}"[^}}]*}} (\S+)$', text, re.M)
    return sum(map(float, found))


def sdk(srv: dict, cls=openai.OpenAI):
    return cls(base_url=srv["url"] + "/v1", api_key="x", max_retries=0, timeout=600)


def chat(srv: dict, **kw) -> dict:
    kw = {"model": "demo", "messages": [{"role": "user", "content": ASK}],
          "temperature": 0, "max_tokens": 60, **kw}
    r = sdk(srv).chat.completions.create(**kw)
    return _answer(r)


def _answer(r) -> dict:
    d = r.model_dump(warnings=False)  # parse()'s parsed field is not a dict
    for c in d["choices"]:  # call ids are random per server
        for call in c["message"].get("tool_calls") or []:
            call.pop("id")
    # token counts, not prompt_tokens_details: how much of a prompt the prefix cache held
    # depends on when its neighbours in a batch were computed
    return {"choices": d["choices"], "usage": {k: v for k, v in d["usage"].items()
                                               if k != "prompt_tokens_details"}}


CASES = {
    "json_object": {"response_format": {"type": "json_object"}},
    "tool_required": {"tools": [QUOTE, CITY], "tool_choice": "required"},
    "tool_named": {"tools": [QUOTE], "tool_choice": NAMED, "logprobs": True,
                   "top_logprobs": 2},
    "tool_auto": {"tools": [QUOTE, CITY], "tool_choice": "auto"},
    "seeded_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "quote", "strict": True, "schema": QUOTE["function"]["parameters"]}},
        "temperature": 0.8, "seed": 5},
}


@pytest.mark.parametrize("case", CASES)
def test_demo_grammars_equal_plain(spec_servers, case):
    on, off = spec_servers
    assert chat(on, **CASES[case]) == chat(off, **CASES[case])


def test_parse_schema_equals_plain_and_drafts_are_counted_by_grammar(spec_servers):
    on, off = spec_servers
    accepted = "fp8serve_spec_decode_num_accepted_tokens_total"
    accepted0 = by_grammar(on, accepted, "json_schema")
    off_drafts0 = metric(off, "fp8serve_spec_decode_num_drafts_total")  # predictions draft
    got = []
    for srv in (on, off):
        r = sdk(srv).chat.completions.parse(
            model="demo", response_format=Minutes, temperature=0, max_tokens=80,
            messages=[{"role": "user", "content": f"Text: {PASSAGE}\n\nWhen did the "
                       "committee meet, what did it approve and what did it delay? "
                       "Answer with the words of the text."}])
        assert isinstance(r.choices[0].message.parsed, Minutes)
        got.append(_answer(r))
    assert got[0] == got[1]
    assert by_grammar(on, accepted, "json_schema") > accepted0
    assert metric(off, "fp8serve_spec_decode_num_drafts_total") == off_drafts0


def test_sixteen_at_once_with_unconstrained_equal_plain(spec_servers):
    on, off = spec_servers
    cases = list(CASES.values())
    jobs = [cases[i % len(cases)] if i % 2 else
            {"messages": [{"role": "user", "content": f"{ASK} ({i})"}]} for i in range(16)]

    async def main(srv):
        client = sdk(srv, openai.AsyncOpenAI)

        async def one(kw):
            kw = {"model": "demo", "messages": [{"role": "user", "content": ASK}],
                  "temperature": 0, "max_tokens": 40, **kw}
            return _answer(await client.chat.completions.create(**kw))
        return await asyncio.gather(*(one(kw) for kw in jobs))

    assert asyncio.run(main(on)) == asyncio.run(main(off))


@pytest.fixture(scope="module")
def tekken_model(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny-tekken")
    write_checkpoint(model, SynthSpec.preset("tiny", tokenizer="tekken"))
    return model


@pytest.fixture(scope="module")
def tekken_servers(tekken_model):
    common = ("--max-model-len", "512", "--max-num-seqs", "4", "--served-model-name",
              "demo", "--kv-cache-gib", "0.05")
    with server_pair(tekken_model, (*common, "--speculative-config", json.dumps(SPEC)),
                     common) as pair:
        yield pair


@pytest.mark.parametrize("choice", ["required", NAMED, "auto"])
def test_mistral_tool_grammar_on_tekken_equals_plain(tekken_servers, choice):
    on, off = tekken_servers
    kw = {"tools": [QUOTE, CITY], "tool_choice": choice, "max_tokens": 40}
    assert chat(on, **kw) == chat(off, **kw)
    if choice != "auto":  # a forced call: [TOOL_CALLS], the name and [ARGS] are drafted
        assert by_grammar(on, "fp8serve_spec_decode_num_accepted_tokens_total",
                          "tool_mistral") > 0


def test_thinking_budget_end_on_tekken_equals_plain(tekken_servers, tekken_model):
    """A logit bias makes the random model open [THINK] and the penalties keep it
    writing; the budget forces [/THINK] after 3 reasoning tokens, and the speculative
    server drafts that end without a lookup: answers equal, drafts counted as
    ``thinking``."""
    on, off = tekken_servers
    think = Tokenizer.from_dir(tekken_model).token_to_id("[THINK]")
    kw = {"max_tokens": 24, "logprobs": True, "logit_bias": {str(think): 8},
          "frequency_penalty": 2, "presence_penalty": 2,
          "extra_body": {"thinking_token_budget": 3}}
    drafts0 = by_grammar(on, "fp8serve_spec_decode_num_drafts_total", "thinking")
    got = chat(on, **kw)
    assert got == chat(off, **kw)
    tokens = [t["token"] for t in got["choices"][0]["logprobs"]["content"]]
    at = tokens.index("[/THINK]")
    assert tokens[0] == "[THINK]" and len([t for t in tokens[1:at] if t != "[THINK]"]) == 3
    assert got["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    assert by_grammar(on, "fp8serve_spec_decode_num_drafts_total", "thinking") > drafts0


def test_reasoning_then_a_json_schema_on_tekken_equals_plain(tekken_servers, tekken_model):
    """The answer may reason first under a constraint: the bias opens [THINK], the budget
    closes it after 3 tokens and the schema holds after it; the speculative server drafts
    through both parts and answers exactly as the plain one."""
    on, off = tekken_servers
    think = Tokenizer.from_dir(tekken_model).token_to_id("[THINK]")
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}}
    kw = {"max_tokens": 40, "logprobs": True, "logit_bias": {str(think): 30},
          "response_format": {"type": "json_schema", "json_schema": {
              "name": "city", "schema": schema, "strict": True}},
          "extra_body": {"thinking_token_budget": 3}}
    got = chat(on, **kw)
    assert got == chat(off, **kw)
    choice = got["choices"][0]
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    assert tokens[0] == "[THINK]" and tokens[4] == "[/THINK]", tokens
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["content"])["city"] in ("Paris", "Oslo")
