"""vLLM's ``continue_final_message`` on /v1/chat/completions and Anthropic's prefill on
/v1/messages (a final assistant message with text): the prompt ends inside that message,
so the answer continues it. On the demo model (a Jinja ChatML template), a tiny
tekken.json checkpoint (mistral-common's ``prefix`` messages) and a tiny checkpoint with
the published file set (tokenizer.json + the published template). With it, chat's
echo, add_special_tokens, return_prompt_text and /tokenize's chat options."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from engine.text.chat_template import ChatTemplateError, cut_after_final_message
from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings

ASK = {"role": "user", "content": "What is the capital of France? Answer in JSON."}
PREFILL = {"role": "assistant", "content": '{"capital": "'}
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.fixture(scope="module", params=["demo", "tekken", "published"])
def served(request, tiny_checkpoint):
    """The demo model (ChatML template), a tekken.json-only checkpoint (mistral-common's
    encoding) and the published file set (tokenizer.json + the published template)."""
    model = (ensure_demo_model() if request.param == "demo"
             else tiny_checkpoint(tokenizer=request.param))
    # the published template writes a long default system prompt
    with TestClient(create_app(Settings(model=model, max_model_len=2048,
                                        kv_cache_gib=0.1))) as c:
        yield c, Tokenizer.from_dir(model), c.get("/v1/models").json()["data"][0]["id"]


def chat(c, **kw):
    return c.post("/v1/chat/completions", json={
        "messages": [ASK, PREFILL], "max_tokens": 8, "temperature": 0, **kw})


def test_the_prompt_ends_inside_the_final_message(served):
    c, tok, _ = served
    ids = tok.encode_chat([ASK, PREFILL], add_generation_prompt=False,
                          continue_final_message=True)
    if tok.chat_template is not None:
        closed = tok.encode_chat([ASK, PREFILL], add_generation_prompt=False)
        assert len(ids) < len(closed)  # the turn's end (and anything after) is gone
    else:  # mistral-common serves a final assistant message only as a prefix
        with pytest.raises(ChatTemplateError, match="prefix"):
            tok.encode_chat([ASK, PREFILL], add_generation_prompt=False)
    assert tok.decode(ids, skip_special_tokens=False).endswith(PREFILL["content"])
    r = chat(c, **CONTINUE)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    # the answer is what the same ids get on /v1/completions
    plain = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 8,
                                            "temperature": 0}).json()
    assert r.json()["choices"][0]["message"]["content"] == plain["choices"][0]["text"]


def test_an_anthropic_prefill_is_continued(served):
    c, tok, name = served
    body = {"model": name, "max_tokens": 8, "temperature": 0, "messages": [ASK, PREFILL]}
    r = c.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    ours = chat(c, **CONTINUE).json()
    assert r.json()["content"][0]["text"] == ours["choices"][0]["message"]["content"]
    usage = r.json()["usage"]  # Anthropic's input_tokens leaves out the cached ones
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == ours["usage"][
        "prompt_tokens"]
    counted = c.post("/v1/messages/count_tokens", json={"model": name,
                                                       "messages": [ASK, PREFILL]})
    assert counted.json()["input_tokens"] == ours["usage"]["prompt_tokens"]


@pytest.mark.parametrize("extra, messages", [
    ({"continue_final_message": True}, [ASK, PREFILL]),  # a generation prompt too
    (CONTINUE, [ASK]),
    (CONTINUE, [ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
])
def test_what_cannot_be_continued_is_a_400(served, extra, messages):
    r = chat(served[0], messages=messages, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in ("continue_final_message", "messages")


def test_cut_after_final_message():
    msgs = [ASK, {"role": "assistant", "content": " Paris is "}]
    assert cut_after_final_message("u: x\na:  Paris is <end>\n", msgs) == "u: x\na:  Paris is "
    # a template that strips the content: the stripped text is found
    assert cut_after_final_message("a: Paris is<end>", msgs) == "a: Paris is"
    parts = [ASK, {"role": "assistant", "content": [{"type": "text", "text": "ab"},
                                                    {"type": "text", "text": "cd"}]}]
    assert cut_after_final_message("x abcd</s>", parts) == "x abcd"
    for bad in ([ASK], [ASK, {"role": "assistant", "content": "  "}]):
        with pytest.raises(ChatTemplateError):
            cut_after_final_message("anything", bad)
    with pytest.raises(ChatTemplateError, match="as it was sent"):
        cut_after_final_message("a: something else", msgs)


def _sse(r) -> list[dict]:
    assert r.status_code == 200, r.text
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def test_echo_returns_the_whole_continued_message(served):
    """vLLM's echo on chat: the answer starts with the final assistant message's text, so
    with continue_final_message it is the whole message; streamed, the echo is the first
    content after the role, and the stream adds up to the same message."""
    c, _, _ = served
    plain = chat(c, n=2, **CONTINUE).json()
    echoed = chat(c, n=2, echo=True, **CONTINUE).json()
    for p, e in zip(plain["choices"], echoed["choices"], strict=True):
        assert e["message"]["content"] == PREFILL["content"] + p["message"]["content"]
    def counts(usage):  # cached_tokens: the first of the two may have warmed the cache
        return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}
    assert counts(echoed["usage"]) == counts(plain["usage"])  # the echo is not generated
    chunks = _sse(chat(c, n=2, echo=True, stream=True, return_token_ids=True, **CONTINUE))
    for i in range(2):
        mine = [ch["choices"][0] for ch in chunks if ch["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[1]["delta"] == {"content": PREFILL["content"]} and not mine[1][
            "token_ids"]
        text = "".join(m["delta"].get("content") or "" for m in mine)
        assert text == echoed["choices"][i]["message"]["content"]
    # the final message is not the assistant's: nothing of the answer's role to echo
    asked = c.post("/v1/chat/completions", json={"messages": [ASK], "max_tokens": 4,
                                                 "temperature": 0, "echo": True}).json()
    alone = c.post("/v1/chat/completions", json={"messages": [ASK], "max_tokens": 4,
                                                 "temperature": 0}).json()
    assert asked["choices"][0]["message"] == alone["choices"][0]["message"]


def test_add_special_tokens_adds_the_tokenizers_own_on_top_of_the_template(served):
    c, tok, _ = served
    bos = tok.encode("", add_special_tokens=True)  # tekken: [BOS]; the demo's: none
    base = c.post("/tokenize", json={"messages": [ASK]}).json()["tokens"]
    doubled = c.post("/tokenize", json={"messages": [ASK], "add_special_tokens": True}
                     ).json()["tokens"]
    assert doubled[len(doubled) - len(base):] == base and len(doubled) == len(base) + len(bos)
    assert tok.encode_chat([ASK], add_special_tokens=True) == doubled
    for body, ids in ((ASK, base), (ASK, doubled)):
        extra = {"add_special_tokens": True} if ids is doubled else {}
        r = c.post("/v1/chat/completions", json={"messages": [body], "max_tokens": 1,
                                                 **extra})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)


def test_tokenize_renders_messages_as_the_chat_route_does(served):
    """/tokenize takes the chat route's prompt options (vLLM's tokenize request for chat),
    so its count is the prompt_tokens a chat request with them reports."""
    c, tok, _ = served
    tokens = c.post("/tokenize", json={"messages": [ASK, PREFILL], **CONTINUE}).json()
    assert tokens["tokens"] == tok.encode_chat([ASK, PREFILL], add_generation_prompt=False,
                                               continue_final_message=True)
    assert tokens["count"] == chat(c, **CONTINUE).json()["usage"]["prompt_tokens"]
    if tok.chat_template is not None:  # mistral-common always ends on the user's turn
        closed = c.post("/tokenize", json={"messages": [ASK],
                                           "add_generation_prompt": False}).json()
        assert closed["tokens"] == tok.encode_chat([ASK], add_generation_prompt=False)
        opened = c.post("/tokenize", json={"messages": [ASK]}).json()["count"]
        if tok.encode_chat([ASK]) != closed["tokens"]:  # ChatML writes a generation prompt;
            assert closed["count"] < opened             # Mistral's [/INST] ends the turn

    r = c.post("/tokenize", json={"prompt": "Paris", "return_token_strs": True}).json()
    assert r["token_strs"] == [tok.id_to_token(i) for i in r["tokens"]]
    bare = c.post("/tokenize", json={"prompt": "Paris", "add_special_tokens": False}).json()
    assert bare["tokens"] == tok.encode("Paris", add_special_tokens=False)
    # an option it cannot honour is a 400 naming it, not a silently different count
    r = c.post("/tokenize", json={"messages": [ASK], "chat_template": "{{ messages }}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
    r = c.post("/tokenize", json={"messages": [ASK], "continue_final_message": True,
                                  "add_generation_prompt": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_tokenize_counts_the_tools_the_chat_route_renders(served):
    c, _, _ = served
    tool = {"type": "function", "function": {"name": "capital", "parameters": {
        "type": "object", "properties": {"country": {"type": "string"}}}}}
    counted = c.post("/tokenize", json={"messages": [ASK], "tools": [tool]}).json()["count"]
    r = c.post("/v1/chat/completions", json={"messages": [ASK], "tools": [tool],
                                             "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert counted == r.json()["usage"]["prompt_tokens"]
    assert counted > c.post("/tokenize", json={"messages": [ASK]}).json()["count"]


def test_return_prompt_text_shows_what_the_model_read(served):
    """vLLM's return_prompt_text: the prompt's ids as text, nothing skipped (the
    template's special tokens included), on the answer or the stream's first chunk."""
    c, tok, _ = served
    ids = tok.encode_chat([ASK, PREFILL], add_generation_prompt=False,
                          continue_final_message=True)
    want = tok.decode(ids, skip_special_tokens=False)
    r = chat(c, return_prompt_text=True, **CONTINUE).json()
    assert r["prompt_text"] == want and want.endswith(PREFILL["content"])
    assert tok.encode(want, add_special_tokens=False) == ids  # it reads back as the ids
    chunks = _sse(chat(c, n=2, stream=True, return_prompt_text=True, **CONTINUE))
    assert chunks[0]["prompt_text"] == want
    assert not any("prompt_text" in ch for ch in chunks[1:])
    assert "prompt_text" not in chat(c, **CONTINUE).json()
