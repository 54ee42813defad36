"""Legacy completions' ``text_offset`` on a byte-level BPE tokenizer (the demo model's),
whose tokens split a multi-byte UTF-8 character (an emoji, CJK) into parts: each token's
offset is where its text starts in the returned text, whole and streamed alike."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings
from tests.service.test_api import sse_events

PROMPT = "Hi 😀 there 日本語 ok"
BODY = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "echo": True, "logprobs": 0, "return_token_ids": True}


@pytest.fixture(scope="module")
def served():
    model = ensure_demo_model()
    with TestClient(create_app(Settings(model=model, max_model_len=128,
                                        kv_cache_gib=0.02))) as c:
        yield c, Tokenizer.from_dir(model)


def starts(tok: Tokenizer, ids: list[int]) -> list[int]:
    """Each token's offset from its bytes: the characters whole before its first byte (a
    token that goes on with a character is at that character)."""
    out, raw = [], b""
    for t in ids:
        out.append(len(raw.decode("utf-8", errors="ignore")))
        raw += tok.token_bytes(t)
    return out


def test_offsets_index_the_text_when_tokens_split_characters(served):
    c, tok = served
    whole = c.post("/v1/completions", json=BODY).json()["choices"][0]
    ids = whole["prompt_token_ids"] + whole["token_ids"]
    assert any(len(tok.token_bytes(t).decode("utf-8", errors="ignore"))
               < len(tok.token_bytes(t)) for t in whole["prompt_token_ids"])  # split
    offsets = whole["logprobs"]["text_offset"]
    assert offsets == starts(tok, ids)
    text = whole["text"]
    assert text.startswith(PROMPT) and max(offsets) <= len(text)
    for t, at in zip(ids, offsets, strict=True):  # a whole token's text is at its offset
        own = tok.token_bytes(t)
        if own.decode("utf-8", errors="ignore").encode() == own:
            assert text[at:at + len(own.decode())] == own.decode()
    events = sse_events(c.post("/v1/completions", json={**BODY, "stream": True}))
    streamed = [o for e in events for ch in e["choices"] if ch["logprobs"]
                for o in ch["logprobs"]["text_offset"]]
    assert streamed == offsets


@pytest.mark.parametrize("seed", [1, 2, 6, 9])
def test_streamed_offsets_equal_whole_when_a_character_spans_chunks(served, seed):
    """Seeded answers that write emoji and CJK byte by byte: each token is its own chunk,
    so a character's parts come in several; a part that goes on with a character is at
    that character's start in every chunk, as in the whole answer."""
    c, tok = served
    prompt = ["😀😃😄 more emoji:", "中文: 你好, 日本語:"][seed % 2]
    body = {"prompt": prompt, "max_tokens": 14, "temperature": 0.8, "seed": seed,
            "ignore_eos": True, "logprobs": 0, "return_token_ids": True, "n": 2,
            "echo": seed > 5}
    whole = c.post("/v1/completions", json=body).json()["choices"]
    events = sse_events(c.post("/v1/completions", json={**body, "stream": True}))
    split = 0
    for ch in whole:
        ids = ch["token_ids"]
        split += any(len(tok.token_bytes(t).decode("utf-8", errors="ignore"))
                     < len(tok.token_bytes(t)) for t in ids)
        offsets = ch["logprobs"]["text_offset"]
        echoed = ch["prompt_token_ids"] if body["echo"] else []
        assert offsets == starts(tok, echoed + ids)
        streamed = [o for e in events for x in e["choices"] if x["index"] == ch["index"]
                    and x["logprobs"] for o in x["logprobs"]["text_offset"]]
        assert streamed == offsets, (ch["index"], ch["text"])
    assert split  # the answers really split characters across tokens


def test_offsets_skip_the_special_tokens_the_text_leaves_out(served):
    """skip_special_tokens (the default) leaves a generated special token out of the text:
    its offset is where the text goes on, and the tokens after it are not pushed past
    the text; kept, it counts its text."""
    c, tok = served
    special = tok.token_to_id("<|im_start|>")
    body = {"prompt": "Hello there", "max_tokens": 4, "temperature": 1, "seed": 3,
            "logprobs": 0, "logit_bias": {str(special): 30},
            "return_token_ids": True, "echo": True}
    for skip in (True, False):
        sent = {**body, "skip_special_tokens": skip}
        whole = c.post("/v1/completions", json=sent).json()["choices"][0]
        assert special in whole["token_ids"] and special not in whole["prompt_token_ids"]
        text, offsets = whole["text"], whole["logprobs"]["text_offset"]
        ids = whole["prompt_token_ids"] + whole["token_ids"]
        shown = [tok.decode([t], skip_special_tokens=skip and i >= len(whole["prompt_token_ids"]))
                 for i, t in enumerate(ids)]
        assert "".join(shown) == text
        assert offsets == [len("".join(shown[:i])) for i in range(len(ids))]
        events = sse_events(c.post("/v1/completions", json={**sent, "stream": True}))
        assert [o for e in events for x in e["choices"] if x["logprobs"]
                for o in x["logprobs"]["text_offset"]] == offsets
