"""Refusals named in the caller's API. The Messages and Responses routes run a translated
chat request; a 400 raised on it names a chat field (``max_tokens``, ``messages[3]``,
``response_format``), which ``in_responses`` / ``in_messages`` rename to the field of the
request the client sent. The rule chat checks across messages (a tool result answers an
earlier call) is checked first on the request itself, so its 400 names the exact block or
item."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from engine.request import InvalidRequestError
from service.errors import APIError, from_engine_error
from service.translate.schemas import (
    AnthropicMessage,
    FunctionCallItem,
    FunctionCallOutputItem,
    ToolResultBlock,
    ToolUseBlock,
)

_HEAD = re.compile(r"^([a-z_]+)(.*)$")


def responses_field(param: str) -> str:
    head, rest = _HEAD.match(param).groups()  # type: ignore[union-attr]
    if head == "tools":
        return param.replace(".function.", ".")  # a function tool is flat here
    if param.startswith("tool_choice.allowed_tools."):  # flat here too
        return "tool_choice." + param[len("tool_choice.allowed_tools."):].replace(
            ".function.", ".")
    return {"max_tokens": "max_output_tokens", "response_format": "text.format",
            "messages": "input"}.get(head, head + rest)


def messages_field(param: str) -> str:
    head, rest = _HEAD.match(param).groups()  # type: ignore[union-attr]
    if head == "tools":  # tools[0].function.parameters -> tools.0.input_schema
        return re.sub(r"\[(\d+)\]", r".\1", param).replace(".function.parameters",
                                                            ".input_schema")
    if head == "messages" and rest.startswith("["):  # chat's indexes are not the request's
        return "messages"
    return {"stop": "stop_sequences", "response_format": "output_config.format"}.get(
        head, head + rest)


def _renamed(exc: APIError | InvalidRequestError, field: Callable[[str], str]) -> APIError:
    exc = exc if isinstance(exc, APIError) else from_engine_error(exc)
    if exc.status != 400 or not exc.param or not _HEAD.match(exc.param):
        return exc
    param = field(exc.param)
    if param == exc.param:
        return exc
    message = exc.message
    if message.startswith(exc.param):
        message = message[len(exc.param):].lstrip(":").lstrip()
    return APIError(400, f"{param}: {message}", param, exc.code, exc.headers, exc.counted)


def in_responses(exc: APIError | InvalidRequestError) -> APIError:
    """``exc`` naming the Responses request's field."""
    return _renamed(exc, responses_field)


def in_messages(exc: APIError | InvalidRequestError) -> APIError:
    """``exc`` naming the Messages request's field."""
    return _renamed(exc, messages_field)


def check_function_outputs(items: Sequence[object], earlier: Sequence[object] = (),
                           name: str = "input") -> None:
    """A function_call_output answers a function_call earlier in ``input`` (``name``: the
    field that holds ``items``) or in ``earlier`` (the items of the response or the
    conversation it continues)."""
    calls = {i.call_id for i in earlier if isinstance(i, FunctionCallItem)}
    for k, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id not in calls:
            field = f"{name}[{k}].call_id"
            raise APIError(400, f"{field}: {item.call_id!r} answers no function_call "
                           f"earlier in {name} (or in the previous response or the "
                           "conversation)", field)


def check_item_ids(items: Sequence[object], taken: Iterable[str] = (),
                   name: str = "input") -> None:
    """An item's ``id`` names one item: none twice in ``items``, and none ``taken`` by
    the items of what they continue (a conversation, a previous response's chain), as
    OpenAI answers "Duplicate item" (an item sent again would be in the prompt twice)."""
    seen = set(taken)
    for k, item in enumerate(items):
        item_id = getattr(item, "id", None)
        if item_id is None:
            continue
        if item_id in seen:
            field = f"{name}[{k}].id"
            raise APIError(400, f"{field}: Duplicate item found with id {item_id!r}; an "
                           f"item id names one item of the {name} and of what it continues "
                           "(the conversation or the previous response)", field)
        seen.add(item_id)


def check_tool_results(messages: Sequence[AnthropicMessage]) -> None:
    """A tool_result block answers a tool_use block of an earlier assistant message."""
    uses: set[str] = set()
    for i, m in enumerate(messages):
        for j, block in enumerate(m.content if isinstance(m.content, list) else ()):
            if isinstance(block, ToolUseBlock) and m.role == "assistant":
                uses.add(block.id)
            elif isinstance(block, ToolResultBlock) and block.tool_use_id not in uses:
                field = f"messages.{i}.content.{j}.tool_use_id"
                raise APIError(400, f"{field}: {block.tool_use_id!r} answers no tool_use "
                               "block of an earlier assistant message", field)
