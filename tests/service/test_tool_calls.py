"""service/tool_calls: Mistral (token ids) and Hermes (text) tool-call parsers, reasoning
parsers, streaming deltas. Token streams are built with the tiny synth checkpoint's v13
tekken.json; every stream is checked cut into steps in every way (all compositions for
short ones, randomized for long ones) against the non-streaming result."""

from __future__ import annotations

import pytest

from service.tool_calls import (
    CallIdMap,
    MissingTokenError,
    OutputParser,
    is_call_id,
    new_call_id,
    parse_output,
)
from service.tool_calls.reasoning import parser_for_prompt, prompt_opens_section
from tests.service.tool_call_fixtures import counter_ids, cuts, reassemble, stream, tekken_tokenizer

TAG_PARTS = ("<", "<t", "<to", "<tool", "<tool_call", "</", "</tool_call", "<th", "<think",
             "</think")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tekken_tokenizer(tmp_path_factory.mktemp("tekken"))


def calls(msg):
    return [(c.name, c.arguments) for c in msg.tool_calls]


def check_all_cuts(tok, text, tools, reasoning=None, limit=12, tags_in_content=False):
    """parse_output(ids) == the reassembled stream for every cut; returns the message."""
    ids = tok.encode(text, add_special_tokens=False)
    whole = parse_output(tok, ids, tools, reasoning, new_id=counter_ids())
    for sizes in cuts(len(ids), limit=limit):
        parser = OutputParser(tok, tools, reasoning, new_id=counter_ids())
        deltas = stream(parser, ids, sizes)
        for d in deltas:
            assert not any(s in d.content for s in ("[TOOL_CALLS]", "[ARGS]", "[THINK]"))
            if not tags_in_content:
                assert not any(p in d.content for p in TAG_PARTS), (sizes, d)
        got = reassemble(deltas)
        assert (got.content, got.reasoning_content) == (whole.content, whole.reasoning_content)
        assert [c.to_openai() for c in got.tool_calls] == [c.to_openai() for c in whole.tool_calls]
    return whole


# -- mistral, well-formed ---------------------------------------------------------------------
def test_v13_content_then_two_calls(tok):
    text = ('Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
            '[TOOL_CALLS]get_time[ARGS]{}</s>')
    msg = check_all_cuts(tok, text, "mistral")
    assert msg.content == "Sure."
    assert calls(msg) == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert [c.id for c in msg.tool_calls] == ["id0000000", "id0000001"]
    assert all(c.arguments_valid for c in msg.tool_calls)


def test_v13_short_stream_every_composition(tok):
    ids = tok.encode("Hi[TOOL_CALLS]f[ARGS]{\"a\": 1}", add_special_tokens=False)
    assert len(ids) <= 14  # so check_all_cuts tries all 2^(n-1) cuts
    msg = check_all_cuts(tok, "Hi[TOOL_CALLS]f[ARGS]{\"a\": 1}", "mistral", limit=14)
    assert (msg.content, calls(msg)) == ("Hi", [("f", '{"a": 1}')])


def test_v11_call_id_is_kept(tok):
    msg = check_all_cuts(tok, '[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{"a": "x"}', "mistral")
    assert [(c.id, c.name, c.arguments) for c in msg.tool_calls] == [("abcDEF123", "f",
                                                                      '{"a": "x"}')]
    bad = parse_output(tok, tok.encode("[TOOL_CALLS]f[CALL_ID]no[ARGS]{}", False), "mistral",
                       new_id=counter_ids())
    assert bad.tool_calls[0].id == "id0000000"  # not 9 alphanumerics: a fresh id


