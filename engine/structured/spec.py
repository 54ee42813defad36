"""What a constrained request must produce, as a Lark grammar for llguidance: JSON (any
object, or valid against a JSON schema) and the ``GrammarError`` every builder and the
compiler raise (the HTTP layer answers 400 with its message).

A :class:`GrammarSpec` is pure data (no tokenizer, no engine state): equal specs compile
to the same grammar, so the compiler caches by spec. JSON is written the way
``json.dumps`` writes it (``", "`` between items, ``": "`` after keys, no other
whitespace), so the output ends exactly at the closing brace and the request finishes
there instead of drifting into whitespace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# llguidance's JSON options ("x-guidance" in a schema), see llguidance JsonCompileOptions
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# GrammarSpec.kind: what built the grammar (a small, fixed set of metric label values)
KINDS = ("grammar", "json_object", "json_schema", "regex", "choice", "structural_tag",
         "tool_mistral", "tool_hermes")


class GrammarError(ValueError):
    """A schema, tool list or grammar cannot be turned into a constraint; the message says
    which and why (HTTP 400)."""


@dataclass(frozen=True)
class GrammarSpec:
    """lark: the whole grammar (llguidance's Lark dialect, ``start`` is the entry rule;
    special tokens as ``<[id]>``). name: what it is, for error messages and logs. kind:
    one of KINDS, a metrics label (what speculation drafted under, engine/spec/)."""

    lark: str
    name: str = field(default="grammar", compare=False)
    kind: str = "grammar"  # compared: a cached grammar keeps the kind it was built for

    def __post_init__(self) -> None:
        if not isinstance(self.lark, str) or "start" not in self.lark:
            raise GrammarError(f"{self.name}: a grammar needs a 'start' rule")
        if self.kind not in KINDS:
            raise ValueError(f"GrammarSpec.kind {self.kind!r} not in {KINDS}")


def json_lark(schema: Mapping[str, Any], strict: bool = True) -> str:
    """``%json {...}`` for a Lark rule: the schema with our JSON style; non-strict schemas
    are compiled leniently (keywords llguidance does not implement are ignored, as the
    model's output is still checked against everything it does implement)."""
    if not isinstance(schema, Mapping):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    opts = dict(JSON_STYLE, lenient=not strict)
    opts.update(schema.get("x-guidance") or {})
    try:
        text = json.dumps({**schema, "x-guidance": opts}, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"the JSON schema is not JSON-serializable: {exc}") from exc
    return f"%json {text}"


def json_object_spec() -> GrammarSpec:
    """Any JSON object (OpenAI ``response_format: {"type": "json_object"}``)."""
    return GrammarSpec(f"start: {json_lark(ANY_OBJECT)}\n", "json_object", "json_object")


def json_schema_spec(schema: Mapping[str, Any], name: str = "schema",
                     strict: bool = True) -> GrammarSpec:
    """A JSON value valid against ``schema`` (``$defs``/``$ref``, ``anyOf``, enums,
    ``additionalProperties: false``, nested arrays...)."""
    return GrammarSpec(f"start: {json_lark(schema, strict)}\n", f"json_schema {name!r}",
                       "json_schema")


def spec_from_response_format(response_format: Mapping[str, Any] | None
                              ) -> GrammarSpec | None:
    """OpenAI ``response_format`` dict -> spec; None for ``text`` (or no format). vLLM's
    ``{"type": "structural_tag", "triggers", "structures"}`` as structural_tag_spec.

    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (no
    ``schema``: any JSON value, the empty schema): compiled
    strictly (an unsupported keyword is an error) when ``strict`` is true, as the openai
    SDK's ``parse()`` sends it; leniently otherwise."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return json_object_spec()
    if kind == "structural_tag":
        from engine.structured.outputs import structural_tag_spec

        return structural_tag_spec(response_format)
    if kind != "json_schema":
        raise GrammarError(f"response_format type {kind!r} is not supported")
    body = response_format.get("json_schema")
    if not isinstance(body, Mapping):
        raise GrammarError("response_format json_schema needs a 'json_schema' object")
    schema = {} if body.get("schema") is None else body["schema"]  # optional in OpenAI's API
    if not isinstance(schema, Mapping):
        raise GrammarError("response_format json_schema's 'schema' must be an object")
    return json_schema_spec(schema, str(body.get("name") or "schema"),
                            body.get("strict") is True)
