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
- ``structural_tag``: free text in which every trigger opens a tagged segment:
  ``{"triggers": [...], "structures": [{"begin", "schema", "end"}]}`` (an object or its
  JSON text; vLLM's form, also sent as ``response_format`` with ``"type":
  "structural_tag"``): once the output reaches a trigger it must go on with a structure's
  ``begin`` (which starts with that trigger), a JSON value valid against its ``schema``
  and its ``end``; then free text again. Built with llguidance's StructTag, as vLLM's
  guidance backend builds it. xgrammar's newer ``format`` form is a GrammarError.

and options for the JSON constraints: ``whitespace_pattern`` (the whitespace allowed
between JSON tokens; without it JSON is written as ``json.dumps`` writes it: ``", "``
between items, ``": "`` after keys, no other whitespace), ``disable_any_whitespace`` (no
whitespace at all, ``{"a":1,"b":2}``, as vLLM's), ``disable_additional_
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
    json_lark,
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
    """The output is exactly one of ``choices`` (JSON string literals are Lark strings),
    as one terminal: the lexer walks the alternatives, so their number is not bounded by
    the parser's items per row (2000: a rule of 2000 alternatives failed at its first
    token)."""
    if (isinstance(choices, str) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise GrammarError("choice: a non-empty list of non-empty strings is needed")
    alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
    return GrammarSpec(f"start: CHOICE\nCHOICE: {alts}\n", "choice", "choice")


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


_TAG_KEYS = ("type", "triggers", "structures")
_STRUCTURE_KEYS = ("begin", "schema", "end")


def _object_or_text(value: Any, not_json: str, not_object: str) -> Mapping[str, Any]:
    """A JSON object given as itself or as its text; the messages say what was expected."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"{not_json}: {exc}") from exc
    if not isinstance(value, Mapping):
        raise GrammarError(f"{not_object}, got {type(value).__name__}")
    return value


def _tag_object(value: Any) -> Mapping[str, Any]:
    value = _object_or_text(value, "structural_tag: not JSON", "structural_tag: an object "
                            "with triggers and structures is needed")
    if value.get("format") is not None:
        raise GrammarError("structural_tag.format: xgrammar's format form is not served; "
                           "send triggers and structures")
    unknown = sorted(k for k in value if k not in _TAG_KEYS and value[k] is not None)
    if unknown:
        raise GrammarError(f"structural_tag.{unknown[0]}: not a field (fields: "
                           f"{', '.join(_TAG_KEYS)})")
    if value.get("type", "structural_tag") != "structural_tag":
        raise GrammarError("structural_tag.type: must be 'structural_tag'")
    return value


def structural_tag_spec(value: Any, closed: bool = False) -> GrammarSpec:
    """vLLM's legacy structural tag (see the module docstring) -> spec. Each structure's
    trigger is the first of ``triggers`` its ``begin`` starts with; the schemas are
    compiled leniently in the JSON style of every other constraint here, with
    ``additionalProperties: false`` added where unset when ``closed``."""
    import llguidance

    tag = _tag_object(value)
    triggers = tag.get("triggers")
    if (not isinstance(triggers, list) or not triggers
            or not all(isinstance(t, str) and t for t in triggers)):
        raise GrammarError("structural_tag.triggers: a non-empty list of non-empty strings "
                           "is needed")
    structures = tag.get("structures")
    if not isinstance(structures, list) or not structures:
        raise GrammarError("structural_tag.structures: a non-empty list of {begin, schema, "
                           "end} objects is needed")
    tags = []
    for i, st in enumerate(structures):
        where = f"structural_tag.structures[{i}]"
        if not isinstance(st, Mapping):
            raise GrammarError(f"{where}: an object with begin, schema and end is needed")
        extra = sorted(set(st) - set(_STRUCTURE_KEYS))
        if extra:
            raise GrammarError(f"{where}.{extra[0]}: not a field (fields: begin, schema, end)")
        begin, end = st.get("begin"), st.get("end")
        if not isinstance(begin, str) or not isinstance(end, str):
            raise GrammarError(f"{where}: begin and end must be strings")
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise GrammarError(f"{where}.begin: {begin!r} starts with none of the triggers")
        try:
            schema = {} if st.get("schema") is None else _schema(st["schema"])
        except GrammarError as exc:
            raise GrammarError(f"{where}.schema: {str(exc).removeprefix('json: ')}") from None
        if closed:
            schema = closed_objects(schema)
        # json_lark's "%json {...}" minus its prefix: the schema text StructTag embeds
        text = json_lark(schema, strict=False).removeprefix("%json ")
        tags.append(llguidance.StructTag(trigger=trigger, begin=begin, grammar=text, end=end))
    return GrammarSpec(llguidance.StructTag.to_grammar(tags), "structural_tag",
                       "structural_tag")


def _schema(value: Any) -> Mapping[str, Any]:
    return _object_or_text(value, "json: the schema text is not JSON",
                           "json: a JSON schema must be an object")


def _json_spec(params: Mapping[str, Any]) -> GrammarSpec:
    if params.get("json_object") is True:
        schema: Mapping[str, Any] = {"type": "object"}
        name, kind = "json_object", "json_object"
    else:
        schema, name, kind = _schema(params["json"]), "json", "json_schema"
    if params.get("disable_additional_properties"):
        schema = closed_objects(schema)
    ws = params.get("whitespace_pattern")
    compact = params.get("disable_any_whitespace") is True
    if ws is not None and compact:
        raise GrammarError("disable_any_whitespace: contradicts whitespace_pattern")
    if ws is not None and (not isinstance(ws, str) or not ws):
        raise GrammarError("whitespace_pattern: a non-empty regex is needed")
    if ws is not None or compact:  # separators without spaces; whitespace only from ws
        guide = dict(schema.get("x-guidance") or {})
        guide.update(item_separator=",", key_separator=":")
        if ws is not None:
            guide.update(whitespace_flexible=True, whitespace_pattern=ws)
        schema = {**schema, "x-guidance": guide}
    if kind == "json_object" and ws is None and not compact:
        return json_object_spec()
    spec = json_schema_spec(schema, name, strict=False)
    return GrammarSpec(spec.lark, name, kind)


def spec_from_structured_outputs(params: Mapping[str, Any] | None) -> GrammarSpec | None:
    """``structured_outputs`` (keys of CONSTRAINTS and OPTIONS; None or unset values are
    absent) -> spec; None when ``params`` is None. Raises GrammarError when no constraint
    or more than one is set, or when a constraint is malformed."""
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
    for option in ("whitespace_pattern", "disable_any_whitespace"):
        if params.get(option) not in (None, False) and kind not in ("json", "json_object"):
            raise GrammarError(f"{option}: applies to json and json_object, not {kind}")
    if kind == "structural_tag":
        return structural_tag_spec(params["structural_tag"],
                                   bool(params.get("disable_additional_properties")))
    if kind == "regex":
        return regex_spec(params["regex"])
    if kind == "choice":
        return choice_spec(params["choice"])
    if kind == "grammar":
        return grammar_text_spec(params["grammar"])
    return _json_spec(params)
