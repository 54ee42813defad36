"""Anthropic's Messages API onto the chat run: a MessagesRequest becomes the
ChatCompletionRequest it means, and a finished choice becomes Anthropic's message.

- ``system`` (a string or text blocks) is a system message first; several text blocks
  (of the system, a tool_result or an assistant turn) stay text parts, joined as the chat
  template or the mistral-common encoding joins a message's parts;
- user ``text`` / ``image`` blocks are OpenAI text / ``image_url`` parts (an image's base64
  source a data: URL); each ``tool_result`` block is a ``tool`` message (``is_error``
  puts "Error: " in front of its content; an image block in it is a 400 naming it, as
  chat's tool messages are text);
- assistant ``text`` blocks are its content, ``tool_use`` blocks its tool calls (input
  as JSON text); ``thinking`` / ``redacted_thinking`` blocks are dropped from the prompt,
  as Anthropic's own models drop earlier turns' thinking (a thinking block's signature is
  checked first, service/translate/signature.py), and a turn of thinking alone with them;
  consecutive user (or assistant) messages are one turn of their blocks, as Anthropic
  combines them; a user message's ``tool_result`` blocks come first (a 400 otherwise);
- ``tool_choice`` auto / any / tool / none is auto / required / a named function / none,
  ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``;
- ``thinking: {type: enabled}`` needs a model with a reasoning parser (a 400 otherwise)
  and a tool_choice that does not force tool use (``any`` or ``tool``: a 400, as Anthropic);
  ``budget_tokens`` must be below ``max_tokens`` and is enforced in the sampler (chat's
  ``thinking_token_budget``, service/tool_calls/thinking.py): a 400 naming it where the
  model's reasoning markers are not single tokens. ``{type: disabled}`` is a budget of 0
  on a model that reasons (a section it opens is closed at once); left out, or
  ``{type: adaptive}``, the model reasons as it does by default;
- a final assistant message with text is a prefill: the answer continues it (chat's
  ``continue_final_message``) and holds only what follows; with thinking enabled it must
  start with a thinking block (a 400 otherwise, as Anthropic);
- ``output_config.format`` (structured outputs, a JSON schema) is chat's ``json_schema``
  response format (grammar-constrained); ``output_config.effort`` other than null is a 400.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from engine.request import FinishReason
from service.errors import APIError
from service.schemas import ChatCompletionRequest
from service.tool_calls.call_json import complete_members
from service.tool_calls.choice import ChoiceReader
from service.tool_calls.select import ParserChoice
from service.tool_calls.thinking import thinking_budget
from service.translate.schemas import (
    AnthropicMessage,
    CountTokensRequest,
    ImageBlock,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from service.translate.turns import one_turn_each


def _part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    src = block.source
    url = src.url if src.type == "url" else f"data:{src.media_type};base64,{src.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: ToolResultBlock, where: str) -> dict[str, Any]:
    """The ``tool`` message of a tool_result block (``where``: its path in the request)."""
    if not isinstance(block.content, str):
        for k, b in enumerate(block.content):
            if isinstance(b, ImageBlock):  # chat's tool messages are text
                raise APIError(400, f"{where}.content.{k}: an image in a tool_result is not "
                               "served (tool results are read as text; send the image in a "
                               "user text turn)", f"{where}.content.{k}")
    parts = ([{"type": "text", "text": block.content}] if isinstance(block.content, str)
             else [_part(b) for b in block.content])
    if block.is_error:  # one text, so no join separator lands after the prefix
        first = parts[0] if parts else {"type": "text", "text": ""}
        parts[:1] = [{"type": "text", "text": "Error: " + first["text"]}]
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": parts}


def _user(content: Any, i: int) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if isinstance(block, ToolResultBlock):
            if parts:  # Anthropic's rule: the results answer the calls right before them
                field = f"messages.{i}.content.{j}"
                raise APIError(400, f"{field}: a tool_result block after a text or image "
                               "block: a user message's tool_result blocks come first",
                               field)
            out.append(_tool_message(block, f"messages.{i}.content.{j}"))
        elif isinstance(block, TextBlock | ImageBlock):
            parts.append(_part(block))
        else:
            raise APIError(400, f"messages: a user message cannot carry {block.type} blocks",
                           "messages")
    return out + ([{"role": "user", "content": parts}] if parts else [])


def _assistant(content: Any) -> dict[str, Any]:
    if isinstance(content, str):  # empty: dropped, as an empty text block is
        return {"role": "assistant", "content": content or None}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, TextBlock):
            if block.text:
                parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input)}})
        elif isinstance(block, ImageBlock | ToolResultBlock):
            raise APIError(400, f"messages: an assistant message cannot carry {block.type} "
                           "blocks",
                           "messages")
    text: Any = parts[0]["text"] if len(parts) == 1 else parts or None
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    return {**msg, "tool_calls": calls} if calls else msg


def _messages(body: CountTokensRequest | MessagesRequest) -> list[dict[str, Any]]:
    system: Any = body.system
    if isinstance(system, list):  # blocks stay parts: the template or encoding joins them
        system = [{"type": "text", "text": b.text} for b in system if b.text]
    out = [{"role": "system", "content": system}] if system else []
    for i, m in enumerate(body.messages):
        if m.role == "user":
            out += _user(m.content, i)
            continue
        msg = _assistant(m.content)
        if msg["content"] is not None or "tool_calls" in msg:
            out.append(msg)
        # else only thinking (or empty text): the turn is dropped whole, as its thinking
        # is (an empty assistant turn is no valid message to Mistral's encoding)
    if all(m["role"] == "system" for m in out):
        raise APIError(400, "messages: no message to answer (thinking blocks and empty "
                       "text are dropped from the prompt)", "messages")
    return one_turn_each(out)


def _tool_fields(body: CountTokensRequest | MessagesRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if body.tools:
        out["tools"] = [{"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema,
            **({"description": t.description} if t.description else {}),
            **({"strict": t.strict} if t.strict is not None else {})}}
            for t in body.tools]
    tc = body.tool_choice
    if tc is not None:
        if tc.type == "tool" and not tc.name:
            raise APIError(400, "tool_choice.name: a tool_choice of type tool needs a name",
                           "tool_choice.name")
        out["tool_choice"] = ({"type": "function", "function": {"name": tc.name}}
                              if tc.type == "tool" else
                              {"auto": "auto", "any": "required", "none": "none"}[tc.type])
        out["parallel_tool_calls"] = not tc.disable_parallel_tool_use
    return out


def _thinking(body: CountTokensRequest | MessagesRequest, parsers: ParserChoice, tok: Any
              ) -> int | None:
    """The chat request's thinking_token_budget: budget_tokens when enabled, 0 when
    disabled on a model that reasons; a 400 naming the field where it cannot be enforced,
    or where tool_choice forces tool use."""
    t, parser = body.thinking, parsers.reasoning_parser
    if t is None or t.type == "adaptive" or (t.type == "disabled" and parser is None):
        return None  # adaptive: the model reasons as it does, if it can
    forced = body.tool_choice.type if body.tool_choice else None
    if t.type == "enabled" and forced in ("any", "tool"):  # Anthropic's rule
        raise APIError(400, "thinking: thinking may not be enabled when tool_choice forces "
                       f"tool use (tool_choice.type {forced!r}): send tool_choice auto or "
                       "none, or thinking disabled", "thinking")
    if t.type == "disabled":
        thinking_budget(tok, parser, 0, "thinking")
        return 0
    _check_prefill(body.messages)
    if parser is None:
        raise APIError(400, "thinking: this model has no reasoning format the server can "
                       "read (start it with --reasoning-parser)", "thinking")
    limit = getattr(body, "max_tokens", None)
    if limit is not None and t.budget_tokens >= limit:
        raise APIError(400, "thinking.budget_tokens: must be less than max_tokens",
                       "thinking.budget_tokens")
    thinking_budget(tok, parser, t.budget_tokens, "thinking.budget_tokens")
    return t.budget_tokens


def _check_prefill(messages: list[AnthropicMessage]) -> None:
    """With thinking enabled, a final assistant message (a prefill) starts with a thinking
    or redacted_thinking block, as Anthropic's rule: after a text prefill the answer is
    past its reasoning, so the thinking asked for could not be given."""
    i, last = len(messages) - 1, messages[-1]
    if last.role != "assistant":
        return
    first = last.content if isinstance(last.content, str) else last.content[0]
    if isinstance(first, ThinkingBlock | RedactedThinkingBlock):
        return
    field = f"messages.{i}.content" + ("" if isinstance(first, str) else ".0.type")
    found = "a string" if isinstance(first, str) else first.type
    raise APIError(400, f"{field}: expected thinking or redacted_thinking, found {found}: "
                   "with thinking enabled, a final assistant message (a prefill) must start "
                   "with a thinking block; send thinking disabled to continue it", field)


def _output(body: MessagesRequest) -> dict[str, Any]:
    """``output_config.format`` (structured outputs) as chat's json_schema format."""
    cfg = body.output_config
    if cfg is None:
        return {}
    if cfg.effort is not None:
        raise APIError(400, f"output_config.effort: {cfg.effort!r} is not supported: this "
                       "server has no effort control (accepted: null)", "output_config.effort")
    if cfg.format is None:
        return {}
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": cfg.format.schema_, "strict": True}}}


