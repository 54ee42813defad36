"""engine/text/content_format.py and normalize_messages: a template's content shape is read
from its source once, and None, strings and part lists reach it in that shape. The
published Ministral-3 template (engine/synth/templates/) renders the openai SDK's
``"content": null`` tool-call turn, and its ids equal mistral-common's for the same chat
(one text part a message; several are joined as each reference joins them)."""

from __future__ import annotations

import pytest

from engine.demo_model.tokenizer_files import CHATML_TOOLS
from engine.synth.tokenizer import PUBLISHED_TEMPLATE
from engine.text.chat_template import PARTS as PARTS_FORMAT
from engine.text.chat_template import normalize_messages, render_chat_template
from engine.text.content_format import detect_content_format
from engine.text.tokenizer import Tokenizer

CALL = {"id": "abcDEF123", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
PARTS = [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]


def _loop(expr: str) -> str:
    return "{% for m in messages %}" + expr + "{% endfor %}"


@pytest.mark.parametrize("source, fmt", [
    (PUBLISHED_TEMPLATE.read_text(), "openai"),
    (CHATML_TOOLS.read_text(), "string"),
    (_loop("{{ m['content'] }}"), "string"),
    (_loop("{% for p in m.content %}{{ p.text }}{% endfor %}"), "openai"),
    (_loop("{% for p in m['content'] | selectattr('type') %}{{ p.text }}{% endfor %}"),
     "openai"),
    (_loop("{% set c = m.content %}{% for p in c %}{{ p.text }}{% endfor %}"), "openai"),
    (_loop("{% for x in m.tool_calls %}{{ x.id }}{% endfor %}"), "string"),
    (None, "string"),
    ("{% for %}", "string"),  # a syntax error is reported when rendering
])
def test_detect_content_format(source, fmt):
    assert detect_content_format(source) == fmt


@pytest.mark.parametrize("fmt, none, parts, tool", [
    ("string", "", "Weather in \nParis?", "sun\nny"),  # parts joined as vLLM joins them
    ("openai", [], PARTS, "sun\nny"),  # templates print tool results as text
    (PARTS_FORMAT, "", PARTS, [{"type": "text", "text": "sun"},  # mistral-common joins
                               {"type": "text", "text": "ny"}]),
])
def test_normalize_none_strings_and_parts(fmt, none, parts, tool):
    msgs = [{"role": "user", "content": PARTS},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "abcDEF123",
             "content": [{"type": "text", "text": "sun"}, {"type": "text", "text": "ny"}]},
            {"role": "user", "content": "Thanks"}]
    out = normalize_messages(msgs, fmt)
    assert [m["content"] for m in out] == [parts, none, tool, "Thanks"]
    assert out[1]["tool_calls"] == [CALL] and msgs[1]["content"] is None  # input untouched


@pytest.fixture(scope="module")
def published(tiny_checkpoint):
    """(published file set: tokenizer.json + the published template + tekken.json,
    tekken.json alone) on the same vocabulary."""
    return [Tokenizer.from_dir(tiny_checkpoint(tokenizer=fmt))
            for fmt in ("published", "tekken")]


@pytest.mark.parametrize("content", [None, "", []])
def test_published_template_takes_the_sdks_tool_call_turn(published, content):
    hf, tekken = published
    assert (hf.content_format, tekken.content_format) == ("openai", "string")
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": content, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny"},
            {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]}]
    text = hf.apply_chat_template(chat, tools=TOOLS)
    assert text.startswith("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS]")
    assert text.endswith('[INST]Weather in Paris?[/INST][TOOL_CALLS]get_weather[ARGS]'
                         '{"city": "Paris"}</s>[TOOL_RESULTS]sunny[/TOOL_RESULTS]'
                         'Sunny.</s>[INST]Thanks![/INST]')
    # both Mistral paths render one-part contents alike, so the same ids
    assert hf.encode_chat(chat, tools=TOOLS) == tekken.encode_chat(chat, tools=TOOLS)


def _mistral_common_ids(tok, messages):
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    request = ChatCompletionRequest.from_openai(messages, None)
    mistral = MistralTokenizer.from_file(str(tok.backend.path))
    return list(mistral.encode_chat_completion(request).tokens)


def test_several_text_parts_join_as_each_reference_joins_them(published):
    """Several text parts in one message: the published template prints a user's or a
    system's parts one after another, and tool results joined by the server ("\n", vLLM's
    separator, since the template prints them as text); tekken.json alone encodes the
    parts through mistral-common, which joins them with "\n\n" (v13) in every role."""
    hf, tekken = published
    two = [{"type": "text", "text": "Error: "}, {"type": "text", "text": "boom"}]
    chat = [{"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                           {"type": "text", "text": "Be kind."}]},
            {"role": "user", "content": PARTS},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "abcDEF123", "content": two},
            {"role": "assistant", "content": [{"type": "text", "text": "A"},
                                              {"type": "text", "text": "B"}]},
            {"role": "user", "content": "Thanks!"}]
    text = hf.apply_chat_template(chat)
    assert "[SYSTEM_PROMPT]Be brief.Be kind.[/SYSTEM_PROMPT]" in text
    assert "[INST]Weather in Paris?[/INST]" in text
    assert "[TOOL_RESULTS]Error: \nboom[/TOOL_RESULTS]AB</s>" in text
    assert tekken.encode_chat(chat) == _mistral_common_ids(tekken, chat)
    mc = tekken.apply_chat_template(chat)
    assert "Be brief.\n\nBe kind." in mc and "Weather in \n\nParis?" in mc
    assert "Error: \n\nboom" in mc and "A\n\nB</s>" in mc


def test_developer_messages_read_as_system_on_the_published_template(published):
    """The published template knows no developer role (it raised); OpenAI's clients send
    one for system instructions: both Mistral paths read it as a system message."""
    hf, tekken = published
    for content in ("Be brief.", [{"type": "text", "text": "Be brief."}]):
        chat = [{"role": "developer", "content": content}, {"role": "user", "content": "Hi"}]
        text = hf.apply_chat_template(chat)
        assert text == hf.apply_chat_template([{**chat[0], "role": "system"}, chat[1]])
        assert text.startswith("<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi")
        assert hf.encode_chat(chat) == tekken.encode_chat(chat)


def test_a_template_that_reads_developer_gets_it_as_sent():
    source = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
    chat = [{"role": "developer", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_chat_template(source, chat, False) == "system:a;user:b;"
    reads = "{% for m in messages %}{{ m.role }}{% if m.role == 'developer' %}!{% endif %}" \
            "{% endfor %}"
    assert render_chat_template(reads, chat, False) == "developer!user"
