"""vLLM's ``prompt_logprobs`` on /v1/completions and /v1/chat/completions (fake model: it
predicts (sum + len) % 50, so after [2] the likeliest id is 3 and after [2, 3] it is 7):
per prompt token its own logprob and rank and the k likeliest ids, the first null."""

from __future__ import annotations

import pytest

from tests.service.test_api import client

BASE = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def test_completions_carry_each_prompt_tokens_logprob_and_rank(c):
    r = c.post("/v1/completions", json={**BASE, "prompt": "2 3 5", "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    first, hit, miss = r.json()["choices"][0]["prompt_logprobs"]
    assert first is None  # the first token has no context
    assert hit["3"]["rank"] == 1 and hit["3"]["logprob"] == pytest.approx(0.0, abs=1e-3)
    assert hit["3"]["decoded_token"] == " 3" and len(hit) == 2  # itself, and one more
    assert miss["5"]["rank"] > 1 and miss["5"]["logprob"] < -5
    assert miss["7"]["rank"] == 1 and len(miss) == 3  # itself and the 2 likeliest
    assert [e["rank"] for k, e in miss.items() if k != "5"] == [1, 2]


def test_echo_logprobs_keep_their_own_k_beside_prompt_logprobs(c):
    r = c.post("/v1/completions", json={**BASE, "prompt": "2 3 5", "echo": True,
                                        "logprobs": 1, "prompt_logprobs": 3}).json()
    choice = r["choices"][0]
    # echo's k (1), plus the token itself where it is not the likeliest
    assert [len(t) for t in choice["logprobs"]["top_logprobs"][1:3]] == [1, 2]
    assert len(choice["prompt_logprobs"][2]) == 4  # the token and 3 alternatives


def test_chat_carries_the_prompts_logprobs(c):
    r = c.post("/v1/chat/completions", json={
        **BASE, "messages": [{"role": "user", "content": "3 4"}], "prompt_logprobs": 0})
    body = r.json()
    lps = body["prompt_logprobs"]
    assert len(lps) == body["usage"]["prompt_tokens"] and lps[0] is None
    assert all(len(e) == 1 and e[k]["rank"] >= 1 for e in lps[1:] for k in e)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "2 3"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "3"}]}),
])
def test_prompt_logprobs_are_not_streamed(c, path, body):
    r = c.post(path, json={**BASE, **body, "stream": True, "prompt_logprobs": 1})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt_logprobs"


def test_a_prompt_is_scored_once_for_its_n_choices(c, monkeypatch):
    """n choices of one prompt share its prompt logprobs, scored by one engine request
    (each choice's scored the prompt again); the answer is the one a single choice gets,
    on every choice, whole and streamed (echo + logprobs)."""
    from tests.service.test_api import sse_events
    eng = c.app.state.serving.engine
    scored: list[int | None] = []
    add = eng.add_request

    def spy(rid, prompt_ids, params, *args, **kw):
        scored.append(params.prompt_logprobs)
        return add(rid, prompt_ids, params, *args, **kw)

    monkeypatch.setattr(eng, "add_request", spy)
    body = {**BASE, "prompt": ["2 3 5", "4 1"], "prompt_logprobs": 2}
    one = c.post("/v1/completions", json=body).json()["choices"]
    many = c.post("/v1/completions", json={**body, "n": 3}).json()["choices"]
    assert scored == [2, 2] + [2, None, None] * 2
    assert [m["prompt_logprobs"] for m in many] == [o["prompt_logprobs"] for o in one
                                                    for _ in range(3)]
    echo = {**BASE, "prompt": "2 3 5", "echo": True, "logprobs": 1, "stream": True,
            "return_token_ids": True}
    single = sse_events(c.post("/v1/completions", json=echo))[0]["choices"][0]
    scored.clear()
    firsts: dict[int, dict] = {}
    for e in sse_events(c.post("/v1/completions", json={**echo, "n": 2})):
        firsts.setdefault(e["choices"][0]["index"], e["choices"][0])
    assert scored == [1, None]
    k = len(single["prompt_token_ids"])
    for first in firsts.values():  # each choice's first chunk: the echo and its logprobs
        assert first["text"].startswith("2 3 5")
        assert {f: first["logprobs"][f][:k] for f in ("tokens", "token_logprobs",
                                                        "top_logprobs", "text_offset")} \
            == {f: single["logprobs"][f][:k] for f in ("tokens", "token_logprobs",
                                                         "top_logprobs", "text_offset")}
