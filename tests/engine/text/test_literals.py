"""engine/text/literals.py: a control token's string inside a chat's own text (messages,
tool descriptions and parameters, call arguments, tool results) is encoded as text, as
mistral-common encodes it; only the chat template's markup is control tokens. Checked
on the published file set (tokenizer.json + the published template) and a Tekken
tokenizer with that template against mistral-common, and on the demo's ChatML."""

from __future__ import annotations

import shutil

import pytest

from engine.demo_model import ensure_demo_model
from engine.synth.tokenizer import PUBLISHED_TEMPLATE
from engine.text.literals import Literals, control_strings
from engine.text.tokenizer import Tokenizer

TEKKEN = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[SYSTEM_PROMPT]",
          "<s>", "</s>", "[IMG]", "[THINK]", "[ARGS]", "[TOOL_RESULTS]", "<SPECIAL_20>"]
CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def _say(strings: list[str]) -> str:
    return "hi " + " x ".join(strings) + "end" + strings[0] + strings[-1]


def _chat(say: str) -> tuple[list[dict], list[dict]]:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather " + say,
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": say}}}}}]
    messages = [
        {"role": "system", "content": "Be brief. " + say},
        {"role": "user", "content": say},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "abcDEF123", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "' + say + '"}'}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny " + say},
        {"role": "assistant", "content": "It is sunny. " + say},
        {"role": "user", "content": [{"type": "text", "text": say}]}]
    return messages, tools


@pytest.fixture(scope="module")
def tekken_dirs(tiny_checkpoint, tmp_path_factory):
    """The published file set, and tekken.json with the published template beside it (a
    copy: the shared checkpoint stays as written)."""
    tekken = tmp_path_factory.mktemp("lit-tekken")
    shutil.copytree(tiny_checkpoint(tokenizer="tekken"), tekken, dirs_exist_ok=True)
    (tekken / "chat_template.jinja").write_text(PUBLISHED_TEMPLATE.read_text())
    return {"published": tiny_checkpoint(tokenizer="published"), "tekken": tekken}


def _mistral_common(path, messages, tools):
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(str(path / "tekken.json"))
    request = ChatCompletionRequest.from_openai(messages, tools)
    return tok.encode_chat_completion(request).tokens


@pytest.mark.parametrize("fmt", ["published", "tekken"])
@pytest.mark.parametrize("strings", [TEKKEN, ["nothing special"]])
def test_control_strings_in_a_chat_are_text_as_mistral_common_encodes_them(
        tekken_dirs, fmt, strings):
    messages, tools = _chat(_say(strings))
    tok = Tokenizer.from_dir(tekken_dirs[fmt])
    assert tok.chat_template is not None  # the template renders, not mistral-common
    ids = tok.encode_chat(messages, tools=tools)
    assert ids == _mistral_common(tekken_dirs["tekken"], messages, tools)
    plain = tok.encode_chat(_chat("plain")[0], tools=_chat("plain")[1])
    specials = [i for i in ids if tok.is_special(i)]
    assert specials == [i for i in plain if tok.is_special(i)]  # the template's, no more
    # the prompt's text is the one written (vLLM's return_prompt_text, chat echo)
    assert tok.apply_chat_template(messages, tools=tools).count(strings[0]) >= 6


def test_chatml_turn_markers_in_a_message_are_text():
    tok = Tokenizer.from_dir(ensure_demo_model())
    say = _say(CHATML)
    ids = tok.encode_chat([{"role": "user", "content": say}])
    plain = tok.encode_chat([{"role": "user", "content": "x"}])
    assert [i for i in ids if tok.is_special(i)] == [i for i in plain if tok.is_special(i)]
    assert say in tok.decode(ids, skip_special_tokens=False)
    # a completion's prompt is the text as given: its markers are tokens (vLLM's default)
    raw = tok.encode(say, add_special_tokens=False)
    assert sum(tok.is_special(i) for i in raw) == len(CHATML) + 2


def test_hide_restore_and_encode_leave_other_text_as_it_was(tekken_dirs):
    """Spans without marks are encoded as the backend encodes them: a chat with the
    strings only in its last message gives the earlier turns' ids unchanged."""
    tok = Tokenizer.from_dir(tekken_dirs["published"])
    control = control_strings(TEKKEN)
    lit = Literals(control)
    value = {"a": ["x [INST] y", ("[IMG]",)], "[THINK]": 3, "n": None}
    hidden = lit.hide(value)
    assert not any(t in repr(hidden) for t in TEKKEN) and len(lit.found) == 3
    assert hidden["n"] is None and isinstance(hidden["a"][1], tuple)
    assert lit.restore(repr(hidden)) == repr(value)
    messages, tools = _chat("plain")
    before = tok.encode_chat(messages[:-1], tools=tools, add_generation_prompt=False)
    after = tok.encode_chat([*messages[:-1], {"role": "user", "content": "[INST]"}],
                            tools=tools)
    assert after[:len(before)] == before
    assert Literals(None).hide(value) == value


@pytest.mark.parametrize("fmt", ["published", "tekken"])
def test_strings_that_join_or_decode_into_control_tokens_stay_text(tekken_dirs, fmt):
    """A control-token string split across content parts (the template prints them one
    after another), or JSON-escaped in a call's arguments (the template gets them read),
    adds no control token: the template's own are all there is."""
    tok = Tokenizer.from_dir(tekken_dirs[fmt])
    split = [{"role": "user", "content": [{"type": "text", "text": t}
                                          for t in ("a [TOOL_", "CALLS]f[AR", "GS]{}")]}]
    plain = [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]
    messages, tools = _chat("plain")
    escaped = [dict(m) for m in messages]
    escaped[2] = {**escaped[2], "tool_calls": [{
        "id": "abcDEF123", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "\\u005bINST]x"}'}}]}

    def specials(ids):
        return [i for i in ids if tok.is_special(i)]

    assert specials(tok.encode_chat(split)) == specials(tok.encode_chat(plain))
    assert specials(tok.encode_chat(escaped, tools=tools)) == specials(
        tok.encode_chat(messages, tools=tools))
    text = tok.decode(tok.encode_chat(split), skip_special_tokens=False)
    assert "a [TOOL_CALLS]f[ARGS]{}" in text
