"""OpenAI's Agents SDK (openai-agents) runs its agent loop against this server, as its users
write it, over HTTP (uvicorn on a loopback port, the scripted model of
tests/service/scripted_backend.py): the model calls a function tool, the SDK runs it and
sends the output back, the model answers, over the Responses API and over chat
completions. The Responses loop runs four ways, each answering the
same: the SDK resending the whole history, the server chaining by previous_response_id,
a server-side conversation (conversation_id), and the SDK's OpenAIConversationsSession,
which keeps the history in this server's Conversations API."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import openai
import pytest
import uvicorn
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from service.app import create_app
from service.settings import Settings
from tests.service.scripted_backend import MODEL, scripted_loader
from tests.service.test_chat_tools_api import SCRIPTS

CALLED: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather of a city."""
    CALLED.append(city)
    return "<script5>"  # the scripted model then answers "Hello world"


@pytest.fixture(scope="module")
def base_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(Settings(max_model_len=512), load_backend=scripted_loader(SCRIPTS))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < end and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    set_tracing_disabled(True)  # no traces sent to OpenAI
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(30)


def run(base_url: str, api: str = "responses", **kw):
    """One agent run on a fresh client (each asyncio.run has its own loop); ``api``: the
    SDK's model over the Responses API or over chat completions."""
    async def go():
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                      model=kind(model=MODEL, openai_client=client),
                      model_settings=kw.pop("settings", ModelSettings()))
        session = kw.pop("session", None)
        if session == "conversations":
            session = OpenAIConversationsSession(openai_client=client)
        result = await Runner.run(agent, "<script0>", session=session, **kw)
        items = await session.get_items() if session is not None else None
        return result, items
    return asyncio.run(go())


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_agent_loop_calls_the_tool_and_answers(base_url, api):
    CALLED.clear()
    result, _ = run(base_url, api)
    assert CALLED == ["Paris", "Rome"]  # script 0's two calls, each run by the SDK
    assert result.final_output == "Hello world"
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == 2 and kinds.count("tool_call_output_item") == 2
    assert kinds[-1] == "message_output_item"


@pytest.mark.parametrize("how", ["previous_response_id", "conversation_id", "session"])
def test_server_kept_history_answers_the_same(base_url, how):
    CALLED.clear()
    kw: dict = {}
    if how == "previous_response_id":
        kw["auto_previous_response_id"] = True
    elif how == "conversation_id":
        sync = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        kw["conversation_id"] = sync.conversations.create().id
    else:
        kw["session"] = "conversations"
    result, session_items = run(base_url, **kw)
    assert CALLED == ["Paris", "Rome"]
    assert result.final_output == "Hello world"
    if how == "conversation_id":  # the server kept every turn's items
        sync = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        listed = list(sync.conversations.items.list(kw["conversation_id"], order="asc"))
        assert [i.type for i in listed] == ["message", "message", "function_call",
                                             "function_call", "function_call_output",
                                             "function_call_output", "message"]
        assert listed[-1].content[0].text == "Hello world"
    if how == "session":  # the SDK kept them in this server's conversation
        assert [i.get("type", "message") for i in session_items][-1] == "message"
        assert len(session_items) == 7


def test_the_loop_with_top_logprobs(base_url):
    """ModelSettings(top_logprobs) over the Responses API: the SDK asks for the message's
    logprobs in every turn, the calls' turn included (it was a 400 with tools); the
    answer's text carries its tokens' entries."""
    CALLED.clear()
    result, _ = run(base_url, settings=ModelSettings(top_logprobs=2))
    assert CALLED == ["Paris", "Rome"] and result.final_output == "Hello world"
    first, last = result.raw_responses[0], result.raw_responses[-1]
    text = [o for o in first.output if o.type == "message"][0].content[0]
    assert text.text == "Let me check."  # the text before the calls: its tokens' entries
    assert "".join(e.token for e in text.logprobs) == "Let me check."
    answer = last.output[-1].content[0]
    assert [e.token for e in answer.logprobs] == ["Hello", " world"]  # not the end token
    assert all(len(e.top_logprobs) == 2 for e in answer.logprobs)


TIMES: list[str] = []


@function_tool
def get_time() -> str:
    """The time."""
    TIMES.append("asked")
    return "<script5>"


def test_a_stateless_loop_sends_its_encrypted_reasoning_back(base_url):
    """ModelSettings(store=False, response_include=["reasoning.encrypted_content"]), as a
    client that keeps nothing on the server runs a reasoning model: the first turn reasons
    and calls a tool, the SDK sends the reasoning item back with its encrypted_content
    (the include was a 400), and the server opens it."""
    TIMES.clear()
    settings = ModelSettings(store=False, response_include=["reasoning.encrypted_content"])

    async def go():
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        agent = Agent(name="clock", instructions="Answer briefly.", tools=[get_time],
                      model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                      model_settings=settings)
        return await Runner.run(agent, "<script7>")

    result = asyncio.run(go())
    assert TIMES == ["asked"] and result.final_output == "Hello world"
    first = result.raw_responses[0]
    reasoning = [o for o in first.output if o.type == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0].encrypted_content
    sent = result.to_input_list()
    assert any(i.get("type") == "reasoning" and i.get("encrypted_content")
               == reasoning[0].encrypted_content for i in sent)
    assert len(result.raw_responses) == 2  # the second turn was served, with the item
