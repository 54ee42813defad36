"""The assistant-history fields of OpenAI's chat messages besides content and tool_calls:
``reasoning_content`` / ``reasoning`` reach the chat template (mistral-common and the
templates it writes render them as [THINK]...[/THINK]; the published Instruct template
leaves earlier reasoning out, its own choice), ``refusal`` is the turn's text, and the
deprecated ``function_call`` is a 400 naming it; none is dropped by the server."""

from __future__ import annotations

import pytest

from engine.synth import SynthSpec, write_checkpoint
from engine.text.tokenizer import Tokenizer
from service.prompts import message_dicts
from service.schemas import ChatMessage
from tests.service.test_api import client, error_of

ASK = {"role": "user", "content": "Hi"}


def _dicts(*messages):
    return message_dicts([ChatMessage.model_validate(m) for m in messages])


def test_reasoning_and_refusal_reach_the_template_dicts():
    d = _dicts(ASK, {"role": "assistant", "content": "Hello", "reasoning": "greet"},
               {"role": "user", "content": "Bad?"},
               {"role": "assistant", "content": None, "refusal": "I can't."})
    assert d[1] == {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}
    assert d[3] == {"role": "assistant", "content": "I can't."}
    same = _dicts(ASK, {"role": "assistant", "content": "Hello", "reasoning_content": "greet",
                        "reasoning": "greet"})
    assert same[1] == d[1]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """tokenizer.json + mistral-common's template, tekken.json, tokenizer.json + the
    published Instruct template: one vocabulary."""
    toks = []
    for fmt in ("hf", "tekken", "published"):
        d = tmp_path_factory.mktemp(f"tok-{fmt}")
        write_checkpoint(d, SynthSpec.preset("tiny", tokenizer=fmt))
        toks.append(Tokenizer.from_dir(d))
    return toks


def test_earlier_reasoning_reaches_the_template(tokenizers):
    hf, tekken, published = tokenizers
    chat = _dicts(ASK, {"role": "assistant", "content": "Hello", "reasoning": "greet"},
                  {"role": "user", "content": "Again"})
    text = hf.apply_chat_template(chat)
    assert "[INST]Hi[/INST][THINK]greet[/THINK]Hello</s>[INST]Again[/INST]" in text
    assert hf.encode_chat(chat) == tekken.encode_chat(chat)
    without = [chat[0], {"role": "assistant", "content": "Hello"}, chat[2]]
    assert published.apply_chat_template(chat) == published.apply_chat_template(without)


@pytest.mark.parametrize("message, field, words", [
    ({"role": "assistant", "content": None, "function_call": {
        "name": "f", "arguments": "{}"}}, "function_call", "tool_calls"),
    ({"role": "user", "content": "x", "reasoning_content": "r"}, "reasoning_content",
     "only assistant"),
    ({"role": "tool", "tool_call_id": "a", "content": "x", "refusal": "no"}, "refusal",
     "only assistant"),
    ({"role": "assistant", "content": "x", "refusal": "no"}, "refusal", "one of content"),
    ({"role": "assistant", "content": "x", "reasoning": "a", "reasoning_content": "b"},
     "reasoning", "one text")])
def test_history_fields_that_cannot_be_served_are_400s(message, field, words):
    with client() as c:
        err = error_of(c.post("/v1/chat/completions", json={
            "messages": [ASK, message, ASK], "max_tokens": 1}), 400)
    assert err["param"] == f"messages.1.{field}" and words in err["message"], err
