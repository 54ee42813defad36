"""vLLM's use_beam_search on /v1/completions and /v1/chat/completions, on the demo model:
width 1 is the greedy answer; beams come best first by vLLM's score (cumulative logprob /
length ** length_penalty) and their logprobs are the model's (as scoring the same tokens
as a prompt reads them); the answer is the same alone, beside other prompts' searches and
under sampled load; a stream carries each beam whole; stop_token_ids and ignore_eos end
beams as they end plain generations; --request-timeout bounds the whole search; what beam
search cannot honour is a 400 naming the field. Each step's logprobs equal those of the
same tokens scored as one prompt, bit for bit (the kernels are batch-invariant)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from engine.request import FinishReason, QueueFullError
from engine.stream import RequestOutput, TokenLogprob
from service.app import create_app
from service.beam_search import BeamRequest, BeamSubmission
from service.settings import Settings

PROMPTS = ["The capital of France is", "My favourite recipe for soup"]
CHAT = {"messages": [{"role": "user", "content": "Name a color."}]}


def beams(n: int = 3, **kw) -> dict:
    return {"max_tokens": 12, "n": n, "use_beam_search": True, **kw}


@pytest.fixture(scope="module")
def c():
    with TestClient(create_app(Settings(model=ensure_demo_model(), max_model_len=256,
                                        kv_cache_gib=0.05))) as cl:
        yield cl


def texts(answer: dict) -> list[str]:
    return [ch.get("text", ch.get("message", {}).get("content")) for ch in answer["choices"]]


def test_width_one_is_the_greedy_answer(c):
    for route, body in (("/v1/completions", {"prompt": PROMPTS[0]}), ("/v1/chat/completions",
                                                                     CHAT)):
        greedy = c.post(route, json={**body, "max_tokens": 12, "temperature": 0}).json()
        beam = c.post(route, json={**body, **beams(1)}).json()
        assert texts(beam) == texts(greedy)
        for k in ("prompt_tokens", "completion_tokens"):
            assert beam["usage"][k] == greedy["usage"][k]


def test_an_eos_listed_in_stop_token_ids_ends_a_beam_as_eos(c):
    """EOS is checked before stop_token_ids, as in a plain generation: stop_reason null
    and no EOS text, even with include_stop_str_in_output."""
    eos = c.post("/tokenize", json={"prompt": "<|im_end|>", "add_special_tokens": False}
                 ).json()["tokens"][-1]
    body = {"messages": [{"role": "user", "content": "Reply with one word: yes or no?"}],
            "stop_token_ids": [eos],
            "include_stop_str_in_output": True, "skip_special_tokens": False}
    greedy = c.post("/v1/chat/completions", json={**body, "temperature": 0,
                                                  "max_tokens": 12}).json()
    beam = c.post("/v1/chat/completions", json={**body, **beams(2), "max_tokens": 12}).json()
    ended = [ch for a in (greedy, beam) for ch in a["choices"] if ch["finish_reason"] == "stop"]
    assert ended  # some answer ended on EOS
    for ch in ended:
        assert ch["stop_reason"] is None and "<|im_end|>" not in ch["message"]["content"]


@pytest.mark.parametrize("lp", [0.0, 1.0, 2.0])
def test_beams_are_ranked_by_their_score_and_carry_the_models_logprobs(c, lp):
    got = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(4, logprobs=2),
                                          "length_penalty": lp, "return_token_ids": True})
    assert got.status_code == 200, got.text
    answer = got.json()
    scores = []
    for ch in answer["choices"]:
        ids, lps = ch["token_ids"], ch["logprobs"]["token_logprobs"]
        assert len(ids) == len(lps)
        for token, top in zip(ch["logprobs"]["tokens"], ch["logprobs"]["top_logprobs"],
                              strict=True):  # the token itself and 2 alternatives
            assert token in top and len(top) in (2, 3)
        length = len(ch["prompt_token_ids"]) + len(ids) - (ch["finish_reason"] == "stop")
        scores.append(sum(lps) / length ** lp)
        # the same tokens scored as a prompt: the model's logprobs of each beam token
        scored = c.post("/v1/completions", json={
            "prompt": ch["prompt_token_ids"] + ids, "max_tokens": 1, "echo": True,
            "logprobs": 0, "temperature": 0}).json()["choices"][0]["logprobs"]
        tail = scored["token_logprobs"][len(ch["prompt_token_ids"]):-1]
        assert tail == lps  # bit for bit: the kernels are batch-invariant
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(ch["token_ids"]) for ch in answer["choices"]}) == 4
    assert [ch["index"] for ch in answer["choices"]] == [0, 1, 2, 3]


def test_the_answer_is_the_same_alone_and_under_load(c):
    alone = [c.post("/v1/completions", json={"prompt": p, **beams()}).json() for p in PROMPTS]
    together = c.post("/v1/completions", json={"prompt": PROMPTS, **beams()}).json()
    assert texts(together) == texts(alone[0]) + texts(alone[1])
    assert [ch["index"] for ch in together["choices"]] == list(range(6))

    def sampled(i: int) -> dict:
        return c.post("/v1/completions", json={"prompt": f"Story {i}:", "max_tokens": 24,
                                               "temperature": 1.0, "seed": i}).json()

    with ThreadPoolExecutor(6) as pool:
        noise = [pool.submit(sampled, i) for i in range(4)]
        loaded = [pool.submit(c.post, "/v1/completions", json={"prompt": p, **beams()})
                  for p in PROMPTS]
        chat = pool.submit(c.post, "/v1/chat/completions", json={**CHAT, **beams()})
        assert all("choices" in f.result() for f in noise)
    assert [texts(f.result().json()) for f in loaded] == [texts(a) for a in alone]
    assert texts(chat.result().json()) == texts(
        c.post("/v1/chat/completions", json={**CHAT, **beams()}).json())


def test_a_stream_carries_each_beam_whole(c):
    whole = c.post("/v1/chat/completions", json={**CHAT, **beams()}).json()
    with c.stream("POST", "/v1/chat/completions",
                  json={**CHAT, **beams(), "stream": True,
                        "stream_options": {"include_usage": True}}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    got = [""] * 3
    reasons = [None] * 3
    for ch in chunks:
        for choice in ch["choices"]:
            got[choice["index"]] += choice["delta"].get("content") or ""
            reasons[choice["index"]] = choice["finish_reason"] or reasons[choice["index"]]
    assert got == texts(whole)
    assert reasons == [ch["finish_reason"] for ch in whole["choices"]]
    for k in ("prompt_tokens", "completion_tokens"):  # cached_tokens: what the cache held
        assert chunks[-1]["usage"][k] == whole["usage"][k]
    completion = c.post("/v1/completions", json={"prompt": PROMPTS[1], **beams(),
                                                 "stream": True})
    pieces = [""] * 3
    for ln in completion.text.splitlines():
        if ln.startswith("data: {"):
            for choice in json.loads(ln[6:])["choices"]:
                pieces[choice["index"]] += choice["text"]
    assert pieces == texts(c.post("/v1/completions",
                                  json={"prompt": PROMPTS[1], **beams()}).json())


def test_stop_token_ids_end_beams_and_ignore_eos_runs_to_the_length(c):
    period = c.post("/tokenize", json={"prompt": ".", "add_special_tokens": False}
                    ).json()["tokens"][-1]
    got = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(),
                                          "stop_token_ids": [period],
                                          "return_token_ids": True}).json()
    stopped = [ch for ch in got["choices"] if ch["finish_reason"] == "stop"]
    assert stopped  # " Paris." is among the best beams
    for ch in stopped:
        if ch["stop_reason"] is not None:
            assert ch["stop_reason"] == period and ch["token_ids"][-1] == period
            assert not ch["text"].endswith(".")  # an ending stop token id is no text
    kept = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(),
                                           "stop_token_ids": [period],
                                           "include_stop_str_in_output": True}).json()
    assert [ch["text"] for ch in kept["choices"]] == [
        ch["text"] + ("." if ch["stop_reason"] == period else "") for ch in got["choices"]]
    assert any(ch["stop_reason"] == period for ch in stopped)
    free = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(),
                                           "ignore_eos": True, "return_token_ids": True}
                  ).json()
    assert all(ch["finish_reason"] == "length" and len(ch["token_ids"]) == 12
               for ch in free["choices"])


@pytest.mark.parametrize("route,extra,param", [
    ("/v1/completions", {"temperature": 0.7}, "temperature"),
    ("/v1/completions", {"top_p": 0.9}, "top_p"),
    ("/v1/completions", {"stop": ["\n"]}, "stop"),
    ("/v1/completions", {"n": 11}, "n"),
    ("/v1/completions", {"best_of": 5}, "best_of"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
    ("/v1/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"min_tokens": 2}, "min_tokens"),
    ("/v1/chat/completions", {"structured_outputs": {"regex": "[a-z]+"}},
     "structured_outputs"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
])
def test_what_beam_search_cannot_honour_is_a_400_naming_it(c, route, extra, param):
    body = {"prompt": PROMPTS[0]} if route == "/v1/completions" else CHAT
    r = c.post(route, json={**body, **beams(), **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_what_changes_nothing_is_taken(c):
    plain = texts(c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams()}).json())
    for extra in ({"temperature": 0}, {"temperature": 1}, {"seed": 5}, {"best_of": 3},
                  {"echo": True}):
        got = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(), **extra})
        assert got.status_code == 200, (extra, got.text)
        shown = texts(got.json())
        if extra.get("echo"):
            shown = [t.removeprefix(PROMPTS[0]) for t in shown]
        assert shown == plain, extra


def test_the_request_timeout_bounds_the_whole_search():
    settings = Settings(model=ensure_demo_model(), max_model_len=256, kv_cache_gib=0.05,
                        request_timeout=0.3)
    with TestClient(create_app(settings)) as cl:
        r = cl.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 200,
                                             "n": 4, "use_beam_search": True,
                                             "ignore_eos": True})
    assert r.status_code == 408, r.text


@pytest.mark.parametrize("lp", [251.0, -251.0])
def test_any_length_penalty_is_served(c, lp):
    """length ** 251 overflows a float: the ranking is computed in log space."""
    got = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(), "length_penalty": lp})
    assert got.status_code == 200, got.text
    assert len(got.json()["choices"]) == 3


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_length_penalty_without_beams_is_a_400(c, route):
    """It ranks beams: a sampled request has none to rank, so it would go unused; 1 (its
    default) changes nothing and is taken."""
    body = {"prompt": PROMPTS[0]} if route == "/v1/completions" else CHAT
    r = c.post(route, json={**body, "max_tokens": 2, "length_penalty": 0.5})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "length_penalty"
    assert "use_beam_search" in r.json()["error"]["message"]
    ok = c.post(route, json={**body, "max_tokens": 2, "length_penalty": 1})
    assert ok.status_code == 200, ok.text


def test_ranking_on_a_server_that_reports_logits_is_a_400():
    """Beams and best_of candidates are ranked by their summed log-probabilities; where
    --logprobs-mode reports logits the steps' and candidates' figures are logits, and
    summing those ranked the outputs wrongly."""
    settings = Settings(model=ensure_demo_model(), max_model_len=256, kv_cache_gib=0.05,
                        logprobs_mode="processed_logits")
    with TestClient(create_app(settings)) as cl:
        for route, body in (("/v1/completions", {"prompt": PROMPTS[0]}),
                            ("/v1/chat/completions", CHAT)):
            r = cl.post(route, json={**body, **beams()})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "use_beam_search"
            assert "--logprobs-mode" in r.json()["error"]["message"]
        sampled = {"prompt": PROMPTS[0], "max_tokens": 4, "seed": 1}
        r = cl.post("/v1/completions", json={**sampled, "n": 1, "best_of": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
        for ok in ({"n": 2, "best_of": 2}, {"n": 2, "logprobs": 1}):
            r = cl.post("/v1/completions", json={**sampled, **ok})
            assert r.status_code == 200, (ok, r.text)


def test_the_steps_are_counted_apart_in_the_metrics(c):
    def steps() -> float:
        text = c.get("/metrics").text
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("fp8serve_request_success_total")
                   and 'api="beam_search"' in ln)

    before = steps()
    got = c.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(2), "ignore_eos": True})
    assert got.status_code == 200
    assert steps() - before == 1 + 2 * 11  # a request per live beam and token (one first)


class _QueueFullEngine:
    """An engine whose queue is full for the next ``refuse`` requests; every other request
    answers at once with the same four candidates."""

    def __init__(self) -> None:
        self.refuse = 0
        self.refused = 0
        self.counted: list[bool] = []  # count_refusal of each request that went in

    def output_budget(self, num_prompt: int, asked: int | None, count: bool = False,
                      default: int | None = None) -> int:
        return asked or 4

    def add_request(self, rid, prompt, params, sink, **kw) -> None:
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            # the search waits a full queue out: its later steps' refusals are not the
            # client's (the first step's is: the request itself is refused)
            assert kw.get("count_refusal") is False, kw
            raise QueueFullError("2 requests already waiting")
        self.counted.append(kw.get("count_refusal", True))
        top = ((5, -0.25), (6, -0.5), (7, -1.0), (8, -2.0))
        sink(RequestOutput(rid, "x", (5,), (TokenLogprob(5, -0.25, top),), True,
                           FinishReason.LENGTH))

    def abort(self, rid: str) -> None:
        pass


def test_a_step_refused_by_a_full_queue_is_tried_again():
    engine = _QueueFullEngine()
    state = _state(engine)

    async def run() -> list:
        sub = BeamSubmission(state, "cmpl", [[1, 3, 4]], BeamRequest(
            2, 3, 1.0, frozenset({2}), frozenset(), None, True))
        engine.refuse = 3  # the second step is refused three times, then goes in
        return [out async for _, out in sub]

    outs = asyncio.run(run())
    assert engine.refused == 3
    assert engine.counted[0] is True and not any(engine.counted[1:])  # the first step
    assert [o.token_ids for o in outs] == [(5, 5, 5), (5, 5, 6)]
    assert all(o.finish_reason is FinishReason.LENGTH for o in outs)


class _HeldEngine(_QueueFullEngine):
    """Holds every request until it is aborted (a client that went away)."""

    def __init__(self) -> None:
        super().__init__()
        self.sinks: dict = {}

    def add_request(self, rid, prompt, params, sink, **kw) -> None:
        self.sinks[rid] = sink

    def abort(self, rid: str) -> None:
        self.sinks.pop(rid)(RequestOutput(rid, finished=True, finish_reason=FinishReason.ABORT))


def _state(engine) -> SimpleNamespace:
    return SimpleNamespace(
        engine=engine, dispatcher=None,
        settings=Settings(request_timeout=30, max_num_seqs=1, max_queue=2),
        backend=SimpleNamespace(tokenizer=SimpleNamespace(
            eos_token_ids=(2,), decode=lambda ids, skip_special_tokens=True: "x" * len(ids))))


def test_an_abort_ends_the_search_and_its_step_in_flight():
    engine = _HeldEngine()

    async def run() -> list:
        sub = BeamSubmission(_state(engine), "cmpl", [[1, 3]], BeamRequest(
            2, 8, 1.0, frozenset({2}), frozenset(), None, True))
        reader = asyncio.ensure_future(asyncio.wait_for(_all(sub), 10))
        await asyncio.sleep(0.05)
        assert len(engine.sinks) == 1  # the first step waits on the engine
        sub.abort_all()
        return await reader

    async def _all(sub) -> list:
        return [out async for _, out in sub]

    outs = asyncio.run(run())
    assert [o.finish_reason for o in outs] == [FinishReason.ABORT] * 2
    assert not engine.sinks  # nothing left in the engine


def test_a_width_beyond_what_the_server_takes_is_a_400():
    settings = Settings(model=ensure_demo_model(), max_model_len=256, kv_cache_gib=0.05,
                        max_num_seqs=1, max_queue=2)
    with TestClient(create_app(settings)) as cl:
        r = cl.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(4)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        assert cl.post("/v1/completions", json={"prompt": PROMPTS[0], **beams(3)}
                       ).status_code == 200


def test_width_one_is_greedy_on_the_published_file_set(tiny_checkpoint):
    """A chat on tokenizer.json + the published template (its long default system prompt,
    the mistral reasoning and tool parsers reading the beam)."""
    model = tiny_checkpoint(tokenizer="published")
    with TestClient(create_app(Settings(model=model, max_model_len=2048,
                                        kv_cache_gib=0.1))) as cl:
        body = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 8}
        greedy = cl.post("/v1/chat/completions", json={**body, "temperature": 0}).json()
        beam = cl.post("/v1/chat/completions", json={**body, "n": 1, "use_beam_search": True,
                                                     "return_token_ids": True}).json()
        assert [c["message"] for c in beam["choices"]] == [
            c["message"] for c in greedy["choices"]]
        wide = cl.post("/v1/chat/completions", json={**body, "n": 3, "use_beam_search": True})
        assert wide.status_code == 200 and len(wide.json()["choices"]) == 3
