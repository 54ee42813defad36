"""Every OpenAI request field, per endpoint, in one of three classes:

- IMPLEMENTED: the server honours it (a field of the request model in service/schemas/);
- NOOP: the server does not implement it; the values listed are what it does anyway (a
  no-op), so they are accepted; any other value is a 400 naming the field;
- HINTS: accepted with any value and ignored, because they never change what is generated.
  ``user``, ``safety_identifier``: end-user ids for OpenAI's abuse monitoring (this server
  does none); ``prompt_cache_key``, ``prompt_cache_retention``, ``prompt_cache_options``:
  cache-routing and retention advice; the prefix cache here is automatic (cache_salt
  isolates it), and a cache only ever changes latency, never the text.
  ``include_obfuscation``: padding
  against length side channels, which carries no content.

VLLM_NOOP and VLLM_HINTS classify vLLM's request extensions the same way (clients written
for vLLM send them as extra_body). Any other top-level field of an endpoint's body (a
typo, an extension of another server) is a 400 naming it, as OpenAI ("Unrecognized
request argument supplied") and Anthropic ("Extra inputs are not permitted") answer: a
``max_token`` ignored would quietly generate 16 tokens. Null is a field left out. Nested
objects (messages, content parts, tool definitions of OpenAI's API) only log theirs:
clients echo response objects back into the next request with fields that carry nothing
for the prompt.
tests/service/test_unsupported_fields.py walks the installed openai SDK's request
TypedDicts and fails on a field in none of the classes.

Accepted values are compared as JSON (``true`` is not ``1``; ``1.0`` is ``1``), see
:func:`is_noop`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
STREAM_OPTIONS = "stream_options"
MESSAGES = "/v1/messages"  # Anthropic's API
COUNT_TOKENS = "/v1/messages/count_tokens"
RESPONSES = "/v1/responses"
TOKENIZE = "/tokenize"  # vLLM's
RESPONSES_INPUT_TOKENS = "/v1/responses/input_tokens"
RESPONSES_TEXT = "text"  # the Responses API's text config (format, verbosity)
ANTHROPIC_TOOL = "tools[] (Anthropic)"  # a /v1/messages tool definition

_SAMPLING = ("model", "stream", "stream_options", "temperature", "top_p", "n", "seed",
             "stop", "presence_penalty", "frequency_penalty", "logit_bias")

IMPLEMENTED: Mapping[str, frozenset[str]] = {
    COMPLETIONS: frozenset(_SAMPLING + ("prompt", "max_tokens", "logprobs", "echo",
                                        "best_of")),
    # tools, tool_choice, parallel_tool_calls and response_format belong to the tool-call
    # and structured-output work (service/tool_calls/, engine/structured/)
    CHAT: frozenset(_SAMPLING + (
        "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs",
        "tools", "tool_choice", "parallel_tool_calls", "response_format",
        "reasoning_effort", "prediction", "store", "metadata")),
    STREAM_OPTIONS: frozenset({"include_usage"}),
    MESSAGES: frozenset({"model", "max_tokens", "messages", "system", "stop_sequences",
                         "temperature", "top_p", "top_k", "stream", "tools", "tool_choice",
                         "thinking", "output_config"}),
    COUNT_TOKENS: frozenset({"model", "messages", "system", "tools", "tool_choice",
                             "thinking"}),
    RESPONSES: frozenset({"model", "input", "instructions", "tools", "tool_choice",
                          "parallel_tool_calls", "text", "max_output_tokens", "temperature",
                          "top_p", "stream", "reasoning", "include", "top_logprobs",
                          "store", "previous_response_id", "metadata", "background",
                          "truncation", "conversation", "max_tool_calls"}),
    RESPONSES_INPUT_TOKENS: frozenset({
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "text", "reasoning", "previous_response_id", "truncation", "conversation"}),
    RESPONSES_TEXT: frozenset({"format"}),
    ANTHROPIC_TOOL: frozenset({"type", "name", "description", "input_schema", "strict"}),
}

NOOP: Mapping[str, Mapping[str, tuple[Any, ...]]] = {
    COMPLETIONS: {
        "suffix": (None, ""),  # no fill-in-the-middle
    },
    CHAT: {
        "audio": (None,),
        "modalities": (None, ["text"]),
        "web_search_options": (None,),
        "functions": (None, []),  # deprecated for tools
        "function_call": (None, "none"),  # deprecated for tool_choice
        "verbosity": (None,),
        "service_tier": (None, "auto", "default"),  # one tier here
        "moderation": (None,),
    },
    STREAM_OPTIONS: {},
    MESSAGES: {
        "service_tier": (None, "auto", "standard_only"),  # one tier here
        "speed": (None, "standard"),
        "container": (None,),  # no code-execution containers
        "mcp_servers": (None, []),  # no MCP connector
        "context_management": (None,),
    },
    COUNT_TOKENS: {"mcp_servers": (None, []), "context_management": (None,),
                   "output_config": (None,), "speed": (None, "standard")},
    RESPONSES: {
        "prompt": (None,),  # stored prompt templates
        "service_tier": (None, "auto", "default"),
        "context_management": (None,),
        "background_options": (None,),
        "access_programs": (None,),
        "image": (None,),  # image-generation options
        "moderation": (None,),
    },
    RESPONSES_INPUT_TOKENS: {"personality": (None,)},  # a ChatGPT reply style
    RESPONSES_TEXT: {"verbosity": (None,)},  # as chat's verbosity: no length control
    ANTHROPIC_TOOL: {
        "defer_loading": (None, False),  # no tool search: every tool is in the prompt
        "allowed_callers": (None, ["direct"]),  # no code-execution callers
        "input_examples": (None, []),  # examples are not rendered into the prompt
        # a call's input streams as it is generated (input_json_delta) either way; false
        # (buffer the whole input) is not served
        "eager_input_streaming": (None, True),
    },
}

# vLLM's request extensions this server does not implement: a 400 naming the field unless
# the value is vLLM's default (what happens here anyway). Clients written for vLLM send
# them as extra_body; ignoring one would answer something other than what was asked.
_VLLM_SAMPLING_NOOP: dict[str, tuple[Any, ...]] = {
    # kept special tokens (skip_special_tokens false) are joined as the tokenizer decodes
    # them, with no spaces added: false; vLLM's default true gives the same text with a
    # fast tokenizer (its fast detokenizer does not read the flag)
    "spaces_between_special_tokens": (None, True, False),
    "logits_processors": (None, []),
    "kv_transfer_params": (None,),
    "ec_transfer_params": (None,),
    "return_token_offsets": (None, False),
    "repetition_detection": (None,),
    "vllm_xargs": (None, {}),
    "mm_processor_kwargs": (None, {}),
    "media_io_kwargs": (None, {}),
}
VLLM_NOOP: Mapping[str, Mapping[str, tuple[Any, ...]]] = {
    COMPLETIONS: {**_VLLM_SAMPLING_NOOP, "prompt_embeds": (None,),
                  "return_prompt_text": (None, False)},
    CHAT: {**_VLLM_SAMPLING_NOOP,
           # reasoning is returned apart (reasoning_content) whenever a parser reads it:
           # vLLM's default; false (drop it) is not served
           "include_reasoning": (None, True),
           "best_of": (None, 1),  # one candidate per choice (n)
           },
    TOKENIZE: {"mm_processor_kwargs": (None, {})},
}
# vLLM's request and session ids name the request in its logs; the output never changes
VLLM_HINTS: Mapping[str, frozenset[str]] = {
    COMPLETIONS: frozenset({"request_id", "session_id"}),
    CHAT: frozenset({"request_id", "session_id"}),
}

_CACHE_HINTS = ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options")
HINTS: Mapping[str, frozenset[str]] = {
    COMPLETIONS: frozenset({"user"}),
    CHAT: frozenset(("user", "safety_identifier") + _CACHE_HINTS),
    STREAM_OPTIONS: frozenset({"include_obfuscation"}),
    RESPONSES_TEXT: frozenset(),
    ANTHROPIC_TOOL: frozenset({"cache_control"}),
    # Anthropic's: metadata.user_id (abuse monitoring), cache_control (prompt caching
    # breakpoints; the prefix cache here is automatic), where and for whom it runs
    MESSAGES: frozenset({"metadata", "cache_control", "inference_geo", "diagnostics",
                         "user_profile_id", "workspace_id"}),
    COUNT_TOKENS: frozenset({"cache_control", "user_profile_id", "workspace_id"}),
    RESPONSES: frozenset(("user", "safety_identifier", "stream_options")
                         + _CACHE_HINTS),
    RESPONSES_INPUT_TOKENS: frozenset(),
}


def whole_numbers(value: Any) -> Any:
    """JSON has one number type: 2.0 is the integer 2 (JSON Schema's rule), 2.5 is not;
    bools stay bools."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    return value


def _json(value: Any) -> str:
    return json.dumps(whole_numbers(value), sort_keys=True)


def is_noop(value: Any, accepted: Iterable[Any]) -> bool:
    return _json(value) in {_json(a) for a in accepted}


@dataclass(frozen=True)
class Unsupported:
    """A request field set to a value this server does not implement."""

    field: str
    value: Any
    accepted: tuple[Any, ...]

    def message(self) -> str:
        ok = " or ".join(_json(a) for a in self.accepted)
        return (f"{_json(self.value)[:80]} is not supported by this server "
                f"(accepted: {ok}; or leave it out)")


@dataclass(frozen=True)
class Unrecognized:
    """A top-level field no class names for its endpoint."""

    field: str
    value: Any

    def message(self) -> str:
        return (f"unrecognized request argument supplied: {self.field!r} is not a field of "
                "this endpoint (GET /openapi.json lists them); leave it out")


def rejects_unknown(endpoint: str) -> bool:
    """Whether a field no class names is a 400 on ``endpoint`` (its top-level bodies), or
    only logged (a nested object's, by its model's name)."""
    return endpoint in IMPLEMENTED or endpoint == TOKENIZE


def check_fields(endpoint: str, data: Mapping[str, Any], known: Iterable[str],
                 strict: bool | None = None) -> Unsupported | Unrecognized | None:
    """The first field of ``data`` the server does not implement (None: all fine).
    Fields nothing names are a 400 on an endpoint's body (:func:`rejects_unknown`, or
    ``strict``: another route's body), else logged."""
    noop = {**VLLM_NOOP.get(endpoint, {}), **NOOP.get(endpoint, {})}
    hints = HINTS.get(endpoint, frozenset()) | VLLM_HINTS.get(endpoint, frozenset())
    unknown = []
    for name in data.keys() - set(known):
        if name in noop:
            if not is_noop(data[name], noop[name]):
                return Unsupported(name, data[name], noop[name])
        elif name not in hints:
            unknown.append(name)
    asked = sorted(n for n in unknown if data[n] is not None)  # null: left out
    if asked and (rejects_unknown(endpoint) if strict is None else strict):
        return Unrecognized(asked[0], data[asked[0]])
    if unknown:
        log.debug("%s: the following fields were present in the request but ignored: %s",
                  endpoint, sorted(unknown))
    return None


def schema_properties(endpoint: str) -> dict[str, dict[str, Any]]:
    """OpenAPI properties for the fields the request model does not declare, so the
    published contract says what the server takes: each no-op field's accepted values (an
    enum), and the hints (any value)."""
    hints = HINTS.get(endpoint, frozenset()) | VLLM_HINTS.get(endpoint, frozenset())
    props: dict[str, dict[str, Any]] = {
        name: {"description": "accepted and ignored (a hint)"} for name in sorted(hints)}
    noop = {**VLLM_NOOP.get(endpoint, {}), **NOOP.get(endpoint, {})}
    props.update({name: {"enum": list(values), "description": "not implemented; only "
                         "these values (no-ops) are accepted, anything else is a 400"}
                  for name, values in noop.items()})
    return props
