"""--served-model-name with several names (vLLM's aliases): /v1/models lists each, a
request may name any and its answer reports the name it used, the first names the model
in the metrics; another name is a 404 that lists them."""

from __future__ import annotations

import argparse

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from cli.serve import register, settings_from_args
from engine.demo_model import ensure_demo_model
from service.app import create_app
from service.settings import Settings

NAMES = ("ministral", "gpt-4o-mini")
ASK = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
       "temperature": 0}


@pytest.fixture(scope="module")
def c():
    settings = Settings(model=ensure_demo_model(), served_model_name=NAMES,
                        max_model_len=256, kv_cache_gib=0.05)
    with TestClient(create_app(settings)) as cl:
        yield cl


def test_every_name_is_listed_and_answers_as_itself(c):
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == list(NAMES)
    answers = {}
    for name in (*NAMES, None):
        body = {**ASK} if name is None else {**ASK, "model": name}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == (name or NAMES[0])
        answers[name] = r.json()["choices"][0]["message"]["content"]
    assert len(set(answers.values())) == 1  # one model behind every name
    r = c.post("/v1/messages", json={**ASK, "model": NAMES[1]})
    assert r.status_code == 200 and r.json()["model"] == NAMES[1]
    assert c.get(f"/v1/models/{NAMES[1]}").json()["id"] == NAMES[1]
    assert f'model_name="{NAMES[0]}"' in c.get("/metrics").text


def test_another_name_is_a_404_listing_the_served_ones(c):
    r = c.post("/v1/chat/completions", json={**ASK, "model": "gpt-4o"})
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and all(n in err["message"] for n in NAMES)
    assert c.get("/v1/models/gpt-4o").status_code == 404


def test_names_from_flags_and_environment(monkeypatch):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--served-model-name", *NAMES])
    assert settings_from_args(args).served_model_name == NAMES
    monkeypatch.setenv("FP8SERVE_SERVED_MODEL_NAME", ",".join(NAMES))
    assert Settings().served_model_name == NAMES
    for bad in (("a", "a"), ("a", " b")):
        with pytest.raises(ValidationError, match="served model names"):
            Settings(served_model_name=bad)
