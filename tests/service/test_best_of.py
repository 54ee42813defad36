"""OpenAI's best_of on /v1/completions: best_of candidates per prompt, the n with the
highest sum of their tokens' logprobs returned, best first; usage counts every candidate;
best_of below n, or above n with stream, is a 400 naming it. On the demo model, sampled
with a seed, so the candidates are the n=best_of choices of the same request."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from service.app import create_app
from service.settings import Settings

BODY = {"prompt": ["Once upon a time", "The weather today"], "max_tokens": 8,
        "temperature": 1.2, "seed": 7}


@pytest.fixture(scope="module")
def c():
    with TestClient(create_app(Settings(model=ensure_demo_model(), max_model_len=256,
                                        kv_cache_gib=0.05))) as cl:
        yield cl


def test_the_best_candidates_are_returned_and_every_one_is_counted(c):
    every = c.post("/v1/completions", json={**BODY, "n": 4, "logprobs": 0}).json()
    best = c.post("/v1/completions", json={**BODY, "n": 2, "best_of": 4}).json()
    shown = c.post("/v1/completions", json={**BODY, "n": 2, "best_of": 4, "logprobs": 0}
                   ).json()
    for p in range(2):  # each prompt's four candidates, ranked by their summed logprobs
        cands = every["choices"][4 * p:4 * p + 4]
        assert len({x["text"] for x in cands}) > 1  # sampled: they differ
        score = {x["text"]: sum(x["logprobs"]["token_logprobs"]) for x in cands}
        ranked = sorted(cands, key=lambda x: -score[x["text"]])
        want = [x["text"] for x in ranked[:2]]
        assert [x["text"] for x in best["choices"][2 * p:2 * p + 2]] == want
        assert [x["text"] for x in shown["choices"][2 * p:2 * p + 2]] == want
    assert [x["index"] for x in best["choices"]] == [0, 1, 2, 3]
    assert all(x["logprobs"] is None for x in best["choices"])  # not asked for: not shown
    assert best["usage"]["completion_tokens"] == every["usage"]["completion_tokens"]
    assert best["usage"]["prompt_tokens"] == every["usage"]["prompt_tokens"]


def test_best_of_equal_to_n_is_n(c):
    a = c.post("/v1/completions", json={**BODY, "n": 2, "best_of": 2}).json()
    b = c.post("/v1/completions", json={**BODY, "n": 2}).json()
    assert [x["text"] for x in a["choices"]] == [x["text"] for x in b["choices"]]


@pytest.mark.parametrize("extra", [{"n": 3, "best_of": 2}, {"best_of": 2, "stream": True}])
def test_what_best_of_cannot_do_is_a_400(c, extra):
    r = c.post("/v1/completions", json={**BODY, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
