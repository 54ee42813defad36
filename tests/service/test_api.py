"""API tests: the real app and engine over a fake runner/tokenizer (create_app injection)."""

import json
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from engine.checkpoint.generation import SamplingDefaults
from engine.sampling_params import SamplingParams
from service.app import create_app
from service.chat_run import make_params
from service.schemas import ChatCompletionRequest, CompletionRequest
from service.settings import Settings
from tests.engine.fake_runner import VOCAB, expected_tokens
from tests.service.fake_backend import MODEL, fake_loader


def text_of(tokens):
    return "".join(f" {t}" for t in tokens if t != 0)


def client(**kw):
    loader_kw = {k: kw.pop(k) for k in ("delay_s", "fail_on_token") if k in kw}
    settings = Settings(**{"max_model_len": 64, "max_num_seqs": 4, **kw})
    return TestClient(create_app(settings, load_backend=fake_loader(**loader_kw)))


@pytest.fixture(scope="module")
def c():
    with client() as cl:
        yield cl


def sse_events(resp):
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    lines = [ln[len("data: "):] for ln in resp.text.split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_completion_text_usage_and_finish(c):
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": "3 4 5", "max_tokens": 5,
                                        "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["choices"][0]["text"] == text_of(expected_tokens([3, 4, 5], 5))
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize("prompt,ids", [
    (["1 2", "7"], [[1, 2], [7]]),
    ([4, 9], [[4, 9]]),
    ([[4, 9], [11]], [[4, 9], [11]]),
])
def test_prompt_forms_and_n(c, prompt, ids):
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "n": 2,
                                        "temperature": 0, "ignore_eos": True})
    choices = r.json()["choices"]
    assert [ch["index"] for ch in choices] == list(range(2 * len(ids)))
    for i, ch in enumerate(choices):
        assert ch["text"] == text_of(expected_tokens(ids[i // 2], 3))
    assert r.json()["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_streaming_matches_non_streaming_with_usage(c):
    req = {"prompt": "8 8", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    full = c.post("/v1/completions", json=req).json()["choices"][0]["text"]
    events = sse_events(c.post("/v1/completions", json={
        **req, "stream": True, "stream_options": {"include_usage": True}}))
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == full
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


def test_echo_stop_and_logprobs(c):
    seq = expected_tokens([2, 3], 8)
    r = c.post("/v1/completions", json={"prompt": "2 3", "max_tokens": 8, "temperature": 0,
                                        "ignore_eos": True, "echo": True,
                                        "stop": [f" {seq[2]}"]}).json()
    assert r["choices"][0]["text"] == "2 3" + text_of(seq[:2])
    assert r["choices"][0]["finish_reason"] == "stop"
    r = c.post("/v1/completions", json={"prompt": "2 3", "max_tokens": 3, "temperature": 0,
                                        "ignore_eos": True, "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert lp["tokens"] == [f" {t}" for t in seq[:3]]
    assert all(v == pytest.approx(0.0, abs=1e-3) for v in lp["token_logprobs"])
    assert all(len(t) == 2 for t in lp["top_logprobs"])


def test_echo_with_logprobs_scores_the_prompt(c):
    """The fake model predicts (sum + len) % 50: after [2] it predicts 3 (a hit, logprob
    ~0), after [2, 3] it predicts 7, not 5 (logprob ~-20)."""
    seq = expected_tokens([2, 3, 5], 2)
    body = {"prompt": "2 3 5", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "echo": True, "logprobs": 1}
    r = c.post("/v1/completions", json=body).json()
    choice = r["choices"][0]
    assert choice["text"] == "2 3 5" + text_of(seq)
    lp = choice["logprobs"]
    assert lp["tokens"] == [" 2", " 3", " 5"] + [f" {t}" for t in seq]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1] == pytest.approx(0.0, abs=1e-3)
    assert lp["token_logprobs"][2] == pytest.approx(-20.0, abs=1e-3)
    # the token itself, then the 1 alternative (OpenAI: up to logprobs + 1 entries)
    assert list(lp["top_logprobs"][2]) == [" 5", " 7"]
    assert list(lp["top_logprobs"][1]) == [" 3"]  # the token is the likeliest
    assert lp["text_offset"][:3] == [0, 2, 4] and lp["text_offset"][3] == len("2 3 5")
    assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    events = sse_events(c.post("/v1/completions", json={**body, "stream": True}))
    first = events[0]["choices"][0]
    assert first["text"] == "2 3 5" + text_of(seq[:1])
    assert first["logprobs"]["tokens"] == lp["tokens"][:4]
    assert first["logprobs"]["token_logprobs"][:3] == lp["token_logprobs"][:3]
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]


def test_chat_plain_stream_and_logprobs(c):
    msgs = [{"role": "system", "content": "5"},
            {"role": "user", "content": [{"type": "text", "text": "6 7"}]}]
    want = text_of(expected_tokens([1, 5, 6, 7], 4))
    r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs,
                                             "max_completion_tokens": 4, "temperature": 0,
                                             "ignore_eos": True, "logprobs": True,
                                             "top_logprobs": 1}).json()
    assert r["object"] == "chat.completion"
    assert r["choices"][0]["message"] == {"role": "assistant", "content": want}
    assert len(r["choices"][0]["logprobs"]["content"]) == 4
    assert len(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1
    events = sse_events(c.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "stream": True}))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == want


def error_of(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_errors_have_openai_shape(c):
    err = error_of(c.post("/v1/completions", json={"prompt": "1", "n": 0}), 400)
    assert err["param"] == "n"
    err = error_of(c.post("/v1/completions", json={"prompt": "1", "temperature": -1}), 400)
    assert err["param"] == "temperature"
    err = error_of(c.post("/v1/completions", json={"prompt": "1 2", "max_tokens": 63}), 400)
    assert err["param"] == "max_tokens" and "max_model_len" in err["message"]
    # a prompt that alone fills max_model_len is the prompt's fault, whatever max_tokens is
    long = " ".join(["5"] * 64)
    err = error_of(c.post("/v1/completions", json={"prompt": long, "max_tokens": 1}), 400)
    assert err["param"] == "prompt" and "no room" in err["message"]
    err = error_of(c.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": long}], "max_tokens": 1}), 400)
    assert err["param"] == "messages" and "no room" in err["message"]
    for field in ("max_tokens", "max_completion_tokens"):  # the field the client sent
        err = error_of(c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "1"}], field: 63}), 400)
        assert err["param"] == field and f"{field} (63)" in err["message"]
    err = error_of(c.post("/v1/completions", json={"model": "nope", "prompt": "1"}), 404)
    assert err["param"] == "model" and err["type"] == "not_found_error"
    err = error_of(c.post("/v1/chat/completions", json={"messages": [{"role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}), 400)
    assert "does not take images" in err["message"]
    assert err["param"] == "messages.0.content.0"  # the part, in the one dotted form
    err = error_of(c.post("/v1/chat/completions", json={"messages": [
        {"role": "bad", "content": "1"}]}), 400)
    assert err["param"] == "messages.0.role"  # the schema names the template's roles
    # a tagged union's tag is no field: response_format.json_schema.name, not
    # response_format.json_schema.json_schema.name (nor the source's type in a block's)
    err = error_of(c.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "1"}], "response_format": {
            "type": "json_schema", "json_schema": {}}}), 400)
    assert err["param"] == "response_format.json_schema.name", err
    err = error_of(c.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "1"}], "response_format": {"type": "json_schema"}}), 400)
    assert err["param"] == "response_format.json_schema", err
    err = error_of(c.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "1"}], "tools": [{"type": "function", "function": {}}]}),
        400)
    assert err["param"] == "tools.0.function.name", err  # a key equal to a type value
    r = c.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]}]})
    assert r.json()["error"]["message"].startswith("messages.0.content.0.source.data:"), r.text
    error_of(c.post("/v1/completions", json={"prompt": [999]}), 400)
    error_of(c.post("/v1/completions", content=b"{not json"), 400)
    error_of(c.get("/nope"), 404)