def to_chat(body: CountTokensRequest | MessagesRequest, parsers: ParserChoice, tok: Any
            ) -> ChatCompletionRequest:
    """The chat request ``body`` means (sampling fields left out take the model's
    defaults, as on the chat route); ``tok``: the model's tokenizer."""
    messages = _messages(body)
    data: dict[str, Any] = {"model": body.model, "messages": messages, **_tool_fields(body)}
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and last.get("content") and "tool_calls" not in last:
        # a prefill: the answer continues the final assistant message
        data.update(continue_final_message=True, add_generation_prompt=False)
    budget = _thinking(body, parsers, tok)
    if budget is not None:
        data["thinking_token_budget"] = budget
    if isinstance(body, MessagesRequest):
        data.update(max_tokens=body.max_tokens, stream=body.stream, **_output(body))
        for ours, theirs in (("stop", "stop_sequences"), ("temperature", "temperature"),
                             ("top_p", "top_p"), ("top_k", "top_k")):
            if getattr(body, theirs) is not None:
                data[ours] = getattr(body, theirs)
    return validated(data)


def validated(data: dict[str, Any]) -> ChatCompletionRequest:
    """The translated chat request; what chat's model refuses is a 400 naming its place."""
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise APIError(400, f"{param}: {err['msg']}", param) from exc


def stop_reason(reader: ChoiceReader, finish: FinishReason | None,
                stop: int | str | None, window: bool = False) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence) of a finished choice (``finish`` and
    ``stop``: its engine finish_reason and stop_reason; ``window``: a length stop there
    was max_model_len's, before max_tokens)."""
    reason = reader.finish_reason(finish)
    if reason is None:
        return None, None
    if isinstance(stop, str):  # a stop sequence ended it, after tool calls too
        return "stop_sequence", stop
    if reason == "tool_calls":
        return "tool_use", None
    if finish is FinishReason.LENGTH:
        return ("model_context_window_exceeded" if window else "max_tokens"), None
    return "end_turn", None


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object (complete_members): the anthropic SDK's stream
    accumulator parses the same ``input_json_delta`` text, so both modes give one input."""
    return complete_members(arguments)


def usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, int]:
    """Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens is the
    whole prompt."""
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
