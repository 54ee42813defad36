"""The body of /v1/chat/completions: messages, tools, tool_choice, prediction."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.config import JsonDict

from service import unsupported
from service.schemas.base import (
    MAX_REQUEST_TEMPLATE_CHARS,
    Metadata,
    ReasoningEffort,
    _Body,
    _field_error,
    _Option,
)
from service.schemas.formats import (
    NAME_PATTERN,
    ResponseFormat,
)
from service.schemas.sampling import (
    REFUSED_UNLESS_NULL,
    _Sampling,
)

# a function's parameters schema describes an object (OpenAI's rule: the arguments are a
# JSON object); a schema that names another type is a 400, not arguments a client cannot
# take as keyword arguments
ObjectParameters = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "properties": {"type": {"const": "object"}}})]


def check_object_parameters(model: str, field: str, schema: dict[str, Any] | None) -> None:
    if schema is not None and schema.get("type", "object") != "object":
        raise _field_error(model, field, "value_error", f"{field} must describe an object "
                           f"(type 'object'): a call's arguments are a JSON object; got type "
                           f"{schema.get('type')!r}", schema)


class FunctionDefinition(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: ObjectParameters | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None

    @model_validator(mode="after")
    def _object(self) -> FunctionDefinition:
        check_object_parameters(type(self).__name__, "parameters", self.parameters)
        return self


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Option):
    name: str


class NamedToolChoice(_Option):
    type: Literal["function"]
    function: FunctionName


class AllowedTools(_Option):
    """The tools the model may call, of those the prompt shows (all of ``tools``, so
    that the prompt stays the same): ``auto``, text or calls of these; ``required``, one
    or more calls of these."""
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(_Option):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools



class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class AssistantToolCall(_Body):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


# OpenAI's message types by role, as rules on one model: a tool message names the call it
# answers; only an assistant message carries tool calls
_ROLE_RULES: JsonDict = {"allOf": [
    {"if": {"properties": {"role": {"const": "tool"}}},
     "then": {"required": ["tool_call_id"],
              "properties": {"tool_call_id": {"type": "string", "minLength": 1}}}},
    {"if": {"properties": {"role": {"not": {"const": "assistant"}}}},
     "then": {"properties": {name: {"type": "null"} for name in (
         "tool_calls", "reasoning_content", "reasoning", "refusal")}}}]}
# an assistant turn's earlier reasoning (vLLM's and mistral-common's reading of OpenAI
# history; the published Ministral-3 template renders it as [THINK]...[/THINK])
_REASONING = ("reasoning_content", "reasoning")


class ChatMessage(_Body):
    model_config = ConfigDict(json_schema_extra=_ROLE_RULES)
    role: Literal["system", "user", "assistant", "tool", "developer"]  # template's ROLES
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None  # assistant turns
    tool_call_id: str | None = None  # tool turns: the call this result answers
    # assistant turns: the reasoning before the answer (either name, equal if both), and
    # OpenAI's refusal text (the turn's text when it has no content)
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    # OpenAI's deprecated single call (top-level functions are refused): tool_calls
    function_call: Annotated[dict[str, Any] | None, WithJsonSchema(
        {"type": "null", "description": "deprecated: send tool_calls",
         **REFUSED_UNLESS_NULL})] = None

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        name = type(self).__name__
        if self.role == "tool" and not self.tool_call_id:
            raise _field_error(name, "tool_call_id", "missing",
                               "a tool message needs tool_call_id", self.tool_call_id)
        for field in ("tool_calls", *_REASONING, "refusal"):
            if getattr(self, field) is not None and self.role != "assistant":
                raise _field_error(name, field, "extra_forbidden",
                                   f"only assistant messages carry {field}",
                                   getattr(self, field))
        if self.function_call is not None:
            raise _field_error(name, "function_call", "unsupported_value",
                               "function_call (deprecated) is not supported: send the call "
                               "as tool_calls", self.function_call)
        if None not in (self.reasoning, self.reasoning_content) and \
                self.reasoning != self.reasoning_content:
            raise _field_error(name, "reasoning", "value_error", "reasoning and "
                               "reasoning_content are two names for one text: send one, or "
                               "equal ones", self.reasoning)
        if self.refusal and self.content not in (None, "", []):
            raise _field_error(name, "refusal", "value_error", "refusal is the text of a "
                               "turn without content: send one of content and refusal",
                               self.refusal)
        return self


class PredictionTextPart(_Option):
    type: Literal["text"]
    text: str


class PredictionContent(_Option):
    """OpenAI's predicted output: text the answer is expected to copy (much of it), whose
    tokens are drafted and verified (engine/spec/prediction.py). It never changes the
    answer, only how fast it comes."""

    type: Literal["content"]
    content: str | list[PredictionTextPart]

    @property
    def text(self) -> str:
        return (self.content if isinstance(self.content, str)
                else "".join(p.text for p in self.content))


class ChatCompletionRequest(_Sampling):
    openai_endpoint: ClassVar[str | None] = unsupported.CHAT
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    tools: list[ToolDefinition] | None = None
    tool_choice: (Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice
                  | None) = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # a cap on reasoning tokens (service/tool_calls/thinking.py): vLLM's budget (-1: none),
    # and OpenAI's effort, of which only "none" has a meaning here
    thinking_token_budget: int | None = Field(None, ge=-1)
    reasoning_effort: ReasoningEffort | None = None
    prediction: PredictionContent | None = None
    # vLLM's: more variables for the chat template (enable_thinking, ...); see
    # service/tool_calls/plan.py for the names it may not set
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the answer continues the final (assistant) message instead of starting one
    continue_final_message: bool = False
    # vLLM's: a Jinja template for this request instead of the model's (a server started
    # with --trust-request-chat-template; else a 400)
    chat_template: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_TEMPLATE_CHARS)
    # vLLM's: documents for retrieval-augmented templates (the template's ``documents``
    # variable); a 400 when the chat template reads none
    documents: list[dict[str, str]] | None = None
    # vLLM's: the answer's content starts with the final message's text when that message
    # is the assistant's (with continue_final_message: the whole message)
    echo: bool = False
    # vLLM's: the tokenizer's special tokens (BOS) on top of what the chat template writes
    add_special_tokens: bool = False
    # vLLM's: the answer (a stream's first chunk) carries prompt_text, the prompt the model
    # read, as text (special tokens and image tokens included)
    return_prompt_text: bool = False
    # OpenAI's stored chat completions (service/routers/stored_chat.py): kept with the
    # metadata when store is true, for GET /v1/chat/completions/...
    store: bool | None = None
    metadata: Metadata | None = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:  # OpenAI's rule (and vLLM's)
            raise _field_error(type(self).__name__, "top_logprobs", "value_error",
                               "top_logprobs needs logprobs true", self.top_logprobs)
        return self

    def output_limit(self, default: int | None) -> int | None:
        """max_completion_tokens, else max_tokens; neither: the model's default, else
        None (up to max_model_len)."""
        given = self.max_completion_tokens or self.max_tokens
        return given if given is not None else default