def test_ops_endpoints(c):
    assert c.get("/health").json()["status"] == "ready"
    assert c.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert c.get(f"/v1/models/{MODEL}").json() == c.get("/v1/models").json()["data"][0]
    err = error_of(c.get("/v1/models/other/model"), 404)
    assert err["code"] == "model_not_found" and "other/model" in err["message"]
    k = c.get("/kernels").json()
    assert k["layers"][0]["kernel_id"] == "torch_w8a16" and k["hardware"]["features"]["avx2"]
    assert c.post("/tokenize", json={"prompt": "3 4"}).json()["tokens"] == [3, 4]
    assert c.post("/tokenize", json={"messages": [{"role": "user", "content": "3"}]}
                  ).json()["tokens"] == [1, 3]
    assert c.post("/detokenize", json={"tokens": [3, 4]}).json()["prompt"] == " 3 4"
    assert "version" in c.get("/version").json()


def test_metrics(c):
    c.post("/v1/completions", json={"prompt": "1 2", "max_tokens": 2, "ignore_eos": True})
    text = c.get("/metrics").text
    assert ('fp8serve_kernel_selected{kernel="torch_w8a16",platform="cpu",'
            'scale_kind="per_tensor"} 4.0') in text
    assert 'fp8serve_kernel_rejections{kernel="avx512_w8a16",reason="no avx512"} 4.0' in text
    assert ('fp8serve_kernel_runtime_fallbacks_total{from_kernel="avx2_w8a16",'
            'to_kernel="torch_w8a16"} 1.0') in text
    assert 'fp8serve_layer_group_kernel{kernel="torch_w8a16",layer_group="q_proj"} 2.0' in text
    assert ('fp8serve_kernel_startup_fallbacks{from_kernel="avx2_w8a16",layer_group="q_proj",'
            'to_kernel="torch_w8a16"} 1.0') in text
    assert 'fp8serve_hardware_feature{feature="avx2"} 1.0' in text
    assert 'fp8serve_hardware_feature{feature="avx512f"} 0.0' in text
    assert 'fp8serve_extension_info{' in text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f'fp8serve_{name}{{model_name="{MODEL}"}}' in text
    assert ('fp8serve_request_success_total{api="completions",finished_reason="length",'
            f'model_name="{MODEL}"}}') in text
    for h in ("time_to_first_token_seconds", "inter_token_latency_seconds",
              "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert f"fp8serve_{h}_bucket" in text


def _step_counts(c) -> dict[str, float]:
    text = c.get("/metrics").text
    counts = {}
    for kind in ("decode", "prefill", "mixed"):
        line = f'fp8serve_engine_step_seconds_count{{kind="{kind}",model_name="{MODEL}"}}'
        counts[kind] = float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])
    return counts


