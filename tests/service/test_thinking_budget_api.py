"""Thinking budgets through the app and the engine, on the scripted model
(tests/service/scripted_backend.py, whose reasoning goes on with its answer once the
sampler closes it): Anthropic's ``thinking.budget_tokens`` and chat's
``thinking_token_budget`` / ``reasoning_effort`` cut the reasoning at exactly the budget,
and the rest of the answer follows; a budget that cannot be enforced is a 400 naming it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.scripted_backend import ScriptTokenizer, scripted_loader
from tests.service.test_e2e_tools import e2e_model_dir
from tests.service.test_messages_api import events

SCRIPTS = ["[THINK]Paris is in France[/THINK]Hello world",
           "Let me think.[THINK]Paris is in France[/THINK]Hello world",
           "Paris is in France</think>Hello world"]  # a template that opens <think>


def _client(**settings) -> TestClient:
    return TestClient(create_app(Settings(max_model_len=512, **settings),
                                 load_backend=scripted_loader(SCRIPTS)))


@pytest.fixture(scope="module")
def client():
    with _client() as c:
        yield c


def ask(script: int, **body) -> dict:
    return {"max_tokens": 100, "temperature": 0,
            "messages": [{"role": "user", "content": f"<script{script}>"}], **body}


def _message(client, body: dict) -> dict:
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _blocks(m: dict) -> list[tuple[str, str]]:
    return [(b["type"], b.get("thinking", b.get("text"))) for b in m["content"]]


def test_messages_thinking_is_cut_at_the_budget_and_the_answer_follows(client):
    # tokens: "Paris", " ", "i", "s", ...: a budget of 3 keeps "Paris i"
    body = ask(0, thinking={"type": "enabled", "budget_tokens": 3})
    m = _message(client, body)
    assert _blocks(m) == [("thinking", "Paris i"), ("text", "Hello world")]
    assert m["stop_reason"] == "end_turn"
    # [THINK], 3 reasoning tokens, [/THINK], "Hello", " world", </s>
    assert m["usage"]["output_tokens"] == 8
    evs = events(client, body)
    thought = "".join(d["delta"].get("thinking", "") for n, d in evs
                      if n == "content_block_delta")
    text = "".join(d["delta"].get("text", "") for n, d in evs if n == "content_block_delta")
    assert (thought, text) == ("Paris i", "Hello world")
    whole = _message(client, ask(0, thinking={"type": "enabled", "budget_tokens": 50}))
    assert _blocks(whole) == [("thinking", "Paris is in France"), ("text", "Hello world")]


def test_messages_thinking_disabled_closes_the_section_at_once(client):
    m = _message(client, ask(0, thinking={"type": "disabled"}))
    assert _blocks(m) == [("text", "Hello world")]


def _chat(client, script: int, **body) -> dict:
    r = client.post("/v1/chat/completions", json=ask(script, **body))
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_thinking_token_budget_counts_from_the_start_token(client):
    c = _chat(client, 1, thinking_token_budget=2, logprobs=True)
    toks = [t["token"] for t in c["choices"][0]["logprobs"]["content"]]
    assert toks[toks.index("[THINK]"):] == ["[THINK]", "Paris", " ", "[/THINK]", "Hello",
                                           " world", "</s>"]
    msg = c["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("Paris ", "Let me think.Hello world")
    assert c["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2
    for no_cap in (-1, None):
        msg = _chat(client, 1, thinking_token_budget=no_cap)["choices"][0]["message"]
        assert msg["reasoning_content"] == "Paris is in France"


def test_chat_reasoning_effort_none_is_a_budget_of_zero(client):
    msg = _chat(client, 0, reasoning_effort="none")["choices"][0]["message"]
    assert (msg.get("reasoning_content"), msg["content"]) == (None, "Hello world")
    r = client.post("/v1/chat/completions", json=ask(0, reasoning_effort="low"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"
    r = client.post("/v1/chat/completions", json=ask(0, thinking_token_budget=-2))
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget"


def test_a_section_the_prompt_opened_counts_from_the_first_output_token():
    with _client(reasoning_parser="think-open") as c:
        msg = _chat(c, 2, thinking_token_budget=2)["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == ("Paris ", "Hello world")
        m = _message(c, ask(2, thinking={"type": "enabled", "budget_tokens": 1}))
        assert _blocks(m) == [("thinking", "Paris"), ("text", "Hello world")]


def test_markers_that_are_not_single_tokens_are_a_400_naming_the_budget(monkeypatch):
    real = ScriptTokenizer.token_to_id
    monkeypatch.setattr(ScriptTokenizer, "token_to_id",
                        lambda self, t: None if t in ("<think>", "</think>") else real(self, t))
    with _client(reasoning_parser="think-open") as c:
        r = c.post("/v1/messages", json=ask(2, thinking={"type": "enabled",
                                                         "budget_tokens": 5}))
        err = r.json()["error"]
        assert r.status_code == 400 and err["message"].startswith("thinking.budget_tokens: ")
        assert "not single tokens" in err["message"]
        r = c.post("/v1/chat/completions", json=ask(2, thinking_token_budget=5))
        assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget"
        r = c.post("/v1/messages", json=ask(2, thinking={"type": "disabled"}))
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("thinking: ")
        r = c.post("/v1/responses", json={"input": "<script2>", "reasoning": {"effort": "none"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning.effort"
        # without a budget, the same model still reads its reasoning
        assert _chat(c, 2)["choices"][0]["message"]["content"] == "Hello world"


def test_the_real_engine_and_tekken_tokenizer_cut_at_the_budget(tmp_path_factory):
    """A tiny random v13-tekken checkpoint: [THINK]/[/THINK] resolved from tekken.json, a
    logit bias makes the model open a section. Greedy, so the budgeted output is the free
    one up to the section's third reasoning token, then [/THINK], then more answer."""
    with TestClient(create_app(Settings(model=e2e_model_dir("tekken", tmp_path_factory),
                                        max_model_len=256))) as c:
        tok = c.app.state.serving.backend.tokenizer
        think = tok.token_to_id("[THINK]")
        name = c.get("/v1/models").json()["data"][0]["id"]
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 16, "temperature": 0, "logprobs": True,
                "logit_bias": {str(think): 8}, "frequency_penalty": 2, "presence_penalty": 2}

        def run(**extra) -> tuple[list[str], int]:
            r = c.post("/v1/chat/completions", json={**body, **extra})
            assert r.status_code == 200, r.text
            choice, usage = r.json()["choices"][0], r.json()["usage"]
            return ([t["token"] for t in choice["logprobs"]["content"]],
                    usage["completion_tokens_details"]["reasoning_tokens"])

        free, free_reasoning = run()
        assert free[0] == "[THINK]" and "[/THINK]" not in free and free_reasoning > 3
        cut, reasoning = run(thinking_token_budget=3)
        at = cut.index("[/THINK]")
        assert reasoning == 3 and cut[:at] == free[:at]
        assert len([t for t in cut[1:at] if t != "[THINK]"]) == 3  # a start inside: a marker
        assert at < len(cut) - 1  # the answer follows
