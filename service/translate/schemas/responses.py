"""Request bodies of /v1/responses (OpenAI's Responses API) and /v1/conversations (its
Conversations API): input items, tools, text formats; strict types, as service/schemas/."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic.config import JsonDict

from service import unsupported
from service.schemas import (
    NAME_PATTERN,
    Metadata,
    ObjectParameters,
    ReasoningEffort,
    check_object_parameters,
    with_rules,
)
from service.schemas.base import _Body, _field_error, _Option

# --- /v1/responses (OpenAI's Responses API) ---

class InputText(_Body):
    type: Literal["input_text"]
    text: str


class OutputText(_Body):
    """An earlier answer's text, sent back in ``input``."""
    type: Literal["output_text"]
    text: str


# one schema per discriminator value: a value two names share made /openapi.json read
# "input_text" as off the enum of the "output_text" branch
TextPart = Annotated[InputText | OutputText, Field(discriminator="type")]


class InputImage(_Body):
    type: Literal["input_image"]
    image_url: str  # a URL or data: URL (file_id inputs are not served)
    detail: Literal["low", "high", "auto"] = "auto"


ContentPart = Annotated[InputText | OutputText | InputImage, Field(discriminator="type")]


class _Item(_Body):
    """An input item; ``id``: the one it was listed with (an earlier output's), kept as
    its id in input_items and a conversation's items."""
    id: Annotated[str, Field(min_length=1)] | None = None


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    # "incomplete": max_output_tokens cut the call (its arguments may be cut JSON)
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]


class SummaryText(_Body):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Body):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Item):
    """An earlier turn's reasoning: dropped from the prompt; kept as given (input_items
    and a conversation's items list it with its summary and text). ``encrypted_content``:
    what ``include: ["reasoning.encrypted_content"]`` returned (service/translate/sealed.py);
    checked, and its text restored where ``content`` is left out."""
    type: Literal["reasoning"]
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


def _item_type(value: Any) -> Any:
    """An item's type; a message item may leave it out (OpenAI's EasyInputMessage)."""
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")], Discriminator(_item_type)]


class FunctionTool(_Body):
    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: ObjectParameters | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _object(self) -> FunctionTool:
        check_object_parameters(type(self).__name__, "parameters", self.parameters)
        return self


class NamedFunction(_Option):
    type: Literal["function"]
    name: str


class AllowedFunctions(_Option):
    """Chat's allowed_tools in the Responses API's shape."""
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[NamedFunction] = Field(min_length=1)


# name, description, schema and strict belong to a json_schema format (OpenAI's); on
# another type they would go unused: a 400 naming the field, as the schema says
_JSON_SCHEMA_ONLY = ("name", "description", "schema", "strict")
_FORMAT_RULES: JsonDict = {"if": {"properties": {"type": {"not": {"const": "json_schema"}}}},
                           "then": {"properties": {k: {"type": "null"}
                                                   for k in _JSON_SCHEMA_ONLY}}}


class TextFormat(_Option):
    model_config = ConfigDict(json_schema_extra=with_rules(_FORMAT_RULES))
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _json_schema_fields(self) -> TextFormat:
        if self.type != "json_schema":
            for name in _JSON_SCHEMA_ONLY:
                value = getattr(self, "schema_" if name == "schema" else name)
                if value is not None:
                    raise _field_error(type(self).__name__, name, "extra_forbidden",
                                       f"{name} goes with type json_schema, not "
                                       f"{self.type}", value)
        return self


class TextConfig(_Body):
    openai_endpoint: ClassVar[str | None] = unsupported.RESPONSES_TEXT
    format: TextFormat | None = None


Summary = Literal["auto", "concise", "detailed"]


class ReasoningConfig(_Option):
    """``effort`` and ``summary`` (and its deprecated ``generate_summary``): the values
    this server can serve are checked in service/translate/responses.py; ``context``:
    reasoning items are never rendered back into the prompt, so only the server's choice
    (auto) is served; ``mode``: one execution mode."""

    effort: ReasoningEffort | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None
    context: Literal["auto"] | None = None
    mode: Literal["standard"] | None = None


class ConversationRef(_Option):
    id: str = Field(min_length=1)


class ResponsePrompt(_Body):
    """The fields a Responses request's prompt is built from: what /v1/responses and
    /v1/responses/input_tokens share."""

    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: (Literal["none", "auto", "required"] | NamedFunction | AllowedFunctions
                  | None) = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    previous_response_id: Annotated[str, Field(min_length=1)] | None = None
    # "auto": drop the oldest turns when the prompt leaves no room for the answer
    # (service/translate/truncation.py); "disabled" (the default): a 400 instead
    truncation: Literal["auto", "disabled"] | None = None
    # a conversation (service/store/conversations.py): its items come first in the prompt,
    # and the input and output are added to it
    conversation: Annotated[str, Field(min_length=1)] | ConversationRef | None = None


class ResponsesRequest(ResponsePrompt):
    openai_endpoint: ClassVar[str | None] = unsupported.RESPONSES
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    # of OpenAI's include values, "message.output_text.logprobs" is served
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # kept for previous_response_id and GET (service/store/responses.py); null: stored
    # when the server keeps responses (--responses-store-mib), as OpenAI's default
    store: bool | None = None
    # run on after the request returns (service/store/background.py); needs store
    background: bool | None = None
    # OpenAI's cap on calls to built-in tools (web search, code interpreter, ...); this
    # server runs none (they are a 400 in tools), so no response ever reaches it: echoed
    max_tool_calls: int | None = Field(None, ge=0)
    metadata: Metadata | None = None


class ResponsesInputTokensRequest(ResponsePrompt):
    """OpenAI's input token count: the prompt /v1/responses would build for these fields
    (earlier turns of previous_response_id or conversation, instructions, tools,
    truncation), counted, nothing generated."""

    openai_endpoint: ClassVar[str | None] = unsupported.RESPONSES_INPUT_TOKENS

    def as_request(self) -> ResponsesRequest:
        """The same fields as a /v1/responses request (what the prompt is built from)."""
        names = set(ResponsePrompt.model_fields)
        return ResponsesRequest.model_construct(
            self.model_fields_set & names, **{name: getattr(self, name) for name in names})


# --- /v1/conversations (OpenAI's Conversations API) ---

class ConversationCreateRequest(_Body):
    strict_body: ClassVar[bool] = True
    items: Annotated[list[InputItem], Field(max_length=20)] | None = None
    metadata: Metadata | None = None


class ConversationItemsRequest(_Body):
    strict_body: ClassVar[bool] = True
    items: Annotated[list[InputItem], Field(min_length=1, max_length=20)]
