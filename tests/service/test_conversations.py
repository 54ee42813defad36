"""OpenAI's Conversations API on the scripted model (tests/service/scripted_backend.py):
an agent loop through ``conversation`` answers what the whole history sent again answers
(and what previous_response_id answers), the items routes (create, list and page,
retrieve, add, delete), metadata, deletion, every refusal naming its field, another API
key, a server without conversations, background and cancelled runs, the store's LRU
byte budget, the stores' gauges on /metrics, and the openai SDK's calls."""

from __future__ import annotations

import time

import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.settings import Settings
from service.store.conversations import ConversationStore, ConversationTooLarge
from tests.service.conformance import final_response, response_items
from tests.service.scripted_backend import scripted_loader
from tests.service.test_chat_tools_api import SCRIPTS, make_client
from tests.service.test_responses_api import TOOLS
from tests.service.test_responses_background import slow, wait
from tests.service.test_responses_store import plain, post, results


@pytest.fixture
def client():
    with make_client() as c:
        yield c


def conversation(client, **body) -> str:
    r = client.post("/v1/conversations", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "conversation"
    return r.json()["id"]


def items(client, cid: str, **query) -> list[dict]:
    r = client.get(f"/v1/conversations/{cid}/items", params={"order": "asc", "limit": 100,
                                                            **query})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_an_agent_loop_answers_what_the_whole_history_answers(client):
    cid = conversation(client)
    first = post(client, input="<script0>", tools=TOOLS, conversation=cid)
    assert first["conversation"] == {"id": cid} and len(results(first)) == 2
    second = post(client, input=results(first), tools=TOOLS, conversation={"id": cid})
    history = [{"role": "user", "content": "<script0>"}, *first["output"], *results(first)]
    whole = post(client, input=history, tools=TOOLS)
    chained = post(client, input=results(first), tools=TOOLS,
                   previous_response_id=first["id"])
    for other in (whole, chained):
        assert plain(second["output"]) == plain(other["output"])
        assert second["usage"]["input_tokens"] == other["usage"]["input_tokens"]
    # the conversation holds every turn: input, then output, as the response listed them
    listed = items(client, cid)
    assert [i["type"] for i in listed] == (
        ["message"] + [o["type"] for o in first["output"]]
        + ["function_call_output"] * 2 + [o["type"] for o in second["output"]])
    assert listed[1:1 + len(first["output"])] == first["output"]
    assert listed[-1] == second["output"][-1]
    assert listed[0]["content"] == [{"type": "input_text", "text": "<script0>"}]
    assert all(i["status"] == "completed" for i in listed)


def test_items_are_created_listed_paged_retrieved_and_deleted(client):
    seed = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    cid = conversation(client, items=seed, metadata={"topic": "t"})
    assert client.get(f"/v1/conversations/{cid}").json()["metadata"] == {"topic": "t"}
    r = client.post(f"/v1/conversations/{cid}/items", json={"items": [
        {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                          "text": "<script5>"}]}]})
    assert r.status_code == 200 and r.json()["object"] == "list"
    added = r.json()["data"]
    everything = items(client, cid)
    assert [i["role"] for i in everything] == ["user", "assistant", "user"]
    assert everything[-1] == added[0]
    desc = items(client, cid, order="desc")
    assert desc == everything[::-1]
    page = client.get(f"/v1/conversations/{cid}/items",
                      params={"limit": 2, "order": "asc"}).json()
    assert page["data"] == everything[:2] and page["has_more"] is True
    rest = client.get(f"/v1/conversations/{cid}/items", params={
        "limit": 2, "order": "asc", "after": page["last_id"]}).json()
    assert rest["data"] == everything[2:] and rest["has_more"] is False
    one = client.get(f"/v1/conversations/{cid}/items/{everything[1]['id']}")
    assert one.json() == everything[1]
    r = client.delete(f"/v1/conversations/{cid}/items/{everything[1]['id']}")
    assert r.json()["id"] == cid and r.json()["object"] == "conversation"
    assert items(client, cid) == [everything[0], everything[2]]
    # the prompt is built from what the conversation holds now
    answer = post(client, input="<script1>", conversation=cid)
    alone = post(client, input=[{"role": "user", "content": "hi"},
                                {"role": "user", "content": "<script5>"},
                                {"role": "user", "content": "<script1>"}])
    assert answer["usage"]["input_tokens"] == alone["usage"]["input_tokens"]
    assert client.get(f"/v1/conversations/{cid}/items/nope").status_code == 404