@pytest.mark.parametrize("text,parser", [
    ('[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{}[TOOL_CALLS]g[CALL_ID]abcDEF123[ARGS]{}',
     "mistral"),
    ('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "abcDEF123"}, '
     '{"name": "g", "arguments": {}, "id": "abcDEF123"}]', "mistral"),
    ('<tool_call>{"name": "f", "arguments": {}, "id": "abcDEF123"}</tool_call>'
     '<tool_call>{"name": "g", "arguments": {}, "id": "abcDEF123"}</tool_call>', "hermes"),
])
def test_an_id_the_model_gives_twice_is_kept_once(tok, text, parser):
    """Two calls of one answer never share an id (a client matches each result to its
    call by id): a model's id an earlier call of the answer took gives way to a fresh
    one; it came back on both calls."""
    msg = check_all_cuts(tok, text, parser, limit=8, tags_in_content=parser == "hermes")
    assert [(c.id, c.name) for c in msg.tool_calls] == [("abcDEF123", "f"), ("id0000000", "g")]


def test_v7_json_list(tok):
    text = ('[TOOL_CALLS] [{"name": "f", "arguments": {"q": "}]\\"{"}}, '
            '{"name": "g", "arguments": {}, "id": "ABCdef789"}]</s>')
    msg = check_all_cuts(tok, text, "mistral")
    assert msg.content == ""
    assert calls(msg) == [("f", '{"q": "}]\\"{"}'), ("g", "{}")]
    assert msg.tool_calls[1].id == "ABCdef789"


def test_mistral_reasoning_then_call(tok):
    text = "[THINK]Need the weather.[/THINK]Checking.[TOOL_CALLS]get_weather[ARGS]{}"
    msg = check_all_cuts(tok, text, "mistral", "mistral")
    assert (msg.reasoning_content, msg.content) == ("Need the weather.", "Checking.")
    assert calls(msg) == [("get_weather", "{}")]
    assert msg.to_openai()["reasoning_content"] == "Need the weather."


def test_multibyte_text_never_shows_replacement_chars(tok):
    msg = check_all_cuts(tok, "héllo ✓ 日本[TOOL_CALLS]f[ARGS]{\"t\": \"✓\"}", "mistral")
    assert msg.content == "héllo ✓ 日本" and calls(msg) == [("f", '{"t": "✓"}')]


def test_no_tool_parser_all_text_is_content(tok):
    msg = check_all_cuts(tok, "[THINK]a[/THINK]b[TOOL_CALLS]c", None, "mistral")
    assert (msg.reasoning_content, msg.content, msg.tool_calls) == ("a", "bc", [])


# -- mistral, malformed -------------------------------------------------------------------------
@pytest.mark.parametrize("text,content,want_calls,valid", [
    ('[TOOL_CALLS]f[ARGS]{"a": </s>', "", [("f", '{"a": ')], False),  # EOS mid-arguments
    ('[TOOL_CALLS]f[ARGS]{"a": 1', "", [("f", '{"a": 1')], False),  # the output just ends
    ("[TOOL_CALLS]f[ARGS]not json", "", [("f", "not json")], False),
    # a name with no [ARGS] (EOS, the end, the next [TOOL_CALLS]) is a call's start: never
    # content (it came back as "Higet_weather", glued to the text before it)
    ("Hi[TOOL_CALLS]get_weather</s>", "Hi", [], None),
    ("Hi[TOOL_CALLS]get_wea", "Hi", [], None),  # max_tokens or a stop string cut the name
    ("Hi[TOOL_CALLS]get_weather[CALL_ID]ab1", "Hi", [], None),  # cut in a v11 call id
    ("Hi[TOOL_CALLS]get_wea[TOOL_CALLS]f[ARGS]{}", "Hi", [("f", "{}")], True),
    ("Hi[TOOL_CALLS] ", "Hi", [], None),
    ("Hi[TOOL_CALLS]I cannot do that", "HiI cannot do that", [], None),  # no name: text
    ("[TOOL_CALLS]a b[ARGS]{}", "a b{}", [], None),  # invalid name
    ("[TOOL_CALLS][ARGS]{}[TOOL_CALLS]g[ARGS]{}", "{}", [("g", "{}")], True),  # empty name
    ("[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]", "", [("f", "{}")], True),  # trailing [TOOL_CALLS]
    ("a</s>b[TOOL_CALLS]f[ARGS]{}", "a", [], None),  # nothing after EOS
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}, {"nom": 1}, {"name": "g"', '{"nom": 1}'
     '{"name": "g"', [("f", "{}")], True),  # v7: a bad element and an unclosed one
])
def test_mistral_malformed(tok, text, content, want_calls, valid):
    msg = check_all_cuts(tok, text, "mistral", limit=10)
    assert (msg.content, calls(msg)) == (content, want_calls)
    if valid is not None:
        assert msg.tool_calls[0].arguments_valid is valid


