"""The published contract (/openapi.json): each route's error statuses with OpenAI's error
body, and JSON schemas of the success bodies that are plain dicts (service/openai_format.py
builds them). FastAPI's default 422 is dropped: validation errors are 400s
(service/errors.py)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.rejections import Rule, describe

_REF = "#/components/schemas/"
RULES_KEY = "x-fp8serve-rules"
_STR, _INT = {"type": "string"}, {"type": "integer"}
_NULL_STR = {"type": ["string", "null"]}
_OBJ_OR_NULL = {"type": ["object", "null"]}
_FINISH = {"enum": ["stop", "length", "abort", "timeout", "error", None]}


def _obj(required: tuple[str, ...], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": props}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


_ERROR = _obj(("error",), error=_obj(
    ("message", "type", "param", "code"), message=_STR, type=_STR, param=_NULL_STR,
    code=_NULL_STR))
_USAGE = _obj(("prompt_tokens", "completion_tokens", "total_tokens"),
              prompt_tokens=_INT, completion_tokens=_INT, total_tokens=_INT,
              prompt_tokens_details=_obj(("cached_tokens",), cached_tokens=_INT),
              completion_tokens_details=_obj((), reasoning_tokens=_INT,
                                             accepted_prediction_tokens=_INT,
                                             rejected_prediction_tokens=_INT))
# system_fingerprint: the serving configuration (service/fingerprint.py)
_HEAD = {"id": _STR, "created": _INT, "model": _STR, "system_fingerprint": _NULL_STR}
# vLLM's return_token_ids: the prompt's ids, and each choice's (or chunk's) generated ids
_IDS = {"type": "array", "items": _INT}
# vLLM's prompt_logprobs: per prompt token null (the first) or id -> logprob, rank, text
_PROMPT_LPS = {"type": "array", "items": {"type": ["object", "null"]}}
_COMPLETION_CHOICE = _obj(("index", "text", "logprobs", "finish_reason"), index=_INT,
                          text=_STR, logprobs=_OBJ_OR_NULL, finish_reason=_FINISH,
                          prompt_token_ids=_IDS, token_ids=_IDS, prompt_logprobs=_PROMPT_LPS)
_MESSAGE = _obj(("role",), role={"const": "assistant"}, content=_NULL_STR)
_CHAT_CHOICE = _obj(("index", "message", "finish_reason"), index=_INT, message=_MESSAGE,
                    logprobs=_OBJ_OR_NULL, finish_reason=_FINISH, token_ids=_IDS)
# OpenAI's model and Anthropic's ModelInfo in one card (service/routers/openai.py)
_MODEL = _obj(("id", "object", "created", "owned_by", "type", "display_name", "created_at",
               "lifecycle"), id=_STR,
              object={"const": "model"}, created=_INT, owned_by=_STR, max_model_len=_INT,
              input_modalities={"type": "array", "items": _STR}, type={"const": "model"},
              display_name=_STR, created_at={"type": "string", "format": "date-time"},
              lifecycle={"const": "active"}, max_input_tokens=_INT, max_tokens=_INT)
_DELTA = {"type": "object", "properties": {"role": {"const": "assistant"}, "content": _STR}}
_CHUNK_CHOICE = _obj(("index", "text", "finish_reason"), index=_INT, text=_STR,
                     logprobs=_OBJ_OR_NULL, finish_reason=_FINISH, prompt_token_ids=_IDS,
                     token_ids=_IDS)
_CHAT_CHUNK_CHOICE = _obj(("index", "delta", "finish_reason"), index=_INT, delta=_DELTA,
                          logprobs=_OBJ_OR_NULL, finish_reason=_FINISH, token_ids=_IDS)


def _chunk(obj: str, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A stream chunk; the last before [DONE] may carry usage and no choices (each chunk
    carries the usage so far with vLLM's continuous_usage_stats; null with include_usage
    alone, as OpenAI's)."""
    return _obj(("id", "object", "created", "model", "choices"), **_HEAD, object={"const": obj},
                choices={"type": "array", "items": choice},
                usage={"anyOf": [_ref("Usage"), {"type": "null"}]}, **extra)


