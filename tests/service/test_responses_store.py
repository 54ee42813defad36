"""Stored responses on the scripted model (tests/service/scripted_backend.py): a
continuation by previous_response_id answers what the whole history sent again answers
(same output items, same prompt length), in both modes; instructions are not carried;
GET returns the answer as it was given, DELETE forgets it, input_items pages the
request's own items; store false, a server that stores nothing, another API key and an
unknown id each get their documented answer; the openai SDK's calls; and the store's
own LRU byte budget."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from service.store.responses import ResponseStore, tenant_of
from tests.service.conformance import final_response, response_items
from tests.service.scripted_backend import scripted_loader
from tests.service.test_chat_tools_api import SCRIPTS, make_client
from tests.service.test_responses_api import TOOLS, events


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def post(client, **body) -> dict:
    r = client.post("/v1/responses", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def final(client, **body) -> dict:
    """The streamed response's last snapshot (response.completed / .incomplete)."""
    return events(client, {"temperature": 0, **body})[-1]["response"]


def plain(items: list[dict]) -> list[dict]:
    """Output items without their ids (each answer draws its own item and call ids)."""
    return [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in items]


def results(first: dict) -> list[dict]:
    return [{"type": "function_call_output", "call_id": o["call_id"], "output": "<script3>"}
            for o in first["output"] if o["type"] == "function_call"]


@pytest.mark.parametrize("streamed", [False, True])
def test_continuation_answers_what_the_whole_history_answers(client, streamed):
    answer = final if streamed else post
    first = answer(client, input="<script0>", tools=TOOLS)
    assert first["store"] is True and len(results(first)) == 2
    chained = answer(client, input=results(first), tools=TOOLS,
                     previous_response_id=first["id"])
    history = [{"role": "user", "content": "<script0>"}, *first["output"], *results(first)]
    replayed = post(client, input=history, tools=TOOLS)
    assert plain(chained["output"]) == plain(replayed["output"])
    assert chained["usage"]["input_tokens"] == replayed["usage"]["input_tokens"]
    assert chained["previous_response_id"] == first["id"]
    # a third turn continues the second: the context is the whole chain
    third = post(client, input="<script5>", previous_response_id=chained["id"])
    again = post(client, input=[*history, *chained["output"],
                                {"role": "user", "content": "<script5>"}])
    assert plain(third["output"]) == plain(again["output"])
    assert third["usage"]["input_tokens"] == again["usage"]["input_tokens"]
    assert third["usage"]["input_tokens"] > chained["usage"]["input_tokens"]


def test_instructions_are_not_carried_over(client):
    first = post(client, input="<script5>", instructions="Be brief.")
    chained = post(client, input="<script1>", previous_response_id=first["id"])
    without = post(client, input=[{"role": "user", "content": "<script5>"},
                                  *first["output"], {"role": "user", "content": "<script1>"}])
    assert chained["instructions"] is None
    assert chained["usage"]["input_tokens"] == without["usage"]["input_tokens"]
    with_them = post(client, input="<script1>", instructions="Be brief.",
                     previous_response_id=first["id"])
    assert with_them["usage"]["input_tokens"] > chained["usage"]["input_tokens"]


def test_get_returns_the_answer_as_given(client):
    body = post(client, input="<script1>", metadata={"run": "7"})
    assert body["metadata"] == {"run": "7"}
    assert client.get(f"/v1/responses/{body['id']}").json() == body
    snap = final(client, input="<script1>")
    assert client.get(f"/v1/responses/{snap['id']}").json() == snap
    cut = post(client, input="<script1>", max_output_tokens=2)  # incomplete is kept too
    assert client.get(f"/v1/responses/{cut['id']}").json()["status"] == "incomplete"
    assert post(client, input="<script5>", previous_response_id=cut["id"])["output"]


def test_delete_forgets_and_cancel_is_for_background_only(client):
    rid = post(client, input="<script5>")["id"]
    r = client.post(f"/v1/responses/{rid}/cancel")
    assert r.status_code == 400 and "only background" in r.json()["error"]["message"]
    assert client.delete(f"/v1/responses/{rid}").json() == {
        "id": rid, "object": "response", "deleted": True}
    for r in (client.get(f"/v1/responses/{rid}"), client.delete(f"/v1/responses/{rid}"),
              client.post(f"/v1/responses/{rid}/cancel")):
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.post("/v1/responses", json={"input": "x", "previous_response_id": rid})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": f"Previous response with id {rid!r} not found.",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}


