"""vLLM's ``structured_outputs`` (and the guided_* fields it replaced) end to end, sent as
the openai SDK sends them (``extra_body``), on the demo model: a server with n-gram
speculation against the plain one. Every answer follows its constraint, and the two
servers answer alike (speculation under the constraint changes nothing). Refusals are 400s
naming the field the client sent."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from tests.service.test_e2e_spec import PASSAGE
from tests.service.test_e2e_spec_grammar import _answer, sdk

POINT = {"type": "object", "properties": {"day": {"type": "string", "maxLength": 12},
                                          "approved": {"type": "string", "maxLength": 40}},
         "required": ["day", "approved"]}
CLOSED = {**POINT, "additionalProperties": False}
WORDS = r"[A-Z][a-z]+( [a-z]+){2,12}\."
GBNF = 'root ::= "The " noun " was " verb "."\nnoun ::= "committee" | "library" | ' \
       '"bridge"\nverb ::= "approved" | "delayed" | "reviewed"'
SENTENCE = re.compile(r"The (committee|library|bridge) was (approved|delayed|reviewed)\.")
ASK = f"Text: {PASSAGE}\n\nWhat did the committee approve? Answer from the text."


def check_json(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


# name -> (extra_body, a check of the answer's text)
CASES = {
    "choice": ({"structured_outputs": {"choice": ["the library", "the bridge"]}},
               lambda t: t in ("the library", "the bridge")),
    "regex": ({"structured_outputs": {"regex": WORDS}}, lambda t: re.fullmatch(WORDS, t)),
    "json": ({"structured_outputs": {"json": POINT, "disable_additional_properties": True}},
             lambda t: check_json(t, CLOSED) or True),
    # closed by the schema itself (an open one lets greedy decoding add properties until
    # max_tokens: seen with the portable kernels' arithmetic)
    "json_text": ({"structured_outputs": {"json": json.dumps(CLOSED)}},
                  lambda t: check_json(t, CLOSED) or True),
    "gbnf": ({"structured_outputs": {"grammar": GBNF}}, lambda t: SENTENCE.fullmatch(t)),
    "json_object": ({"structured_outputs": {"json_object": True}},
                    lambda t: isinstance(json.loads(t), dict)),
    "guided_regex": ({"guided_regex": WORDS, "guided_decoding_backend": "guidance"},
                     lambda t: re.fullmatch(WORDS, t)),
    "guided_choice": ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    "guided_json_ws": ({"guided_json": POINT, "guided_whitespace_pattern": r"[ ]?"},
                       lambda t: check_json(t, POINT) or True),
}


@pytest.mark.parametrize("case", CASES)
def test_chat_answers_follow_the_constraint_and_equal_plain(spec_servers, case):
    extra, ok = CASES[case]
    got = []
    for srv in spec_servers:
        r = sdk(srv).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": ASK}], temperature=0,
            max_tokens=80, extra_body=extra)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice  # the constraint ended it
        assert ok(choice.message.content), choice.message.content
        got.append(_answer(r))
    assert got[0] == got[1]


ANSWER = {"type": "object", "properties": {"approved": {"type": "string", "maxLength": 40}},
          "required": ["approved"], "additionalProperties": False}
# the demo model starts its answer with "The": the trigger turns that into a tagged answer
TAG = {"triggers": ["The"], "structures": [{"begin": "The answer: ", "schema": ANSWER,
                                            "end": "."}]}


def tagged(text: str, cut: bool) -> list[dict]:
    """The tagged segments of ``text``, each checked: every "The" of the free text opens
    "The answer: " + a JSON value valid against ANSWER + "."; ``cut``: the output ran into
    max_tokens, so its last segment may be unfinished."""
    found, i, dec = [], 0, json.JSONDecoder()
    while (j := text.find("The", i)) >= 0:
        body = text[j:]
        assert "The answer: ".startswith(body) if len(body) < 12 and cut else \
            body.startswith("The answer: "), body[:60]
        try:
            value, n = dec.raw_decode(body, len("The answer: "))
        except json.JSONDecodeError:
            assert cut, body  # only an output cut short may end inside a segment
            break
        if n == len(body) and cut:
            break
        jsonschema.validate(value, ANSWER)
        assert body[n] == ".", body[:n + 10]
        found.append(value)
        i = j + n + 1
    return found


def test_structural_tags_open_in_free_text_and_speculate_alike(spec_servers):
    """vLLM's structural_tag (structured_outputs, its older top-level field, chat's
    response_format): free text, in which the trigger forces a tagged JSON segment."""
    answers = []
    for srv, extra in zip(spec_servers, ({"structured_outputs": {"structural_tag": TAG}},
                                         {"response_format": {"type": "structural_tag",
                                                              **TAG}}), strict=True):
        r = sdk(srv).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": ASK}], temperature=0,
            max_tokens=60, extra_body=extra)
        text = r.choices[0].message.content
        # at least one whole segment: the constraint was exercised
        assert tagged(text, r.choices[0].finish_reason == "length"), text
        answers.append(text)
    assert answers[0] == answers[1]
    free = sdk(spec_servers[1]).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": ASK}], temperature=0,
        max_tokens=60).choices[0].message.content
    assert free.startswith("The") and not free.startswith("The answer: "), free
    r = httpx.post(spec_servers[0]["url"] + "/v1/completions", json={
        "model": "demo", "prompt": f"{PASSAGE}\nQ: What was approved?\nA:", "max_tokens": 40,
        "temperature": 0, "structural_tag": json.dumps(TAG)}, timeout=300).json()
    tagged(r["choices"][0]["text"], r["choices"][0]["finish_reason"] == "length")


def test_structural_tags_on_the_published_file_set(tiny_checkpoint):
    """tokenizer.json + the published template (its system prompt, the mistral reasoning
    and tool parsers reading the answer): both forms give the same answer, in which every
    "a" of the free text opens "a=<integer>;"."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    tag = {"triggers": ["a"], "structures": [{"begin": "a=", "schema": {"type": "integer"},
                                              "end": ";"}]}
    model = tiny_checkpoint(tokenizer="published", vocab_size=131072)
    with TestClient(create_app(Settings(model=model, max_model_len=2048,
                                        kv_cache_gib=0.1))) as cl:
        got = []
        for extra in ({"response_format": {"type": "structural_tag", **tag}},
                      {"structured_outputs": {"structural_tag": tag}}):
            r = cl.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Say a."}], "max_tokens": 40,
                "temperature": 0, **extra})
            assert r.status_code == 200, r.text
            got.append(r.json()["choices"][0]["message"]["content"])
    assert got[0] == got[1]
    text = got[0]
    assert re.search(r"a=-?\d+;", text), text  # the tag was opened at least once
    # with the whole tags taken out, an "a" is left only where max_tokens cut one short
    assert "a" not in re.sub(r"a(=-?\d*)?$", "", re.sub(r"a=-?\d+;", "", text)), text