def _sse_event(chunk: str | tuple[str, ...]) -> dict[str, Any]:
    """One SSE event: a JSON chunk (of one of the components) or error body, then
    ``[DONE]`` last."""
    chunks = (chunk,) if isinstance(chunk, str) else chunk
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [*map(_ref, chunks), _ref("ErrorResponse")]}}
    data = {"type": "string", "if": {"const": "[DONE]"}, "else": json_data}
    return {"type": "object", "required": ["data"], "properties": {"data": data}}


_ANTHROPIC_ERROR = _obj(("type", "error"), type={"const": "error"},
                        error=_obj(("type", "message"), type=_STR, message=_STR,
                                   details={"type": "object"}))
_ANTHROPIC_MESSAGE = _obj(("id", "type", "role", "model", "content", "stop_reason", "usage"),
                          id=_STR, type={"const": "message"}, role={"const": "assistant"},
                          model=_STR, content={"type": "array"},
                          stop_reason=_NULL_STR, stop_sequence=_NULL_STR,
                          usage=_obj(("input_tokens", "output_tokens"), input_tokens=_INT,
                                     output_tokens=_INT))

COMPONENTS: dict[str, dict[str, Any]] = {
    "ErrorResponse": _ERROR,
    "AnthropicErrorResponse": _ANTHROPIC_ERROR,
    "AnthropicMessageResponse": _ANTHROPIC_MESSAGE,
    "InputTokens": _obj(("input_tokens",), input_tokens=_INT),
    "Response": _obj(("id", "object", "created_at", "model", "status", "output", "usage"),
                     id=_STR, object={"const": "response"}, created_at=_INT, model=_STR,
                     status={"enum": ["queued", "in_progress", "completed", "incomplete",
                                      "failed", "cancelled"]},
                     # null until a background response has run (queued, in_progress)
                     output={"type": "array"}, usage={"type": ["object", "null"]}),
    "ResponseDeleted": _obj(("id", "object", "deleted"), id=_STR,
                            object={"const": "response"}, deleted={"const": True}),
    "ResponseItemList": _obj(("object", "data", "first_id", "last_id", "has_more"),
                             object={"const": "list"},
                             data={"type": "array", "items": _obj(("id", "type"), id=_STR,
                                                                  type=_STR)},
                             first_id=_NULL_STR, last_id=_NULL_STR,
                             has_more={"type": "boolean"}),
    "ChatCompletionList": _obj(("object", "data", "first_id", "last_id", "has_more"),
                               object={"const": "list"},
                               data={"type": "array", "items": _ref("ChatCompletion")},
                               first_id=_NULL_STR, last_id=_NULL_STR,
                               has_more={"type": "boolean"}),
    "ChatCompletionDeleted": _obj(("id", "object", "deleted"), id=_STR,
                                  object={"const": "chat.completion.deleted"},
                                  deleted={"const": True}),
    "Conversation": _obj(("id", "object", "created_at", "metadata"), id=_STR,
                         object={"const": "conversation"}, created_at=_INT,
                         metadata={"type": "object"}),
    "ConversationDeleted": _obj(("id", "object", "deleted"), id=_STR,
                                object={"const": "conversation.deleted"},
                                deleted={"const": True}),
    "ConversationItem": _obj(("id", "type"), id=_STR, type=_STR),
    "Usage": _USAGE,
    "Completion": _obj(("id", "object", "created", "model", "choices", "usage"), **_HEAD,
                       object={"const": "text_completion"},
                       choices={"type": "array", "items": _COMPLETION_CHOICE},
                       usage=_ref("Usage")),
    "ChatCompletion": _obj(("id", "object", "created", "model", "choices", "usage"), **_HEAD,
                           object={"const": "chat.completion"},
                           choices={"type": "array", "items": _CHAT_CHOICE},
                           usage=_ref("Usage"), prompt_token_ids=_IDS,
                           prompt_logprobs=_PROMPT_LPS, prompt_text=_STR),
    "CompletionChunk": _chunk("text_completion", _CHUNK_CHOICE),
    "ChatCompletionChunk": _chunk("chat.completion.chunk", _CHAT_CHUNK_CHOICE,
                                  prompt_token_ids=_IDS, prompt_text=_STR),
    "ModelList": _obj(("object", "data", "has_more", "first_id", "last_id"),
                      object={"const": "list"}, data={"type": "array", "items": _MODEL},
                      has_more={"type": "boolean"}, first_id=_NULL_STR, last_id=_NULL_STR),
    "Model": _MODEL,
    "Tokens": _obj(("tokens", "count", "max_model_len"),
                   tokens={"type": "array", "items": _INT}, count=_INT, max_model_len=_INT,
                   token_strs={"type": "array", "items": _STR}),
    "Text": _obj(("prompt",), prompt=_STR),
    "ResponseInputTokens": _obj(("object", "input_tokens"),
                                object={"const": "response.input_tokens"}, input_tokens=_INT),
    "Health": _obj(("status",), status={"enum": ["loading", "ready", "draining", "dead"]},
                   error=_STR, running=_INT, waiting=_INT),
}

