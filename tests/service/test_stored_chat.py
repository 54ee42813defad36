"""OpenAI's stored chat completions on the scripted model (tests/service/scripted_backend.py):
``store: true`` keeps the answer (a stream keeps what it adds up to: the non-streamed
answer, tool calls and n included), the list pages and filters by model and metadata,
retrieve, metadata update, delete and the request's messages; nothing is kept without
``store``; a server that stores nothing, another API key and bad filters each get their
documented answer; and the openai SDK's calls."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.scripted_backend import scripted_loader
from tests.service.test_chat_tools_api import SCRIPTS, TOOLS, make_client

CHAT = "/v1/chat/completions"


@pytest.fixture
def client():
    with make_client() as c:
        yield c


def chat(client, content="<script5>", **kw) -> dict:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": content}],
                                "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def streamed_id(client, content: str, **kw) -> str:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": content}],
                                "temperature": 0, "stream": True, **kw})
    assert r.status_code == 200, r.text
    return r.text.split('"id": "', 1)[1].split('"', 1)[0]


def same(a: dict, b: dict) -> bool:
    """Two answers alike but for their ids, times and tool-call ids."""
    def plain(x):
        choices = []
        for c in x["choices"]:
            m = dict(c["message"])
            m["tool_calls"] = [{**t, "id": None} for t in m.get("tool_calls") or []]
            choices.append({**c, "message": m})
        return {**x, "id": None, "created": None, "choices": choices}
    return plain(a) == plain(b)


@pytest.mark.parametrize("content,kw", [("<script5>", {}), ("<script1>", {"n": 2}),
                                        ("<script0>", {"tools": TOOLS})])
def test_a_stored_answer_reads_back_streamed_or_not(client, content, kw):
    whole = chat(client, content, store=True, metadata={"k": "v"}, **kw)
    got = client.get(f"{CHAT}/{whole['id']}").json()
    assert got == {**whole, "metadata": {"k": "v"}}
    sid = streamed_id(client, content, store=True, **kw)
    kept = client.get(f"{CHAT}/{sid}").json()
    assert kept["id"] == sid and same({**kept, "metadata": {"k": "v"}}, got)


def test_nothing_is_kept_without_store(client):
    for rid in (chat(client)["id"], chat(client, store=False)["id"],
                streamed_id(client, "<script5>")):
        assert client.get(f"{CHAT}/{rid}").status_code == 404
    assert client.get(CHAT).json()["data"] == []


def test_the_list_pages_and_filters(client):
    ids = [chat(client, store=True, metadata={"run": str(k % 2)})["id"] for k in range(5)]
    everything = client.get(CHAT).json()
    assert [c["id"] for c in everything["data"]] == ids  # made order, oldest first
    desc = client.get(CHAT, params={"order": "desc", "limit": 2}).json()
    assert [c["id"] for c in desc["data"]] == ids[::-1][:2] and desc["has_more"]
    rest = client.get(CHAT, params={"order": "desc", "after": desc["last_id"]}).json()
    assert [c["id"] for c in rest["data"]] == ids[::-1][2:] and not rest["has_more"]
    odd = client.get(CHAT, params={"metadata[run]": "1"}).json()
    assert [c["id"] for c in odd["data"]] == ids[1::2]
    assert client.get(CHAT, params={"model": "other"}).json()["data"] == []
    assert len(client.get(CHAT, params={"model": "scripted-model"}).json()["data"]) == 5
    for query, param in (({"after": "nope"}, "after"), ({"status": "x"}, "status")):
        r = client.get(CHAT, params=query)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_filtered_list_pages_on_when_its_cursor_no_longer_matches(client):
    """A page of metadata[state]=todo, each marked done, then the next page after the
    last: the cursor is placed in the whole list (it was a 400, the cursor being no
    longer in the filtered one, so a client that worked through a filter page by page
    was stopped after the first)."""
    ids = [chat(client, store=True, metadata={"state": "todo"})["id"] for _ in range(4)]
    first = client.get(CHAT, params={"metadata[state]": "todo", "limit": 2}).json()
    assert [c["id"] for c in first["data"]] == ids[:2] and first["has_more"]
    for done in first["data"]:
        client.post(f"{CHAT}/{done['id']}", json={"metadata": {"state": "done"}})
    rest = client.get(CHAT, params={"metadata[state]": "todo", "limit": 2,
                                    "after": first["last_id"]})
    assert rest.status_code == 200, rest.text
    assert [c["id"] for c in rest.json()["data"]] == ids[2:]
    assert not rest.json()["has_more"]
    desc = client.get(CHAT, params={"metadata[state]": "done", "order": "desc",
                                    "after": ids[3]}).json()
    assert [c["id"] for c in desc["data"]] == ids[1::-1]
    r = client.get(CHAT, params={"metadata[state]": "todo", "after": "chatcmpl-nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"


def test_query_parameters_the_routes_do_not_take_are_400s(client):
    """retrieve, update and delete take no query parameter (one was ignored); a filter
    given twice is refused (the last one was used)."""
    rid = chat(client, store=True)["id"]
    for method, kw in (("GET", {}), ("POST", {"json": {"metadata": {"a": "b"}}}),
                       ("DELETE", {})):
        r = client.request(method, f"{CHAT}/{rid}", params={"include[]": "x"}, **kw)
        assert r.status_code == 400 and r.json()["error"]["param"] == "include", r.text
    assert client.get(f"{CHAT}/{rid}").json()["metadata"] == {}  # nothing was done
    r = client.get(CHAT, params=[("metadata[a]", "b"), ("metadata[a]", "c")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata[a]", r.text
    r = client.get(CHAT, params=[("limit", "1"), ("limit", "2")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text


def test_update_delete_and_messages(client):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "<script5>"}]}]
    r = client.post(CHAT, json={"messages": messages, "store": True, "temperature": 0})
    rid = r.json()["id"]
    listed = client.get(f"{CHAT}/{rid}/messages").json()
    assert [(m["id"], m["role"], m["content"]) for m in listed["data"]] == [
        (f"{rid}-0", "system", "be brief"), (f"{rid}-1", "user", None)]
    assert listed["data"][1]["content_parts"] == [{"type": "text", "text": "<script5>"}]
    one = client.get(f"{CHAT}/{rid}/messages", params={"order": "desc", "limit": 1}).json()
    assert one["data"] == listed["data"][1:] and one["has_more"]
    for query in ({"before": f"{rid}-1"}, {"metadata[tag]": "x"}):  # were ignored
        r = client.get(f"{CHAT}/{rid}/messages", params=query)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == next(iter(query)), r.text
    updated = client.post(f"{CHAT}/{rid}", json={"metadata": {"tag": "x"}}).json()
    assert updated["metadata"] == {"tag": "x"}
    assert client.get(f"{CHAT}/{rid}").json() == updated
    assert client.delete(f"{CHAT}/{rid}").json() == {
        "id": rid, "object": "chat.completion.deleted", "deleted": True}
    for r in (client.get(f"{CHAT}/{rid}"), client.delete(f"{CHAT}/{rid}"),
              client.get(f"{CHAT}/{rid}/messages")):
        assert r.status_code == 404 and r.json()["error"]["param"] == "completion_id"


def test_refusals():
    with make_client(responses_store_mib=0) as c:
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "x"}],
                               "store": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "store"
        assert c.get(f"{CHAT}/chatcmpl-x").status_code == 404
    with make_client() as c:
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "x"}],
                               "store": True, "metadata": {f"k{i}": "v" for i in range(17)}})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("metadata")


def test_metadata_needs_store(client):
    """metadata is kept only with the answer (OpenAI's 400: only allowed when store is
    enabled): without store true it was answered 200 and dropped."""
    for extra in ({}, {"store": False}, {"store": None}, {"stream": True}):
        r = client.post(CHAT, json={"messages": [{"role": "user", "content": "<script5>"}],
                                    "metadata": {"k": "v"}, **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "metadata" and "store" in r.json()["error"][
            "message"]
    for extra in ({"metadata": {}}, {"metadata": None}):
        assert chat(client, **extra)["object"] == "chat.completion"
    assert client.get(CHAT).json()["data"] == []


def test_each_api_key_reads_only_its_own():
    cfg = Settings(max_model_len=512, api_keys=("key-one", "key-two"))
    with TestClient(create_app(cfg, load_backend=scripted_loader(SCRIPTS))) as c:
        one, two = ({"Authorization": f"Bearer {k}"} for k in ("key-one", "key-two"))
        r = c.post(CHAT, headers=one, json={
            "messages": [{"role": "user", "content": "<script5>"}], "store": True})
        rid = r.json()["id"]
        assert c.get(f"{CHAT}/{rid}", headers=one).status_code == 200
        assert c.get(f"{CHAT}/{rid}", headers=two).status_code == 404
        assert c.get(CHAT, headers=two).json()["data"] == []


def test_the_openai_sdk(client):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    made = sdk.chat.completions.create(
        model="scripted-model", messages=[{"role": "user", "content": "<script5>"}],
        store=True, metadata={"suite": "sdk"})
    got = sdk.chat.completions.retrieve(made.id)
    assert got.choices[0].message.content == "Hello world"
    assert [c.id for c in sdk.chat.completions.list(metadata={"suite": "sdk"})] == [made.id]
    assert [m.content for m in sdk.chat.completions.messages.list(made.id)] == ["<script5>"]
    sdk.chat.completions.update(made.id, metadata={"suite": "done"})
    assert sdk.chat.completions.list(metadata={"suite": "sdk"}).data == []
    assert sdk.chat.completions.delete(made.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.retrieve(made.id)