def test_completions_stream_and_sample_under_the_constraint(spec_servers):
    on, off = spec_servers
    body = {"model": "demo", "prompt": [f"{PASSAGE}\nIn one sentence:", "Name a day:"],
            "max_tokens": 40, "n": 2, "temperature": 0.9, "seed": 11,
            "structured_outputs": {"regex": WORDS}}
    answers = []
    for srv in (on, off):
        r = httpx.post(srv["url"] + "/v1/completions", json=body, timeout=600).json()
        texts = [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])]
        assert len(texts) == 4 and all(re.fullmatch(WORDS, t) for t in texts), texts
        answers.append(texts)
    assert answers[0] == answers[1]  # seeded sampling is speculated exactly too
    stream = sdk(on).completions.create(
        model="demo", prompt="Yes or no?", max_tokens=20, temperature=0, stream=True,
        extra_body={"guided_choice": ["yes", "no"]})
    assert "".join(c.choices[0].text for c in stream if c.choices) in ("yes", "no")


def test_completions_take_response_format(spec_servers):
    r = sdk(spec_servers[1]).completions.create(
        model="demo", prompt="A JSON object about Paris:", max_tokens=60, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": "city", "schema": {**POINT, "additionalProperties": False}}}})
    assert r.choices[0].finish_reason == "stop"
    check_json(r.choices[0].text, CLOSED)


MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# (path, extra fields, the field the 400 names, words of its message)
REFUSED = [
    ("chat", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one of"),
    ("chat", {"structured_outputs": {}}, "structured_outputs", "exactly one of"),
    ("chat", {"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs",
     "structural_tag.triggers: a non-empty list"),
    ("chat", {"structured_outputs": {"structural_tag": {**TAG, "format": {}}}},
     "structured_outputs", "xgrammar's format form is not served"),
    ("chat", {"structured_outputs": {"structural_tag": {"triggers": ["<f"], "structures": [
        {"begin": "<g>", "schema": {}, "end": ""}]}}}, "structured_outputs",
     "starts with none of the triggers"),
    ("chat", {"response_format": {"type": "structural_tag", "triggers": ["<tool_call>"],
                                  "structures": [{"begin": "<tool_call>", "end": ""}]}},
     "response_format", "unknown special token"),
    ("chat", {"response_format": {"type": "structural_tag", **TAG}, "tools": [TOOL]},
     "response_format", "goes alone"),
    ("chat", {"structured_outputs": {"regex": "(a"}}, "structured_outputs",
     "cannot be enforced as a grammar"),
    ("chat", {"structured_outputs": {"grammar": "root ::= ::="}}, "structured_outputs",
     "not Lark, and not GBNF"),
    ("chat", {"structured_outputs": {"choice": ["a"], "backend": "x"}},
     "structured_outputs.backend", "Extra inputs"),
    ("chat", {"structured_outputs": {"choice": ["a"]},
              "response_format": {"type": "json_object"}}, "structured_outputs",
     "cannot be combined with response_format"),
    ("chat", {"structured_outputs": {"choice": ["a"]}, "tools": [TOOL]},
     "structured_outputs", "cannot be combined with tools"),
    ("chat", {"guided_choice": ["a"], "structured_outputs": {"choice": ["b"]}},
     "guided_choice", "cannot be combined with structured_outputs"),
    ("chat", {"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex", "exactly one"),
    ("chat", {"guided_choice": ["a"], "guided_decoding_backend": "xgrammar"},
     "guided_decoding_backend", "is not available"),
    ("chat", {"structural_tag": "{}"}, "structural_tag", "structural_tag.triggers"),
    ("completions", {"guided_json": "{oops"}, "guided_json", "not JSON"),
    ("completions", {"guided_choice": ["a"], "response_format": {"type": "json_object"}},
     "guided_choice", "cannot be combined with response_format"),
]


@pytest.mark.parametrize("path,extra,param,words", REFUSED)
def test_refusals_name_the_field_sent(spec_servers, path, extra, param, words):
    base = ({"messages": MSG} if path == "chat" else {"prompt": "hi"})
    r = httpx.post(f"{spec_servers[1]['url']}/v1/{'chat/' if path == 'chat' else ''}"
                   "completions", json={"model": "demo", **base, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def _ids(srv, text: str) -> list[int]:
    r = httpx.post(srv["url"] + "/tokenize", json={"prompt": text, "add_special_tokens": False})
    return r.json()["tokens"]


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_token_filters_hold_under_speculation_and_equal_plain(spec_servers):
    """The passage invites n-gram drafts of the banned word; the verifier must mask them as
    plain decoding does."""
    on, off = spec_servers
    banned = [_ids(off, w) for w in ("committee", " committee", " budget")]
    digits = sorted({t for d in "0123456789" for t in _ids(off, d)})
    cases = [({"bad_words": ["committee", "budget"]},
              lambda ids: not any(_contains(ids, b) for b in banned)),
             ({"allowed_token_ids": digits}, lambda ids: set(ids) <= set(digits))]
    for extra, ok in cases:
        got = []
        for srv in (on, off):
            r = httpx.post(srv["url"] + "/v1/chat/completions", timeout=600, json={
                "model": "demo", "temperature": 0, "max_tokens": 40, "return_token_ids": True,
                "messages": [{"role": "user", "content": f"Text: {PASSAGE}\n\nCopy the "
                              "first sentence of the text exactly."}], **extra})
            assert r.status_code == 200, r.text
            ids = r.json()["choices"][0]["token_ids"]
            assert ok(ids), (extra, ids)
            got.append(ids)
        assert got[0] == got[1], extra


ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}},
           "required": ["a"]}


def _last_event(url: str, body: dict) -> dict:
    """The data of a named-event stream's last event."""
    with httpx.stream("POST", url, json=body, timeout=60) as s:
        data = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    return data[-1]


def test_constraints_no_output_completes_are_400s(spec_servers):
    """A schema that is only a reference to itself fails at compile time; one whose
    required property recurses with no end is found after '{"a": ' (llguidance then
    allows EOS alone): both are 400s, streamed as an error event, on both servers, and
    the servers serve on. A choice of 2500 strings (past the parser's 2000 items per row)
    is served."""
    for srv in spec_servers:
        url = srv["url"] + "/v1/completions"
        r = httpx.post(url, json={"model": "demo", "prompt": "JSON:", "max_tokens": 20,
                                  "structured_outputs": {"json": {"$ref": "#"}}}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text
        body = {"model": "demo", "prompt": "JSON:", "max_tokens": 20, "temperature": 0,
                "structured_outputs": {"json": ENDLESS}}
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 400 and "no output satisfies it" in r.text, r.text
        # found while generating, it names the field that built the grammar (was null)
        assert r.json()["error"]["param"] == "structured_outputs", r.text
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: {")]
        assert events[-1]["error"]["type"] == "invalid_request_error", events[-1]
        assert events[-1]["error"]["param"] == "structured_outputs", events[-1]
        chat = {"model": "demo", "max_tokens": 20, "temperature": 0,
                "messages": [{"role": "user", "content": "JSON:"}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "endless", "schema": ENDLESS}}}
        r = httpx.post(srv["url"] + "/v1/chat/completions", json=chat, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        r = httpx.post(srv["url"] + "/v1/responses", timeout=60, json={
            "model": "demo", "input": "JSON:", "max_output_tokens": 20, "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "endless", "schema": ENDLESS}}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "text.format", r.text
        # streamed, the Responses and Messages error events name the same field (were null)
        resp = {"model": "demo", "input": "JSON:", "max_output_tokens": 20, "temperature": 0,
                "stream": True, "text": {"format": {"type": "json_schema", "name": "endless",
                                                    "schema": ENDLESS}}}
        err = _last_event(srv["url"] + "/v1/responses", resp)
        assert err["type"] == "error" and err["param"] == "text.format", err
        assert err["message"].startswith("text.format: "), err
        msgs = {"model": "demo", "max_tokens": 20, "stream": True,
                "messages": [{"role": "user", "content": "JSON:"}],
                "output_config": {"format": {"type": "json_schema", "schema": ENDLESS}}}
        err = _last_event(srv["url"] + "/v1/messages", msgs)
        assert err["type"] == "error", err
        assert err["error"]["message"].startswith("output_config.format: "), err
        choices = [f"item {i}" for i in range(2500)]
        r = httpx.post(url, json={"model": "demo", "prompt": "Pick one:", "max_tokens": 8,
                                  "temperature": 0, "structured_outputs": {"choice": choices}},
                       timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] in choices, r.text
