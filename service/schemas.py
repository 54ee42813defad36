"""Request bodies of the OpenAI-compatible endpoints (pydantic only at the edge).
Responses are plain dicts built in service/openai_format.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import InitErrorDetails, PydanticCustomError

from engine.checkpoint.generation import SamplingDefaults
from service import unsupported


def _document_unsupported(schema: dict[str, Any], cls: type) -> None:
    props = schema.setdefault("properties", {})
    endpoint = getattr(cls, "openai_endpoint", None) or ""
    for name, prop in unsupported.schema_properties(endpoint).items():
        props.setdefault(name, prop)  # a declared field (user) keeps its own
    if unsupported.rejects_unknown(endpoint) or getattr(cls, "strict_body", False):
        # any other field is a 400, unless null (a field left out)
        schema["additionalProperties"] = {"type": "null"}


def with_rules(rules: JsonDict) -> Callable[[dict[str, Any], type], None]:
    """A model's json_schema_extra: its own ``rules`` (if / then, ...) beside what every
    body documents (its no-op fields; additionalProperties where others are a 400)."""
    def extra(schema: dict[str, Any], cls: type) -> None:
        schema.update(copy.deepcopy(rules))
        _document_unsupported(schema, cls)
    return extra


class _Body(BaseModel):
    """Strict JSON types (``"5"`` is not an integer, ``1`` not a boolean, as OpenAI
    answers; ``5.0`` is an integer, as in JSON Schema); fields outside the model go through
    service/unsupported.py: a not-implemented OpenAI value is a 400, and so is an unknown
    field of an endpoint's body and of an option's object (_Option; a message's or
    content part's is logged)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False,
                              json_schema_extra=_document_unsupported)
    openai_endpoint: ClassVar[str | None] = None
    # a route's body without an OpenAI endpoint class (/detokenize, conversations, a
    # metadata update): an unknown field is a 400 as on the API endpoints
    strict_body: ClassVar[bool] = False
    # null for a field with a default that is not null means that default, as OpenAI's
    # API and vLLM read it (``"temperature": null``, the openai SDK's temperature=None)
    nulls_as_defaults: ClassVar[bool] = True

    @classmethod
    def _checks_fields(cls, data: dict[str, Any]) -> bool:
        """Whether service/unsupported.py looks at this object's fields (a subclass may
        leave an object the schema refuses anyway to that error)."""
        return True

    @model_validator(mode="before")
    @classmethod
    def _unsupported_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not cls._checks_fields(data):
            return data
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        # a nested object (a message, a content part) only logs its unknown fields
        bad = unsupported.check_fields(cls.openai_endpoint or cls.__name__, data, known,
                                       strict=cls.strict_body or None)
        if bad is not None:
            kind = ("unrecognized_argument" if isinstance(bad, unsupported.Unrecognized)
                    else "unsupported_value")
            raise _field_error(cls.__name__, bad.field, kind, bad.message(), bad.value)
        if cls.nulls_as_defaults:
            data = {k: v for k, v in data.items() if v is not None or not cls._has_default(k)}
        return unsupported.whole_numbers(data)

    @classmethod
    def _has_default(cls, name: str) -> bool:
        """Whether field ``name`` has a default that null is read as (it is not nullable
        and not required)."""
        field = cls.model_fields.get(name)
        return (field is not None and not field.is_required()
                and type(None) not in get_args(field.annotation)
                and field.annotation is not Any)


def _field_error(model: str, field: str, kind: str, message: str, value: Any
                 ) -> ValidationError:
    """A validation error located at ``field`` (the 400 names it: service/errors.py)."""
    return ValidationError.from_exception_data(model, [InitErrorDetails(
        type=PydanticCustomError(kind, message), loc=(field,), input=value)])


NonEmptyStr = Annotated[str, Field(min_length=1)]
# stop strings: each is searched for, and held back while it may still be starting, at
# every generated token (engine/text/detokenizer.py); thousands of long ones cost a request
# seconds per token on the engine thread, every other request's steps with it
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 512
# a request's own chat_template: compiled before the render's deadline applies (2.5 MB
# took 15 s), and far past the longest published template (tens of KB)
MAX_REQUEST_TEMPLATE_CHARS = 128 * 1024
StopStr = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopList = Annotated[list[StopStr], Field(max_length=MAX_STOP_STRINGS)]
MAX_BAD_WORDS = 1024
# the output limit of a completion that answers with its prompt alone (max_tokens 0 with
# echo): one token, whose prefill scores the prompt; service/prompt_echo.py drops it
SCORING_TOKENS = 1  # each checked against the output at every step (and encoded twice)
# OpenAI's metadata, echoed and stored: at most 16 pairs, keys up to 64 characters,
# values up to 512
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)],
                          Annotated[str, Field(max_length=512)]], Field(max_length=16)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