def test_missing_special_token_is_an_error():
    class NoTools:
        def token_to_id(self, token):
            return None

        def decode(self, ids, skip_special_tokens=True):
            return ""

    with pytest.raises(MissingTokenError, match=r"\[TOOL_CALLS\]"):
        OutputParser(NoTools(), "mistral")
    with pytest.raises(ValueError, match="unknown parser"):
        OutputParser(NoTools(), "llama")


# -- hermes and <think> -------------------------------------------------------------------------
def test_hermes_calls_between_text(tok):
    text = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>{"name": "f", "arguments": "{}"}</tool_call> done')
    msg = check_all_cuts(tok, text, "hermes")
    assert msg.content == "Let me check.\n done"
    assert calls(msg) == [("get_weather", '{"city": "Paris"}'), ("f", "{}")]


@pytest.mark.parametrize("tail", ["", "\n", "\n</tool_call", "</tool_"])
def test_hermes_block_cut_after_its_json_is_a_call(tok, tail):
    """max_tokens cut the closing tag (or all of it): the call is whole, so it is a call,
    and no part of the tag reaches the content (it did: the block came back verbatim)."""
    text = ('ok<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}' + tail)
    msg = check_all_cuts(tok, text, "hermes")
    assert msg.content == "ok\n"
    assert calls(msg) == [("get_weather", '{"city": "Paris"}'), ("f", '{"a": 1}')]


def test_a_close_tag_inside_an_argument_string_is_the_arguments_text(tok):
    """A tool grammar allows any JSON string, the close tag included: the block ends
    where the JSON is done, not at a tag a string quotes (the call came back as text)."""
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris</tool_call>",'
            ' "note": "a \\"</tool_call>\\" quote"}}\n</tool_call>after')
    msg = check_all_cuts(tok, text, "hermes")
    assert msg.content == "after"
    assert calls(msg) == [("get_weather", '{"city": "Paris</tool_call>", '
                           '"note": "a \\"</tool_call>\\" quote"}')]


