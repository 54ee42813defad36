"""vLLM's ``chat_template_kwargs`` on /v1/chat/completions: more variables for the model's
Jinja chat template (a tiny checkpoint whose template reads ``greeting``), refused where
there is no template (a tekken.json checkpoint: mistral-common encodes its chats) and for
the variables the server sets itself."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient

from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings

TEMPLATE = ("{{ bos_token }}{% if greeting %}[{{ greeting }}]{% endif %}"
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
ASK = [{"role": "user", "content": "hello there"}]


def _app(model):
    return TestClient(create_app(Settings(model=model, max_model_len=256, kv_cache_gib=0.02)))


@pytest.fixture(scope="module")
def templated(tiny_checkpoint, tmp_path_factory):
    model = tmp_path_factory.mktemp("templated") / "model"
    shutil.copytree(tiny_checkpoint(tokenizer=True), model)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    with _app(model) as c:
        yield c, Tokenizer.from_dir(model)


def chat(c, **kw):
    return c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2,
                                                "temperature": 0, **kw})


def test_the_template_gets_the_variables(templated):
    c, tok = templated
    plain = chat(c).json()["usage"]["prompt_tokens"]
    assert plain == len(tok.encode_chat(ASK))
    r = chat(c, chat_template_kwargs={"greeting": "good morning to you all"})
    assert r.status_code == 200, r.text
    with_kwargs = tok.encode_chat(ASK, greeting="good morning to you all")
    assert r.json()["usage"]["prompt_tokens"] == len(with_kwargs) > plain
    assert chat(c, chat_template_kwargs={}).json()["usage"]["prompt_tokens"] == plain


@pytest.mark.parametrize("name", ["messages", "add_generation_prompt", "bos_token", "tools"])
def test_the_servers_own_variables_are_refused(templated, name):
    r = chat(templated[0], chat_template_kwargs={name: "x"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"chat_template_kwargs.{name}"


def test_a_model_without_a_template_refuses_them(tiny_checkpoint):
    with _app(tiny_checkpoint(tokenizer="tekken")) as c:
        assert chat(c).status_code == 200
        r = chat(c, chat_template_kwargs={"greeting": "hi"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "chat_template_kwargs"
        assert "mistral-common" in r.json()["error"]["message"]