def test_engine_step_histogram_by_kind(c):
    before = _step_counts(c)
    c.post("/v1/completions", json={"prompt": "1 2", "max_tokens": 3, "ignore_eos": True})
    # the engine thread records a step after it publishes the step's tokens: the answer
    # may come back before its last step is counted
    end = time.monotonic() + 5
    while (after := _step_counts(c))["decode"] - before["decode"] < 2 \
            and time.monotonic() < end:
        time.sleep(0.01)
    # one step prefills the 2-token prompt (sampling token 1), two decode tokens 2 and 3
    assert after["prefill"] - before["prefill"] == 1
    assert after["decode"] - before["decode"] == 2
    assert after["mixed"] == before["mixed"]


def test_auth_on():
    with client(api_keys=("k1", "k2")) as cl:
        err = error_of(cl.post("/v1/completions", json={"prompt": "1"}), 401)
        assert err["type"] == "authentication_error"
        error_of(cl.get("/v1/models", headers={"Authorization": "Bearer k3"}), 401)
        error_of(cl.get("/kernels"), 401)
        assert cl.get("/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
        assert cl.get("/health").status_code == 200
        assert cl.get("/ping").status_code == 200 and cl.post("/ping").status_code == 200
        assert cl.get("/metrics").status_code == 200


def test_queue_full_timeout_and_drain():
    with client(max_num_seqs=1, max_queue=1, request_timeout=0.3, delay_s=0.02) as cl:
        eng = cl.app.state.serving.engine
        long = SamplingParams(max_tokens=40, ignore_eos=True)
        eng.add_request("hog1", [1], long, lambda o: None)
        eng.add_request("hog2", [1], long, lambda o: None)
        while eng.stats().num_running != 1:  # hog1 runs, hog2 waits
            time.sleep(0.01)
        err = error_of(cl.post("/v1/completions", json={"prompt": "1"}), 429)
        assert cl.post("/v1/completions", json={"prompt": "1"}).headers["retry-after"] == "1"
        assert err["type"] == "rate_limit_error"
        eng.abort("hog1")
        eng.abort("hog2")
        while eng.num_unfinished:
            time.sleep(0.01)
        err = error_of(cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 60,
                                                        "ignore_eos": True}), 408)
        assert "timed out" in err["message"]
        cl.app.state.serving.begin_drain()
        r = cl.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "draining"
        for r in (cl.get("/ping"), cl.post("/ping")):  # vLLM's liveness route: the same
            assert r.status_code == 503 and r.json()["status"] == "draining"
        error_of(cl.post("/v1/completions", json={"prompt": "1"}), 503)


