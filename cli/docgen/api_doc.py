"""The generated regions of docs/api.md: the route table (from the routers) and one field
table per request body and per object nested in one (from the pydantic request models,
service/schemas/ and service/translate/schemas/, and service/unsupported.py). The prose
around them is written by hand.

A region is ``<!-- generated: KEY -->`` ... ``<!-- end generated -->``; KEY is ``routes``,
``objects`` or a route's path (``/v1/completions``). A route with a request body and no
region of its own is an error, so a new route cannot go undocumented."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from pydantic import BaseModel

from cli.docgen import table

REGION = re.compile(r"(<!-- generated: (?P<key>[^ ]+) -->\n).*?(<!-- end generated -->)",
                    re.S)
_LIMITS = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"),
           ("exclusiveMaximum", "< {}"), ("minLength", "length >= {}"),
           ("maxLength", "length <= {}"), ("minItems", "items >= {}"),
           ("maxItems", "items <= {}"), ("pattern", "pattern `{}`"))


def routes() -> list[tuple[str, str, bool, type[BaseModel] | None]]:
    """(method, path, needs the API key, request body model) for every route served."""
    from service.routers import anthropic, conversations, openai, ops, responses, stored_chat

    out = []
    for router in (ops.public, ops.private, openai.router, stored_chat.router,
                   anthropic.router, responses.router, conversations.router):
        for route in router.routes:
            hints = typing.get_type_hints(route.endpoint)
            body = next((t for t in hints.values()
                         if isinstance(t, type) and issubclass(t, BaseModel)), None)
            for method in sorted(route.methods):
                out.append((method, route.path_format, bool(router.dependencies), body))
    return out


def _anchor(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}".replace(".", "-").lower()


def _nested(cls: type[BaseModel]) -> list[type[BaseModel]]:
    """The models cls's fields refer to, in field order."""
    found: list[type[BaseModel]] = []

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp not in found:
                found.append(tp)
            return
        for arg in typing.get_args(tp):
            walk(arg)

    for field in cls.model_fields.values():
        walk(field.annotation)
    return found


