"""OpenAI's Responses API onto the chat run: a ResponsesRequest becomes the
ChatCompletionRequest it means.

- ``instructions`` is a system message first; ``input`` a string (one user message) or
  items: ``message`` items (``input_text`` / ``output_text`` parts are text parts,
  ``input_image`` an ``image_url`` part), ``function_call`` items the calls of an
  assistant message (consecutive calls share one), ``function_call_output`` items
  ``tool`` messages; ``reasoning`` items are dropped from the prompt; consecutive
  messages of one role are one turn (service/translate/turns.py);
- ``include: ["message.output_text.logprobs"]`` (with ``top_logprobs``) is chat's
  ``logprobs`` (``top_logprobs``): the message's ``output_text`` part and its deltas carry
  the entries of the tokens its text is made of, each with the token's own bytes (an
  output read as plain text: every generated token's; with tools or reasoning, not those
  of the calls, the reasoning or their markers); ``"reasoning.encrypted_content"`` puts a
  reasoning item's text, sealed, in its ``encrypted_content`` (service/translate/sealed.py),
  for a client that stores nothing here to send it back;
- ``tools`` (function), ``tool_choice`` (``allowed_tools`` too, in the Responses shape),
  ``parallel_tool_calls`` as on chat;
  ``text.format`` is chat's ``response_format``; ``max_output_tokens`` is ``max_tokens``;
- ``reasoning.effort``: ``"none"`` is a thinking budget of 0 on a model that reasons (a
  section it opens is closed at once; service/tool_calls/thinking.py) and a no-op on one
  without a reasoning parser; other efforts are 400s (no effort control to map them to).
  ``reasoning.summary`` (and ``generate_summary``) other than null is a 400: a summary
  needs a second generation, and the reasoning item carries the reasoning text itself.

The output (service/translate/responses_stream.py) is built by one encoder for both
modes: the non-streaming body is the stream's last snapshot.

``previous_response_id`` continues a stored response (service/store/responses.py): the
prompt is built from its context, its output items read back as input items (as a
client sending the whole history would), then this request's input; ``instructions``
are this request's only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from service.errors import APIError
from service.schemas import ChatCompletionRequest
from service.tool_calls.call_json import complete_members
from service.tool_calls.select import ParserChoice
from service.tool_calls.thinking import effort_budget, thinking_budget
from service.translate import sealed
from service.translate.anthropic import validated
from service.translate.schemas import (
    AllowedFunctions,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputText,
    MessageItem,
    OutputText,
    ResponsesRequest,
)
from service.translate.turns import one_turn_each

_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs"}


def own_items(body: ResponsesRequest) -> list[InputItem]:
    """The request's input as items (a string is one user message)."""
    if isinstance(body.input, str):
        return [MessageItem(role="user", content=body.input)]
    return list(body.input)


def output_items(output: list[dict[str, Any]]) -> list[InputItem]:
    """A response's output items as the input items a client would send back."""
    return _ITEMS.validate_python(output)


def with_ids(items: Sequence[InputItem]) -> list[InputItem]:
    """The items, each without an id given a new one (so that the response's input_items
    and the conversation list an item under one id)."""
    return [i if i.id is not None else i.model_copy(update={"id": _new_id(i.type)})
            for i in items]


def _new_id(item_type: str) -> str:
    return f"{_ID_PREFIX[item_type]}_{uuid.uuid4().hex}"


def items_json(items: Sequence[InputItem], status: bool = False) -> list[dict[str, Any]]:
    """Input items as ``GET /v1/responses/{id}/input_items`` lists them: each with its id
    (the one it was sent with, else a new one), a message's string content as one text
    part; ``status``: each (but reasoning) also a status, as conversation items are listed:
    its own (a cut call's "incomplete"), else "completed"."""
    out = []
    for item in with_ids(items):  # the callers' items have theirs already (one id each)
        data = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            data["content"] = [{"type": kind, "text": item.content}]
        if status and item.type != "reasoning":
            data.setdefault("status", "completed")
        out.append({"id": data.pop("id"), **data})
    return out


def _parts(content: Any) -> Any:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": p.text} if isinstance(p, InputText | OutputText)
            else {"type": "image_url", "image_url": {"url": p.image_url, "detail": p.detail}}
            for p in content]


