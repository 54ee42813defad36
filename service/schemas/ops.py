"""The bodies of the operator routes: /tokenize, /detokenize, a metadata update."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    ConfigDict,
    Field,
)
from pydantic.config import JsonDict

from service import unsupported
from service.schemas.base import (
    MAX_REQUEST_TEMPLATE_CHARS,
    Metadata,
    TokenId,
    _Body,
    _document_unsupported,
)
from service.schemas.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ToolDefinition,
)

_PROMPT_OR_MESSAGES: JsonDict = {"oneOf": [  # exactly one of them, the other null or absent
    {"required": ["prompt"], "properties": {"prompt": {"type": "string"},
                                            "messages": {"type": "null"}}},
    {"required": ["messages"], "properties": {"messages": {"type": "array"},
                                              "prompt": {"type": "null"}}}]}


def _tokenize_schema(schema: dict[str, Any], cls: type) -> None:
    _document_unsupported(schema, cls)
    schema.update(_PROMPT_OR_MESSAGES)


class MetadataUpdate(_Body):
    """A stored object's new metadata (a conversation's, a stored chat completion's)."""

    strict_body: ClassVar[bool] = True

    metadata: Metadata | None


class TokenizeRequest(_Body):
    """vLLM's /tokenize: a text prompt (``add_special_tokens`` true unless sent), or chat
    messages rendered as /v1/chat/completions renders them, with the same prompt options
    (``add_special_tokens`` false unless sent: the template writes BOS)."""

    model_config = ConfigDict(json_schema_extra=_tokenize_schema)
    openai_endpoint: ClassVar[str | None] = unsupported.TOKENIZE
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ToolDefinition] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_TEMPLATE_CHARS)
    # the tokens' vocabulary strings beside their ids
    return_token_strs: bool = False

    def chat_request(self) -> ChatCompletionRequest:
        """The messages and their prompt options as a chat request (what the chat route
        would render)."""
        return ChatCompletionRequest(
            messages=self.messages, tools=self.tools,
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template_kwargs=self.chat_template_kwargs,
            chat_template=self.chat_template,
            add_special_tokens=bool(self.add_special_tokens))


class DetokenizeRequest(_Body):
    strict_body: ClassVar[bool] = True
    model: str | None = None
    tokens: list[TokenId]
