"""Input item ids (Responses and Conversations, on the scripted model): an item sent with
an ``id`` (an earlier output sent back, as agent SDKs do) is listed with that id by
input_items and by the conversation, one without gets a new one; an id names one item,
so one given twice, or one the conversation already holds, is a 400 naming it, and
nothing of the refused request is kept."""

from __future__ import annotations

import pytest

from tests.service.test_chat_tools_api import make_client
from tests.service.test_conversations import conversation, items
from tests.service.test_responses_api import TOOLS
from tests.service.test_responses_store import plain, post, results


@pytest.fixture(scope="module")
def client():
    with make_client() as c:
        yield c


def input_items(client, response_id: str) -> list[dict]:
    r = client.get(f"/v1/responses/{response_id}/input_items", params={"order": "asc"})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_input_items_keep_the_ids_they_were_sent_with(client):
    first = post(client, input="<script0>", tools=TOOLS)
    history = [{"role": "user", "content": "<script0>"}, *first["output"], *results(first)]
    second = post(client, input=history, tools=TOOLS)
    listed = input_items(client, second["id"])
    assert [i["id"] for i in listed[1:1 + len(first["output"])]] == [
        o["id"] for o in first["output"]]
    # the items sent without one get ids of their own, each different
    fresh = [listed[0]["id"], *(i["id"] for i in listed[1 + len(first["output"]):])]
    assert len(set(fresh)) == len(fresh) and not set(fresh) & {o["id"] for o in
                                                              first["output"]}
    # an id does not change the prompt
    bare = [{k: v for k, v in i.items() if k != "id"} for i in history]
    again = post(client, input=bare, tools=TOOLS)
    assert again["usage"]["input_tokens"] == second["usage"]["input_tokens"]
    assert plain(again["output"]) == plain(second["output"])


def test_an_id_given_twice_is_a_400_naming_it(client):
    twice = [{"type": "message", "role": "user", "content": "a", "id": "msg_1"},
             {"type": "message", "role": "user", "content": "<script5>", "id": "msg_1"}]
    r = client.post("/v1/responses", json={"input": twice})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.1.id", r.text
    assert "Duplicate item" in r.json()["error"]["message"]
    cid = conversation(client)
    r = client.post(f"/v1/conversations/{cid}/items", json={"items": twice})
    assert r.status_code == 400 and r.json()["error"]["param"] == "items.1.id", r.text
    assert "one item of the items and of what it continues" in r.json()["error"]["message"]
    r = client.post("/v1/conversations", json={"items": twice})
    assert r.status_code == 400 and r.json()["error"]["param"] == "items.1.id", r.text
    assert items(client, cid) == []


def test_a_conversation_lists_the_ids_and_refuses_one_it_holds(client):
    cid = conversation(client, items=[{"role": "user", "content": "hi", "id": "msg_a"}])
    assert [i["id"] for i in items(client, cid)] == ["msg_a"]
    assert client.get(f"/v1/conversations/{cid}/items/msg_a").json()["content"] == [
        {"type": "input_text", "text": "hi"}]
    answer = post(client, input=[{"role": "user", "content": "<script5>", "id": "msg_b"}],
                  conversation=cid)
    held = items(client, cid)
    assert [i["id"] for i in held[:2]] == ["msg_a", "msg_b"]
    assert held[2:] == answer["output"]
    # an item sent without an id has one id, in input_items and in the conversation
    other = post(client, input="<script5>", conversation=cid)
    assert items(client, cid)[len(held)]["id"] == input_items(client, other["id"])[0]["id"]
    held = items(client, cid)
    # the conversation's items sent again (the whole history) are refused, naming one
    for again in (held[1], answer["output"][0]):
        r = client.post("/v1/responses", json={"input": [again], "conversation": cid})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.id", r.text
        r = client.post(f"/v1/conversations/{cid}/items", json={"items": [again]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "items.0.id", r.text
    assert items(client, cid) == held


def test_a_continuation_refuses_an_item_of_the_chain_it_continues(client):
    """previous_response_id: an item of the stored chain (an earlier input or output)
    sent again would be in the prompt twice; OpenAI answers "Duplicate item found"."""
    first = post(client, input=[{"role": "user", "content": "<script0>", "id": "msg_q"}],
                 tools=TOOLS)
    second = post(client, input=results(first), tools=TOOLS, previous_response_id=first["id"])
    for again in ({"role": "user", "content": "<script0>", "id": "msg_q"},
                  first["output"][0], input_items(client, second["id"])[0]):
        r = client.post("/v1/responses", json={"input": [again], "tools": TOOLS,
                                               "previous_response_id": second["id"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.id", r.text
    # items of another chain are no duplicates
    other = post(client, input="<script5>")
    assert post(client, input=[*first["output"], *results(first)], tools=TOOLS,
                previous_response_id=other["id"])["status"] == "completed"
