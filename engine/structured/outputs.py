"""vLLM's ``structured_outputs`` request parameter as a :class:`GrammarSpec`.

The parameter (``StructuredOutputsParams`` in vLLM; sent by clients as ``extra_body``)
holds exactly one constraint:

- ``json``: a JSON schema (an object, or its JSON text), compiled leniently as vLLM's
  guidance backend does (keywords llguidance does not implement are ignored);
- ``regex``: the whole output matches the pattern (Rust regex syntax, Unicode classes);
- ``choice``: the output is exactly one of the strings;
- ``grammar``: a context-free grammar, llguidance's Lark dialect or llama.cpp's GBNF
  (converted by llguidance);
- ``json_object: true``: any JSON object;
- ``structural_tag``: not implemented (GrammarError).

and options for the JSON constraints: ``whitespace_pattern`` (the whitespace allowed
between JSON tokens; without it JSON is written compactly, as ``json.dumps`` writes it),
``disable_any_whitespace`` (compact JSON: what happens anyway), ``disable_additional_
properties`` (objects whose schema does not say otherwise take no other keys) and
``disable_fallback`` (there is one backend and no fallback).

Pure data in, a spec out: the HTTP layer maps a GrammarError to a 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.structured.spec import (
    GrammarError,
    GrammarSpec,
    json_object_spec,
    json_schema_spec,
)

# the constraint fields (exactly one must be set) and the options that go with them
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
OPTIONS = ("whitespace_pattern", "disable_any_whitespace", "disable_additional_properties",
           "disable_fallback")


def regex_spec(pattern: str) -> GrammarSpec:
    """The whole output matches ``pattern`` (llguidance escapes it for Lark's ``/.../``)."""
    import llguidance

    if not isinstance(pattern, str) or not pattern:
        raise GrammarError("regex: the pattern must be a non-empty string")
    return GrammarSpec(f"start: /{llguidance.regex_to_lark(pattern, '')}/\n",
                       "regex", "regex")


def choice_spec(choices: Sequence[str]) -> GrammarSpec:
    """The output is exactly one of ``choices`` (JSON string literals are Lark strings)."""
    if (isinstance(choices, str) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise GrammarError("choice: a non-empty list of non-empty strings is needed")
    alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
    return GrammarSpec(f"start: {alts}\n", "choice", "choice")


def grammar_text_spec(text: str) -> GrammarSpec:
    """A Lark grammar (``start`` rule) or a GBNF one (``root ::= ...``)."""
    from llguidance.gbnf_to_lark import any_to_lark

    if not isinstance(text, str) or not text.strip():
        raise GrammarError("grammar: the grammar must be a non-empty string")
    try:
        lark = any_to_lark(text)
    except Exception as exc:  # the converter raises its own error types (and ValueError)
        raise GrammarError(f"grammar: not Lark, and not GBNF either: {exc}") from exc
    return GrammarSpec(lark, "grammar", "grammar")


# JSON Schema keywords whose value is a schema, a list of schemas, or a name -> schema map
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
              "propertyNames", "additionalItems", "unevaluatedItems",
              "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that does
    not set it (vLLM's ``disable_additional_properties``), walking the keywords that hold
    schemas; a copy, the input is kept."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), (Mapping, list)):
            sub = out[key]
            out[key] = ([closed_objects(s) for s in sub] if isinstance(sub, list)
                        else closed_objects(sub))
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    if (out.get("type") == "object" or "properties" in out) \
            and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _schema(value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"json: the schema text is not JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise GrammarError(f"json: a JSON schema must be an object, got "
                           f"{type(value).__name__}")
    return value


def _json_spec(params: Mapping[str, Any]) -> GrammarSpec:
    if params.get("json_object") is True:
        schema: Mapping[str, Any] = {"type": "object"}
        name, kind = "json_object", "json_object"
    else:
        schema, name, kind = _schema(params["json"]), "json", "json_schema"
    if params.get("disable_additional_properties"):
        schema = closed_objects(schema)
    ws = params.get("whitespace_pattern")
    if ws is not None:
        if not isinstance(ws, str) or not ws:
            raise GrammarError("whitespace_pattern: a non-empty regex is needed")
        guide = dict(schema.get("x-guidance") or {})
        guide.update(whitespace_flexible=True, whitespace_pattern=ws,
                     item_separator=",", key_separator=":")
        schema = {**schema, "x-guidance": guide}
    if kind == "json_object" and ws is None:
        return json_object_spec()
    spec = json_schema_spec(schema, name, strict=False)
    return GrammarSpec(spec.lark, name, kind)


def spec_from_structured_outputs(params: Mapping[str, Any] | None) -> GrammarSpec | None:
    """``structured_outputs`` (keys of CONSTRAINTS and OPTIONS; None or unset values are
    absent) -> spec; None when ``params`` is None. Raises GrammarError when no constraint
    or more than one is set, for structural_tag, or when a constraint is malformed."""
    if params is None:
        return None
    unknown = sorted(set(params) - set(CONSTRAINTS) - set(OPTIONS))
    if unknown:
        raise GrammarError(f"{unknown[0]}: not a structured_outputs field (fields: "
                           f"{', '.join(CONSTRAINTS + OPTIONS)})")
    given = [k for k in CONSTRAINTS if params.get(k) not in (None, False)]
    if len(given) != 1:
        raise GrammarError("exactly one of " + ", ".join(CONSTRAINTS) + " must be set, got "
                           + (", ".join(given) if given else "none"))
    kind = given[0]
    if params.get("whitespace_pattern") is not None and kind not in ("json", "json_object"):
        raise GrammarError(f"whitespace_pattern: applies to json and json_object, not {kind}")
    if kind == "structural_tag":
        raise GrammarError("structural_tag: not supported by this server (use json, regex, "
                           "choice or grammar)")
    if kind == "regex":
        return regex_spec(params["regex"])
    if kind == "choice":
        return choice_spec(params["choice"])
    if kind == "grammar":
        return grammar_text_spec(params["grammar"])
    return _json_spec(params)