TokenId = Annotated[int, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
_BIAS = {"type": "number", "minimum": -100, "maximum": 100}
# token id (a decimal string: JSON keys are strings) -> additive bias
LogitBias = Annotated[
    dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")], Annotated[float, Field(ge=-100, le=100)]],
    WithJsonSchema({"type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                    "additionalProperties": _BIAS})]


class _Option(_Body):
    """A request option's object (response_format, tool_choice, prediction, ...): a field
    it does not name is a 400 naming it, as OpenAI and Anthropic answer (a typo such as
    ``"stirct": true`` would otherwise go unused). The objects clients send back from
    earlier answers (messages, content parts, tool definitions) only log theirs."""

    strict_body: ClassVar[bool] = True


class StreamOptions(_Body):
    openai_endpoint: ClassVar[str | None] = unsupported.STREAM_OPTIONS
    include_usage: bool = False
    # vLLM's: every chunk carries the usage so far (its choice's tokens); needs include_usage
    continuous_usage_stats: bool = False

    @model_validator(mode="after")
    def _continuous_needs_usage(self) -> StreamOptions:
        if self.continuous_usage_stats and not self.include_usage:
            raise _field_error(type(self).__name__, "continuous_usage_stats", "value_error",
                               "continuous_usage_stats needs include_usage true",
                               self.continuous_usage_stats)
        return self


# a declared field the server refuses when set (the published schema says so, and the
# 400 names the field): the request model reads it so that it is never ignored
HANDLING_KEY = "x-fp8serve-handling"
REFUSED_UNLESS_NULL: JsonDict = {HANDLING_KEY: "not implemented: 400 unless `null`"}


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` (``StructuredOutputsParams``): exactly one constraint
    (json, regex, choice, grammar, json_object, structural_tag) and the JSON
    options (engine/structured/outputs.py). Unknown keys are a 400, not ignored."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False

    def as_params(self) -> dict[str, Any]:
        """The fields that were set, by their JSON names."""
        return self.model_dump(by_alias=True, exclude_none=True)


# Request fields a model's generation_config.json can give defaults for.
DISTRIBUTION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
NO_DEFAULTS = SamplingDefaults()


class _Sampling(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)  # OpenAI's range (vLLM's too)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    # any integer, modulo 2**64 (engine/sampler.py make_generator); -1: none, as in vLLM
    seed: int | None = None
    n: int = Field(1, ge=1, le=32)
    stop: StopStr | StopList | None = None
    stop_token_ids: list[TokenId] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    logit_bias: LogitBias | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    user: str | None = None
    # vLLM's: requests with different salts never share prefix-cache blocks
    cache_salt: str | None = Field(None, min_length=1)
    # vLLM's: lower is served first under --scheduling-policy priority; 0 otherwise
    priority: int = 0
    # vLLM's: streamed chunks every N tokens (the first token at once; None: the
    # server's --stream-interval)
    stream_interval: int | None = Field(None, ge=1)
    # vLLM's: the prompt's and each choice's token ids in the answer (and its chunks)
    return_token_ids: bool = False
    # vLLM's: logprobs name each token "token_id:<id>" (ids a client can map back)
    return_tokens_as_token_ids: bool = False
    # vLLM's: the last N prompt tokens only (-1: the last max_model_len)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    # vLLM's: each prompt token's logprob and rank, with this many alternatives
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    # vLLM's token filters: sample only these ids; never complete these words
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    bad_words: Annotated[list[StopStr], Field(max_length=MAX_BAD_WORDS)] | None = None
    # vLLM's output constraint (service/structured_outputs.py), and the fields it replaced
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    # vLLM's beam search (service/beam_search.py): n beams, ranked by cumulative logprob
    # / length ** length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0

    def sampling_kwargs(self, defaults: SamplingDefaults = NO_DEFAULTS) -> dict[str, Any]:
        """SamplingParams keyword arguments. A distribution field the request leaves out
        takes the model's default (generation_config.json) when it has one."""
        dist = {name: getattr(self, name) for name in DISTRIBUTION_FIELDS}
        for name, value in defaults.as_dict().items():
            if name in dist and name not in self.model_fields_set:
                dist[name] = value
        return dict(
            **dist, stop=self.stop, stop_token_ids=self.stop_token_ids or (),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            allowed_token_ids=self.allowed_token_ids,
        )

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:  # OpenAI's rule (vLLM's)
            raise _field_error(type(self).__name__, "stream_options", "value_error",
                               "stream_options is only allowed when stream is true",
                               self.stream_options.model_dump())
        return self

    @model_validator(mode="after")
    def _length_penalty_needs_beams(self) -> _Sampling:
        # it ranks beams: a sampled request has none, so another value would go unused
        if self.length_penalty != 1 and not self.use_beam_search:
            raise _field_error(type(self).__name__, "length_penalty", "value_error",
                               "length_penalty ranks beams: it needs use_beam_search true "
                               "(or leave it out)", self.length_penalty)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's stream_options.continuous_usage_stats: usage on every chunk."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


# OpenAI's rule for function and response-format names
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class JsonSchemaFormat(_Option):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class _PlainFormat(_Option):
    """A response_format without a schema (text, json_object): a json_schema beside it
    would go unused, so it is a 400 unless null (vLLM's ResponseFormat model sends null)."""

    json_schema: Annotated[Any, WithJsonSchema(
        {"type": "null", "description": "only with type json_schema",
         **REFUSED_UNLESS_NULL})] = None

    @model_validator(mode="after")
    def _no_schema(self) -> _PlainFormat:
        if self.json_schema is not None:
            raise _field_error(type(self).__name__, "json_schema", "extra_forbidden",
                               "json_schema goes with type json_schema, not "
                               f"{getattr(self, 'type', '?')}", self.json_schema)
        return self


class TextFormat(_PlainFormat):
    type: Literal["text"]


class JsonObjectFormat(_PlainFormat):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Option):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class StructuralTagStructure(_Body):
    model_config = ConfigDict(extra="forbid")
    begin: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    end: str


class StructuralTagResponseFormat(_Body):
    """vLLM's structural tag (engine/structured/outputs.py structural_tag_spec): free text
    in which each trigger opens one of the structures. Unknown keys (xgrammar's
    ``format`` form among them) are a 400."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["structural_tag"]
    triggers: list[str]
    structures: list[StructuralTagStructure]


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat
                           | StructuralTagResponseFormat, Field(discriminator="type")]


PROMPT_FORMS = "a string, a list of strings, a list of token ids or a list of token-id lists"


def _json_kind(value: Any) -> str:
    """What a prompt (or one of its items) is, in the words of PROMPT_FORMS."""
    kinds = ((bool, "a boolean"), (str, "a string"), (int, "a token id"), (float, "a number"),
             (list, "a list"), (dict, "an object"))
    return next((word for t, word in kinds if isinstance(value, t)), "null")


def check_prompt_form(prompt: Any) -> Any:
    """A prompt of one of OpenAI's four forms, else a 400 that says which item breaks it
    (a union's error would name one form: "should be a valid string" for [[1], 2])."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and not prompt):
        return prompt  # an empty list: the schema's own "at least 1 item"
    if not isinstance(prompt, list):
        raise PydanticCustomError("value_error", "got {kind}; send {forms}",
                                  {"kind": _json_kind(prompt), "forms": PROMPT_FORMS})
    first = _json_kind(prompt[0])
    for i, item in enumerate(prompt):
        kind = _json_kind(item)
        if kind not in ("a string", "a token id", "a list") or kind != first:
            where = f" where item 0 is {first}" if kind != first else ""
            raise PydanticCustomError("value_error", "item {i} is {kind}{where}; send {forms}",
                                      {"i": i, "kind": kind, "where": where,
                                       "forms": PROMPT_FORMS})
    return prompt


# max_tokens 0 answers with the prompt alone: only with echo true
_NO_OUTPUT_NEEDS_ECHO: JsonDict = {
    "if": {"not": {"required": ["echo"], "properties": {"echo": {"const": True}}}},
    "then": {"properties": {"max_tokens": {"not": {"const": 0}}}}}


class CompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra=with_rules(_NO_OUTPUT_NEEDS_ECHO))
    openai_endpoint: ClassVar[str | None] = unsupported.COMPLETIONS
    # text may be empty, as in OpenAI's API: it prompts with the start of a document
    # (service/prompts.py)
    prompt: Annotated[str | Annotated[list[str], Field(min_length=1)] | TokenIds
                      | Annotated[list[TokenIds], Field(min_length=1)],
                      BeforeValidator(check_prompt_form)]
    # 0 with echo: the prompt alone (service/prompt_echo.py)
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    # OpenAI's: best_of candidates per prompt, the n with the highest sum of their tokens'
    # logprobs returned (not with stream)
    best_of: int | None = Field(None, ge=1, le=32)
    # vLLM's extension: the output as JSON (service/structured_outputs.py)
    response_format: ResponseFormat | None = None
    # vLLM's: BOS (and the like) before a text prompt
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _no_output_needs_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:  # vLLM's rule: nothing to answer
            raise _field_error(type(self).__name__, "max_tokens", "value_error",
                               "max_tokens 0 answers with the prompt alone: it needs echo "
                               "true", self.max_tokens)
        if self.max_tokens == 0 and self.min_tokens:  # not the scoring token's 1
            raise _field_error(type(self).__name__, "min_tokens", "value_error",
                               f"min_tokens {self.min_tokens} exceeds max_tokens 0",
                               self.min_tokens)
        return self

    @property
    def prompt_only(self) -> bool:
        """max_tokens 0 with echo: the answer is the prompt (service/prompt_echo.py)."""
        return self.max_tokens == 0

    def output_limit(self, default: int | None) -> int | None:
        """max_tokens as sent (0: the one token that scores the prompt, dropped from the
        answer); left out: the model's default, else OpenAI's 16."""
        if self.prompt_only:
            return SCORING_TOKENS
        if "max_tokens" in self.model_fields_set or default is None:
            return self.max_tokens
        return default


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