def _call(item: FunctionCallItem) -> dict[str, Any]:
    """A call of the history; one max_output_tokens cut (status incomplete, as this
    server stores and returns it) with its complete members only, so that the turn after
    it can be rendered (its cut JSON was a 400 on every later turn). Arguments the model
    wrote as no valid JSON (a Mistral call's are returned as generated) go back as a JSON
    string of that text, so that they render too: the Jinja templates write a string as
    it is, mistral-common's encoding as it wrote that text already (OpenAI keeps
    arguments a string; a template's JSON parse made them a 400 on every later turn)."""
    arguments = item.arguments
    if item.status == "incomplete":
        arguments = json.dumps(complete_members(arguments), ensure_ascii=False)
    elif not _is_json(arguments or "{}"):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": arguments}}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _messages(body: ResponsesRequest, context: Sequence[InputItem]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    for item in context:
        last = out[-1] if out else None
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _parts(item.content)})
        elif isinstance(item, FunctionCallItem):
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(_call(item))
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [_call(item)]})
        elif isinstance(item, FunctionCallOutputItem):
            # a part list stays parts: the template or encoding joins a tool's parts
            output = (item.output if isinstance(item.output, str)
                      else [{"type": "text", "text": p.text} for p in item.output])
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    if not out:
        raise APIError(400, "input: no message to answer (reasoning items are dropped from "
                       "the prompt)", "input")
    return one_turn_each(out)


def _format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    spec = {"name": fmt.name or "response", "schema": fmt.schema_,
            "description": fmt.description, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items()
                                                   if v is not None}}


def _reasoning(body: ResponsesRequest, parsers: ParserChoice, tok: Any) -> int | None:
    """The chat request's thinking_token_budget for ``reasoning`` (None: no cap)."""
    r = body.reasoning
    if r is None:
        return None
    for name in ("summary", "generate_summary"):
        if getattr(r, name) is not None:
            field = f"reasoning.{name}"
            raise APIError(400, f"{field}: {getattr(r, name)!r} is not supported: this server "
                           "writes no reasoning summaries (that needs a second generation); "
                           "the reasoning item carries the reasoning text itself (accepted: "
                           "null)", field)
    budget = effort_budget(r.effort, "reasoning.effort")
    if budget is None or parsers.reasoning_parser is None:
        return None  # no reasoning format: "none" is what the model does anyway
    thinking_budget(tok, parsers.reasoning_parser, budget, "reasoning.effort")
    return budget


LOGPROBS = "message.output_text.logprobs"
INCLUDES = (LOGPROBS, sealed.INCLUDE)


def seals(body: ResponsesRequest) -> bool:
    """Whether the reasoning items carry ``encrypted_content``."""
    return sealed.INCLUDE in (body.include or [])


def _logprobs(body: ResponsesRequest) -> int | None:
    """The chat request's top_logprobs when ``include`` asks for the message's logprobs
    (None: not asked)."""
    include = body.include or []
    for value in include:
        if value not in INCLUDES:
            raise APIError(400, f"include: {value!r} is not supported: nothing is stored or "
                           "run beside the model here (accepted: "
                           f"{', '.join(map(repr, INCLUDES))})", "include")
    if LOGPROBS not in include:
        if body.top_logprobs:
            raise APIError(400, f"top_logprobs: needs include [{LOGPROBS!r}], which "
                           "returns the logprobs", "top_logprobs")
        return None
    return body.top_logprobs or 0


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def to_chat(body: ResponsesRequest, parsers: ParserChoice, tok: Any,
            context: Sequence[InputItem] | None = None) -> ChatCompletionRequest:
    """The chat request ``body`` means; ``tok``: the model's tokenizer; ``context``: the
    input items the prompt is built from (default: the request's own)."""
    items = own_items(body) if context is None else context
    data: dict[str, Any] = {"model": body.model, "messages": _messages(body, items),
                            "parallel_tool_calls": body.parallel_tool_calls,
                            "stream": body.stream}
    top = _logprobs(body)
    if top is not None:
        data["logprobs"], data["top_logprobs"] = True, top
    budget = _reasoning(body, parsers, tok)
    if budget is not None:
        data["thinking_token_budget"] = budget
    if body.tools:
        data["tools"] = [{"type": "function", "function": t.model_dump(
            exclude_none=True, exclude={"type"})} for t in body.tools]
    tc = body.tool_choice
    if isinstance(tc, AllowedFunctions):
        data["tool_choice"] = {"type": "allowed_tools", "allowed_tools": {
            "mode": tc.mode, "tools": [_named(t.name) for t in tc.tools]}}
    elif tc is not None:
        data["tool_choice"] = tc if isinstance(tc, str) else _named(tc.name)
    fmt = _format(body)
    if fmt is not None:
        data["response_format"] = fmt
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p")):
        if getattr(body, theirs) is not None:
            data[ours] = getattr(body, theirs)
    return validated(data)