def metric_values(cl, name: str) -> list[str]:
    """The lines of one metric family in /metrics."""
    return [line for line in cl.get("/metrics").text.splitlines() if line.startswith(name)]


def test_more_choices_than_ever_fit_are_a_400_and_a_full_queue_refuses_them_whole():
    """n (or best_of) past --max-num-seqs + --max-queue could never run: a 400 naming
    it (it was a 429 on an idle server, on every retry). Choices that do not fit the queue
    now refuse the request whole: one refusal, nothing queued and aborted."""
    with client(max_num_seqs=2, max_queue=3, delay_s=0.02) as cl:
        err = error_of(cl.post("/v1/completions", json={"prompt": "1", "n": 6}), 400)
        assert err["param"] == "n" and "--max-num-seqs" in err["message"]
        err = error_of(cl.post("/v1/completions", json={"prompt": "1", "n": 2,
                                                        "best_of": 6}), 400)
        assert err["param"] == "best_of"
        err = error_of(cl.post("/v1/completions", json={"prompt": ["1", "2"], "n": 3}), 400)
        assert err["param"] == "n"
        assert cl.post("/v1/completions", json={"prompt": "1", "n": 5, "max_tokens": 2}
                       ).status_code == 200
        eng = cl.app.state.serving.engine
        long = SamplingParams(max_tokens=40, ignore_eos=True)
        for i in range(3):  # two run, one waits: room for 2 more
            eng.add_request(f"hog{i}", [1], long, lambda o: None)
        while eng.stats().num_running != 2:
            time.sleep(0.01)
        before = metric_values(cl, "fp8serve_requests_aborted_total")
        error_of(cl.post("/v1/completions", json={"prompt": "1", "n": 3}), 429)
        assert metric_values(cl, "fp8serve_requests_aborted_total") == before
        for i in range(3):
            eng.abort(f"hog{i}")


def test_a_request_taken_before_a_drain_still_runs_in_it():
    """One still being prepared when SIGTERM came (its body arriving, its prompt being
    tokenized) gets --drain-timeout as the others do (it was a 503)."""
    with client(delay_s=0.02) as cl:
        state = cl.app.state.serving
        tok = state.backend.tokenizer
        encode = tok.encode

        def slow_encode(*a, **k):  # the drain begins while this request is prepared
            state.begin_drain()
            return encode(*a, **k)

        tok.encode = slow_encode
        try:
            r = cl.post("/v1/completions", json={"prompt": "5 6", "max_tokens": 2})
        finally:
            tok.encode = encode
        assert r.status_code == 200, r.text
        error_of(cl.post("/v1/completions", json={"prompt": "5 6", "max_tokens": 2}), 503)