def _fmt(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _type(s: dict[str, Any], names: dict[str, type]) -> str:
    if "$ref" in s:
        cls = names[s["$ref"].rsplit("/", 1)[1]]
        return f"[{cls.__name__}](#{_anchor(cls)})"
    for key in ("anyOf", "oneOf"):
        if key in s:
            return " or ".join(_type(b, names) for b in s[key])
    if "const" in s:
        return _fmt(s["const"])
    if "enum" in s:
        return " or ".join(_fmt(v) for v in s["enum"])
    kind = s.get("type")
    if kind == "array":
        return f"array of {_type(s.get('items', {}), names)}"
    if kind == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"object of {_type(s['additionalProperties'], names)}"
    if isinstance(kind, list):
        return " or ".join(kind)
    return kind or "any"


def _own_limits(s: dict[str, Any]) -> list[str]:
    out = [fmt.format(s[k]) for k, fmt in _LIMITS if k in s]
    for inner, prefix in (("items", "each "), ("additionalProperties", "each value "),
                          ("propertyNames", "keys: ")):
        if isinstance(s.get(inner), dict):
            out += [prefix + fmt.format(s[inner][k]) for k, fmt in _LIMITS if k in s[inner]]
    return [x.removesuffix(".0") for x in out]


def _limits(s: dict[str, Any]) -> list[str]:
    """The schema's bounds, its branches' and its items' (one level)."""
    out = _own_limits(s)
    for branch in [*s.get("anyOf", ()), *s.get("oneOf", ())]:
        out += [x for x in _own_limits(branch) if x not in out]
    return out


def _handling(name: str, declared: set[str], endpoint: str | None,
              prop: dict[str, Any]) -> str:
    from service import unsupported
    from service.schemas import HANDLING_KEY

    if HANDLING_KEY in prop:
        return prop[HANDLING_KEY]
    # a hint is ignored even where the model declares it (to type-check it): `user`
    hints = (unsupported.HINTS.get(endpoint or "", frozenset())
             | unsupported.VLLM_HINTS.get(endpoint or "", frozenset()))
    if name in hints:
        return "accepted and ignored"
    if name in declared:
        return "implemented"
    accepted = {**unsupported.VLLM_NOOP.get(endpoint or "", {}),
                **unsupported.NOOP.get(endpoint or "", {})}.get(name)
    if accepted is not None:
        return "not implemented: 400 unless " + " or ".join(_fmt(v) for v in accepted)
    return "accepted and ignored"


def field_rows(cls: type[BaseModel]) -> list[tuple[str, ...]]:
    """field, type, default, limits, handling: every property of cls's published schema
    (its declared fields, and the no-op and hint fields service/unsupported.py adds)."""
    schema = cls.model_json_schema(ref_template="#/$defs/{model}")
    names = {c.__name__: c for c in _nested(cls)}
    declared = {f.alias or n for n, f in cls.model_fields.items()}
    required = set(schema.get("required", ()))
    endpoint = getattr(cls, "openai_endpoint", None)
    rows = []
    for name, prop in schema.get("properties", {}).items():
        default = ("required" if name in required
                   else _fmt(prop["default"]) if "default" in prop else "-")
        kind = _type(prop, names) if name in declared else "any"
        rows.append((f"`{name}`", kind, default, ", ".join(_limits(prop)),
                     _handling(name, declared, endpoint, prop)))
    return rows


def _field_table(cls: type[BaseModel]) -> list[str]:
    return table(("field", "type", "default", "limits", "handling"), field_rows(cls))


def _routes_region() -> list[str]:
    rows = []
    for method, path, keyed, body in routes():
        link = f"[{body.__name__}](#{_anchor(body)})" if body else "-"
        rows.append((f"`{method} {path}`", "yes" if keyed else "no", link))
    return table(("route", "API key", "request body"), rows)


def _body_region(path: str) -> list[str]:
    bodies = [b for _, p, _, b in routes() if p == path and b is not None]
    if not bodies:
        raise ValueError(f"docs/api.md: no route {path} with a request body")
    cls = bodies[0]
    # a body several routes take is anchored once, at the first route's section
    first = next(p for _, p, _, b in routes() if b is cls)
    anchor = [f'<a id="{_anchor(cls)}"></a>', ""] if first == path else []
    return [*anchor, f"Body: `{cls.__name__}`.", "", *_field_table(cls)]


def all_objects() -> list[type[BaseModel]]:
    """Every model nested in a request body, in order of first use."""
    found: list[type[BaseModel]] = []
    queue = [b for *_, b in routes() if b is not None]
    while queue:
        for cls in _nested(queue.pop(0)):
            if cls not in found:
                found.append(cls)
                queue.append(cls)
    return found


def _objects_region() -> list[str]:
    objects = all_objects()
    counts: dict[str, int] = {}
    for cls in objects:
        counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
    lines: list[str] = []
    for cls in objects:
        where = f" (`{cls.__module__}`)" if counts[cls.__name__] > 1 else ""
        lines += [f'<a id="{_anchor(cls)}"></a>', "", f"#### `{cls.__name__}`{where}", "",
                  *_field_table(cls), ""]
    return lines[:-1]


def render_region(key: str) -> str:
    if key == "routes":
        lines = _routes_region()
    elif key == "objects":
        lines = _objects_region()
    else:
        lines = _body_region(key)
    return "\n".join(lines) + "\n"


def render_api(text: str) -> str:
    """``text`` (docs/api.md) with every generated region rewritten."""
    keys = {m.group("key") for m in REGION.finditer(text)}
    missing = [p for _, p, _, b in routes() if b is not None and p not in keys]
    missing += [k for k in ("routes", "objects") if k not in keys]
    if missing:
        raise ValueError(f"docs/api.md has no generated region for {sorted(set(missing))}")
    return REGION.sub(lambda m: m.group(1) + render_region(m.group("key")) + m.group(3), text)
