"""The base of every request body: strict JSON types, unknown and not-implemented
fields through service/unsupported.py, option objects, field errors, the shared limits."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import InitErrorDetails, PydanticCustomError

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
