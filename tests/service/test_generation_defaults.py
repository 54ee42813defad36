"""Sampling defaults from generation_config.json: applied to the fields a request leaves
out, never over a value the client sent, and off with --generation-config none."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.generation import SamplingDefaults
from service.app import create_app
from service.backend import load_backend
from service.schemas import ChatCompletionRequest, CompletionRequest
from service.settings import Settings
from tests.service.fake_backend import MODEL, fake_loader

DEFAULTS = SamplingDefaults(temperature=0.15, top_p=0.9, top_k=20, min_p=0.05,
                            repetition_penalty=1.1, max_tokens=3)


def test_left_out_fields_take_the_defaults() -> None:
    body = CompletionRequest(prompt="hi")
    kw = body.sampling_kwargs(DEFAULTS)
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["min_p"],
            kw["repetition_penalty"]) == (0.15, 0.9, 20, 0.05, 1.1)
    assert body.output_limit(DEFAULTS.max_tokens) == 3
    assert body.output_limit(None) == 16  # OpenAI's completions default


def test_values_sent_win_even_when_equal_to_the_schema_default() -> None:
    body = CompletionRequest(prompt="hi", temperature=1.0, top_k=-1, max_tokens=16)
    kw = body.sampling_kwargs(DEFAULTS)
    assert (kw["temperature"], kw["top_k"], kw["top_p"]) == (1.0, -1, 0.9)
    assert body.output_limit(3) == 16
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}],
                                 max_completion_tokens=7)
    assert chat.output_limit(3) == 7
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "x"}]) \
        .output_limit(3) == 3


def test_null_is_the_default_as_openai_and_vllm_read_it() -> None:
    """null for a field with a default (the openai SDK's temperature=None) is that field
    left out: the model's default applies; a required field's null stays a 400."""
    nulls = {k: None for k in ("temperature", "top_p", "top_k", "min_p",
                               "repetition_penalty", "n", "stream", "presence_penalty",
                               "frequency_penalty", "ignore_eos", "min_tokens", "echo")}
    body = CompletionRequest.model_validate({"prompt": "hi", **nulls})
    kw = body.sampling_kwargs(DEFAULTS)
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["min_p"],
            kw["repetition_penalty"]) == (0.15, 0.9, 20, 0.05, 1.1)
    assert (body.n, body.stream, kw["presence_penalty"], body.echo) == (1, False, 0.0, False)
    chat = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}], "logprobs": None,
        "parallel_tool_calls": None, "add_generation_prompt": None, **nulls})
    assert (chat.logprobs, chat.parallel_tool_calls, chat.add_generation_prompt) == (
        False, True, True)
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": None})
    with pytest.raises(ValidationError):  # not null: still checked
        CompletionRequest.model_validate({"prompt": "hi", "temperature": "1"})


def test_served_requests_use_the_default_max_tokens() -> None:
    settings = Settings(max_model_len=64, max_num_seqs=4)
    app = create_app(settings, load_backend=fake_loader(
        sampling_defaults=SamplingDefaults(max_tokens=3)))
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6],
                                            "max_tokens": 5})
        assert r.json()["usage"]["completion_tokens"] == 5
        r = c.post("/v1/chat/completions",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "6 7"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_a_default_max_tokens_over_the_room_left_is_a_cap_not_a_400() -> None:
    """The model's max_new_tokens (a generation_config made for a longer context than the
    server's --max-model-len) stops the output at the room the prompt leaves, as vLLM
    caps it; a max_tokens the client sent over that room is still a 400."""
    settings = Settings(max_model_len=64, max_num_seqs=4)
    app = create_app(settings, load_backend=fake_loader(
        sampling_defaults=SamplingDefaults(max_tokens=100)))
    prompt = " ".join(["5"] * 58)
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6],
                                            "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 62
        for extra in ({}, {"use_beam_search": True}):
            r = c.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": prompt}],
                "ignore_eos": True, **extra})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 64 - 59
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6],
                                            "max_tokens": 100})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("mode,want", [("auto", {"temperature": 0.3, "max_tokens": 9}),
                                       ("none", {})])
def test_load_backend_reads_generation_config_unless_none(tiny_checkpoint, tmp_path,
                                                          mode, want) -> None:
    model = tmp_path / "m"
    shutil.copytree(tiny_checkpoint(tokenizer=True), model)
    gen = json.loads((model / "generation_config.json").read_text())
    gen.update(temperature=0.3, max_new_tokens=9, do_sample=True)
    (model / "generation_config.json").write_text(json.dumps(gen))
    backend = load_backend(Settings(model=model, generation_config=mode, kv_cache_gib=0.01))
    assert backend.sampling_defaults.as_dict() == want


def test_vllms_generation_config_forms(tiny_checkpoint, tmp_path) -> None:
    """--generation-config vllm is none (vLLM's word), a directory reads the
    generation_config.json there, and --override-generation-config sets its keys over
    whichever defaults were read (alone with none / vllm), as vLLM does."""
    model = tmp_path / "m"
    shutil.copytree(tiny_checkpoint(tokenizer=True), model)
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.3,
                                                              "top_p": 0.8}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"top_k": 7}))

    def defaults(**kw):
        return load_backend(Settings(model=model, kv_cache_gib=0.01, **kw)
                            ).sampling_defaults.as_dict()

    assert defaults(generation_config="vllm") == {}
    assert defaults(generation_config=str(other)) == {"top_k": 7}
    over = '{"temperature": 0.5, "max_new_tokens": 12}'
    assert defaults(override_generation_config=over) == {"temperature": 0.5, "top_p": 0.8,
                                                         "max_tokens": 12}
    assert defaults(generation_config="vllm", override_generation_config=over) == {
        "temperature": 0.5, "max_tokens": 12}


@pytest.mark.parametrize("kw,words", [
    ({"override_generation_config": '{"temprature": 1}'}, "temprature: not sampling"),
    ({"override_generation_config": "[1]"}, "a JSON object"),
    ({"override_generation_config": "{"}, "not JSON"),
    ({"generation_config": "/nowhere/at/all"}, "not auto, vllm, none or a directory"),
    # a directory without the file: it started with no defaults, without a word
    ({"generation_config": "/"}, "/ holds no generation_config.json"),
])
def test_bad_generation_config_flags_are_refused(kw, words) -> None:
    with pytest.raises(ValueError, match=words):
        Settings(**kw)


def test_an_override_a_request_could_not_send_fails_at_startup(tiny_checkpoint) -> None:
    with pytest.raises(CheckpointError, match="--override-generation-config: top_p"):
        load_backend(Settings(model=tiny_checkpoint(tokenizer=True), kv_cache_gib=0.01,
                              override_generation_config='{"top_p": 1.5}'))
