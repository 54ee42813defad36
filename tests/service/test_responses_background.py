"""Background responses on the scripted model (tests/service/scripted_backend.py): a
background run answers what the same request answers in the foreground (both modes),
GET polls it and follows its events from any sequence number, cancel and DELETE stop it
and free its engine request, a client that leaves a background stream leaves the run
going, every refusal names its field, and the openai SDK's calls."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.service.test_chat_tools_api import make_client
from tests.service.test_responses_api import TOOLS, events
from tests.service.test_responses_store import plain, post

SLOW_S = 0.04  # per engine step, so that a run is seen in flight


@pytest.fixture
def client():
    with make_client() as c:
        yield c


def slow(client, on: bool = True) -> None:
    client.app.state.serving.backend.runner.delay_s = SLOW_S if on else 0.0


def parse(text: str) -> list[dict]:
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append(json.loads(data[6:]))
        assert name == f"event: {out[-1]['type']}"
    return out


def wait(client, rid: str, timeout: float = 20.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        body = client.get(f"/v1/responses/{rid}").json()
        if body["status"] not in ("queued", "in_progress") or time.monotonic() > end:
            return body
        time.sleep(0.02)


def idle(client, timeout: float = 5.0) -> bool:
    engine = client.app.state.serving.engine
    end = time.monotonic() + timeout
    while engine.num_unfinished and time.monotonic() < end:
        time.sleep(0.02)
    return engine.num_unfinished == 0


@pytest.mark.parametrize("script", ["<script0>", "<script1>"])
def test_a_background_run_answers_what_the_foreground_answers(client, script):
    fg = post(client, input=script, tools=TOOLS)
    bg = post(client, input=script, tools=TOOLS, background=True)
    assert bg["status"] == "queued" and bg["background"] is True and bg["output"] == []
    done = wait(client, bg["id"])
    assert done["status"] == "completed" and fg["background"] is False
    assert plain(done["output"]) == plain(fg["output"])
    assert done["usage"] == fg["usage"]
    assert {k: v for k, v in done.items() if k not in ("id", "created_at", "output",
                                                         "background")} == {
        k: v for k, v in fg.items() if k not in ("id", "created_at", "output", "background")}


def test_a_background_stream_replays_from_any_sequence_number(client):
    r = client.post("/v1/responses", json={"input": "<script0>", "tools": TOOLS,
                                           "temperature": 0, "background": True,
                                           "stream": True})
    assert r.status_code == 200, r.text
    got = parse(r.text)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert [e["type"] for e in got[:3]] == ["response.created", "response.queued",
                                           "response.in_progress"]
    assert got[0]["response"]["status"] == "queued"
    assert got[-1]["type"] == "response.completed"
    fg = events(client, {"input": "<script0>", "tools": TOOLS, "temperature": 0})
    # the same events after the start as a foreground stream's (ids aside)
    assert [e["type"] for e in got[3:]] == [e["type"] for e in fg[2:]]
    assert plain(got[-1]["response"]["output"]) == plain(fg[-1]["response"]["output"])
    rid = got[0]["response"]["id"]
    assert client.get(f"/v1/responses/{rid}").json() == got[-1]["response"]
    for after in (-1, 0, 5, len(got) - 2, len(got) - 1):
        again = client.get(f"/v1/responses/{rid}", params={
            "stream": "true", "starting_after": str(after)})
        assert again.status_code == 200
        assert (parse(again.text) if again.text else []) == got[after + 1:]


def test_get_follows_a_run_in_flight(client):
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True, stream=False)
    assert client.get(f"/v1/responses/{bg['id']}").json()["status"] in (
        "queued", "in_progress")
    r = client.post("/v1/responses", json={"input": "<script0>", "background": True,
                                           "stream": True, "tools": TOOLS})
    rid = parse(r.text)[0]["response"]["id"]
    whole = parse(r.text)
    # a late reader gets every event after its place, in order, up to the end
    late = client.get(f"/v1/responses/{rid}", params={"stream": "true",
                                                      "starting_after": "2"})
    assert parse(late.text) == whole[3:]
    assert wait(client, bg["id"])["status"] == "completed"


def test_cancel_stops_the_run_and_frees_its_engine_request(client):
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True)
    time.sleep(5 * SLOW_S)
    r = client.post(f"/v1/responses/{bg['id']}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert idle(client)
    kept = client.get(f"/v1/responses/{bg['id']}").json()
    assert kept["status"] == "cancelled" and kept == r.json()
    # again: the same answer; a finished background or a foreground response: a 400
    assert client.post(f"/v1/responses/{bg['id']}/cancel").json() == kept
    slow(client, False)
    done = post(client, input="<script5>", background=True)
    wait(client, done["id"])
    r = client.post(f"/v1/responses/{done['id']}/cancel")
    assert r.status_code == 400 and "already ended (completed)" in r.json()["error"]["message"]
    fg = post(client, input="<script5>")
    r = client.post(f"/v1/responses/{fg['id']}/cancel")
    assert r.status_code == 400 and "only background" in r.json()["error"]["message"]


@pytest.mark.parametrize("end", ["cancelled", "failed"])
def test_a_run_stopped_midway_holds_no_item_in_progress(end):
    """A run cancelled (or failed: the request timeout) while it writes an item keeps
    that item as ``incomplete``, as max_output_tokens cuts one (it stayed ``in_progress``
    in a terminal response), and a call it cut goes back into a continuation's prompt
    with its complete arguments only (its cut JSON was a 400 on every later turn)."""
    from service.translate.responses import _call, output_items

    with make_client(**({"request_timeout": 0.5} if end == "failed" else {})) as client:
        slow(client)
        bg = post(client, input="<script0>", tools=TOOLS, background=True)
        end_at = time.monotonic() + 10
        while not client.get(f"/v1/responses/{bg['id']}").json()["output"]:
            assert time.monotonic() < end_at
            time.sleep(0.01)
        if end == "cancelled":
            assert client.post(f"/v1/responses/{bg['id']}/cancel").status_code == 200
        kept = wait(client, bg["id"])
        assert kept["status"] == end and kept["output"], kept
        statuses = [o["status"] for o in kept["output"]]
        assert statuses == ["completed"] * (len(statuses) - 1) + ["incomplete"]
        for item in output_items(kept["output"]):
            if item.type == "function_call":
                json.loads(_call(item)["function"]["arguments"])
        slow(client, False)
        r = client.post("/v1/responses", json={"input": "<script5>", "tools": TOOLS,
                                               "previous_response_id": bg["id"]})
        assert r.status_code == 200, r.text


def test_a_failed_run_reports_the_error_code_a_foreground_answer_has():
    """A background run past --request-timeout ends failed with error.code "timeout",
    the code of a foreground answer's error for the same end (the stream's error event,
    the whole answer's 408); it was the error's type, "timeout_error" ("server_error"
    where a foreground answer says "engine_error")."""
    with make_client(request_timeout=0.3) as client:
        slow(client)
        bg = post(client, input="<script0>", tools=TOOLS, background=True)
        failed = wait(client, bg["id"])
        fg = events(client, {"input": "<script0>", "tools": TOOLS})
        whole = client.post("/v1/responses", json={"input": "<script0>", "tools": TOOLS})
    assert failed["status"] == "failed", failed
    assert fg[-1]["type"] == "error" and whole.status_code == 408
    assert failed["error"]["code"] == fg[-1]["code"] == whole.json()["error"]["code"] \
        == "timeout"
    assert failed["error"]["message"] == fg[-1]["message"]


def test_input_items_are_listed_while_the_run_goes_on(client):
    """GET .../input_items of a running background response lists its items (with the
    ids they keep once it ended), as GET shows the response: it was a 404."""
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True)
    r = client.get(f"/v1/responses/{bg['id']}/input_items")
    assert r.status_code == 200, r.text
    assert client.get(f"/v1/responses/{bg['id']}").json()["status"] in ("queued",
                                                                         "in_progress")
    assert [i["content"] for i in r.json()["data"]] == [
        [{"type": "input_text", "text": "<script0>"}]]
    assert wait(client, bg["id"])["status"] == "completed"
    assert client.get(f"/v1/responses/{bg['id']}/input_items").json() == r.json()


def test_a_continuation_counts_no_events_of_the_response_it_continues(client):
    """The store counts a background stream's events in its entry, and a continuation's
    entry counts its context: the earlier response's context and output, not its events,
    which the continuation does not keep (they were counted again in every later entry
    of a chain, which then outgrew the budget long before its memory did)."""
    from service.store.responses import json_bytes, tenant_of

    r = client.post("/v1/responses", json={"input": "<script1>", "background": True,
                                           "stream": True})
    first = parse(r.text)[-1]["response"]
    second = post(client, input="<script5>", previous_response_id=first["id"])
    store = client.app.state.serving.responses
    one, two = store.get(tenant_of(None), first["id"]), store.get(tenant_of(None),
                                                                  second["id"])
    assert one.frames and one.context_bytes == one.nbytes - sum(map(len, one.frames))
    assert two.nbytes == (one.context_bytes + json_bytes(list(two.input_items))
                          + json_bytes(two.response))


def test_a_run_created_without_stream_keeps_no_events(client):
    """Only a response created with stream is streamed again: a run without it keeps no
    events while it runs (they were kept, one SSE frame per event, uncounted, to be
    dropped at its end)."""
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True)
    job = client.app.state.serving.jobs.get("", bg["id"])
    end_at = time.monotonic() + 10
    while not client.get(f"/v1/responses/{bg['id']}").json()["output"]:
        assert time.monotonic() < end_at
        time.sleep(0.01)
    assert job.frames == []
    assert wait(client, bg["id"])["status"] == "completed"


def test_a_cancelled_stream_ends_with_response_cancelled(client):
    slow(client)
    with client.stream("POST", "/v1/responses", json={
            "input": "<script0>", "tools": TOOLS, "background": True,
            "stream": True}) as r:
        data = (json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: "))
        rid = next(data)["response"]["id"]
        assert client.post(f"/v1/responses/{rid}/cancel").status_code == 200
        rest = list(data)  # the stream ends by itself
    assert rest[-1]["type"] == "response.cancelled"
    assert rest[-1]["response"]["status"] == "cancelled"


def test_a_client_that_leaves_the_stream_leaves_the_run_going(client):
    slow(client)
    with client.stream("POST", "/v1/responses", json={
            "input": "<script0>", "tools": TOOLS, "background": True,
            "stream": True}) as r:
        first = json.loads(next(line for line in r.iter_lines()
                                if line.startswith("data: "))[6:])
    rid = first["response"]["id"]
    done = wait(client, rid)
    assert done["status"] == "completed" and len(done["output"]) == 3


def test_delete_cancels_a_running_response(client):
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True)
    assert client.delete(f"/v1/responses/{bg['id']}").json()["deleted"] is True
    assert idle(client)
    assert client.get(f"/v1/responses/{bg['id']}").status_code == 404


def test_delete_of_a_running_response_too_large_to_store_is_a_delete(client):
    """The cancelled run is not stored when it is over the store's budget: DELETE
    cancelled it and then answered 404, as if the id were unknown."""
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True)
    client.app.state.serving.responses.budget = 1  # no response fits
    r = client.delete(f"/v1/responses/{bg['id']}")
    assert r.status_code == 200, r.text
    assert r.json() == {"id": bg["id"], "object": "response", "deleted": True}
    assert idle(client)
    assert client.get(f"/v1/responses/{bg['id']}").status_code == 404


def test_refusals_name_their_field(client):
    r = client.post("/v1/responses", json={"input": "x", "background": True, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
    slow(client)
    bg = post(client, input="<script0>", tools=TOOLS, background=True)
    r = client.post("/v1/responses", json={"input": "x", "previous_response_id": bg["id"]})
    assert r.status_code == 400 and "still running" in r.json()["error"]["message"]
    r = client.get(f"/v1/responses/{bg['id']}", params={"stream": "true"})  # no stream
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    for query in ({"stream": "true", "starting_after": "x"},
                  {"stream": "true", "starting_after": "-2"}, {"starting_after": "1"}):
        r = client.get(f"/v1/responses/{bg['id']}", params=query)
        assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after"
    client.post(f"/v1/responses/{bg['id']}/cancel")


def test_the_openai_sdk(client):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    bg = sdk.responses.create(model="scripted-model", input="<script1>", background=True)
    assert bg.status == "queued" and bg.background is True
    while bg.status in ("queued", "in_progress"):
        time.sleep(0.02)
        bg = sdk.responses.retrieve(bg.id)
    assert bg.status == "completed" and bg.output_text == "Hello world"
    streamed = list(sdk.responses.create(model="scripted-model", input="<script1>",
                                         background=True, stream=True))
    rid = streamed[0].response.id
    resumed = list(sdk.responses.retrieve(rid, stream=True, starting_after=2))
    assert [e.sequence_number for e in resumed] == list(range(3, len(streamed)))
    assert resumed[-1].response.output_text == "Hello world"
    slow(client)
    running = sdk.responses.create(model="scripted-model", input="<script0>",
                                   tools=TOOLS, background=True)
    assert sdk.responses.cancel(running.id).status == "cancelled"


def test_a_run_that_raises_midway_keeps_its_sequence_numbers_gapless():
    """An exception in the middle of a batch (the third output's encoding raised, after
    numbering an event of its own): the batch's earlier events were numbered but never
    sent, so the sequence numbers had a gap before response.failed and starting_after
    replayed from the wrong place. They now go out, and the numbers stay 0, 1, 2, ..."""
    import asyncio
    from types import SimpleNamespace

    from service.store.background import BackgroundJob

    class Encoder:
        def __init__(self) -> None:
            self.response = {"id": "resp_x", "status": "in_progress", "output": []}
            self.seq = 0

        def ev(self, kind, **data):
            self.seq += 1
            return kind, {"type": kind, "sequence_number": self.seq - 1, **data}

        def chunk(self, out):
            if out.text == "boom":
                self.ev("response.output_text.delta", delta="lost")
                raise RuntimeError("boom")
            return [self.ev("response.output_text.delta", delta=out.text)]

        def interrupt(self) -> None:
            pass

    class Sub:
        grammar_param = None

        async def batches(self):
            yield [(0, SimpleNamespace(text=t, finish_reason=None))
                   for t in ("a", "b", "boom")]

        def abort_all(self) -> None:
            pass

    async def run():
        job = BackgroundJob("", Encoder(), Sub(), True, lambda _job: None)
        job.start()
        await job.task
        replay = "".join([x async for x in job.follow(3)])
        return job, parse("".join(job.frames)), parse(replay) if replay else []

    job, got, after_3 = asyncio.run(run())
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert [e["type"] for e in got] == [
        "response.created", "response.queued", "response.in_progress",
        "response.output_text.delta", "response.output_text.delta", "response.failed"]
    assert [e.get("delta") for e in got[3:5]] == ["a", "b"]
    assert got[-1]["response"]["error"] == {"code": "engine_error",  # an engine error's
                                            "message": "RuntimeError: boom"}
    assert after_3 == got[4:]


def test_starting_after_past_the_last_event_is_a_400_naming_it(client):
    """A sequence number no event has (was a 200 with an empty body): a finished run's
    last event is the last; a running one's, the last so far."""
    r = client.post("/v1/responses", json={"input": "<script0>", "tools": TOOLS,
                                           "background": True, "stream": True})
    got = parse(r.text)
    rid = got[0]["response"]["id"]
    last = client.get(f"/v1/responses/{rid}", params={"stream": "true",
                                                      "starting_after": len(got) - 1})
    assert last.status_code == 200 and last.text == ""  # the last event: nothing after it
    for after in (len(got), len(got) + 100):
        past = client.get(f"/v1/responses/{rid}", params={"stream": "true",
                                                          "starting_after": after})
        assert past.status_code == 400, past.text
        err = past.json()["error"]
        assert err["param"] == "starting_after"
        assert err["message"] == (f"starting_after: {after} is past the last event of this "
                                  f"response (sequence number {len(got) - 1})")
    slow(client)
    with client.stream("POST", "/v1/responses", json={
            "input": "<script0>", "tools": TOOLS, "background": True,
            "stream": True}) as r:
        rid = json.loads(next(line for line in r.iter_lines()
                              if line.startswith("data: "))[6:])["response"]["id"]
        past = client.get(f"/v1/responses/{rid}", params={"stream": "true",
                                                          "starting_after": 10_000})
        assert past.status_code == 400, past.text
        assert past.json()["error"]["param"] == "starting_after"
        assert "so far)" in past.json()["error"]["message"]
        assert client.post(f"/v1/responses/{rid}/cancel").status_code == 200