def test_error_after_stream_started_sends_error_event_then_done():
    seq = expected_tokens([5, 6], 4)
    with client(fail_on_token=seq[1]) as cl:
        events = sse_events(cl.post("/v1/completions", json={
            "prompt": "5 6", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream": True}))
        assert [e["choices"][0]["text"] for e in events[:2]] == [f" {seq[0]}", f" {seq[1]}"]
        assert "poisoned" in events[-1]["error"]["message"]
        # the same error code as the whole answer's (the stream said "error")
        whole = error_of(cl.post("/v1/completions", json={
            "prompt": "5 6", "max_tokens": 4, "temperature": 0, "ignore_eos": True}), 500)
        assert events[-1]["error"]["code"] == whole["code"] == "engine_error"
        assert cl.get("/health").json()["status"] == "ready"


def test_a_body_over_the_limit_is_a_413_before_it_is_read():
    """--max-request-body-mib: by Content-Length, and by the bytes read when a chunked body
    has none; a body within the limit is served."""
    with client(max_request_body_mib=1) as cl:
        big = b'{"prompt": "' + b"5 " * (2**20) + b'"}'
        err = error_of(cl.post("/v1/completions", content=big,
                               headers={"content-type": "application/json"}), 413)
        assert "--max-request-body-mib" in err["message"]

        def chunks():
            yield big[:1000]
            yield big[1000:]
        err = error_of(cl.post("/v1/completions", content=chunks(),
                               headers={"content-type": "application/json"}), 413)
        r = cl.post("/v1/messages", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "request_too_large"  # Anthropic's 413 type
        assert cl.post("/v1/completions", json={"prompt": "5", "max_tokens": 1}
                       ).status_code == 200


def test_a_prompt_too_long_for_any_encoding_is_refused_before_it_is_encoded(monkeypatch):
    """A text of more characters than max_model_len tokens can hold is a 400 without the
    tokenizer seeing it (it took seconds and gigabytes for megabytes of text)."""
    with client() as cl:
        tok = cl.app.state.serving.backend.tokenizer
        seen = []
        monkeypatch.setattr(tok, "encode", lambda text, *a, **k: seen.append(text) or [5])
        monkeypatch.setattr(tok, "max_token_bytes", 2, raising=False)  # the fake has none
        most = 2 * 64 * tok.max_token_bytes
        long = "5" * (most + 1)
        err = error_of(cl.post("/v1/completions", json={"prompt": long}), 400)
        assert err["param"] == "prompt" and "cannot fit max_model_len" in err["message"]
        err = error_of(cl.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": [{"type": "text", "text": long}]}]}), 400)
        assert err["param"] == "messages" and "cannot fit" in err["message"]
        assert not seen
        # at the bound it is the tokenizer's to count (and with truncation it is kept)
        cl.post("/v1/completions", json={"prompt": long[1:], "max_tokens": 1})
        cl.post("/v1/completions", json={"prompt": long, "max_tokens": 1,
                                         "truncate_prompt_tokens": 8})
        assert len(seen) == 2
        # a text cut to its last tokens, or only counted (/tokenize), may run past that
        # bound 4 times, no more (8 MB of text took 1.4 GB to encode: none is unbounded)
        huge = "5" * (4 * most + 1)
        for path, body, param in (
                ("/v1/completions", {"prompt": huge, "truncate_prompt_tokens": 8}, "prompt"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}],
                                          "truncate_prompt_tokens": 8}, "messages"),
                ("/tokenize", {"prompt": huge}, "prompt"),
                ("/tokenize", {"messages": [{"role": "user", "content": huge}]},
                 "messages")):
            err = error_of(cl.post(path, json=body), 400)
            assert err["param"] == param and "4 times" in err["message"], (path, err)
        assert len(seen) == 2
        cl.post("/tokenize", json={"prompt": huge[1:]})
        assert len(seen) == 3


def rejected(cl, zeros: bool = False) -> dict[str, float]:
    """requests_rejected_total by reason: the reasons counted so far (``zeros``: every
    series exported, those still at 0 too)."""
    from prometheus_client.parser import text_string_to_metric_families
    fams = text_string_to_metric_families(cl.get("/metrics").text)
    return {s.labels["reason"]: s.value for f in fams
            if f.name == "fp8serve_requests_rejected" for s in f.samples
            if s.name.endswith("_total") and (zeros or s.value)}


def test_the_usual_refusals_are_exported_as_zeros_before_the_first():
    """A counter series born at its first refusal starts at 1: rate() and increase() see no
    step, and a burst of 400s read 0 on the dashboard's 'Finished requests' panel. The
    engine's refusals and the service's usual statuses start at 0."""
    with client() as cl:
        assert rejected(cl, zeros=True) == {
            r: 0.0 for r in ("InvalidRequestError", "QueueFullError",
                             "EngineUnavailableError", "http_400", "http_401", "http_404",
                             "http_413")}
        cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 0})
        assert rejected(cl) == {"http_400": 1}


