"""response_format: text, json_object, json_schema and structural_tag."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from service.schemas.base import (
    _Body,
    _field_error,
    _Option,
)
from service.schemas.sampling import (
    REFUSED_UNLESS_NULL,
)

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