def test_store_false_keeps_nothing(client):
    body = post(client, input="<script5>", store=False)
    assert body["store"] is False
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404


def test_input_items_pages_the_requests_own_items(client):
    first = post(client, input="<script0>", tools=TOOLS)
    items = [*results(first), {"role": "user", "content": "<script5>"},
             {"type": "message", "role": "developer",
              "content": [{"type": "input_text", "text": "note"}]}]
    rid = post(client, input=items, tools=TOOLS, previous_response_id=first["id"])["id"]
    url = f"/v1/responses/{rid}/input_items"
    asc = client.get(url, params={"order": "asc"}).json()
    assert [i["type"] for i in asc["data"]] == ["function_call_output"] * 2 + ["message"] * 2
    assert asc["data"][2]["content"] == [{"type": "input_text", "text": "<script5>"}]
    assert asc["data"][3]["role"] == "developer" and not asc["has_more"]
    ids = [i["id"] for i in asc["data"]]
    assert len(set(ids)) == 4 and (asc["first_id"], asc["last_id"]) == (ids[0], ids[-1])
    desc = client.get(url).json()  # newest first by default, as OpenAI's
    assert [i["id"] for i in desc["data"]] == ids[::-1]
    page = client.get(url, params={"order": "asc", "limit": 2}).json()
    assert [i["id"] for i in page["data"]] == ids[:2] and page["has_more"]
    rest = client.get(url, params={"order": "asc", "after": page["last_id"]}).json()
    assert [i["id"] for i in rest["data"]] == ids[2:] and not rest["has_more"]
    # a string input is one user message
    one = post(client, input="<script5>")["id"]
    assert client.get(f"/v1/responses/{one}/input_items").json()["data"][0]["content"] == [
        {"type": "input_text", "text": "<script5>"}]


@pytest.mark.parametrize("query, param", [
    ({"after": "msg_nope"}, "after"), ({"include": "message.input_image.image_url"},
                                       "include"), ({"limit": 0}, "limit")])
def test_input_items_refusals_name_the_parameter(client, query, param):
    rid = post(client, input="<script5>")["id"]
    r = client.get(f"/v1/responses/{rid}/input_items", params=query)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), r.text


@pytest.mark.parametrize("query", [{"stream": "true"}, {"include": "reasoning"},
                                   {"starting_after": "3"}])
def test_retrieve_refuses_what_it_cannot_serve(client, query):
    rid = post(client, input="<script5>")["id"]
    r = client.get(f"/v1/responses/{rid}", params=query)
    assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(query)), r.text
    assert client.get(f"/v1/responses/{rid}", params={"stream": "false"}).status_code == 200


@pytest.mark.parametrize("method, suffix, query", [
    ("get", "", {"limit": "5"}), ("get", "", {"order": "asc"}), ("get", "", {"after": "x"}),
    ("delete", "", {"force": "true"}), ("post", "/cancel", {"force": "true"})])
def test_a_query_parameter_a_route_does_not_take_is_refused(client, method, suffix, query):
    """Paging belongs to input_items: on the response itself, and on delete and cancel
    (which take none), a query parameter is a 400 naming it, not ignored."""
    rid = post(client, input="<script5>")["id"]
    r = client.request(method, f"/v1/responses/{rid}{suffix}", params=query)
    assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(query)), r.text
    assert client.get(f"/v1/responses/{rid}").status_code == 200  # nothing was deleted