def test_every_grammar_kind_of_the_draft_counters_is_exported_as_zero_first():
    """The spec_decode counters' series for a grammar kind were born at its first draft,
    already above 0, so rate() lost that first step: every kind starts at 0."""
    from prometheus_client.parser import text_string_to_metric_families

    from service.metrics import SPEC_GRAMMARS
    with client() as cl:
        fams = list(text_string_to_metric_families(cl.get("/metrics").text))
    for name in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                 "spec_decode_num_accepted_tokens"):
        got = {s.labels["grammar"]: s.value for f in fams if f.name == f"fp8serve_{name}"
               for s in f.samples if s.name.endswith("_total")}
        assert got == dict.fromkeys(SPEC_GRAMMARS, 0.0), name


def test_every_refusal_is_counted_once():
    """fp8serve_requests_rejected_total counts the service's refusals by status (only the
    engine's were counted: a bad field, a wrong model, a missing key moved nothing), and
    an engine refusal once, under its own reason."""
    with client(api_keys=("k",), max_request_body_mib=1) as cl:
        auth = {"Authorization": "Bearer k"}
        cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 0}, headers=auth)
        cl.post("/v1/completions", json={"prompt": [999]}, headers=auth)
        cl.post("/v1/completions", json={"prompt": "1", "model": "nope"}, headers=auth)
        cl.post("/v1/completions", json={"prompt": "1"})
        cl.post("/v1/completions", content=b"x" * (2**20 + 1), headers=auth)
        cl.post("/v1/completions", json={"prompt": "1 2", "max_tokens": 63}, headers=auth)
        assert cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 1},
                       headers=auth).status_code == 200
        # a path or method no route serves is no refused API request (a scanner's
        # /favicon.ico counted as http_404 beside the unknown model)
        assert cl.get("/favicon.ico", headers=auth).status_code == 404
        assert cl.delete("/v1/completions", headers=auth).status_code == 405
        # nor is one without a key: refused (401) before its body is read, not counted
        assert cl.get("/favicon.ico").status_code == 401
        assert cl.delete("/v1/completions").status_code == 401
        assert cl.post("/nope", content=b"x" * (2**20 + 1), headers=auth).status_code == 413
        assert cl.post("/nope", content=b'{"a": "\\ud800"}', headers={
            **auth, "content-type": "application/json"}).status_code == 400
        # a body FastAPI cannot read (bytes that are no UTF-8) is a refused API request
        assert cl.post("/v1/completions", content=b'{"prompt": "\xff"}', headers={
            **auth, "content-type": "application/json"}).status_code == 400
        assert rejected(cl) == {"http_400": 3, "http_404": 1, "http_401": 1, "http_413": 1,
                                "InvalidRequestError": 1}
        # an engine refusal renamed for each API, and beam search's own budget check
        long = " ".join(["5"] * 64)
        user = [{"role": "user", "content": long}]
        for path, body in (("/v1/chat/completions", {"messages": user, "max_tokens": 1}),
                           ("/v1/messages", {"messages": user, "max_tokens": 1}),
                           ("/v1/responses", {"input": long, "max_output_tokens": 16}),
                           ("/v1/completions", {"prompt": "1 2", "max_tokens": 63,
                                                "use_beam_search": True, "n": 2})):
            r = cl.post(path, json=body, headers=auth)
            assert r.status_code == 400, (path, r.text)
        assert rejected(cl) == {"http_400": 3, "http_404": 1, "http_401": 1, "http_413": 1,
                                "InvalidRequestError": 5}


