"""Request bodies of /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API):
strict types, as service/schemas/; fields outside these models go through
service/unsupported.py."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from service import unsupported
from service.schemas import (
    NAME_PATTERN,
    StopList,
    with_rules,
)
from service.schemas.base import _Body, _field_error, _Option


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class Base64Source(_Body):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(_Body):
    type: Literal["url"]
    url: str


class ImageBlock(_Body):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool = False


class ThinkingBlock(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Body):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock
                         | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")]


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlock], Field(min_length=1)]


class AnthropicTool(_Body):
    openai_endpoint: ClassVar[str | None] = unsupported.ANTHROPIC_TOOL
    type: Literal["custom"] = "custom"  # server tools (bash, web search, ...): a 400

    @classmethod
    def _checks_fields(cls, data: dict[str, Any]) -> bool:
        # a server tool's own fields (max_uses, ...) are not the error: its type is
        return data.get("type") in (None, "custom")

    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    # Anthropic's rule: a tool's input is an object (a call's input is one)
    input_schema: Annotated[dict[str, Any], WithJsonSchema({
        "type": "object", "required": ["type"],
        "properties": {"type": {"const": "object"}}})]
    strict: bool | None = None  # the input schema enforced as chat's function.strict

    @model_validator(mode="after")
    def _object_input(self) -> AnthropicTool:
        if self.input_schema.get("type") != "object":
            raise _field_error(type(self).__name__, "input_schema", "value_error",
                               "input_schema.type must be 'object' (a tool's input is an "
                               f"object), got {self.input_schema.get('type')!r}",
                               self.input_schema)
        return self


class AnthropicToolChoice(_Option):
    """Anthropic's tool choices as one model: ``tool`` names the tool (its ToolChoiceTool
    requires ``name``)."""

    model_config = ConfigDict(json_schema_extra=with_rules({
        "if": {"properties": {"type": {"const": "tool"}}},
        "then": {"required": ["name"],
                 "properties": {"name": {"type": "string", "minLength": 1}}}}))
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> AnthropicToolChoice:
        if self.type == "tool" and not self.name:
            raise _field_error(type(self).__name__, "name", "missing",
                               "a tool_choice of type tool needs a name", self.name)
        return self


class ThinkingEnabled(_Option):
    """``budget_tokens``: from 1 (Anthropic asks for 1024 or more; small models reason
    briefly), below max_tokens (service/translate/anthropic.py)."""
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)
    # "omitted": thinking blocks come without their text, signed (anthropic_stream.py)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(_Option):
    """The model decides whether and how much to think: no budget."""
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Option):
    type: Literal["disabled"]


class _AnthropicBody(_Body):
    model: str | None = None
    system: str | list[TextBlock] | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled,
                        Field(discriminator="type")] | None = None


class JsonOutputFormat(_Option):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Option):
    """Anthropic's structured outputs (``format``); ``effort`` has no control to map to:
    only null is accepted (service/translate/anthropic.py)."""
    format: JsonOutputFormat | None = None
    effort: str | None = None


class MessagesRequest(_AnthropicBody):
    openai_endpoint: ClassVar[str | None] = unsupported.MESSAGES
    max_tokens: int = Field(ge=1)
    # Anthropic's server-side threads (beta): refused with the details its SDK reads to
    # send the whole conversation instead (routers/anthropic.py)
    thread: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stop_sequences: StopList | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    stream: bool = False


class CountTokensRequest(_AnthropicBody):
    openai_endpoint: ClassVar[str | None] = unsupported.COUNT_TOKENS