def test_metadata_update_and_delete(client):
    cid = conversation(client, metadata={"a": "1"})
    r = client.post(f"/v1/conversations/{cid}", json={"metadata": {"b": "2"}})
    assert r.json()["metadata"] == {"b": "2"}
    assert client.delete(f"/v1/conversations/{cid}").json() == {
        "id": cid, "object": "conversation.deleted", "deleted": True}
    for r in (client.get(f"/v1/conversations/{cid}"),
              client.get(f"/v1/conversations/{cid}/items"),
              client.delete(f"/v1/conversations/{cid}")):
        assert r.status_code == 404 and r.json()["error"]["param"] == "conversation_id"
    r = client.post("/v1/responses", json={"input": "x", "conversation": cid})
    assert r.status_code == 400 and r.json()["error"]["param"] == "conversation"
    assert "not found" in r.json()["error"]["message"]


def test_refusals_name_their_field(client):
    cid = conversation(client)
    first = post(client, input="<script5>")
    r = client.post("/v1/responses", json={"input": "x", "conversation": cid,
                                           "previous_response_id": first["id"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "conversation"
    # the two together are refused whatever the stored response (one not stored, store
    # false, was refused as a previous_response_id not found)
    for prev in (post(client, input="<script5>", store=False)["id"], "resp_nope"):
        r = client.post("/v1/responses", json={"input": "x", "conversation": cid,
                                               "previous_response_id": prev})
        assert r.status_code == 400 and r.json()["error"]["param"] == "conversation", r.text
        assert "previous_response_id" in r.json()["error"]["message"]
    stray = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
    r = client.post(f"/v1/conversations/{cid}/items", json={"items": stray})
    assert r.status_code == 400 and r.json()["error"]["param"] == "items.0.call_id"
    r = client.post("/v1/conversations", json={"items": stray})
    assert r.status_code == 400 and r.json()["error"]["param"] == "items.0.call_id"
    r = client.post("/v1/responses", json={"input": stray, "conversation": cid})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.call_id"
    assert items(client, cid) == []  # nothing refused was kept
    r = client.post("/v1/conversations", json={"items": [{"role": "user", "content": "x"}]
                                               * 21})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("items")
    # a call goes after its output: no output is ever left answering nothing
    made = client.post(f"/v1/conversations/{cid}/items", json={"items": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"}]}).json()["data"]
    r = client.delete(f"/v1/conversations/{cid}/items/{made[0]['id']}")
    assert r.status_code == 400 and r.json()["error"]["param"] == "item_id"
    for item in made[::-1]:
        assert client.delete(f"/v1/conversations/{cid}/items/{item['id']}").status_code == 200
    for query in ({"include": "x"}, {"after": "nope"}):
        r = client.get(f"/v1/conversations/{cid}/items", params=query)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(query))


def test_only_finished_runs_join_the_conversation(client):
    cid = conversation(client)
    cut = post(client, input="<script1>", conversation=cid, max_output_tokens=2,
               store=False)
    assert cut["status"] == "incomplete"
    assert len(items(client, cid)) == 1 + len(cut["output"])  # store false: kept too
    bg = post(client, input="<script5>", conversation=cid, background=True)
    done = wait(client, bg["id"])
    assert items(client, cid)[-1] == done["output"][-1]
    before = items(client, cid)
    slow(client)
    running = post(client, input="<script0>", tools=TOOLS, conversation=cid,
                   background=True)
    assert client.post(f"/v1/responses/{running['id']}/cancel").status_code == 200
    time.sleep(0.1)
    assert items(client, cid) == before


def test_each_api_key_reads_only_its_own():
    cfg = Settings(max_model_len=512, api_keys=("key-one", "key-two"))
    with TestClient(create_app(cfg, load_backend=scripted_loader(SCRIPTS))) as c:
        one, two = ({"Authorization": f"Bearer {k}"} for k in ("key-one", "key-two"))
        cid = c.post("/v1/conversations", json={}, headers=one).json()["id"]
        assert c.get(f"/v1/conversations/{cid}", headers=one).status_code == 200
        assert c.get(f"/v1/conversations/{cid}", headers=two).status_code == 404
        r = c.post("/v1/responses", headers=two, json={"input": "x", "conversation": cid})
        assert r.status_code == 400 and r.json()["error"]["param"] == "conversation"


def test_a_server_without_conversations():
    with make_client(conversations_store_mib=0) as c:
        for r in (c.post("/v1/conversations", json={}), c.get("/v1/conversations/conv_x"),
                  c.post("/v1/responses", json={"input": "x", "conversation": "conv_x"})):
            assert r.status_code == 400 and r.json()["error"]["param"] == "conversation"
            assert "--conversations-store-mib 0" in r.json()["error"]["message"]


def test_least_recently_used_conversations_go_first_within_the_byte_budget():
    store = ConversationStore(1800)
    a, b = store.create("t", {}), store.create("t", {})
    store.get("t", a.id)  # b is now the least recently used
    big = [{"id": f"msg_{k}", "content": "x" * 300} for k in range(5)]
    assert store.append("t", a, [None] * 5, big)
    assert store.get("t", b.id) is None and store.get("t", a.id) is a
    assert store.used == a.nbytes <= store.budget
    store.remove_item(a, 0)
    assert store.used == a.nbytes and len(a.items) == len(a.listed) == 4
    c = store.create("u", {})  # another key's
    used = store.used
    # a conversation that would outgrow the whole budget is refused, changing nothing:
    # it emptied the store, every key's conversations, and then went itself
    with pytest.raises(ConversationTooLarge, match="--conversations-store-mib"):
        store.append("t", a, [None] * 5, big)
    assert store.used == used and len(a.items) == 4
    assert store.get("t", a.id) is a and store.get("u", c.id) is c
    assert store.delete("t", a.id)
    assert not store.append("t", a, [None], big[:1])  # no longer kept


def test_metadata_that_grows_the_store_evicts_as_items_do():
    """Metadata replaced by bigger metadata is counted and evicts the least recently
    used past the budget (it was counted only: a store of small conversations, each given
    16 long pairs, held many times its budget until the next create or append)."""
    store = ConversationStore(4000)
    convs = [store.create("t", {}) for _ in range(20)]
    assert store.used <= store.budget and len(store) == 20
    big = {f"k{i}": "v" * 500 for i in range(3)}
    for conv in convs:
        store.set_metadata(conv, big)
        assert store.used <= store.budget, store.used
    assert store.get("t", convs[-1].id) is convs[-1]  # the one just updated stays
    assert store.used == sum(c.nbytes for c in convs if store.get("t", c.id) is c)


def test_items_that_outgrow_the_store_are_a_400_and_evict_nothing():
    settings = Settings(max_model_len=256, max_num_seqs=4, conversations_store_mib=1)
    with TestClient(create_app(settings, load_backend=scripted_loader(SCRIPTS))) as c:
        keep = [conversation(c) for _ in range(3)]
        item = {"type": "message", "role": "user", "content": "x" * 60_000}
        r = c.post("/v1/conversations", json={"items": [item] * 20})
        assert r.status_code == 400 and r.json()["error"]["param"] == "items", r.text
        r = c.post(f"/v1/conversations/{keep[0]}/items", json={"items": [item] * 20})
        assert r.status_code == 400 and r.json()["error"]["param"] == "items", r.text
        assert all(c.get(f"/v1/conversations/{k}").status_code == 200 for k in keep)
        assert items(c, keep[0]) == []


def test_the_openai_sdk(client):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    conv = sdk.conversations.create(metadata={"user": "u1"})
    first = sdk.responses.create(model="scripted-model", input="<script0>", tools=TOOLS,
                                 conversation=conv.id)
    outputs = [{"type": "function_call_output", "call_id": o.call_id, "output": "<script3>"}
               for o in first.output if o.type == "function_call"]
    with sdk.responses.stream(model="scripted-model", input=outputs, tools=TOOLS,
                              conversation=conv.id) as s:
        streamed = final_response(s)
    assert streamed.output_text == "Hello world"
    listed = list(sdk.conversations.items.list(conv.id, order="asc", limit=2))  # 2 a page
    assert [i.id for i in listed[-len(streamed.output):]] == [o.id for o in streamed.output]
    assert len(listed) == 1 + len(first.output) + 2 + len(streamed.output)
    assert sdk.conversations.items.retrieve(listed[0].id, conversation_id=conv.id).role == (
        "user")
    sdk.conversations.items.delete(listed[-1].id, conversation_id=conv.id)
    sdk.conversations.items.create(conv.id, items=[{"role": "user", "content": "<script5>"}])
    assert sdk.conversations.update(conv.id, metadata={"user": "u2"}).metadata == {
        "user": "u2"}
    assert response_items(streamed)
    assert sdk.conversations.delete(conv.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.retrieve(conv.id)


def metric(client, name: str) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "fp8serve_" + name:
                return sample.value
    raise AssertionError(f"{name} not exported")


def test_metrics_show_what_the_stores_hold(client):
    state = client.app.state.serving
    assert metric(client, "conversations_store_entries") == 0
    assert metric(client, "conversations_store_budget_bytes") == 256 * 2**20
    cid = conversation(client, items=[{"role": "user", "content": "hi"}])
    post(client, input="<script5>", conversation=cid)
    assert metric(client, "conversations_store_entries") == 1
    assert metric(client, "conversations_store_bytes") == state.conversations.used > 0
    assert metric(client, "responses_store_entries") == len(state.responses) == 1
    assert metric(client, "responses_store_bytes") == state.responses.used > 0
    slow(client)
    running = post(client, input="<script0>", tools=TOOLS, background=True)
    assert metric(client, "background_responses_running") == 1
    client.post(f"/v1/responses/{running['id']}/cancel")
    assert metric(client, "background_responses_running") == 0


def test_query_parameters_not_served_are_400s_naming_them(client):
    """include as the SDK sends it (include[]) and any parameter the routes do not take
    were answered 200 and ignored."""
    cid = conversation(client, items=[{"type": "message", "role": "user", "content": "hi"}])
    item = items(client, cid)[0]["id"]
    for method, path, query in (
            ("GET", f"/v1/conversations/{cid}/items", {"include[]": "message.output_text"
                                                        ".logprobs"}),
            ("GET", f"/v1/conversations/{cid}/items", {"before": item}),
            ("GET", f"/v1/conversations/{cid}/items/{item}", {"include[]": "x"}),
            ("GET", f"/v1/conversations/{cid}/items/{item}", {"limit": "3"})):
        r = client.request(method, path, params=query)
        name = next(iter(query)).removesuffix("[]")
        assert r.status_code == 400 and r.json()["error"]["param"] == name, (path, r.text)
    r = client.post(f"/v1/conversations/{cid}/items", params={"include[]": "x"},
                    json={"items": [{"type": "message", "role": "user", "content": "a"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include"
    assert len(items(client, cid, after=item, order="asc")) == 0  # paging still served


def test_the_routes_on_a_conversation_take_no_query_parameter(client):
    """create, retrieve, update, delete and an item's delete answered 200 with a query
    parameter ignored; a paging parameter given twice was read once."""
    cid = conversation(client, items=[{"type": "message", "role": "user", "content": "hi"}])
    item = items(client, cid)[0]["id"]
    for method, path, kw in (
            ("POST", "/v1/conversations", {"json": {}}),
            ("GET", f"/v1/conversations/{cid}", {}),
            ("POST", f"/v1/conversations/{cid}", {"json": {"metadata": {"a": "b"}}}),
            ("DELETE", f"/v1/conversations/{cid}/items/{item}", {}),
            ("DELETE", f"/v1/conversations/{cid}", {})):
        r = client.request(method, path, params={"include[]": "x"}, **kw)
        assert r.status_code == 400 and r.json()["error"]["param"] == "include", (path,
                                                                                  r.text)
    # nothing was done
    assert client.get(f"/v1/conversations/{cid}").json()["metadata"] == {}
    assert [i["id"] for i in items(client, cid)] == [item]
    r = client.get(f"/v1/conversations/{cid}/items", params=[("limit", "1"),
                                                             ("limit", "5")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
    assert "given twice" in r.json()["error"]["message"]
    # one not served at all is named as such, however often it is given
    r = client.get(f"/v1/conversations/{cid}/items", params=[("include", "a"),
                                                             ("include", "b")])
    assert r.status_code == 400 and "not supported here" in r.json()["error"]["message"]


def test_an_output_whose_call_was_deleted_meanwhile_is_not_added(client):
    """A background response answers call c1; c1 is deleted from the conversation while
    it runs: its turn is not added (it left an output with no call before it, and every
    later turn on the conversation was a 400)."""
    cid = conversation(client, items=[
        {"type": "message", "role": "user", "content": "<script0>"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": "{}"}])
    call = items(client, cid)[-1]["id"]
    slow(client)
    try:
        bg = post(client, conversation=cid, background=True, tools=TOOLS, input=[
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}])
        r = client.delete(f"/v1/conversations/{cid}/items/{call}")
        assert r.status_code == 200, r.text
    finally:
        slow(client, False)
    assert wait(client, bg["id"])["status"] == "completed"
    assert [i["type"] for i in items(client, cid, order="asc")] == ["message"]
    nxt = client.post("/v1/responses", json={"input": "<script5>", "conversation": cid})
    assert nxt.status_code == 200, nxt.text


def test_a_cut_call_is_listed_as_incomplete(client):
    """An item's own status (a call max_output_tokens cut) is kept in the listing: all
    were listed completed, beside their cut arguments."""
    cid = conversation(client, items=[
        {"type": "message", "role": "user", "content": "<script0>"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"ci', "status": "incomplete"}])
    assert [i["status"] for i in items(client, cid, order="asc")] == [
        "completed", "incomplete"]