_WHY = {
    400: "invalid request: schema, a value the model cannot take (token id, length), or a "
         "not-implemented OpenAI field (service/unsupported.py)",
    401: "missing or wrong API key (when the server has keys)",
    404: "the request names a model this server does not serve",
    408: "the request ran past the server's request timeout",
    429: "the waiting queue is full; retry after Retry-After seconds",
    503: "the model is loading, or the server is draining or its engine died",
}


def errors(*statuses: int, body: str = "ErrorResponse",
           rules: tuple[Rule, ...] = (), not_found: str | None = None
           ) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for a route's error statuses, each with the error body
    (``body``: the component, AnthropicErrorResponse on Anthropic's routes). ``rules``: the
    400s a schema-valid request can still get (service/rejections.py), named in the 400's
    description and listed as data under ``x-fp8serve-rules``. ``not_found``: the 404's
    description on a route of stored objects (else: an unserved model)."""
    why = {**_WHY, 404: not_found} if not_found else _WHY
    out: dict[int | str, dict[str, Any]] = {
        s: {"description": why[s], "content": {"application/json": {"schema": _ref(body)}}}
        for s in statuses}
    if rules:
        out[400]["description"] += ("; a schema-valid request can still get a 400 naming "
                                    "the field for these rules:\n" + describe(rules))
        out[400][RULES_KEY] = [r.as_dict() for r in rules]
    return out


def ok(component: str | tuple[str, ...], chunk: str | tuple[str, ...] | None = None,
       status: int = 200, description: str = "success") -> dict[int | str, dict[str, Any]]:
    """A success entry with a component body; ``chunk``: or SSE events, each that
    component (``stream: true`` in the request). Several components: one of them."""
    def one_of(names: str | tuple[str, ...]) -> dict[str, Any]:
        return _ref(names) if isinstance(names, str) else {"oneOf": [_ref(n) for n in names]}

    content: dict[str, Any] = {"application/json": {"schema": one_of(component)}}
    if chunk is not None:
        content["text/event-stream"] = {"schema": _sse_event(chunk)}
    return {status: {"description": description, "content": content}}


def _drop_422(schema: dict[str, Any]) -> None:
    for item in schema.get("paths", {}).values():
        for op in item.values():
            op.get("responses", {}).pop("422", None)
    comps = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        comps.pop(name, None)


def install_openapi(app: FastAPI) -> None:
    """Replace app.openapi with the contract above (built once, then cached)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description=app.description)
            _drop_422(schema)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]


def ok_events(component: str, description: str) -> dict[int | str, dict[str, Any]]:
    """A success entry with a component body, or (``stream: true``) named SSE events
    (``event:`` and ``data:`` lines, Anthropic's and the Responses API's streams)."""
    events = {"type": "object", "required": ["event", "data"],
              "properties": {"event": _STR, "data": _STR}}
    return {200: {"description": description, "content": {
        "application/json": {"schema": _ref(component)},
        "text/event-stream": {"schema": events}}}}
