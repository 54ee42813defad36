"""GET /v1/models and /v1/models/{model} answer both APIs' clients: the openai SDK's
models.list / retrieve and the anthropic SDK's (ModelInfo: display_name, created_at,
lifecycle, max_input_tokens; pages by limit / after_id / before_id, walked whole by the
SDK's auto-pagination). Asked with anthropic-version, an unknown model is a 404 in
Anthropic's error shape; a bad cursor or limit is a 400 naming it."""

from __future__ import annotations

from datetime import datetime

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from engine.demo_model import ensure_demo_model
from service.app import create_app
from service.settings import Settings

NAMES = ("ministral", "alias-1", "alias-2")


@pytest.fixture(scope="module")
def c():
    settings = Settings(model=ensure_demo_model(), served_model_name=NAMES, max_model_len=256,
                        kv_cache_gib=0.05)
    with TestClient(create_app(settings)) as cl:
        yield cl


@pytest.fixture(scope="module")
def sdks(c):
    return (openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c,
                          max_retries=0),
            anthropic.Anthropic(base_url="http://testserver", api_key="x", http_client=c,
                                max_retries=0))


def test_the_openai_sdk_lists_and_retrieves(sdks):
    oa, _ = sdks
    listed = oa.models.list().data
    assert [m.id for m in listed] == list(NAMES)
    assert listed[0].object == "model" and listed[0].owned_by == "fp8serve"
    assert oa.models.retrieve("alias-2").id == "alias-2"


def test_the_anthropic_sdk_lists_pages_and_retrieves(sdks):
    _, an = sdks
    page = an.models.list()
    assert [m.id for m in page.data] == list(NAMES) and page.has_more is False
    info = page.data[0]
    assert info.type == "model" and info.display_name == "ministral"
    assert info.lifecycle == "active" and info.max_input_tokens == 255
    assert isinstance(info.created_at, datetime) and info.created_at.tzinfo is not None
    first = an.models.list(limit=1)
    assert [m.id for m in first.data] == ["ministral"] and first.has_more
    assert first.first_id == first.last_id == "ministral"
    assert [m.id for m in first] == list(NAMES)  # auto-pagination: after_id each page
    before = an.models.list(before_id="alias-2", limit=1)
    assert [m.id for m in before.data] == ["alias-1"] and before.has_more
    assert an.models.retrieve("alias-1").display_name == "alias-1"
    with pytest.raises(anthropic.NotFoundError) as exc:
        an.models.retrieve("claude-nope")
    assert exc.value.body["type"] == "error"
    assert exc.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("query,param", [("limit=0", "limit"), ("limit=1001", "limit"),
                                         ("after_id=nope", "after_id"),
                                         ("after_id=ministral&before_id=alias-2",
                                          "before_id"),
                                         ("order=asc", "order"), ("limit=1&limit=2", "limit")])
def test_a_bad_page_request_is_a_400_naming_it(c, query, param):
    r = c.get(f"/v1/models?{query}")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_retrieving_a_model_takes_no_query_parameter(c):
    assert c.get("/v1/models/ministral").status_code == 200
    r = c.get("/v1/models/ministral?limit=1")
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text


def test_openai_clients_keep_openai_errors(c):
    err = c.get("/v1/models/nope").json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