def test_stop_strings_are_bounded():
    """Each stop string is searched and held back at every token on the engine thread:
    thousands of long ones cost every request's steps seconds (64 of at most 512
    characters; OpenAI's limit is 4)."""
    with client() as cl:
        for stop in (["x"] * 65, ["y" * 513], "z" * 513):
            err = error_of(cl.post("/v1/completions", json={"prompt": "1", "stop": stop}), 400)
            assert err["param"].startswith("stop"), err
        r = cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 2,
                                             "stop": ["s" * 512] * 64})
        assert r.status_code == 200, r.text
        r = cl.post("/v1/messages", json={"model": MODEL, "max_tokens": 2,
                                          "messages": [{"role": "user", "content": "hi"}],
                                          "stop_sequences": ["x"] * 65})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_bad_words_are_bounded():
    """Each is encoded twice (off the event loop) and checked at every step: 1024 of at
    most 512 characters."""
    with client() as cl:
        err = error_of(cl.post("/v1/completions", json={"prompt": "1",
                                                        "bad_words": ["w"] * 1025}), 400)
        assert err["param"].startswith("bad_words"), err
        r = cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 2,
                                             "bad_words": ["qqq"] * 1024})
        assert r.status_code == 200, r.text


def test_whole_answers_are_built_off_the_event_loop(monkeypatch):
    """Formatting and encoding a large whole answer (n=16, top_logprobs 20: 24 MB) held
    the event loop, /health and every stream with it, for seconds: it runs on a worker
    thread (no running loop there)."""
    import asyncio

    from service.openai_format import Formatter

    where: list[bool] = []

    def on_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    for name in ("chat", "completion"):
        real = getattr(Formatter, name)

        def spy(self, *a, _real=real, **k):
            where.append(on_loop())
            return _real(self, *a, **k)
        monkeypatch.setattr(Formatter, name, spy)
    with client() as cl:
        assert cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 2}
                       ).status_code == 200
        assert cl.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "1"}], "max_tokens": 2}).status_code == 200
    assert where == [False, False]


def test_a_keyless_request_is_refused_before_its_body_is_read():
    """A keyless client made the server read and parse up to --max-request-body-mib of
    JSON (and walk it for lone surrogates) before the key was checked: the 401 comes
    first now, in the API's own shape, and the open routes stay open."""
    with client(api_keys=("k1",)) as cl:
        for body in (b'{"prompt": "\\ud800"}', b"not json at all"):
            r = cl.post("/v1/completions", content=body,
                        headers={"content-type": "application/json"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = cl.post("/v1/messages", content=b'{"x": "\\ud800"}',
                    headers={"content-type": "application/json"})
        assert r.status_code == 401 and r.json()["type"] == "error"
        assert cl.get("/health").status_code == 200
        assert cl.get("/openapi.json").status_code == 200
        r = cl.post("/v1/completions", json={"prompt": "1", "max_tokens": 1},
                    headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200


def test_seed_minus_one_is_no_seed_as_in_vllm():
    """vLLM reads seed -1 as "no seed" (clients send it for a random answer); any other
    integer, negative ones included, seeds the request (and n's choices: seed + j)."""
    state = SimpleNamespace(backend=SimpleNamespace(
        sampling_defaults=SamplingDefaults(), tokenizer=SimpleNamespace(vocab_size=VOCAB)))
    for body in (CompletionRequest(prompt="1"),
                 ChatCompletionRequest(messages=[{"role": "user", "content": "1"}])):
        def seed(value, body=body):
            return make_params(state, body.model_copy(update={"seed": value}), None).seed
        assert seed(-1) is None and seed(-2) == -2 and seed(0) == 0 and seed(None) is None
