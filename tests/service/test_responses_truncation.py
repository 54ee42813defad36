"""The Responses API's ``truncation: "auto"``: the cut (service/translate/truncation.py)
falls at a turn start, keeps system and developer messages and every call with its
output, and is the earliest that fits (bisection agrees with a linear scan on random
conversations); through the API on the scripted model (one token per character), the
truncated request answers what the kept items sent alone answer, and "disabled" is
the 400 it was."""

from __future__ import annotations

import asyncio
import random

import pytest

from service.translate.schemas import FunctionCallItem, FunctionCallOutputItem, MessageItem
from service.translate.truncation import cut_at, fit, turn_starts
from tests.service.test_chat_tools_api import make_client


def msg(role: str, text: str) -> MessageItem:
    return MessageItem(role=role, content=text)


def call(cid: str) -> FunctionCallItem:
    return FunctionCallItem(type="function_call", call_id=cid, name="f", arguments="{}")


def output(cid: str) -> FunctionCallOutputItem:
    return FunctionCallOutputItem(type="function_call_output", call_id=cid, output="r")


def size(items) -> int:
    return sum(len(i.content) if isinstance(i, MessageItem) else 3 for i in items)


def run_fit(items, budget: int):
    async def fits(kept) -> bool:
        return size(kept) <= budget
    return asyncio.run(fit(items, fits))


def conversation(rng: random.Random):
    items = [msg("system", "s" * rng.randint(1, 5))] if rng.random() < 0.5 else []
    for turn in range(rng.randint(1, 6)):
        items.append(msg("user", "u" * rng.randint(1, 9)))
        for k in range(rng.randint(0, 2)):
            items += [call(f"c{turn}{k}"), output(f"c{turn}{k}")]
        if rng.random() < 0.2:
            items.append(msg("developer", "d" * rng.randint(1, 3)))
        items.append(msg("assistant", "a" * rng.randint(1, 9)))
    return items[:-1] if rng.random() < 0.5 else items


def test_the_cut_is_the_earliest_turn_start_that_fits():
    rng = random.Random(7)
    for _ in range(300):
        items = conversation(rng)
        budget = rng.randint(1, size(items) + 2)
        got = run_fit(items, budget)
        candidates = [items] + [cut_at(items, s) for s in turn_starts(items) if s > 0]
        fitting = [c for c in candidates if size(c) <= budget]
        assert got == (fitting[0] if fitting else candidates[-1])
        # what is kept starts a turn, keeps every instruction, orphans no call or output
        rest = [i for i in got if not (isinstance(i, MessageItem)
                                       and i.role in ("system", "developer"))]
        assert got == items or (isinstance(rest[0], MessageItem) and rest[0].role == "user")
        kept = {id(i) for i in got}
        assert all(id(i) in kept for i in items
                   if isinstance(i, MessageItem) and i.role in ("system", "developer"))
        calls = {i.call_id for i in got if isinstance(i, FunctionCallItem)}
        outputs = {i.call_id for i in got if isinstance(i, FunctionCallOutputItem)}
        assert calls == outputs


@pytest.fixture(scope="module")
def client():
    with make_client(max_model_len=64) as c:
        yield c


def respond(client, items, **kw):
    return client.post("/v1/responses", json={"input": items, "temperature": 0,
                                              "max_output_tokens": 16, **kw})


HISTORY = [{"role": "system", "content": "be brief"},
           {"role": "user", "content": "a" * 30}, {"role": "assistant", "content": "b" * 10},
           {"role": "user", "content": "c" * 10}, {"role": "assistant", "content": "d" * 5},
           {"role": "user", "content": "<script5>"}]


def counts(body) -> tuple[int, int]:
    return body["usage"]["input_tokens"], body["usage"]["output_tokens"]


def test_auto_drops_the_oldest_turns_and_answers_as_the_kept_items_alone(client):
    r = respond(client, HISTORY)
    assert r.status_code == 400, r.text  # truncation left out: disabled
    assert respond(client, HISTORY, truncation="disabled").status_code == 400
    got = respond(client, HISTORY, truncation="auto")
    assert got.status_code == 200, got.text
    kept = [HISTORY[0], *HISTORY[3:]]  # the first turn goes, the system message stays
    alone = respond(client, kept).json()
    body = got.json()
    assert body["truncation"] == "auto" and alone["truncation"] == "disabled"
    assert counts(body) == counts(alone)  # the cached share differs: the cache is warm
    assert body["usage"]["input_tokens"] == 1 + 8 + 10 + 5 + 1
    assert body["output"][0]["content"][0]["text"] == "Hello world"
    # a history that fits is sent whole
    short = [HISTORY[0], {"role": "user", "content": "a"}, *HISTORY[4:]]
    assert counts(respond(client, short, truncation="auto").json()) == counts(
        respond(client, short).json())


def test_auto_cannot_cut_the_last_turn(client):
    r = respond(client, [{"role": "user", "content": "x" * 70}], truncation="auto")
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]


def test_the_input_token_count_sees_the_cut(client):
    """/v1/responses/input_tokens builds the prompt as /v1/responses does, cut included
    (it takes no max_output_tokens: room for one token is left)."""
    def count(items, **kw) -> int:
        r = client.post("/v1/responses/input_tokens", json={"input": items, **kw})
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    whole = count(HISTORY)  # counted as sent (too long to answer, not to count)
    cut = count(HISTORY, truncation="auto")
    assert cut < whole and cut == count([HISTORY[0], *HISTORY[3:]])
