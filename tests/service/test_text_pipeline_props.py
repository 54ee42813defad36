"""Properties of the text pipeline on seeded random cases: a stream's deltas join into the
whole answer, a stop string ends the text exactly where it first occurs (nothing after it
leaks, whole or streamed), with the demo model (byte-level BPE) and a tiny random
checkpoint with a tekken.json, whose chats go through the output parsers."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient

from engine.synth import SynthSpec, write_checkpoint
from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings
from tests.service.test_api import sse_events
from tests.service.test_text_offsets import served  # noqa: F401  (the demo model's server)


@pytest.fixture(scope="module")
def tekken(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny-tekken")
    write_checkpoint(model_dir, SynthSpec.preset("tiny", tokenizer="tekken"))
    with TestClient(create_app(Settings(model=model_dir, max_model_len=256,
                                        kv_cache_gib=0.02))) as c:
        yield c, Tokenizer.from_dir(model_dir)


def chat_content(c, body):
    """(whole content, streamed content joined, whole choice) of one chat request."""
    whole = c.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    events = sse_events(c.post("/v1/chat/completions", json={**body, "stream": True}))
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e["choices"])
    return choice["message"]["content"] or "", streamed, choice


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_stop_string_after_kept_special_tokens_ends_the_content(tekken, seed):
    """skip_special_tokens false: the tekken model's chats go through its reasoning
    parser, whose content never shows special tokens; a stop string still ends the content
    where it first occurs (the special tokens before it once let up to their text's length
    of what follows the stop through)."""
    c, tok = tekken
    special = tok.token_to_id("<SPECIAL_73>")  # no parser reads it: plain special token
    body = {"messages": [{"role": "user", "content": "Say something"}], "max_tokens": 40,
            "temperature": 1, "seed": seed, "skip_special_tokens": False,
            "logit_bias": {str(special): 6}, "return_token_ids": True}
    full, streamed, choice = chat_content(c, body)
    assert choice["token_ids"].count(special) >= 3 and streamed == full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = full[:full.find(stop)]
    assert len(full) - len(cut) > 12  # text follows the stop
    for include in (False, True):
        got, streamed, choice = chat_content(c, {**body, "stop": [stop],
                                                 "include_stop_str_in_output": include})
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
        assert got == streamed == cut + (stop if include else ""), (got, cut, stop)


def test_seeded_chat_streams_equal_whole_answers(tekken):
    """Random seeded cases: the stream's content equals the whole answer's, with and
    without special tokens kept and stop strings taken from the answer."""
    c, _ = tekken
    rng = random.Random(7)
    for _ in range(6):
        body = {"messages": [{"role": "user", "content": rng.choice(
            ["日本語で 👋", "Café naïve résumé", "a  b\n\n\tc"])}],
            "max_tokens": rng.randint(4, 30), "temperature": 1.2,
            "seed": rng.randint(0, 999), "skip_special_tokens": rng.random() < 0.5}
        full, streamed, _ = chat_content(c, body)
        assert streamed == full
        if len(full) > 4:
            at = rng.randrange(len(full) - 2)
            stop = full[at:at + 2]
            got, streamed, choice = chat_content(c, {**body, "stop": [stop]})
            assert got == streamed == full[:full.find(stop)], (body, stop)
            assert choice["finish_reason"] == "stop"




def test_stop_string_in_text_held_for_a_split_character_ends_with_stop(served):  # noqa: F811
    """A token such as " \\xf0\\x9f" (a space and an emoji's first bytes) is held back
    whole until the emoji completes; when max_tokens ends the output there, the held text
    is released, and a stop string in it cuts the text: the answer then ends with
    finish_reason "stop" and that stop string, as any cut by a stop string does."""
    c, tok = served
    body = {"prompt": "Emoji list: 😀 😃 😄", "max_tokens": 16, "temperature": 0.8,
            "ignore_eos": True, "return_token_ids": True}
    checked = 0
    for seed in (3, 6):
        ids = c.post("/v1/completions", json={**body, "seed": seed}).json()
        ids = ids["choices"][0]["token_ids"]
        k = next(k for k, t in enumerate(ids) if k and tok.token_bytes(t)[:1] == b" "
                 and "\ufffd" in tok.decode([t]))
        before = tok.decode(ids[:k])
        stop = before[-1] + " "
        assert stop not in before
        sent = {**body, "seed": seed, "max_tokens": k + 1, "stop": [stop]}
        whole = c.post("/v1/completions", json=sent).json()["choices"][0]
        assert whole["text"] == before[:-1]
        assert (whole["finish_reason"], whole["stop_reason"]) == ("stop", stop)
        events = sse_events(c.post("/v1/completions", json={**sent, "stream": True}))
        assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
        ends = [(e["choices"][0]["finish_reason"], e["choices"][0].get("stop_reason"))
                for e in events if e["choices"][0]["finish_reason"]]
        assert ends == [("stop", stop)]
        checked += 1
    assert checked == 2


def test_echoed_offsets_index_the_text_after_an_added_bos(tekken):
    """A text prompt on a tokenizer that adds BOS: the echoed text is the prompt as sent,
    without the BOS's text, so the BOS takes no room and every offset indexes the text
    (the generated tokens' after the prompt's: they increase); whole and streamed."""
    c, tok = tekken
    body = {"prompt": "Ωmega ≈ √2 and <s> ok", "max_tokens": 6, "temperature": 0,
            "echo": True, "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
    whole = c.post("/v1/completions", json=body).json()["choices"][0]
    prompt_ids = whole["prompt_token_ids"]
    bos = tok.token_to_id("<s>")
    assert prompt_ids[0] == bos and prompt_ids.count(bos) == 2  # added, and sent as text
    text, offsets = whole["text"], whole["logprobs"]["text_offset"]
    assert text.startswith(body["prompt"]) and offsets == sorted(offsets)
    assert offsets[:2] == [0, 0] and offsets[len(prompt_ids)] == len(body["prompt"])
    for t, at in zip(prompt_ids[1:] + whole["token_ids"], offsets[1:], strict=True):
        own = tok.token_bytes(t)
        if own.decode("utf-8", errors="ignore").encode() == own:
            assert text[at:at + len(own.decode())] == own.decode()
    events = sse_events(c.post("/v1/completions", json={**body, "stream": True}))
    assert [o for e in events for x in e["choices"] if x["logprobs"]
            for o in x["logprobs"]["text_offset"]] == offsets