def test_an_output_must_answer_a_call_of_the_chain(client):
    first = post(client, input="<script0>", tools=TOOLS)
    stray = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
    r = client.post("/v1/responses", json={"input": stray, "tools": TOOLS,
                                           "previous_response_id": first["id"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.call_id"
    assert "previous response" in r.json()["error"]["message"]


def test_a_server_that_stores_nothing():
    with make_client(responses_store_mib=0) as c:
        body = post(c, input="<script5>")
        assert body["store"] is False
        assert c.get(f"/v1/responses/{body['id']}").status_code == 404
        r = c.post("/v1/responses", json={"input": "x", "store": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "store"
        r = c.post("/v1/responses", json={"input": "x", "previous_response_id": body["id"]})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "previous_response_not_found"
        assert "--responses-store-mib 0" in r.json()["error"]["message"]


def test_each_api_key_reads_only_its_own():
    cfg = Settings(max_model_len=512, api_keys=("key-one", "key-two"))
    with TestClient(create_app(cfg, load_backend=scripted_loader(SCRIPTS))) as c:
        one, two = ({"Authorization": f"Bearer {k}"} for k in ("key-one", "key-two"))
        r = c.post("/v1/responses", json={"input": "<script5>"}, headers=one)
        rid = r.json()["id"]
        assert c.get(f"/v1/responses/{rid}", headers=one).status_code == 200
        assert c.get(f"/v1/responses/{rid}", headers={"x-api-key": "key-one"}
                     ).status_code == 200  # the same key, Anthropic's header
        assert c.get(f"/v1/responses/{rid}", headers=two).status_code == 404
        assert c.delete(f"/v1/responses/{rid}", headers=two).status_code == 404
        r = c.post("/v1/responses", headers=two,
                   json={"input": "x", "previous_response_id": rid})
        assert r.status_code == 400
        assert c.get(f"/v1/responses/{rid}").status_code == 401


def test_the_openai_sdk(client):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    first = sdk.responses.create(model="scripted-model", input="<script0>", tools=TOOLS,
                                 metadata={"turn": "1"})
    outputs = [{"type": "function_call_output", "call_id": o.call_id, "output": "<script3>"}
               for o in first.output if o.type == "function_call"]
    with sdk.responses.stream(model="scripted-model", input=outputs, tools=TOOLS,
                              previous_response_id=first.id) as s:
        streamed = final_response(s)
    whole = sdk.responses.create(model="scripted-model", input=outputs, tools=TOOLS,
                                 previous_response_id=first.id)
    assert response_items(streamed) == response_items(whole)
    assert whole.output_text == "Hello world"
    got = sdk.responses.retrieve(whole.id)
    assert response_items(got) == response_items(whole) and got.previous_response_id == first.id
    assert sdk.responses.retrieve(first.id).metadata == {"turn": "1"}
    listed = sdk.responses.input_items.list(whole.id, order="asc")
    assert [i.call_id for i in listed.data] == [o["call_id"] for o in outputs]
    sdk.responses.delete(whole.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(whole.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        sdk.responses.create(model="scripted-model", input="hi",
                             previous_response_id=whole.id)


def test_metadata_bounds_are_checked(client):
    for meta in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513},
                 {"k": 1}):
        r = client.post("/v1/responses", json={"input": "x", "metadata": meta})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("metadata"), meta


# --- the store itself ---

def _resp(rid: str, pad: int = 0) -> dict:
    return {"id": rid, "output": [], "pad": "x" * pad}


def _size(rid: str, pad: int = 0) -> int:
    return len(json.dumps(_resp(rid, pad), separators=(",", ":")))


def test_least_recently_used_go_first_within_the_byte_budget():
    store = ResponseStore(3 * _size("r0", 100))
    for k in range(3):
        assert store.put("", _resp(f"r{k}", 100), (), 0, ())
    assert store.used == store.budget and len(store) == 3
    assert store.get("", "r0") is not None  # now the most recent: r1 goes next
    assert store.put("", _resp("r3", 100), (), 0, ())
    assert store.get("", "r1") is None and store.get("", "r0") is not None
    # context bytes count: an entry whose context fills the budget evicts all others
    assert store.put("", _resp("r4"), ("item",), store.budget - _size("r4"), ())
    assert [store.get("", f"r{k}") is None for k in range(5)] == [True] * 4 + [False]
    assert store.used == store.budget
    # alone over the budget: not stored, nothing evicted
    assert not store.put("", _resp("big", store.budget), (), 0, ())
    assert store.get("", "big") is None and store.get("", "r4") is not None
    assert store.delete("", "r4") and store.used == 0 and not store.delete("", "r4")


def test_tenants_do_not_share_ids():
    store = ResponseStore(10_000)
    a, b = tenant_of("key-a"), tenant_of("key-b")
    assert a != b and tenant_of(None) == tenant_of("") == ""
    store.put(a, _resp("r"), (), 0, ())
    assert store.get(b, "r") is None and store.get(a, "r") is not None
    store.put(b, _resp("r", 5), (), 0, ())
    assert store.get(a, "r").response["pad"] == "" and len(store) == 2


def test_one_key_is_plain_least_recently_used_order_on_replace():
    store = ResponseStore(3 * _size("r0", 100))
    for k in range(3):
        assert store.put("", _resp(f"r{k}", 100), (), 0, ())
    grown = store.replace("", _resp("r1", 150))
    assert grown is not None and store.get("", "r0") is None
    assert store.get("", "r1") is grown and store.get("", "r2") is not None
