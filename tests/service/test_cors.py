"""CORS with vLLM's flags: no CORS headers by default; --allowed-origins lets browser pages
on those origins call the API (preflight answered, the origin echoed on answers), with
the methods, headers and credentials the flags allow; other origins get none. Those
three without an origin would change nothing, so they are refused."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cli.main import build_parser, dashed
from cli.serve import settings_from_args
from service.app import create_app
from service.settings import Settings
from tests.service.fake_backend import fake_loader

PAGE = "https://chat.example.com"


def client(**kw) -> TestClient:
    return TestClient(create_app(Settings(max_model_len=64, **kw), load_backend=fake_loader()))


def preflight(c: TestClient, origin: str = PAGE):
    return c.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})


def test_no_cors_headers_by_default():
    with client() as c:
        r = c.get("/v1/models", headers={"Origin": PAGE})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        assert preflight(c).status_code == 405  # no route answers OPTIONS


def test_allowed_origins_get_cors_answers():
    with client(allowed_origins=(PAGE,), allowed_methods=("GET", "POST")) as c:
        r = preflight(c)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == PAGE
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "access-control-allow-credentials" not in r.headers
        got = c.get("/v1/models", headers={"Origin": PAGE})
        assert got.headers["access-control-allow-origin"] == PAGE
        assert preflight(c, "https://elsewhere.example").status_code == 400
        assert "access-control-allow-origin" not in c.get(
            "/v1/models", headers={"Origin": "https://elsewhere.example"}).headers


def test_any_origin_with_credentials():
    with client(allowed_origins=("*",), allow_credentials=True) as c:
        r = preflight(c, "https://any.example")
        assert r.headers["access-control-allow-origin"] == "https://any.example"
        assert r.headers["access-control-allow-credentials"] == "true"


@pytest.mark.parametrize("kw", [{"allow_credentials": True}, {"allowed_methods": ("GET",)},
                                {"allowed_headers": ("x-api-key",)}])
def test_cors_settings_without_an_origin_are_refused(kw):
    with pytest.raises(ValueError, match="which is not set"):
        Settings(**kw)


@pytest.mark.parametrize("value", ['["https://a.example", "https://b.example"]',
                                   "https://a.example,https://b.example"])
def test_the_flag_takes_vllms_json_list_or_commas(value):
    args = build_parser().parse_args(dashed(["serve", "--allowed-origins", value,
                                             "--allow-credentials"]))
    s = settings_from_args(args)
    assert s.allowed_origins == ("https://a.example", "https://b.example")
    assert s.allow_credentials and s.allowed_methods == ("*",)