def test_a_string_never_closed_does_not_swallow_later_calls(tok):
    """Malformed (unconstrained) output: the first block's string never closes, so its
    close tag looked quoted; at the end the blocks are read again tag by tag."""
    text = ('x<tool_call>{"name": "f", "arguments": {"s": "a}}</tool_call>\n'
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>tail')
    msg = check_all_cuts(tok, text, "hermes", limit=8, tags_in_content=True)
    assert msg.content == 'x<tool_call>{"name": "f", "arguments": {"s": "a}}</tool_call>\ntail'
    assert calls(msg) == [("g", "{}")]


@pytest.mark.parametrize("text,args", [
    ('a<tool_call>{"name": "f"', ""),
    ('a<tool_call>\n{"name": "f", "arguments": {"city": "Par', '{"city": "Par'),
    ('a<tool_call>{"name": "f", "arguments": {"a": "}", "b": [1]}, "x', '{"a": "}", "b": [1]}'),
])
def test_a_call_cut_inside_its_json_after_its_name_is_that_call(tok, text, args):
    """max_tokens cut the call inside its JSON: the call, with its arguments as cut (as
    OpenAI answers a cut call); it came back as text, tags included."""
    msg = check_all_cuts(tok, text, "hermes", limit=8)
    assert (msg.content, calls(msg)) == ("a", [("f", args)])


def test_think_tags_then_hermes(tok):
    msg = check_all_cuts(tok, "<think>2 < 3</think>ok<tool_call>{\"name\": \"f\"}</tool_call>",
                         "hermes", "think", tags_in_content=True)
    assert (msg.reasoning_content, msg.content, calls(msg)) == ("2 < 3", "ok", [("f", "{}")])


def test_think_open_starts_as_reasoning(tok):
    msg = check_all_cuts(tok, "plan</think>answer", None, "think-open")
    assert (msg.reasoning_content, msg.content) == ("plan", "answer")


@pytest.mark.parametrize("text,content", [
    ("<tool_call>{bad json}</tool_call>x", "<tool_call>{bad json}</tool_call>x"),
    ('a<tool_call>{"na', 'a<tool_call>{"na'),  # cut before a whole name
    ("a < b <tool_ca", "a < b <tool_ca"),  # a tag prefix that never completes
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>'),
])
def test_hermes_malformed_falls_back_to_content(tok, text, content):
    msg = check_all_cuts(tok, text, "hermes", limit=10, tags_in_content=True)
    assert (msg.content, msg.tool_calls) == (content, [])


def test_unclosed_think_is_all_reasoning(tok):
    msg = check_all_cuts(tok, "[THINK]still thinking", "mistral", "mistral")
    assert (msg.reasoning_content, msg.content) == ("still thinking", "")


# -- wire shapes and ids ------------------------------------------------------------------------
def test_delta_wire_shapes(tok):
    parser = OutputParser(tok, "mistral", new_id=counter_ids())
    d = parser.feed(tok.encode('ok[TOOL_CALLS]f[ARGS]{"a"', False))
    assert d.to_openai() == {"content": "ok", "tool_calls": [  # one entry per call index
        {"index": 0, "id": "id0000000", "type": "function",
         "function": {"name": "f", "arguments": '{"a"'}}]}
    assert not parser.feed([]) and parser.feed(tok.encode(": 1}", False)).to_openai() == {
        "tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}
    whole = parse_output(tok, tok.encode("[TOOL_CALLS]f[ARGS]{}", False), "mistral")
    assert whole.to_openai()["content"] is None and is_call_id(whole.tool_calls[0].id)


def test_call_ids():
    assert all(is_call_id(new_call_id()) for _ in range(100))
    ids = CallIdMap()
    assert ids("abcDEF123") == "abcDEF123"  # already valid: kept
    a, b = ids("call_x_123456789"), ids("other-123456789")  # same last 9 alphanumerics
    assert a == "123456789" and b != a and is_call_id(b)
    assert ids("call_x_123456789") == a and ids.original(b) == "other-123456789"
    short = ids("c1")
    assert is_call_id(short) and ids("c1") == short
    many = {ids(f"call_{i}") for i in range(2000)}
    assert len(many) == 2000 and all(is_call_id(s) for s in many)


@pytest.fixture(scope="module", params=[False, True], ids=["added", "special"])
def think_tok(request, tmp_path_factory):
    """The demo tokenizer with <think> / </think> as single added tokens (special or not)."""
    from engine.text.tokenizer import Tokenizer
    from tests.engine.structured.think_tokens import think_model_dir
    return Tokenizer.from_dir(think_model_dir(tmp_path_factory.mktemp("think"),
                                              special=request.param))


@pytest.mark.parametrize("reasoning,text,parts", [
    ("think", '<think>plan</think>{"a": 1}', ("plan", '{"a": 1}')),
    ("think-open", 'plan</think>{"a": 1}', ("plan", '{"a": 1}')),
    # a start inside and an end outside are text, or (special tokens) nothing, as [THINK]
    ("think", "<think>a<think>b</think>c</think>d", ("a<think>b", "c</think>d")),
])
def test_think_tags_that_are_special_tokens_are_read(think_tok, reasoning, text, parts):
    """<think> tags the tokenizer makes special tokens decode to no text: the parser reads
    them by id (as the grammar writes them and the thinking budget counts them), so the
    reasoning is not the content's; as added text tokens they are read in the text."""
    msg = check_all_cuts(think_tok, text, None, reasoning, tags_in_content=True)
    if think_tok.is_special(think_tok.token_to_id("<think>")):
        parts = tuple(p.replace("<think>", "").replace("</think>", "") for p in parts)
    assert (msg.reasoning_content, msg.content) == parts


@pytest.mark.parametrize("prefill,inside", [
    ("<think>a</think>b<think>plan so far", True),
    ("<think>plan</think>answer", False),  # a prefill past the section
    ("no tags at all", False),
    ("", False),
])
def test_a_prefill_says_whether_the_answer_starts_inside_think_tags(tok, prefill, inside):
    """Text tags are read in the prefilled assistant message only: any message's text may
    spell them (a question about the <think> tag is no section)."""
    ids = tok.encode("what does <think> mean?", add_special_tokens=False)
    assert prompt_opens_section(tok, "think", ids, prefill) is inside
    for flag in ("think", "think-open"):
        assert parser_for_prompt(tok, flag, ids, prefill) == ("think-open" if inside
                                                               else "think")


def test_without_a_prefill_the_template_opens_think_tags_or_not(tok):
    ids = tok.encode("what does <think> mean?", add_special_tokens=False)
    assert parser_for_prompt(tok, "think", ids) == "think"
    assert parser_for_prompt(tok, "think-open", ids) == "think-open"
    assert parser_for_prompt(tok, "mistral", ids, "[THINK]typed") == "mistral"  # text, no id
    assert parser_for_prompt(tok, None, ids) is None


def test_a_prompt_that_ends_inside_think_is_read_from_inside(tok):
    """[THINK] / [/THINK] read by id: the answer starts inside where the prompt's last
    marker is [THINK], and the reader then takes its text as reasoning up to [/THINK]."""
    b, e = tok.token_to_id("[THINK]"), tok.token_to_id("[/THINK]")
    text = tok.encode("plan", add_special_tokens=False)
    for prompt, want in (([1, b, *text], "mistral-open"), ([1, b, *text, e], "mistral"),
                         ([1, *text], "mistral"), ([b, e, b], "mistral-open")):
        for flag in ("mistral", "mistral-open"):
            assert parser_for_prompt(tok, flag, prompt) == want
    msg = check_all_cuts(tok, "still planning[/THINK]answer", None, "mistral-open")
    assert (msg.reasoning_content, msg.content) == ("still planning", "answer")


@pytest.mark.parametrize("text,ready", [
    ('{"a": 1}', '{"a": 1}'), ('  {"a": [1, {"b": "x\\"y"}]}', '  {"a": [1, {"b": "x\\"y"}]}'),
    ('{"a": 1, "b": nope}', '{"a": 1, "b": n'), ("[1, 2]", ""), ("not json", ""), ("  ", ""),
    ('{"a": "cut', '{"a": "cut'),
])
def test_object_prefix_is_the_same_however_the_text_comes(text, ready):
    """What may be sent of a call's arguments so that every accumulated fragment reads as
    a JSON object so far: the same text fed whole or in any pieces."""
    from pydantic_core import from_json

    from service.tool_calls.call_json import object_prefix
    for sizes in cuts(len(text), limit=8, samples=60):
        sent, held, pos = "", "", 0
        for size in sizes:
            out, held = object_prefix(sent, held + text[pos:pos + size])
            pos += size
            sent += out
            if sent:
                assert isinstance(from_json(sent, allow_partial=True), dict), sent
        assert (sent, held) == (ready, text[len(ready):]), sizes
